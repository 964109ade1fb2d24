"""How quickly a key typed into the chat reaches the screen while a long reply streams (``make bench``).

A thread plays the terminal's input reader: every ``KEY_INTERVAL_S`` it hands a key to the app's event
loop (as a real driver does) and notes the time. The latency of a key is the time from then until the
first frame whose composed update shows the new character in the message box; composing includes
turning the update into terminal output, which a headless run would otherwise skip. "Next frame": the
first frame begun after the key was handed over shows it (a frame already being composed then cannot).
The same is measured with no reply streaming, as the baseline. One frame at Textual's 60 fps is
16.7 ms. Run for the tiny preset (thousands of tokens a second) and the small one (a few hundred here).
Also reported: how late a 5 ms ticker on the event loop ran (the longest stretches the loop was busy)
and the load average, since on a shared machine the process may simply not be running.
"""

from __future__ import annotations

import asyncio
import os
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

FRAME_MS = 1000.0 / 60
N_KEYS = 150
KEY_INTERVAL_S = 0.06  # a fast typist: 1,000 characters a minute


@pytest.fixture(scope="module", params=["tiny", "small"])
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    # tiny writes thousands of tokens a second (the harshest stream); small a few hundred
    from strata.model import ensure_model

    proc = ServerProcess(ensure_model(request.param), ["--threads", "1"])
    proc.start(timeout=240)
    yield proc
    proc.stop()


class _Probe:
    """Timestamps frames and the keys that should appear in them."""

    def __init__(self, app: StrataChat) -> None:
        self.app = app
        self.pending: dict[
            str, tuple[float, int]
        ] = {}  # text the box will hold -> (time sent, frames begun then)
        self.latencies_ms: list[float] = []
        self.frames_to_show: list[int] = []  # frames begun after the key was sent, up to the one showing it
        self.frames = 0  # frames begun
        screen = app.chat
        assert screen is not None
        inner = screen._compositor_refresh
        chat_input = screen.input

        def refresh() -> None:
            self.frames += 1
            begun = self.frames
            # compose the update and render it to terminal bytes, as a real terminal run does
            update = screen._compositor.render_update(screen_stack=app._background_screens)
            if update is not None:
                update.render_segments(app.console)
            inner()
            now = time.perf_counter()
            sent = self.pending.pop(chat_input.text, None)
            if sent is not None:
                self.latencies_ms.append((now - sent[0]) * 1000.0)
                self.frames_to_show.append(begun - sent[1])

        screen._compositor_refresh = refresh  # type: ignore[method-assign]

    def typist(self, loop: asyncio.AbstractEventLoop, n: int, stop: threading.Event) -> threading.Thread:
        app = self.app
        assert app.chat is not None and app._driver is not None
        driver = app._driver

        def run() -> None:
            typed = ""
            t_next = time.perf_counter()
            for i in range(n):
                if stop.is_set():
                    return
                t_next += KEY_INTERVAL_S
                time.sleep(max(0.0, t_next - time.perf_counter()))
                ch = "abcdefghij"[i % 10]
                typed += ch
                ev = events.Key(ch, ch)
                ev.set_sender(app)
                self.pending[typed] = (time.perf_counter(), self.frames)
                loop.call_soon_threadsafe(driver.send_message, ev)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t


def _pct(xs: list[float], q: float) -> float:
    return xs[round(q * (len(xs) - 1))]


def _summary(xs: list[float], frames: list[int], lags: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    lags = sorted(lags)
    return {
        "in_next_frame": sum(f <= 1 for f in frames) / len(frames),
        "max_frames": max(frames),
        "n": len(xs),
        "median_ms": statistics.median(xs),
        "p90_ms": _pct(xs, 0.90),
        "p95_ms": _pct(xs, 0.95),
        "max_ms": xs[-1],
        "within_one_frame": sum(x <= FRAME_MS for x in xs) / len(xs),
        "within_two_frames": sum(x <= 2 * FRAME_MS for x in xs) / len(xs),
        "loop_lag_p99_ms": _pct(lags, 0.99),
        "loop_lag_max_ms": lags[-1],
    }


async def _ticker(lags: list[float], stop: asyncio.Event) -> None:
    """How late a 5 ms sleep wakes up: the time the loop was busy with something else."""
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.005)
        lags.append(max(0.0, (time.perf_counter() - t - 0.005) * 1000.0))


