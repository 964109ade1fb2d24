"""What the memory plan will do with a prompt, predicted from the plan and ``layout(T)`` alone.

The engine decides a request's chunk and loan from its plan and the one ``layout(T)`` function
(``strata_chunk_layout``) by one rule, which ``strata_predict_loan`` gives to callers; this module wraps
it so that a harness can say, before sending anything, whether a prompt of n tokens will be served at its chunk, served at a halved
chunk, or (under ``--lend-policy legacy``) fail with "lending the prompt path its slots failed":

    with Engine(model, EngineConfig(expert_cache="4200", lend_policy="legacy", threads=2)) as eng:
        p = predict(eng, 2000)   # Prediction(chunk=2048, loan_slots=..., verdict="lend failed", ...)

On a layer split (``--split layer``) every device has a plan and a loan of its own and all of them run
one chunk: ``predict`` gives that common answer (loans summed, the worst verdict) and, in ``devices``,
each device's own (``strata_predict_loan_device``).

``legacy_failure_range`` sweeps ``--expert-cache`` sizes (opening an engine per size: a few ms on the
tiny preset) and returns the sizes where a prompt of n tokens fails under the legacy policy.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from dataclasses import dataclass, replace
from os import PathLike
from typing import Literal

from . import _cdefs as C
from ._config import EngineConfig
from ._engine import Engine

__all__ = ["DevicePrediction", "Prediction", "legacy_failure_range", "predict"]


@dataclass(frozen=True)
class DevicePrediction:
    """What one device of the engine lends for a fresh prompt: its own loan at the chunk all devices run."""

    device: int  # the device's index (a CUDA ordinal, or an emulated budget on the CPU backend)
    layers: tuple[int, int]  # [begin, end) of the layers it holds
    chunk: int
    chunk_used: int
    slots_needed: int  # layout(chunk).slots_needed on this device
    loan_slots: int  # what this device's cache lends
    max_lend_slots: int  # the most its plan lets it lend
    halvings: int
    verdict: Literal["ok", "halved", "lend failed"]


@dataclass(frozen=True)
class Prediction:
    """What a fresh prompt of ``n_tokens`` gets from an engine's plan."""

    n_tokens: int
    chunk: int  # the chunk the request asks for (min(auto chunk, n rounded up to 256))
    chunk_used: int  # after any halving (current policy); == chunk otherwise
    slots_needed: int  # layout(chunk).slots_needed
    loan_slots: int  # what the cache lends for the request
    halvings: int  # times the chunk is halved (current policy)
    verdict: Literal["ok", "halved", "lend failed"]
    devices: tuple[DevicePrediction, ...] = ()  # each device's own answer (one without a split)


_VERDICTS: dict[int, Literal["ok", "halved", "lend failed"]] = {0: "ok", 1: "halved", 2: "lend failed"}


def predict(eng: Engine, n_tokens: int) -> Prediction:
    """The chunk, loan and outcome of a fresh prompt of n_tokens: the engine's own rule
    (``strata_predict_loan``, the function its prefill decides with), not a copy of it."""
    if n_tokens < 1:
        raise ValueError(f"a prompt has at least one token, not {n_tokens}")
    out = C.StrataLoanPrediction()
    eng._check(C.strata_predict_loan(eng.handle, int(n_tokens), ctypes.byref(out)))
    per = []
    for i, dev in enumerate(eng.devices()):
        d = C.StrataLoanPrediction()
        eng._check(C.strata_predict_loan_device(eng.handle, i, int(n_tokens), ctypes.byref(d)))
        per.append(
            DevicePrediction(
                dev.device,
                (dev.layer_begin, dev.layer_end),
                d.chunk,
                d.chunk_used,
                d.slots_needed,
                d.loan_slots,
                dev.plan.max_lend_slots,
                d.halvings,
                _VERDICTS[d.verdict],
            )
        )
    return Prediction(
        n_tokens,
        out.chunk,
        out.chunk_used,
        out.slots_needed,
        out.loan_slots,
        out.halvings,
        _VERDICTS[out.verdict],
        tuple(per),
    )


def legacy_failure_range(
    model: str | PathLike[str], config: EngineConfig, n_tokens: int, expert_caches: Iterable[int]
) -> list[int]:
    """The --expert-cache sizes at which a fresh prompt of n_tokens fails under the legacy policy."""
    failing = []
    for n in expert_caches:
        cfg = replace(config, expert_cache=str(n), lend_policy="legacy")
        with Engine(model, cfg) as eng:
            if predict(eng, n_tokens).verdict == "lend failed":
                failing.append(n)
    return failing
