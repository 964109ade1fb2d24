"""Is a change real? A seeded bootstrap of the relative change of a statistic between two sets of samples.

Benchmark repetitions are noisy and their noise is not normal: a run shares the machine with other
work, a clock steps down, a cache is cold, so a few repetitions are far slower than the rest. Two
back-to-back runs of the same build can differ by a third in their means. The median moves far less,
and how far it can move is what the bootstrap measures: each side's samples are resampled with
replacement ``n_boot`` times, the statistic taken on each resample, and the relative change
``stat(new*) / stat(old*) - 1`` collected. The central ``confidence`` share of those changes is the
interval. A change is significant when the interval does not hold 0.

The generator is seeded, so the same two files always give the same interval and the same verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["STATISTICS", "Change", "bootstrap_change", "statistic"]

# statistic name -> percentile (None: the mean)
STATISTICS: dict[str, float | None] = {"mean": None, "median": 50.0, "p50": 50.0, "p90": 90.0, "p99": 99.0}

MIN_SAMPLES = 3  # below this a side says nothing about its own noise


def statistic(values: Sequence[float] | np.ndarray, name: str) -> float:
    """``name`` (mean, median, p50, p90, p99) of the values, NaN for none."""
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return float("nan")
    q = STATISTICS[name]
    return float(a.mean()) if q is None else float(np.percentile(a, q))


@dataclass(frozen=True)
class Change:
    """The relative change of a statistic from OLD's samples to NEW's, with its bootstrap interval."""

    stat: str
    old: float  # the statistic of OLD's samples
    new: float
    change: float  # new / old - 1
    lo: float  # bounds of the interval of the change
    hi: float
    confidence: float
    n_old: int
    n_new: int

    @property
    def significant(self) -> bool:
        """The interval does not hold 0: the samples say the statistic moved."""
        return self.lo > 0 or self.hi < 0

    @property
    def half_width(self) -> float:
        """Half the interval's width: how far noise alone moves the change."""
        return (self.hi - self.lo) / 2

    def interval_text(self) -> str:
        return f"[{self.lo * 100:+.1f}%, {self.hi * 100:+.1f}%]"


def bootstrap_change(
    old: Sequence[float],
    new: Sequence[float],
    stat: str = "median",
    *,
    n_boot: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Change:
    """The change of ``stat`` from ``old`` to ``new`` and its percentile-bootstrap interval.

    Raises ValueError when a side has fewer than 3 finite samples (it cannot show its noise) or the
    statistic of OLD is 0 (no relative change exists).
    """
    if stat not in STATISTICS:
        raise ValueError(f"statistic {stat!r}: use one of {', '.join(STATISTICS)}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence}: give a fraction between 0 and 1, e.g. 0.95")
    if n_boot < 100:
        raise ValueError(f"{n_boot} bootstrap resamples are too few for an interval (use 1000 or more)")
    a = np.asarray([x for x in old if x is not None and math.isfinite(x)], dtype=float)
    b = np.asarray([x for x in new if x is not None and math.isfinite(x)], dtype=float)
    if a.size < MIN_SAMPLES or b.size < MIN_SAMPLES:
        raise ValueError(
            f"{a.size} samples in OLD and {b.size} in NEW: at least {MIN_SAMPLES} on each side are needed "
            "to tell a change from noise (raise -r/--repetitions or --requests)"
        )
    sa, sb = statistic(a, stat), statistic(b, stat)
    if sa == 0:
        raise ValueError(f"the {stat} of OLD is 0: a relative change is not defined")
    rng = np.random.default_rng(seed)
    # resample in blocks so that a side of thousands of requests stays within a few tens of MB
    block = max(1, min(n_boot, 2_000_000 // max(a.size, b.size)))
    changes = np.empty(n_boot)
    q = STATISTICS[stat]
    done = 0
    while done < n_boot:
        k = min(block, n_boot - done)
        ra = a[rng.integers(0, a.size, (k, a.size))]
        rb = b[rng.integers(0, b.size, (k, b.size))]
        if q is None:
            ma, mb = ra.mean(axis=1), rb.mean(axis=1)
        else:
            ma, mb = np.percentile(ra, q, axis=1), np.percentile(rb, q, axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            changes[done : done + k] = mb / ma - 1
        done += k
    changes = changes[np.isfinite(changes)]
    tail = (1 - confidence) / 2
    lo, hi = np.quantile(changes, [tail, 1 - tail]) if changes.size else (-math.inf, math.inf)
    return Change(
        stat=stat, old=sa, new=sb, change=sb / sa - 1, lo=float(lo), hi=float(hi), confidence=confidence,
        n_old=int(a.size), n_new=int(b.size),
    )  # fmt: skip
