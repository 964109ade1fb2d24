"""How quickly a key typed into the chat reaches the screen while a long reply streams (``make bench``).

A thread plays the terminal's input reader: at random moments it hands a key to the app's event loop
(as a real driver does) and notes the time. The latency of a key is the time from then until the
first frame whose composed update shows the new character in the message box; composing includes
turning the update into terminal output, which a headless run would otherwise skip. The same is
measured with no reply streaming, as the baseline. One frame at Textual's 60 fps is 16.7 ms. Run for
the tiny preset (thousands of tokens a second) and the small one (a few dozen).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from textual import events

from strata_tui.app import StrataChat
from strata_tui.server_process import ServerProcess

pytestmark = [pytest.mark.bench, pytest.mark.timeout(300)]

pytest.importorskip("strata.server.cli", reason="strata serve is not in this tree yet")

FRAME_MS = 1000.0 / 60
N_KEYS = 80


@pytest.fixture(scope="module", params=["tiny", "small"])
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    # tiny writes thousands of tokens a second (the harshest stream); small a few dozen (like a real
    # model on a modest machine)
    from strata.model import ensure_model

    proc = ServerProcess(ensure_model(request.param), ["--threads", "1"])
    proc.start(timeout=240)
    yield proc
    proc.stop()


class _Probe:
    """Timestamps frames and the keys that should appear in them."""

    def __init__(self, app: StrataChat) -> None:
        self.app = app
        self.pending: dict[str, tuple[float, int]] = {}  # text the box will hold -> (time sent, frames then)
        self.latencies_ms: list[float] = []
        self.frames_to_show: list[int] = []  # frames composed after the key was sent, up to the one showing it
        self.frames = 0
        screen = app.chat
        assert screen is not None
        inner = screen._compositor_refresh
        chat_input = screen.input

        def refresh() -> None:
            # compose the update and render it to terminal bytes, as a real terminal run does
            update = screen._compositor.render_update(screen_stack=app._background_screens)
            if update is not None:
                update.render_segments(app.console)
            inner()
            now = time.perf_counter()
            self.frames += 1
            sent = self.pending.pop(chat_input.text, None)
            if sent is not None:
                self.latencies_ms.append((now - sent[0]) * 1000.0)
                self.frames_to_show.append(self.frames - sent[1])

        screen._compositor_refresh = refresh  # type: ignore[method-assign]

    def typist(self, loop: asyncio.AbstractEventLoop, n: int, stop: threading.Event) -> threading.Thread:
        app = self.app
        assert app.chat is not None and app._driver is not None
        driver = app._driver
        rng = random.Random(0)

        def run() -> None:
            typed = ""
            for i in range(n):
                if stop.is_set():
                    return
                time.sleep(rng.uniform(0.03, 0.12))
                ch = "abcdefghij"[i % 10]
                typed += ch
                ev = events.Key(ch, ch)
                ev.set_sender(app)
                self.pending[typed] = (time.perf_counter(), self.frames)
                loop.call_soon_threadsafe(driver.send_message, ev)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t


def _summary(xs: list[float], frames: list[int]) -> dict[str, float]:
    xs = sorted(xs)
    return {
        "in_next_frame": sum(f <= 1 for f in frames) / len(frames),
        "max_frames": max(frames),
        "n": len(xs),
        "median_ms": statistics.median(xs),
        "p95_ms": xs[int(0.95 * (len(xs) - 1))],
        "max_ms": xs[-1],
        "within_one_frame": sum(x <= FRAME_MS for x in xs) / len(xs),
    }


async def _measure(server_url: str, tmp_db: Any, streaming: bool) -> tuple[dict[str, float], dict[str, Any]]:
    app = StrataChat(server_url=server_url, db_path=tmp_db)
    async with app.run_test(size=(120, 40)) as pilot:
        while not (app.chat is not None and app.chat.connected and app.chat.conv is not None):
            await pilot.pause(0.05)
        chat = app.chat
        await chat.run_slash("/temp", "0")
        await chat.run_slash("/max-tokens", "4000")
        probe = _Probe(app)
        info: dict[str, Any] = {"pieces": 0}
        stop = threading.Event()
        if streaming:
            # long replies, one after the other for the whole measurement (the tiny model writes
            # thousands of tokens a second: the harshest stream the chat will see)
            chat.input.load_text("Why?")
            await pilot.press("enter")
            while not any(v.role == "assistant" for v in chat.log_view.messages()):
                await pilot.pause(0.02)
            chat.input.focus()
        t = probe.typist(asyncio.get_running_loop(), N_KEYS, stop)
        t_start = time.perf_counter()
        streamed_s = 0.0
        while t.is_alive():
            t0 = time.perf_counter()
            in_flight = chat.reply is not None
            await pilot.pause(0.02)
            if streaming:
                if chat.reply is None:
                    last = chat.log_view.messages()[-1:]
                    info["pieces"] += sum(v.pieces for v in last)
                    chat.call_next(chat.action_regenerate)  # the next reply; the message box is left alone
                    await pilot.pause(0.05)
                elif in_flight:
                    streamed_s += time.perf_counter() - t0
        info["streaming_share"] = streamed_s / (time.perf_counter() - t_start)
        if chat.reply is not None:
            info["pieces"] += chat.reply.n_pieces
        await pilot.pause(0.2)
        if streaming and chat.reply is not None:
            await pilot.press("escape")
        info["frames"] = probe.frames
        return _summary(probe.latencies_ms, probe.frames_to_show), info


def test_typing_while_streaming(benchmark: Any, server: ServerProcess, tmp_path: Any) -> None:
    results: dict[str, Any] = {}

    def run() -> None:
        assert server.url is not None
        results["idle"], _ = asyncio.run(_measure(server.url, tmp_path / "a.sqlite3", streaming=False))
        results["streaming"], results["info"] = asyncio.run(_measure(server.url, tmp_path / "b.sqlite3", streaming=True))

    benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update({"frame_ms": FRAME_MS, "model": str(server.model), **{f"{k}_{m}": v for k in ("idle", "streaming")
                                                           for m, v in results[k].items()},
                                 "pieces_streamed": results["info"]["pieces"],
                                 "streaming_share": results["info"]["streaming_share"]})
    for k in ("idle", "streaming"):
        s = results[k]
        print(f"\n{Path(str(server.model)).name}: key-to-frame latency, {k}: n={s['n']} median {s['median_ms']:.1f} ms, p95 {s['p95_ms']:.1f} ms, "
              f"max {s['max_ms']:.1f} ms, within {FRAME_MS:.1f} ms: {100 * s['within_one_frame']:.0f}%; "
              f"shown in the next frame composed: {100 * s['in_next_frame']:.0f}% (worst: {s['max_frames']} frames)")
    print(f"replies streamed {100 * results['info']['streaming_share']:.0f}% of the time, "
          f"{results['info']['pieces']} pieces in all")
    assert results["streaming"]["n"] >= 10, "too few keys landed while the reply streamed"
