"""Every function exported by strata.h is declared in strata._cdefs with the right arity, and every
declaration names a function of the header and of the built library."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest

from strata import _cdefs
from strata._lib import load_library

HEADER = Path(__file__).resolve().parents[1] / "native" / "include" / "strata.h"


def header_functions() -> dict[str, int]:
    """name -> number of parameters, for every STRATA_API prototype."""
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    out: dict[str, int] = {}
    for m in re.finditer(r"STRATA_API\s+[^;(]*?\b(strata_\w+)\s*\(([^;]*?)\)\s*;", text, flags=re.S):
        name, params = m.group(1), " ".join(m.group(2).split())
        out[name] = 0 if params in ("", "void") else len(params.split(","))
    return out


def test_header_parses_to_many_functions() -> None:
    funcs = header_functions()
    assert len(funcs) >= 30
    assert funcs["strata_engine_open"] == 5
    assert funcs["strata_version"] == 0


@pytest.mark.parametrize("name", sorted(header_functions()))
def test_declared_with_header_arity(name: str) -> None:
    assert name in _cdefs.DECLARATIONS, f"{name} is exported by strata.h but not declared in strata/_cdefs.py"
    argtypes, _ = _cdefs.DECLARATIONS[name]
    assert len(argtypes) == header_functions()[name], f"{name}: header and _cdefs disagree on the arity"


def test_no_declaration_without_header_function() -> None:
    extra = set(_cdefs.DECLARATIONS) - set(header_functions())
    assert not extra, f"declared in _cdefs but not in strata.h: {sorted(extra)}"


def test_every_declared_function_is_in_the_library() -> None:
    lib = load_library()
    for name in _cdefs.DECLARATIONS:
        assert hasattr(lib, name), f"{name} is not exported by {lib._name}"


def test_struct_sizes_match_the_library_defaults() -> None:
    # strata_default_* return structs by value: a wrong field list would shift the values read back.
    p = _cdefs.strata_default_params()
    assert p.expert_cache == -1 and p.lend_floor == -1 and p.kv_type == 0
    g = _cdefs.strata_default_generate_params()
    assert g.max_tokens == 128 and g.stop_at_eos == 1 and g.sampling.top_p == 1.0
    assert ctypes.sizeof(_cdefs.StrataSampling) == 24
