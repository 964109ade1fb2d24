"""Every function exported by strata.h (the engine's contract) or strata_kernels.h (the kernel-level
entry points for tests and benchmarks) is declared in strata._cdefs with the right arity, and every
declaration names a function of one of the headers and of the built library."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest

from strata import _cdefs
from strata._lib import load_library

INCLUDE = Path(__file__).resolve().parents[1] / "native" / "include"
HEADERS = ("strata.h", "strata_kernels.h")


def header_functions(header: str) -> dict[str, int]:
    """name -> number of parameters, for every STRATA_API prototype of one header."""
    text = re.sub(r"/\*.*?\*/", "", (INCLUDE / header).read_text(), flags=re.S)
    out: dict[str, int] = {}
    for m in re.finditer(r"STRATA_API\s+[^;(]*?\b(strata_\w+)\s*\(([^;]*?)\)\s*;", text, flags=re.S):
        name, params = m.group(1), " ".join(m.group(2).split())
        out[name] = 0 if params in ("", "void") else len(params.split(","))
    return out


def exported_functions() -> dict[str, tuple[str, int]]:
    """name -> (header, number of parameters), over both headers."""
    return {name: (h, n) for h in HEADERS for name, n in header_functions(h).items()}


def test_headers_parse_to_many_functions() -> None:
    engine, kernels = header_functions("strata.h"), header_functions("strata_kernels.h")
    assert len(engine) >= 20 and len(kernels) >= 10
    assert engine["strata_engine_open"] == 5
    assert engine["strata_version"] == 0
    assert kernels["strata_matmul"] == 8
    assert kernels["strata_cuda_mirror_expert"] == 14


def test_no_function_in_both_headers() -> None:
    both = set(header_functions("strata.h")) & set(header_functions("strata_kernels.h"))
    assert not both, f"declared in strata.h and in strata_kernels.h: {sorted(both)}"


@pytest.mark.parametrize("name", sorted(exported_functions()))
def test_declared_with_header_arity(name: str) -> None:
    header, arity = exported_functions()[name]
    assert name in _cdefs.DECLARATIONS, f"{name} is exported by {header} but not declared in strata/_cdefs.py"
    argtypes, _ = _cdefs.DECLARATIONS[name]
    assert len(argtypes) == arity, f"{name}: {header} and _cdefs disagree on the arity"


def test_no_declaration_without_header_function() -> None:
    extra = set(_cdefs.DECLARATIONS) - set(exported_functions())
    assert not extra, f"declared in _cdefs but in neither {' nor '.join(HEADERS)}: {sorted(extra)}"


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
