"""Emit iq_tables.h: the i-quant lookup tables, taken from gguf-py's tables at build time.

The grids (IQ2_XS, IQ3_XXS, IQ3_S), the sign table shared by IQ2_XS/IQ3_XXS and the IQ4_NL/IQ4_XS
non-linear values are facts of the GGUF format; gguf-py ships them, so the build reads them from
there instead of keeping a second copy in the C sources.

Usage: python gen_iq_tables.py OUT.h
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def _grid_rows(cls: type) -> np.ndarray:
    """The unpacked grid of a gguf-py quant class as uint8 [entries, values]."""
    cls.init_grid()
    g = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
    u = g.astype(np.uint8)
    if not np.array_equal(u.astype(np.float32), g):
        raise SystemExit(f"{cls.__name__}: grid values are not small non-negative integers")
    return u


def _c_array(ctype: str, name: str, words: list[int], per_line: int, width: int) -> str:
    lines = []
    for i in range(0, len(words), per_line):
        lines.append("    " + ", ".join(f"0x{w:0{width}x}" for w in words[i : i + per_line]) + ",")
    return f"static const {ctype} {name}[{len(words)}] = {{\n" + "\n".join(lines) + "\n};\n"


def _packed(rows: np.ndarray) -> list[int]:
    """Each grid entry packed little-endian into one word: byte j is value j."""
    n = rows.shape[1]
    out = []
    for r in rows:
        w = 0
        for j in range(n):
            w |= int(r[j]) << (8 * j)
        out.append(w)
    return out


def main() -> None:
    out = Path(sys.argv[1])
    from gguf import quants as gq

    iq2xs = _grid_rows(gq.IQ2_XS)
    iq3xxs = _grid_rows(gq.IQ3_XXS)
    iq3s = _grid_rows(gq.IQ3_S)
    assert iq2xs.shape == (512, 8) and iq3xxs.shape == (256, 4) and iq3s.shape == (512, 4)
    ksigns = list(np.frombuffer(gq.IQ2_XXS.ksigns, dtype=np.uint8))
    assert len(ksigns) == 128
    kvalues = [int(v) for v in gq.IQ4_NL.kvalues]
    assert len(kvalues) == 16

    text = [
        "/* Generated at build time by native/cmake/gen_iq_tables.py from gguf-py's tables. Do not edit. */",
        "#ifndef STRATA_IQ_TABLES_H",
        "#define STRATA_IQ_TABLES_H",
        "#include <stdint.h>",
        "",
        "/* IQ2_XS: 512 entries of 8 magnitudes, byte j = value j. */",
        _c_array("uint64_t", "iq2xs_grid", _packed(iq2xs), 4, 16),
        "/* IQ3_XXS: 256 entries of 4 magnitudes, byte j = value j. */",
        _c_array("uint32_t", "iq3xxs_grid", _packed(iq3xxs), 8, 8),
        "/* IQ3_S: 512 entries of 4 magnitudes, byte j = value j. */",
        _c_array("uint32_t", "iq3s_grid", _packed(iq3s), 8, 8),
        "/* 7 stored sign bits -> 8 sign bits (the eighth makes the count of minus signs even). */",
        _c_array("uint8_t", "iq_ksigns", [int(v) for v in ksigns], 16, 2),
        "/* IQ4_NL / IQ4_XS: the 16 non-linear values a 4-bit index selects. */",
        "static const int8_t iq4nl_values[16] = {" + ", ".join(str(v) for v in kvalues) + "};",
        "",
        "#endif",
        "",
    ]
    new = "\n".join(text)
    if not out.exists() or out.read_text() != new:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(new)


if __name__ == "__main__":
    main()
