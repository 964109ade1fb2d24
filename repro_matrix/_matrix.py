"""A matrix: which engine configurations to run, with which prompts, how often, against what.

A matrix is declared in TOML (or on the command line, which builds the same dictionary)::

    name = "cache-sweep"
    model = "tiny"               # a preset made by strata.model.ensure_model, or a .gguf path
    starts = 3                   # fresh engine starts per cell (starts are not all alike)
    max_tokens = 64
    near_tie = 1e-3              # a differing token is a near-tie when the reference's top-2 margin is below this

    [engine]                     # knobs every cell shares (EngineConfig field names)
    vram_budget = "12GiB"
    prefill = "auto"

    [axes]                       # knobs swept: the cells are the product of these lists
    expert_cache = [900, 905, "910..915"]   # "A..B" inclusive, "A..B:S" in steps of S
    lend_policy = ["legacy", "current"]

    [prompts]
    chunks = [2048, 3072, 4096, 6144]      # prompts whose chunk rounds to these sizes
    # lengths = [1500, 2900]               # or prompt lengths in tokens

    [reference]                  # the cell every reply is compared with (overrides of [engine])
    lend_policy = "current"

    [[cells]]                    # extra cells, each a set of overrides (e.g. a planted change)
    temperature = 0.8
    seed = 7

A layer split is three knobs: ``split = "layer"``, ``gpus = "0,1"`` (or ``tensor_split = "0.6,0.4"``) and
``vram_budgets = "12GiB,12GiB"`` (one budget per device). Their values are lists written as one string, so
a comma there does not make a sweep: ``gpus = ["0", "0,1"]`` under ``[axes]`` is two cells (on the command
line, ``--axis 'gpus=0;0,1'``). On a CUDA matrix a cell takes as many cards as its ``gpus`` names.

Knobs are the engine's (``EngineConfig`` fields) or the request's (``temperature``, ``seed``,
``top_k``, ``top_p``, ``min_p``, ``max_tokens``). In TOML the string ``"default"`` stands for the
engine's default (TOML has no null).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from strata._config import EngineConfig, parse_size

__all__ = [
    "ENGINE_KNOBS",
    "LIST_KNOBS",
    "REQUEST_KNOBS",
    "Cell",
    "Matrix",
    "MatrixError",
    "expand_values",
    "load_matrix",
    "parse_shard",
    "prompt_length_for_chunk",
    "shard_cells",
]

ENGINE_KNOBS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(EngineConfig))
# request knobs and their defaults: greedy, fixed seed, 64 tokens
REQUEST_KNOBS: dict[str, Any] = {
    "temperature": 0.0,
    "seed": 0,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "max_tokens": 64,
}
_SIZE_KNOBS = ("vram_budget", "host_ram_budget")
_STR_KNOBS = ("expert_cache", "prefill")
# knobs whose one value is a comma-separated list (one entry per device of a layer split)
LIST_KNOBS = ("gpus", "tensor_split", "vram_budgets")
_RANGE = re.compile(r"\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*(?::\s*(\d+)\s*)?")
# prompts are made this many tokens shorter than their chunk, so that a chunk rounded up to any
# multiple of 64 lands on the target
_CHUNK_SLACK = 40


class MatrixError(ValueError):
    """A matrix declaration that cannot be run; the message says what to change."""


#: Values one knob may sweep: a range is counted before it is expanded, so a typo such as 1..100000000
#: is an error at once, not gigabytes of memory.
MAX_KNOB_VALUES = 100_000
#: Cells a run may hold without --yes (the size is printed before anything runs).
MAX_CELLS_WITHOUT_YES = 10_000


def expand_values(knob: str, values: Any) -> list[Any]:
    """Expand a knob's declared values: a scalar, a list, ranges ``"A..B"`` / ``"A..B:S"``, comma lists."""
    if not isinstance(values, list):
        values = [values]
    if knob in LIST_KNOBS:  # each value is a whole list: its commas separate devices, not values
        out_l: list[Any] = []
        for v in values:
            if repr(v) not in {repr(x) for x in out_l}:
                out_l.append(v.strip() if isinstance(v, str) else v)
        return out_l
    out: list[Any] = []
    for v in values:
        if isinstance(v, str) and "," in v:
            out += expand_values(knob, [p for p in v.split(",") if p.strip()])
            continue
        m = _RANGE.fullmatch(v) if isinstance(v, str) else None
        if m:
            lo, hi, step = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)
            if step <= 0:
                raise MatrixError(f"{knob}: range {v!r} has a step of 0; use A..B:S with S >= 1")
            if hi < lo:
                raise MatrixError(f"{knob}: range {v!r} runs backwards; write the smaller value first")
            n = (hi - lo) // step + 1
            if len(out) + n > MAX_KNOB_VALUES:
                raise MatrixError(
                    f"{knob}: {v!r} is {n:,} values; a knob sweeps at most {MAX_KNOB_VALUES:,}: "
                    f"give the range a step (A..B:S) or narrow it"
                )
            out += list(range(lo, hi + 1, step))
        else:
            out.append(v.strip() if isinstance(v, str) else v)
    # keep the declared order, drop repeats
    seen: list[Any] = []
    keys: set[str] = set()
    for v in out:
        key = repr(v)
        if key not in keys:
            keys.add(key)
            seen.append(v)
    return seen


