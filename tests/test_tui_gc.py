"""The chat's hold on the full garbage collection: taken over while it runs, given back when it closes."""

from __future__ import annotations

import gc

from strata_tui._gc import QuietCollector


def test_full_collections_wait_for_a_quiet_moment_and_settings_come_back() -> None:
    before = gc.get_threshold()
    qc = QuietCollector()
    try:
        qc.start()
        assert qc.active
        assert gc.get_freeze_count() > 0  # what existed at start is no longer walked
        assert gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] > 10**6  # no automatic full runs
        gc.collect(2)
        assert not qc.due() and not qc.collect_if_due()
        for _ in range(before[2]):  # as many middle-generation runs as make a full one due
            gc.collect(1)
        assert qc.due()
        assert qc.collect_if_due() and qc.full_runs == 1
        assert not qc.due()
    finally:
        qc.stop()
    assert not qc.active
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    qc.stop()  # twice is harmless
