"""Engine configuration: one dataclass, one set of command-line flags, used by every command.

Every command that opens an engine (``strata generate``, ``strata serve``, ``strata chat``,
``strata-bench run``, ``repro_matrix`` cells) takes exactly these flags, with these names and
defaults. ``None`` means "the engine's default" (``strata_default_params()`` in C).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ._enums import CachePolicy, Device, KvType, LendPolicy, MissPolicy, Simd, Split, names

__all__ = [
    "MAX_DEVICES",
    "EngineConfig",
    "add_engine_args",
    "config_from_args",
    "config_or_usage_error",
    "generation_room",
    "parse_budgets",
    "parse_size",
]

_N = TypeVar("_N", int, float)

MAX_DEVICES = 8  # STRATA_MAX_DEVICES: the most devices a layer split may use

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


def parse_budgets(text: str | int) -> int | list[int]:
    """``--vram-budget``: one size (``12GiB``), or one per device of a layer split (``12GiB,12GiB``)."""
    if isinstance(text, int):
        return text
    parts = str(text).split(",")
    if len(parts) == 1:
        return parse_size(parts[0])
    return [parse_size(p) for p in parts]


def _number_list(text: str, flag: str, kind: Callable[[str], _N], what: str) -> list[_N]:
    try:
        return [kind(p) for p in str(text).split(",")]
    except ValueError:
        raise ValueError(f"--{flag}: {text!r} is not a comma-separated list of {what}") from None


def _int_list(text: str, flag: str) -> list[int]:
    out = _number_list(text, flag, int, "device numbers (e.g. 0,1)")
    if any(v < 0 for v in out):
        raise ValueError(f"--{flag}: {text!r} names a negative device")
    return out


def _float_list(text: str, flag: str) -> list[float]:
    out = _number_list(text, flag, float, "shares (e.g. 0.6,0.4)")
    if any(not v >= 0 for v in out) or sum(out) <= 0:
        raise ValueError(f"--{flag}: {text!r}: the shares must be numbers >= 0, at least one of them above 0")
    return out


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
    split: str = "none"  # --split none|layer: the layers cut over several devices
    gpus: str | None = None  # --gpus 0,1: the device of each run of layers, in layer order
    tensor_split: str | None = None  # --tensor-split 0.6,0.4: each device's share of the layers
    vram_budgets: list[int] | None = None  # --vram-budget 12GiB,12GiB: one budget per device of the split
    parallel: int | None = None  # --parallel N sequences decoded together (each its own KV cache)

    def split_devices(self) -> list[int]:
        """The device of each run of layers: --gpus, else 0..n-1 for the devices the other split flags count."""
        if self.gpus is not None:
            return _int_list(self.gpus, "gpus")
        n = 1
        if self.tensor_split is not None:
            n = len(_float_list(self.tensor_split, "tensor-split"))
        elif self.vram_budgets:
            n = len(self.vram_budgets)
        return list(range(n))

    def split_shares(self) -> list[float] | None:
        return None if self.tensor_split is None else _float_list(self.tensor_split, "tensor-split")

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
        if self.threads is not None and not 0 <= self.threads <= 1024:  # the engine's own range (engine.c)
            raise ValueError(f"--threads: {self.threads} is out of range (0 = all cores, up to 1024)")
        if self.lend_pct is not None and not 0 < self.lend_pct <= 1:
            raise ValueError(f"--lend-pct: {self.lend_pct} is not in (0, 1]")
        if self.parallel is not None and not 1 <= self.parallel <= 64:
            raise ValueError(f"--parallel: {self.parallel} is not a count of sequences from 1 to 64")
        if self.adapt_decay is not None and not 0 <= self.adapt_decay <= 1:
            raise ValueError(f"--adapt-decay: {self.adapt_decay} is not in [0, 1]")
        self._validate_split()
        return self

    def _validate_split(self) -> None:
        if self.split not in names(Split):
            raise ValueError(f"--split: {self.split!r} is not one of {', '.join(names(Split))}")
        devices = self.split_devices()
        shares = self.split_shares()
        counts = {"--gpus": len(devices)} if self.gpus is not None else {}
        if shares is not None:
            counts["--tensor-split"] = len(shares)
        if self.vram_budgets is not None:
            if self.vram_budget is not None:
                raise ValueError(
                    "--vram-budget is given both as one size and as one per device; give it once"
                )
            if any(not isinstance(b, int) or b < 0 for b in self.vram_budgets):
                raise ValueError(f"--vram-budget: {self.vram_budgets!r} is not a list of sizes")
            counts["--vram-budget"] = len(self.vram_budgets)
        if len(set(counts.values())) > 1:
            said = ", ".join(f"{flag} {n}" for flag, n in counts.items())
            raise ValueError(
                f"the split's flags count different numbers of devices ({said}); give each device once"
            )
        n = len(devices)
        if self.split == "none" and (n > 1 or shares is not None or self.vram_budgets is not None):
            raise ValueError(
                "--gpus, --tensor-split and a budget per device split the model's layers over several devices: "
                "add --split layer"
            )
        if n > MAX_DEVICES:
            raise ValueError(f"--split layer: {n} devices given; at most {MAX_DEVICES}")

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
            budgets = parse_budgets(cfg.vram_budget)
            cfg.vram_budget, cfg.vram_budgets = (
                (None, budgets) if isinstance(budgets, list) else (budgets, None)
            )
        if cfg.vram_budgets is not None:
            cfg.vram_budgets = [parse_size(b) for b in cfg.vram_budgets]
        for name in ("gpus", "tensor_split"):
            if getattr(cfg, name) is not None:
                v = getattr(cfg, name)
                setattr(cfg, name, ",".join(str(x) for x in v) if isinstance(v, list | tuple) else str(v))
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
            if f.name == "vram_budgets":  # one flag: --vram-budget A,B
                out += ["--vram-budget", ",".join(_fmt_size(b) for b in v)]
                continue
            out += [f"--{f.name.replace('_', '-')}", str(v)]
        return out


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Add every engine flag to a parser (one group, same names and defaults everywhere)."""
    g = p.add_argument_group("engine")
    g.add_argument("--threads", type=int, help="CPU threads (default: all cores)")
    g.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"], help="backend (default: cpu)")
    g.add_argument(
        "--vram-budget",
        type=parse_budgets,
        help="device memory to plan for, e.g. 12GiB (CPU: emulated); with --split layer one per device: 12GiB,12GiB",
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
        "--split",
        default="none",
        choices=names(Split),
        help="layer: cut the layers over several devices, each with its own plan, expert cache and loan",
    )
    g.add_argument(
        "--gpus", help="with --split layer: the device of each run of layers, e.g. 0,1 (0,0: one card twice)"
    )
    g.add_argument(
        "--tensor-split", help="with --split layer: each device's share of the layers, e.g. 0.6,0.4"
    )
    g.add_argument(
        "--parallel",
        type=int,
        help="sequences decoded together, each with its own KV cache of --max-context tokens (default 1)",
    )


def config_from_args(ns: argparse.Namespace) -> EngineConfig:
    fields = [f.name for f in dataclasses.fields(EngineConfig) if f.name != "vram_budgets"]
    values = {n: getattr(ns, n) for n in fields}
    if isinstance(values["vram_budget"], list):  # --vram-budget A,B: one budget per device of the split
        values["vram_budgets"] = values.pop("vram_budget")
    return EngineConfig(**values).validate()


def config_or_usage_error(ns: argparse.Namespace, command: str) -> EngineConfig | None:
    """``config_from_args`` for a command's ``run``: on a flag out of range, print ``<command>: <why>`` to
    stderr and return None (the command then exits with status 2)."""
    try:
        return config_from_args(ns)
    except ValueError as e:
        print(f"{command}: {e}", file=sys.stderr)
        return None
