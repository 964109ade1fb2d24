"""The engine's C files call each other only downward: api -> engine / prefill -> memory -> forward ->
blocks -> kernels, with each backend behind one table (backend_ops) that only the memory and forward
layers use. This reads native/src, finds which file defines each function and which files call it, and
checks that the file graph has no circle except the SIMD dispatchers' (a dispatcher in quant.c and the
kernels of each level it picks from, which call its scalar helpers back), and that nothing above the
memory layer calls into a backend."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "native" / "src"
_DEF = re.compile(r"^(?!static\b)[A-Za-z_][\w \*]*?\b([a-z_][a-z0-9_]*)\s*\([^;{]*\)\s*\{", re.M)
_CALL = re.compile(r"\b([a-z_][a-z0-9_]*)\s*\(")
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_STRING = re.compile(r'"(?:\\.|[^"\\])*"')

# files whose circles are the SIMD dispatch (quant.c picks a level's kernels; they call its helpers back)
_SIMD = {"quant.c", "cpu", "cuda_mirror.c"}
# the CUDA backend's host side: reached only through cuda_backend_ops and the kernel API
_BACKEND_FILES = {"cuda/host_memory.c", "cuda/host_forward.c"}
_ABOVE_MEMORY = {"api.c", "engine.c", "prefill.c"}


def _sources() -> dict[str, str]:
    out = {}
    for p in sorted(SRC.rglob("*.c")):
        text = _STRING.sub('""', _COMMENT.sub(" ", p.read_text()))
        out[p.relative_to(SRC).as_posix()] = text
    return out


def _graph() -> tuple[dict[str, set[str]], dict[str, str]]:
    src = _sources()
    owner: dict[str, str] = {}
    for name, text in src.items():
        if name == "cuda_stub.c":  # the no-CUDA build's stand-ins for the kernels' API
            continue
        for m in _DEF.finditer(text):
            owner.setdefault(m.group(1), name)
    edges: dict[str, set[str]] = {n: set() for n in src}
    for name, text in src.items():
        for m in _CALL.finditer(text):
            callee = owner.get(m.group(1))
            if callee and callee != name:
                edges[name].add(callee)
    return edges, owner


def _group(name: str) -> str:
    return "simd" if name.split("/")[0] in _SIMD or name in _SIMD else name


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one file (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_no_circle_in_native_src_but_the_simd_dispatchers() -> None:
    edges, _ = _graph()
    grouped: dict[str, set[str]] = {}
    for a, bs in edges.items():
        ga = _group(a)
        grouped.setdefault(ga, set()).update(_group(b) for b in bs if _group(b) != ga)
    for b in list(grouped.values()):
        for x in b:
            grouped.setdefault(x, set())
    assert _circles(grouped) == [], "files of native/src that call each other in a circle"


def test_the_backends_are_reached_through_their_table_only() -> None:
    edges, _ = _graph()
    for f in _ABOVE_MEMORY:
        bad = sorted(b for b in edges[f] if b in _BACKEND_FILES or b.startswith("cuda"))
        assert bad == [], f"{f} calls the CUDA backend directly: {bad}"
    # memory.c and forward.c reach the CUDA host side only through cuda_backend_ops (no direct calls)
    for f in ("memory.c", "forward.c"):
        bad = sorted(b for b in edges[f] if b in _BACKEND_FILES)
        assert bad == [], f"{f} calls the CUDA host code directly: {bad}"


def test_the_checker_sees_calls() -> None:
    """The parse finds the layering it checks (so the tests above cannot pass on an empty graph)."""
    edges, owner = _graph()
    assert owner.get("mem_open") == "memory.c" and owner.get("engine_forward") == "forward.c"
    assert "memory.c" in edges["prefill.c"] and "forward.c" in edges["memory.c"]
