"""Engine flags that take lists: ``--expert-cache 100,200 --threads 1,2`` is a grid of four configurations.

The flags are exactly strata's (``strata._config.add_engine_args``); each one is made to accept a
comma-separated list whose elements are parsed and checked the way the single flag would be.

A layer split's lists of one value per device are written as llama-bench writes them, with ``/``:
``--split layer --gpus 0/1 --vram-budget 12GiB/12GiB --tensor-split 0.6/0.4`` is one configuration, and
``--gpus 0/1,0/0`` two (a comma still sweeps).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

from strata._config import EngineConfig, add_engine_args, parse_size

__all__ = ["ENGINE_FIELDS", "add_grid_engine_args", "configs_from_grid", "int_list", "swept_knobs"]

ENGINE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(EngineConfig))


def _list_of(parse: Callable[[str], Any] | None, choices: Any, flag: str) -> Callable[[str], list[Any]]:
    def convert(text: str) -> list[Any]:
        items = [t.strip() for t in str(text).split(",")]
        if not items or any(t == "" for t in items):
            raise argparse.ArgumentTypeError(f"{flag}: {text!r} has an empty item (write a,b,c)")
        out = []
        for t in items:
            try:
                v = parse(t) if parse else t
            except (TypeError, ValueError) as e:
                raise argparse.ArgumentTypeError(f"{flag}: {t!r}: {e}") from None
            if choices is not None and v not in choices:
                raise argparse.ArgumentTypeError(
                    f"{flag}: {t!r} is not one of {', '.join(map(str, choices))}"
                )
            out.append(v)
        return out

    convert.__name__ = "list"  # argparse names the type in its messages
    return convert


def _size_or_auto(text: str) -> int | list[int] | None:
    """A size, ``auto`` for the flag's default (no budget: all free device memory), or one size per device
    of a layer split (``12GiB/12GiB``)."""
    if "/" in text:
        return [parse_size(t) for t in text.split("/")]
    return None if text.lower() in ("auto", "none") else parse_size(text)


def _device_list(text: str) -> str:
    """``0/1`` (one value per device) as the engine's ``0,1``."""
    return ",".join(t.strip() for t in text.split("/"))


def add_grid_engine_args(p: argparse.ArgumentParser) -> None:
    """strata's engine flags, each accepting a comma-separated list to sweep.

    The size flags also take ``auto`` in a list (``--vram-budget auto,24GiB,12GiB``): that element is the
    flag left out, so one grid holds the all-resident run and the budgeted ones.
    """
    add_engine_args(p)
    for action in p._actions:
        if action.dest in ENGINE_FIELDS and action.option_strings:
            flag = action.option_strings[0]
            parse = action.type if callable(action.type) else None
            if action.dest in ("vram_budget", "host_ram_budget"):
                parse = _size_or_auto
            if action.dest in ("gpus", "tensor_split"):
                parse = _device_list
            action.type = _list_of(parse, action.choices, flag)
            action.choices = None
            action.metavar = action.metavar or action.dest.upper()
            if action.help:
                action.help += " (comma list sweeps)"


def int_list(text: str) -> list[int]:
    """``512,4096`` -> [512, 4096] (non-negative)."""
    try:
        out = [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if any(v < 0 for v in out):
        raise argparse.ArgumentTypeError(f"{text!r}: values must be >= 0")
    return out


def configs_from_grid(ns: argparse.Namespace) -> list[EngineConfig]:
    """Every combination of the list-valued engine flags, in flag order (the last flag varies fastest)."""
    axes: list[list[Any]] = []
    for name in ENGINE_FIELDS:
        v = getattr(ns, name, None)
        axes.append(v if isinstance(v, list) else [v])
    out = []
    for combo in itertools.product(*axes):
        cfg = EngineConfig(**dict(zip(ENGINE_FIELDS, combo, strict=False)))
        if isinstance(cfg.vram_budget, list):  # 12GiB/12GiB: one budget per device of the split
            cfg.vram_budget, cfg.vram_budgets = None, cfg.vram_budget
        cfg.expert_cache = str(cfg.expert_cache)
        cfg.prefill = str(cfg.prefill)
        out.append(cfg.validate())
    return out


def swept_knobs(knob_dicts: list[dict[str, Any]]) -> list[str]:
    """Knob names whose value differs between the given configurations, in field order."""
    if not knob_dicts:
        return []
    names = [n for n in ENGINE_FIELDS if any(n in d for d in knob_dicts)]
    return [n for n in names if len({repr(d.get(n)) for d in knob_dicts}) > 1]
