"""The chat's hold on the full garbage collection: taken over while it runs, given back when it closes;
the chat runs one when it is quiet, and the check for quiet never outlives the chat screen."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest

from strata_tui._gc import QUIET_S, QuietCollector
from strata_tui.app import StrataChat
from strata_tui.widgets import EnginePanel
from tests.test_tui_offline import closed_port_url, wait_for


def test_full_collections_wait_for_a_quiet_moment_and_settings_come_back() -> None:
    before = gc.get_threshold()
    qc = QuietCollector()
    try:
        qc.start()
        assert qc.active
        assert gc.get_freeze_count() > 0  # what existed at start is no longer walked
        assert (
            gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] > 10**6
        )  # no automatic full runs
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


def test_the_chat_runs_a_due_full_collection_when_quiet(tmp_path: Path) -> None:
    async def run() -> None:
        app = StrataChat(server_url=closed_port_url(), db_path=tmp_path / "c.sqlite3")
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.collector.active, "the collector taken over")
            for _ in range(10**4):  # middle-generation runs until a full one is due
                if app.collector.due():
                    break
                gc.collect(1)
            assert app.collector.due()
            await wait_for(pilot, lambda: app.collector.full_runs > 0, "a full collection when quiet")

    asyncio.run(run())


def test_the_chat_exits_cleanly_while_its_screen_is_taken_down_slowly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quiet check must not run against a screen whose widgets are being removed: at exit, a widget
    that takes longer to unmount than the check's interval (as on two busy cores) leaves the chat
    screen on the stack without its input for a while."""

    async def slow_unmount(self: EnginePanel) -> None:
        await asyncio.sleep(QUIET_S)  # two intervals of the quiet check

    monkeypatch.setattr(EnginePanel, "on_unmount", slow_unmount, raising=False)

    async def run() -> None:
        app = StrataChat(server_url=closed_port_url(), db_path=tmp_path / "c.sqlite3")
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.chat is not None and app.chat.conv is not None, "the chat")
        # leaving the block took the app down; an exception in a handler there is raised here

    asyncio.run(run())
