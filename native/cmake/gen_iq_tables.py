"""Emit iq_tables.h: the i-quant lookup tables, taken from gguf-py's tables at build time.

The grids (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S/IQ1_M), the sign table shared by
IQ2_XXS/IQ2_XS/IQ3_XXS, the IQ4_NL/IQ4_XS non-linear values and MXFP4's (doubled) e2m1 values are facts of the GGUF format; gguf-py ships them, so the build reads them from
there instead of keeping a second copy in the C sources.

Usage: python gen_iq_tables.py OUT.h [OUT_DEVICE.h]

OUT_DEVICE.h (for the CUDA kernels) holds the same tables as `static __device__ const` arrays whose
names start with gqd_ (so that a CUDA file can hold both: the host's for its host code, the device's
for its kernels).
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


def _signed_grid_rows(cls: type) -> np.ndarray:
    """A grid whose values are small signed integers (IQ1_S's -1, 0, 1), as two's complement bytes."""
    cls.init_grid()
    g = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
    i = g.astype(np.int8)
    if not np.array_equal(i.astype(np.float32), g):
        raise SystemExit(f"{cls.__name__}: grid values are not small integers")
    return i.view(np.uint8)


def _c_array(
    ctype: str, name: str, words: list[int], per_line: int, width: int, qual: str = "static const"
) -> str:
    lines = []
    for i in range(0, len(words), per_line):
        lines.append("    " + ", ".join(f"0x{w:0{width}x}" for w in words[i : i + per_line]) + ",")
    return f"{qual} {ctype} {name}[{len(words)}] = {{\n" + "\n".join(lines) + "\n};\n"


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
    iq2xxs = _grid_rows(gq.IQ2_XXS)
    iq2s = _grid_rows(gq.IQ2_S)
    iq1s = _signed_grid_rows(gq.IQ1_S)
    assert iq2xxs.shape == (256, 8) and iq2s.shape == (1024, 8) and iq1s.shape == (2048, 8)
    # quant_low.h negates 8 magnitudes at once as (m ^ 0xFF) + 1 per byte: no magnitude may be 0
    assert iq2xxs.min() >= 1 and iq2s.min() >= 1 and max(iq2xxs.max(), iq2s.max()) <= 127
    mxfp4 = [int(v) for v in gq.MXFP4.kvalues]
    assert len(mxfp4) == 16
    assert iq2xs.shape == (512, 8) and iq3xxs.shape == (256, 4) and iq3s.shape == (512, 4)
    ksigns = list(np.frombuffer(gq.IQ2_XXS.ksigns, dtype=np.uint8))
    assert len(ksigns) == 128
    kvalues = [int(v) for v in gq.IQ4_NL.kvalues]
    assert len(kvalues) == 16

    tabs = (iq2xs, iq3xxs, iq3s, iq2xxs, iq2s, iq1s, mxfp4, ksigns, kvalues)
    _write(out, _text(tabs, "static const", "", "STRATA_IQ_TABLES_H"))
    if len(sys.argv) > 2:
        _write(Path(sys.argv[2]), _text(tabs, "static __device__ const", "gqd_", "STRATA_IQ_TABLES_DEV_H"))


def _text(tabs: tuple, qual: str, pre: str, guard: str) -> str:
    iq2xs, iq3xxs, iq3s, iq2xxs, iq2s, iq1s, mxfp4, ksigns, kvalues = tabs
    text = [
        "/* Generated at build time by native/cmake/gen_iq_tables.py from gguf-py's tables. Do not edit. */",
        f"#ifndef {guard}",
        f"#define {guard}",
        "#include <stdint.h>",
        "",
        "/* IQ2_XS: 512 entries of 8 magnitudes, byte j = value j. */",
        _c_array("uint64_t", pre + "iq2xs_grid", _packed(iq2xs), 4, 16, qual),
        "/* IQ3_XXS: 256 entries of 4 magnitudes, byte j = value j. */",
        _c_array("uint32_t", pre + "iq3xxs_grid", _packed(iq3xxs), 8, 8, qual),
        "/* IQ3_S: 512 entries of 4 magnitudes, byte j = value j. */",
        _c_array("uint32_t", pre + "iq3s_grid", _packed(iq3s), 8, 8, qual),
        "/* IQ2_XXS: 256 entries of 8 magnitudes, byte j = value j. */",
        _c_array("uint64_t", pre + "iq2xxs_grid", _packed(iq2xxs), 4, 16, qual),
        "/* IQ2_S: 1024 entries of 8 magnitudes, byte j = value j. */",
        _c_array("uint64_t", pre + "iq2s_grid", _packed(iq2s), 4, 16, qual),
        "/* IQ1_S / IQ1_M: 2048 entries of 8 values -1, 0, 1, byte j = value j as int8. */",
        _c_array("uint64_t", pre + "iq1s_grid", _packed(iq1s), 4, 16, qual),
        "/* MXFP4: the 16 e2m1 values a 4-bit index selects, doubled (the scale carries the half). */",
        f"{qual} int8_t {pre}mxfp4_values[16] = {{" + ", ".join(str(v) for v in mxfp4) + "};",
        "/* 7 stored sign bits -> 8 sign bits (the eighth makes the count of minus signs even). */",
        _c_array("uint8_t", pre + "iq_ksigns", [int(v) for v in ksigns], 16, 2, qual),
        "/* IQ4_NL / IQ4_XS: the 16 non-linear values a 4-bit index selects. */",
        f"{qual} int8_t {pre}iq4nl_values[16] = {{" + ", ".join(str(v) for v in kvalues) + "};",
        "",
        "#endif",
        "",
    ]
    return "\n".join(text)


def _write(out: Path, new: str) -> None:
    if not out.exists() or out.read_text() != new:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(new)


if __name__ == "__main__":
    main()