async def _measure(
    server_url: str, tmp_db: Any, streaming: bool, temperature: str = "1"
) -> tuple[dict[str, float], dict[str, Any]]:
    app = StrataChat(server_url=server_url, db_path=tmp_db)
    async with app.run_test(size=(120, 40)) as pilot:
        while not (app.chat is not None and app.chat.connected and app.chat.conv is not None):
            await pilot.pause(0.05)
        chat = app.chat
        # long replies: tiny's greedy reply ends after a few dozen tokens (sampled ones run to ~1,000),
        # small's greedy one runs to max tokens
        await chat.run_slash("/temp", temperature)
        await chat.run_slash("/seed", "1")
        await chat.run_slash("/max-tokens", "4000")
        probe = _Probe(app)
        info: dict[str, Any] = {"pieces": 0, "replies": 0}
        stop = threading.Event()
        if streaming:
            # long replies, one after the other for the whole measurement (the tiny model writes
            # thousands of tokens a second: the harshest stream the chat will see)
            chat.input.load_text("Why?")
            await pilot.press("enter")
            while not any(v.role == "assistant" for v in chat.log_view.messages()):
                await pilot.pause(0.02)
            chat.input.focus()
        lags: list[float] = []
        stop_ticker = asyncio.Event()
        ticker = asyncio.create_task(_ticker(lags, stop_ticker))
        t = probe.typist(asyncio.get_running_loop(), N_KEYS, stop)
        t_start = time.perf_counter()
        streamed_s = 0.0
        while t.is_alive():
            t0 = time.perf_counter()
            in_flight = chat.reply is not None
            # plain sleeps: Pilot.pause would compose frames of its own
            await asyncio.sleep(0.02)
            if streaming:
                if chat.reply is None:
                    last = chat.log_view.messages()[-1:]
                    info["pieces"] += sum(v.pieces for v in last)
                    info["replies"] += 1
                    chat.call_next(chat.action_regenerate)  # the next reply; the message box is left alone
                    await asyncio.sleep(0.05)
                elif in_flight:
                    streamed_s += time.perf_counter() - t0
        stop_ticker.set()
        await ticker
        info["streaming_share"] = streamed_s / (time.perf_counter() - t_start)
        if chat.reply is not None:
            info["pieces"] += chat.reply.n_pieces
        await pilot.pause(0.2)
        if streaming and chat.reply is not None:
            await pilot.press("escape")
        info["frames"] = probe.frames
        info["errors"] = [v.content for v in chat.log_view.messages() if v.role == "error"]
        return _summary(probe.latencies_ms, probe.frames_to_show, lags), info


def test_typing_while_streaming(benchmark: Any, server: ServerProcess, tmp_path: Any) -> None:
    results: dict[str, Any] = {}

    def run() -> None:
        assert server.url is not None
        results["idle"], _ = asyncio.run(_measure(server.url, tmp_path / "a.sqlite3", streaming=False))
        temperature = "0" if "small" in str(server.model) else "1"
        results["streaming"], results["info"] = asyncio.run(
            _measure(server.url, tmp_path / "b.sqlite3", streaming=True, temperature=temperature)
        )

    load_before = os.getloadavg()
    benchmark.pedantic(run, rounds=1, iterations=1)
    load = [round(x, 2) for x in (*load_before, *os.getloadavg())]
    benchmark.extra_info.update(
        {
            "frame_ms": FRAME_MS,
            "model": str(server.model),
            "loadavg_before_after": load,
            **{f"{k}_{m}": v for k in ("idle", "streaming") for m, v in results[k].items()},
            "pieces_streamed": results["info"]["pieces"],
            "streaming_share": results["info"]["streaming_share"],
        }
    )
    for k in ("idle", "streaming"):
        s = results[k]
        print(
            f"\n{Path(str(server.model)).name}: key-to-frame latency, {k}: n={s['n']} median {s['median_ms']:.1f} ms, "
            f"p90 {s['p90_ms']:.1f} ms, p95 {s['p95_ms']:.1f} ms, max {s['max_ms']:.1f} ms, "
            f"within {FRAME_MS:.1f} ms: {100 * s['within_one_frame']:.0f}%, within {2 * FRAME_MS:.1f} ms: "
            f"{100 * s['within_two_frames']:.0f}%; shown by the next frame begun: {100 * s['in_next_frame']:.0f}% "
            f"(worst: {s['max_frames']} frames); event loop late by p99 {s['loop_lag_p99_ms']:.1f} ms, "
            f"max {s['loop_lag_max_ms']:.1f} ms"
        )
    print(
        f"replies streamed {100 * results['info']['streaming_share']:.0f}% of the time, "
        f"{results['info']['pieces']} pieces in {results['info']['replies'] + 1} replies; load average before {load[:3]}, after {load[3:]}"
    )
    assert results["streaming"]["n"] >= 10, "too few keys landed while the reply streamed"
