"""Engine configuration: one dataclass, one set of command-line flags, used by every command.

Every command that opens an engine (``strata generate``, ``strata serve``, ``strata chat``,
``strata-bench run``, ``repro_matrix`` cells) takes exactly these flags, with these names and
defaults. ``None`` means "the engine's default" (``strata_default_params()`` in C).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from ._enums import CachePolicy, Device, KvType, LendPolicy, MissPolicy, Simd, names

__all__ = ["EngineConfig", "add_engine_args", "config_from_args", "generation_room", "parse_size"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1 << 20,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1 << 30,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1 << 40,
}


def generation_room(max_context: int, n_past: int, n_prompt: int) -> int:
    """How many tokens a reply can have after ``n_prompt`` prompt tokens, ``n_past`` tokens already
    being in the KV cache: the last token is sampled from the logits and never stored, so
    ``n_past + n_prompt + generated - 1 <= max_context``. The one rule for the engine and the server."""
    return int(max_context) - int(n_past) - int(n_prompt) + 1


def parse_size(text: str | int) -> int:
    """Parse ``12GiB``, ``512MiB``, ``1.5GB`` or a plain byte count into bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use a byte count or a unit: 512MiB, 12GiB, 1.5GB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _fmt_size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n % div == 0 and n >= div:
            return f"{n // div}{unit}"
    return str(n)