def _normalize(knob: str, value: Any) -> Any:
    """One knob value in the form EngineConfig stores (sizes in bytes, cache and prefill as strings)."""
    if isinstance(value, str) and value == "default":
        return None if knob in ENGINE_KNOBS else REQUEST_KNOBS[knob]
    if knob in _SIZE_KNOBS and value is not None:
        try:
            return parse_size(value)
        except ValueError as e:
            raise MatrixError(f"{knob}: {e}") from None
    if knob in _STR_KNOBS and value is not None:
        return str(value)
    if knob in ("gpus", "tensor_split") and value is not None:
        return ",".join(str(x) for x in value) if isinstance(value, list) else str(value)
    if knob == "vram_budgets" and value is not None:
        try:
            return [parse_size(b) for b in (value if isinstance(value, list) else str(value).split(","))]
        except ValueError as e:
            raise MatrixError(f"{knob}: {e}") from None
    if knob in ("threads", "vram_reserve_mib", "max_context", "lend_floor", "adapt_every", "adapt_swaps"):
        if value is not None:
            try:
                return int(value)
            except (TypeError, ValueError):
                raise MatrixError(f"{knob}: {value!r} is not a whole number") from None
    if knob in ("lend_pct", "adapt_decay", "temperature", "top_p", "min_p"):
        try:
            return float(value)
        except (TypeError, ValueError):
            raise MatrixError(f"{knob}: {value!r} is not a number") from None
    if knob in ("seed", "top_k", "max_tokens"):
        try:
            return int(value)
        except (TypeError, ValueError):
            raise MatrixError(f"{knob}: {value!r} is not a whole number") from None
    return value


def _check_knob(knob: str, where: str) -> None:
    if knob not in ENGINE_KNOBS and knob not in REQUEST_KNOBS:
        known = ", ".join(sorted(ENGINE_KNOBS + tuple(REQUEST_KNOBS)))
        raise MatrixError(f"{where}: unknown knob {knob!r}; knobs are: {known}")


def prompt_length_for_chunk(chunk: int, max_context: int, max_tokens: int) -> int:
    """Prompt tokens for a prompt whose chunk rounds to ``chunk``, capped so that it and the reply fit."""
    cap = max_context - max_tokens - 1
    return max(1, min(chunk - _CHUNK_SLACK, cap))


