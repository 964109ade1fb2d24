"""The bisection algorithm: exact edges of every failing range, with few probes."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from repro_matrix import bisect_ranges


@st.composite
def _windows(draw):
    """Disjoint failing windows in 0..200 and samples that hit each window and each gap between them."""
    cuts = sorted(draw(st.sets(st.integers(1, 199), min_size=2, max_size=8)))
    if len(cuts) % 2:
        cuts = cuts[:-1]
    windows = [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts), 2)]
    samples = {0, 200}
    edges = [0, *[x for w in windows for x in (w[0], w[1] + 1)], 201]
    for a, b in zip(edges, edges[1:], strict=False):
        if a < b:
            samples.add(draw(st.integers(a, b - 1)))
    return windows, samples


@given(_windows())
def test_every_window_found_exactly(data):
    windows, samples = data

    def fails(v: int) -> bool:
        return any(a <= v <= b for a, b in windows)

    probed: list[int] = []

    def probe(v: int) -> bool:
        probed.append(v)
        return fails(v)

    res = bisect_ranges({v: fails(v) for v in samples}, probe, knob="expert_cache")
    # merged windows (adjacent ones read as one range)
    merged: list[list[int]] = []
    for a, b in windows:
        if merged and a == merged[-1][1] + 1:
            merged[-1][1] = b
        else:
            merged.append([a, b])
    assert [(r.first, r.last) for r in res.ranges] == [tuple(w) for w in merged]
    for r in res.ranges:
        assert r.exact or r.first == 0 or r.last == 200
    # never probes a value twice or one already known, and stays logarithmic per transition
    assert len(probed) == len(set(probed)) and not set(probed) & samples
    assert len(probed) <= 2 * len(merged) * math.ceil(math.log2(201))


def test_open_ended_range_says_so():
    res = bisect_ranges({10: False, 20: True}, lambda v: v >= 17, knob="expert_cache")
    assert [(r.first, r.last, r.below, r.above) for r in res.ranges] == [(17, 20, 16, None)]
    assert not res.ranges[0].exact and "nothing above was run" in res.ranges[0].describe()
    assert res.probes == [15, 17, 16]


def test_no_transition_runs_nothing():
    res = bisect_ranges({1: False, 9: False}, lambda v: (_ for _ in ()).throw(AssertionError("probed")))
    assert res.ranges == [] and res.probes == [] and res.not_run == 7


def test_boundaries_searched_in_parallel_find_the_same_ranges():
    known = {0: False, 50: True, 100: False, 150: True, 200: False}

    def fails(v: int) -> bool:
        return 33 <= v <= 71 or 140 <= v <= 170

    one = bisect_ranges(known, fails)
    many = bisect_ranges(known, fails, jobs=4)
    assert (
        [(r.first, r.last) for r in many.ranges]
        == [(r.first, r.last) for r in one.ranges]
        == [(33, 71), (140, 170)]
    )
    assert sorted(many.probes) == sorted(one.probes)