@dataclass
class EngineConfig:
    """Every engine knob. Field names are the flags' names with dashes turned into underscores."""

    threads: int | None = None  # --threads: CPU threads (default: all cores)
    device: str = "cpu"  # --device cpu|cuda|auto
    vram_budget: int | None = None  # --vram-budget SIZE (bytes; CPU: emulated arena)
    vram_reserve_mib: int | None = None  # --vram-reserve-mib
    max_context: int | None = None  # --max-context tokens
    kv: str = "f16"  # --kv f16|int8
    expert_cache: str = "auto"  # --expert-cache auto|N
    prefill: str = "auto"  # --prefill auto[:MAX]|N
    lend_policy: str = "current"  # --lend-policy current|legacy
    lend_floor: int | None = None  # --lend-floor slots never lent
    lend_pct: float | None = None  # --lend-pct most of the cache lent (0..1)
    miss: str = "auto"  # --miss host|copy|auto
    cache_policy: str = "adaptive"  # --cache-policy adaptive|lru
    adapt_every: int | None = None  # --adapt-every tokens
    adapt_swaps: int | None = None  # --adapt-swaps experts per adaptation
    adapt_decay: float | None = None  # --adapt-decay 0..1
    expert_profile: str | None = None  # --expert-profile FILE
    host_ram_budget: int | None = None  # --host-ram-budget SIZE
    simd: str = "auto"  # --simd auto|scalar|avx2|avx512
    parallel: int | None = None  # --parallel N sequences decoded together (each its own KV cache)

    def validate(self) -> EngineConfig:
        """Raise ValueError naming the flag when a value is out of range."""
        choices = {
            "device": names(Device),
            "kv": names(KvType),
            "lend_policy": names(LendPolicy),
            "miss": names(MissPolicy),
            "cache_policy": names(CachePolicy),
            "simd": names(Simd),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"--{name.replace('_', '-')}: {getattr(self, name)!r} is not one of {', '.join(allowed)}"
                )
        if self.expert_cache != "auto" and not re.fullmatch(r"\d+", str(self.expert_cache)):
            raise ValueError(f"--expert-cache: {self.expert_cache!r} is not 'auto' or a slot count")
        if not re.fullmatch(r"auto(:\d+)?|\d+", str(self.prefill)):
            raise ValueError(
                f"--prefill: {self.prefill!r} is not 'auto', 'auto:MAX' or a chunk size in tokens"
            )
        if self.lend_pct is not None and not 0 < self.lend_pct <= 1:
            raise ValueError(f"--lend-pct: {self.lend_pct} is not in (0, 1]")
        if self.parallel is not None and not 1 <= self.parallel <= 64:
            raise ValueError(f"--parallel: {self.parallel} is not a count of sequences from 1 to 64")
        if self.adapt_decay is not None and not 0 <= self.adapt_decay <= 1:
            raise ValueError(f"--adapt-decay: {self.adapt_decay} is not in [0, 1]")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EngineConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown engine settings: {', '.join(sorted(unknown))}")
        cfg = cls(**d)
        if isinstance(cfg.vram_budget, str):
            cfg.vram_budget = parse_size(cfg.vram_budget)
        if isinstance(cfg.host_ram_budget, str):
            cfg.host_ram_budget = parse_size(cfg.host_ram_budget)
        cfg.expert_cache = str(cfg.expert_cache)
        cfg.prefill = str(cfg.prefill)
        return cfg.validate()

    def to_cli_args(self) -> list[str]:
        """The flags that reproduce this configuration, leaving out every default."""
        out: list[str] = []
        default = EngineConfig()
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v == getattr(default, f.name):
                continue
            if f.name in ("vram_budget", "host_ram_budget") and isinstance(v, int):
                v = _fmt_size(v)
            out += [f"--{f.name.replace('_', '-')}", str(v)]
        return out


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Add every engine flag to a parser (one group, same names and defaults everywhere)."""
    g = p.add_argument_group("engine")
    g.add_argument("--threads", type=int, help="CPU threads (default: all cores)")
    g.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"], help="backend (default: cpu)")
    g.add_argument(
        "--vram-budget", type=parse_size, help="device memory to plan for, e.g. 12GiB (CPU: emulated)"
    )
    g.add_argument("--vram-reserve-mib", type=int, help="MiB of the budget left free")
    g.add_argument("--max-context", type=int, help="tokens of KV cache (default: min(train context, 4096))")
    g.add_argument("--kv", default="f16", choices=["f16", "int8"], help="KV cache type")
    g.add_argument("--expert-cache", default="auto", help="expert-cache slots: auto or N")
    g.add_argument("--prefill", default="auto", help="prompt chunk: auto, auto:MAX or N tokens")
    g.add_argument(
        "--lend-policy",
        default="current",
        choices=["current", "legacy"],
        help="how the prompt path borrows slots",
    )
    g.add_argument(
        "--lend-floor", type=int, help="slots never lent (default 128, or a quarter of a small cache)"
    )
    g.add_argument("--lend-pct", type=float, help="most of the cache that may be lent (0..1)")
    g.add_argument(
        "--miss",
        default="auto",
        choices=["host", "copy", "read", "auto"],
        help="a decode miss: run on the host, copy into a slot, or (cuda) read from pinned host RAM by the "
        "device; auto: host or copy, split by measured rates",
    )
    g.add_argument(
        "--cache-policy", default="adaptive", choices=["adaptive", "lru"], help="decode cache policy"
    )
    g.add_argument("--adapt-every", type=int, help="decode tokens between adaptive swaps")
    g.add_argument("--adapt-swaps", type=int, help="most experts swapped in per adaptation")
    g.add_argument("--adapt-decay", type=float, help="decay of routing counts per adaptation")
    g.add_argument("--expert-profile", help="file of ranked (layer, expert) pairs to fill the cache at start")
    g.add_argument("--host-ram-budget", type=parse_size, help="host RAM the plan may pin or borrow")
    g.add_argument("--simd", default="auto", choices=names(Simd), help="CPU kernel level")
    g.add_argument(
        "--parallel",
        type=int,
        help="sequences decoded together, each with its own KV cache of --max-context tokens (default 1)",
    )


def config_from_args(ns: argparse.Namespace) -> EngineConfig:
    names = [f.name for f in dataclasses.fields(EngineConfig)]
    return EngineConfig(**{n: getattr(ns, n) for n in names}).validate()