@dataclass(frozen=True)
class Cell:
    """One configuration to run: engine settings, request settings, prompts, starts."""

    engine: dict[str, Any]  # EngineConfig fields that differ from the defaults
    request: dict[str, Any]  # REQUEST_KNOBS, all of them
    reference: bool = False
    origin: str = "matrix"  # matrix | extra | reference | bisect

    @property
    def config(self) -> EngineConfig:
        return EngineConfig.from_dict(dict(self.engine))

    @property
    def cell_id(self) -> str:
        key = json.dumps(
            {"engine": self.engine, "request": self.request, "reference": self.reference}, sort_keys=True
        )
        return hashlib.sha1(key.encode()).hexdigest()[:12]

    def knob(self, name: str) -> Any:
        if name in REQUEST_KNOBS:
            return self.request.get(name, REQUEST_KNOBS[name])
        if name in self.engine:
            return self.engine[name]
        return getattr(EngineConfig(), name)

    def label(self, knobs: Iterable[str]) -> str:
        parts = [f"{k}={self.knob(k)}" for k in knobs]
        return ("reference " if self.reference else "") + " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "request": self.request,
            "reference": self.reference,
            "origin": self.origin,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cell:
        return cls(
            engine=dict(d["engine"]),
            request=dict(d["request"]),
            reference=bool(d.get("reference")),
            origin=d.get("origin", "matrix"),
        )

    @classmethod
    def make(cls, settings: dict[str, Any], *, reference: bool = False, origin: str = "matrix") -> Cell:
        """A cell from knob settings; engine knobs equal to EngineConfig's defaults are left out."""
        engine: dict[str, Any] = {}
        request = dict(REQUEST_KNOBS)
        default = EngineConfig()
        for k, v in settings.items():
            if k in REQUEST_KNOBS:
                request[k] = v
            elif v != getattr(default, k):
                engine[k] = v
        try:
            EngineConfig.from_dict(dict(engine))
        except ValueError as e:
            raise MatrixError(f"cell {settings}: {e}") from None
        return cls(engine=engine, request=request, reference=reference, origin=origin)


