"""Boundaries: narrow a knob between passing and failing values to the exact ranges where it fails.

The sweep samples a knob (say the expert-cache size every 4 slots); between two neighbouring samples
with different outcomes there is a boundary, and a binary search over the whole numbers between them
finds it with log2(gap) more cells. The result is every maximal range of failing values, each edge
exact (its neighbour was run and passes) or open (no passing value was run beyond it). Values between
two samples with the same outcome are assumed to share it; the result says how many were not run.

``bisect_ranges`` is the algorithm on any probe; ``bisect_run`` applies it to a run directory, running
the new cells through the same harness and appending them to the run's records.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["BisectResult", "FailRange", "bisect_ranges", "format_result"]


@dataclass
class FailRange:
    first: int  # first failing value
    last: int  # last failing value
    below: int | None  # largest passing value run below it (None: none)
    above: int | None  # smallest passing value run above it (None: none)

    @property
    def exact(self) -> bool:
        return self.below == self.first - 1 and self.above == self.last + 1

    def describe(self) -> str:
        lo = f"{self.below} passes" if self.below is not None else "nothing below was run"
        hi = f"{self.above} passes" if self.above is not None else "nothing above was run"
        span = str(self.first) if self.first == self.last else f"{self.first}..{self.last}"
        return f"{span} ({lo}, {hi}{'; exact' if self.exact else ''})"


@dataclass
class BisectResult:
    knob: str
    group: dict[str, Any]
    ranges: list[FailRange]
    outcomes: dict[int, bool]  # every value run: True = failing
    probes: list[int] = field(default_factory=list)  # values the bisection ran, in order
    not_run: int = 0  # whole numbers between the lowest and highest value run that were not run

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["outcomes"] = {str(k): v for k, v in sorted(self.outcomes.items())}
        return d


def bisect_ranges(
    known: dict[int, bool],
    probe: Callable[[int], bool],
    *,
    knob: str = "value",
    group: dict[str, Any] | None = None,
    jobs: int = 1,
) -> BisectResult:
    """Bisect every pass/fail transition between neighbouring known values; the failing ranges.

    The transitions are independent: with ``jobs`` > 1 they are searched at the same time (``probe``
    must then be safe to call from several threads).
    """
    outcomes = dict(known)
    probes: list[int] = []
    lock = threading.Lock()
    values = sorted(outcomes)
    pairs = [(a, b) for a, b in zip(values, values[1:], strict=False) if outcomes[a] != outcomes[b]]

    def search(a: int, b: int) -> None:
        lo, hi = a, b  # outcomes[lo] != outcomes[hi]; one transition assumed between them
        while hi - lo > 1:
            mid = (lo + hi) // 2
            with lock:
                have = outcomes.get(mid)
            if have is None:
                have = bool(probe(mid))
                with lock:
                    outcomes[mid] = have
                    probes.append(mid)
            if have == outcomes[lo]:
                lo = mid
            else:
                hi = mid

    if jobs > 1 and len(pairs) > 1:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for f in [pool.submit(search, a, b) for a, b in pairs]:
                f.result()
    else:
        for a, b in pairs:
            search(a, b)
    ranges: list[FailRange] = []
    vals = sorted(outcomes)
    i = 0
    while i < len(vals):
        if not outcomes[vals[i]]:
            i += 1
            continue
        j = i
        while j + 1 < len(vals) and outcomes[vals[j + 1]]:
            j += 1
        ranges.append(
            FailRange(
                first=vals[i],
                last=vals[j],
                below=vals[i - 1] if i > 0 else None,
                above=vals[j + 1] if j + 1 < len(vals) else None,
            )
        )
        i = j + 1
    not_run = (vals[-1] - vals[0] + 1 - len(vals)) if vals else 0
    return BisectResult(
        knob=knob, group=dict(group or {}), ranges=ranges, outcomes=outcomes, probes=probes, not_run=not_run
    )


def format_result(res: BisectResult, labels: dict[int, str] | None = None) -> str:
    """Lines a maintainer reads: the group, each failing range with its edges, what was run."""
    name = ", ".join(f"{k}={v}" for k, v in res.group.items()) or "all cells"
    lines = []
    if res.ranges:
        spans = "; ".join(r.describe() for r in res.ranges)
        lines.append(f"{res.knob} ({name}): fails on {spans}")
    else:
        lo, hi = (min(res.outcomes), max(res.outcomes)) if res.outcomes else (None, None)
        lines.append(f"{res.knob} ({name}): no failure in {lo}..{hi} ({len(res.outcomes)} values run)")
    if res.probes:
        steps = ", ".join(
            f"{v} {(labels or {}).get(v, 'fails' if res.outcomes[v] else 'passes')}"
            for v in sorted(res.probes)
        )
        lines.append(f"  bisection ran {len(res.probes)} cells: {steps}")
    if res.not_run:
        lines.append(f"  {res.not_run} values between those run were not run (assumed like their neighbours)")
    return "\n".join(lines)


def groups_of(
    records: Sequence[dict[str, Any]],
    knob: str,
    other_knobs: Sequence[str],
    value_of: Callable[[dict[str, Any], str], Any],
) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """Records grouped by every other swept knob, keeping only those whose knob value is a whole number."""
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for rec in records:
        if rec["cell"].get("reference"):
            continue
        v = value_of(rec, knob)
        try:
            int(str(v))
        except ValueError:
            continue
        key = tuple(value_of(rec, k) for k in other_knobs)
        out.setdefault(key, []).append(rec)
    return out