@dataclass
class Matrix:
    """A declared matrix: shared settings, swept axes, prompts, starts, reference and extra cells."""

    name: str = "matrix"
    model: str = "tiny"
    starts: int = 1
    near_tie: float = 1e-3
    prompt_seed: int = 0
    engine: dict[str, Any] = field(default_factory=dict)
    axes: dict[str, list[Any]] = field(default_factory=dict)
    chunks: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    reference: dict[str, Any] | None = field(default_factory=dict)
    extra: list[dict[str, Any]] = field(default_factory=list)
    fail_on: list[str] = field(
        default_factory=lambda: [
            "lend failed",
            "engine exited",
            "engine start failed",
            "request failed",
            "reply differs",
            "nondeterministic",
        ]
    )
    # cells matching one of these settings may fail without failing the run (the built-in matrix runs
    # the legacy lend policy on purpose, to show that the harness finds its bug)
    expect_fail: list[dict[str, Any]] = field(default_factory=list)

    # ---- declaration ----------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, name: str | None = None) -> Matrix:
        d = dict(d)
        known = {
            "name",
            "model",
            "starts",
            "max_tokens",
            "near_tie",
            "prompt_seed",
            "engine",
            "axes",
            "prompts",
            "reference",
            "cells",
            "fail_on",
            "expect_fail",
        }
        unknown = set(d) - known
        # knobs written at the top level are shared settings (a list there makes an axis)
        engine = dict(d.pop("engine", {}) or {})
        axes_in = dict(d.pop("axes", {}) or {})
        for k in sorted(unknown):
            _check_knob(k, "top level")
            v = d.pop(k)
            if isinstance(v, list) or (
                isinstance(v, str) and (".." in v or "," in v) and k not in LIST_KNOBS
            ):
                axes_in[k] = v
            else:
                engine[k] = v
        m = cls(name=str(d.get("name", name or "matrix")), model=str(d.get("model", "tiny")))
        try:
            m.starts = int(d.get("starts", 1))
            m.near_tie = float(d.get("near_tie", 1e-3))
            m.prompt_seed = int(d.get("prompt_seed", 0))
        except (TypeError, ValueError) as e:
            raise MatrixError(f"starts, near_tie, prompt_seed: {e}") from None
        if m.starts < 1:
            raise MatrixError(f"starts = {m.starts}: a cell needs at least one engine start")
        if "max_tokens" in d:
            engine["max_tokens"] = d["max_tokens"]
        for k, v in engine.items():
            _check_knob(k, "[engine]")
            if isinstance(v, list) and k not in LIST_KNOBS:
                raise MatrixError(f"[engine] {k} = {v!r}: a list belongs under [axes]")
            m.engine[k] = _normalize(k, v)
        for k, v in axes_in.items():
            _check_knob(k, "[axes]")
            vals = [_normalize(k, x) for x in expand_values(k, v)]
            if not vals:
                raise MatrixError(f"[axes] {k} has no values")
            m.axes[k] = vals
        prompts = d.get("prompts", {}) or {}
        if isinstance(prompts, list):
            prompts = {"chunks": prompts}
        unknown_p = set(prompts) - {"chunks", "lengths"}
        if unknown_p:
            raise MatrixError(
                f"[prompts]: unknown keys {sorted(unknown_p)}; use chunks = [...] or lengths = [...]"
            )
        m.chunks = [int(x) for x in expand_values("chunks", prompts.get("chunks", []))]
        m.lengths = [int(x) for x in expand_values("lengths", prompts.get("lengths", []))]
        if not m.chunks and not m.lengths:
            m.chunks = [2048, 3072, 4096, 6144]
        if any(x < 1 for x in m.chunks + m.lengths):
            raise MatrixError("[prompts]: chunk sizes and lengths must be at least 1 token")
        ref = d.get("reference", {})
        if ref is False:
            m.reference = None
        else:
            m.reference = {}
            for k, v in (ref or {}).items():
                _check_knob(k, "[reference]")
                m.reference[k] = _normalize(k, v)
        for i, c in enumerate(d.get("cells", []) or []):
            extra = {}
            for k, v in c.items():
                _check_knob(k, f"[[cells]] #{i + 1}")
                extra[k] = _normalize(k, v)
            m.extra.append(extra)
        if "fail_on" in d:
            m.fail_on = [str(x) for x in d["fail_on"]]
        expect = d.get("expect_fail", []) or []
        for i, settings in enumerate([expect] if isinstance(expect, dict) else expect):
            for k in settings:
                _check_knob(k, f"expect_fail #{i + 1}")
            m.expect_fail.append({k: _normalize(k, v) for k, v in settings.items()})
        m.cells()  # validate every cell now, not half way through a sweep
        return m

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "starts": self.starts,
            "near_tie": self.near_tie,
            "prompt_seed": self.prompt_seed,
            "engine": self.engine,
            "axes": self.axes,
            "prompts": {"chunks": self.chunks, "lengths": self.lengths},
            "reference": self.reference if self.reference is not None else False,
            "cells": self.extra,
            "fail_on": self.fail_on,
            "expect_fail": self.expect_fail,
        }

    def expected_to_fail(self, cell: Cell) -> bool:
        return any(all(cell.knob(k) == v for k, v in e.items()) for e in self.expect_fail)

    # ---- cells ----------------------------------------------------------------------------------

    def reference_cell(self) -> Cell | None:
        if self.reference is None:
            return None
        settings = {**self.engine, **self.reference}
        return Cell.make(settings, reference=True, origin="reference")

    def cells(self) -> list[Cell]:
        """Every cell: the reference first, then the product of the axes, then the extra cells."""
        out: list[Cell] = []
        ref = self.reference_cell()
        if ref is not None:
            out.append(ref)
        names = list(self.axes)
        for combo in itertools.product(*(self.axes[n] for n in names)):
            out.append(Cell.make({**self.engine, **dict(zip(names, combo, strict=True))}))
        for extra in self.extra:
            out.append(Cell.make({**self.engine, **extra}, origin="extra"))
        # two declarations of the same cell run once; a cell that is the reference is run as the reference
        unique: dict[str, Cell] = {}
        same_as_ref = (ref.engine, ref.request) if ref is not None else None
        for c in out:
            if not c.reference and (c.engine, c.request) == same_as_ref:
                continue
            unique.setdefault(c.cell_id, c)
        return list(unique.values())

    def size(self) -> int:
        """Cells the matrix declares (before repeats are merged), counted without making them."""
        n = 1
        for values in self.axes.values():
            n *= max(1, len(values))
        return n + len(self.extra) + (1 if self.reference_cell() is not None else 0)

    def swept_knobs(self) -> list[str]:
        """Knobs that differ between cells, in declaration order (for labels and table columns)."""
        names = list(self.axes)
        for extra in self.extra:
            names += [k for k in extra if k not in names]
        return names

    def prompt_lengths(self, max_context: int, max_tokens: int) -> list[tuple[int, int | None]]:
        """(length, target chunk or None) for each prompt, capped by the context."""
        out: list[tuple[int, int | None]] = [
            (prompt_length_for_chunk(c, max_context, max_tokens), c) for c in self.chunks
        ]
        out += [(min(n, max_context - max_tokens - 1), None) for n in self.lengths]
        return out


def _parse_toml(text: str, where: str) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise MatrixError(
                "reading TOML on Python 3.10 needs the 'tomli' package: pip install tomli"
            ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise MatrixError(f"{where}: not valid TOML: {e}") from None


def _read_text(p: Path) -> str:
    """A matrix file's text; a file that is not UTF-8 (TOML must be) or cannot be read is a MatrixError."""
    try:
        data = p.read_bytes()
    except OSError as e:
        raise MatrixError(f"{p}: cannot be read ({e.strerror or e})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise MatrixError(
            f"{p}: not UTF-8 text (byte 0x{data[e.start]:02x} on line {line}); TOML files are "
            "UTF-8: save it as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None


def builtin_names() -> list[str]:
    return sorted(
        p.name[: -len(".toml")]
        for p in resources.files("repro_matrix.matrices").iterdir()
        if p.name.endswith(".toml")
    )


def load_matrix(spec: str | Path, overrides: Sequence[str] = (), axes: Sequence[str] = ()) -> Matrix:
    """Load ``builtin`` (or another built-in name), a TOML file, or ``-`` (nothing: the command line alone).

    ``overrides`` are ``knob=value`` settings shared by every cell, ``axes`` are ``knob=v1,v2,A..B`` sweeps;
    both win over the file.
    """
    spec = str(spec)
    if spec == "-":
        d: dict[str, Any] = {}
        name = "command-line"
    elif spec in builtin_names():
        text = resources.files("repro_matrix.matrices").joinpath(f"{spec}.toml").read_text()
        d = _parse_toml(text, f"built-in matrix {spec!r}")
        name = spec
    else:
        p = Path(spec)
        if not p.is_file():
            raise MatrixError(
                f"no matrix {spec!r}: give a TOML file, '-' (flags only), or one of the "
                f"built-in matrices: {', '.join(builtin_names())}"
            )
        d = _parse_toml(_read_text(p), str(p))
        name = p.stem
    for text in overrides:
        k, v = _split_setting(text, "--set")
        if k in ("model", "starts", "near_tie", "prompt_seed", "name", "max_tokens"):
            d[k] = v
        elif k in ("chunks", "lengths"):
            d.setdefault("prompts", {})
            d["prompts"] = {k: v.split(",")}
        else:
            _check_knob(k, "--set")
            d.setdefault("engine", {})[k] = v
            d.get("axes", {}).pop(k, None)
    for text in axes:
        k, v = _split_setting(text, "--axis")
        _check_knob(k, "--axis")
        sep = ";" if k in LIST_KNOBS else ","  # a list knob's value has commas of its own
        d.setdefault("axes", {})[k] = [x for x in v.split(sep) if x.strip()]
        d.get("engine", {}).pop(k, None)
    return Matrix.from_dict(d, name=name)


def _split_setting(text: str, flag: str) -> tuple[str, str]:
    if "=" not in text:
        raise MatrixError(f"{flag} {text!r}: write knob=value, e.g. {flag} expert_cache=900..915")
    k, v = text.split("=", 1)
    return k.strip().replace("-", "_"), v.strip()


def parse_shard(shard: str) -> tuple[int, int]:
    """``"K/N"`` as (K, N), 1 <= K <= N."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", shard)
    if not m:
        raise MatrixError(f"--shard {shard!r}: write K/N with 1 <= K <= N, e.g. --shard 2/4")
    k, n = int(m.group(1)), int(m.group(2))
    if not 1 <= k <= n:
        raise MatrixError(f"--shard {shard}: K must be between 1 and N ({n})")
    return k, n


def shard_cells(cells: Sequence[Cell], shard: str | None) -> list[Cell]:
    """The cells of shard ``K/N`` (1-based): every N-th cell by position, so shards are balanced, and the
    reference cell in every shard (each shard compares its replies with a reference it ran itself)."""
    if not shard:
        return list(cells)
    k, n = parse_shard(shard)
    refs = [c for c in cells if c.reference]
    others = [c for c in cells if not c.reference]
    return [*refs, *(c for i, c in enumerate(others) if i % n == k - 1)]
