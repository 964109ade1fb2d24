"""The chat driven by Textual's Pilot against a real ``strata serve`` on the tiny model.

One server for the module (started the way ``strata chat`` starts it); every test has its own
conversation database.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from textual import events
from textual.pilot import Pilot

from strata_tui.app import StrataChat
from strata_tui.server_process import ServerProcess
from strata_tui.store import Store
from strata_tui.widgets import ConnectionBanner, ConversationList, MessageView

pytestmark = pytest.mark.timeout(300)

SIZE = (120, 36)


# The tiny model writes thousands of tokens a second and reads a 3,000-token prompt in well under a
# second: the tests that strike while a request is in flight (Esc while the prompt is read or the reply
# written, the engine killed) use the small model (``small_server``), where both last seconds.
SERVER_ARGS = ["--threads", "2"]


def long_prompt(tag: str, repeat: int) -> str:
    """About 22 tokens per repeat (15 with the small model's vocabulary); the tag makes it unlike any
    earlier prompt (no reuse of a cached prefix)."""
    return f"{tag}. " + "The quick brown fox jumps over the lazy dog. " * repeat


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess(None, SERVER_ARGS)
    proc.start(timeout=240)
    yield proc
    proc.stop()


async def wait_for(
    pilot: Pilot[None], cond: Callable[[], bool], what: str, timeout: float = 60.0, settle: bool = True
) -> None:
    """Wait until ``cond()`` holds; then (``settle``) until the app is idle, which takes up to a second
    while a reply streams."""
    loop = asyncio.get_running_loop()
    t_end = loop.time() + timeout
    while not cond():
        if loop.time() > t_end:
            raise AssertionError(f"timed out waiting for: {what}")
        if settle:
            await pilot.pause(0.05)
        else:
            await asyncio.sleep(0.05)  # Pilot.pause first waits for every widget's queue: long mid-stream
    if settle:
        await pilot.pause()


def views(app: StrataChat, role: str | None = None) -> list[MessageView]:
    assert app.chat is not None
    return [v for v in app.chat.log_view.messages() if role is None or v.role == role]


async def ready(pilot: Pilot[None], app: StrataChat) -> None:
    await wait_for(
        pilot, lambda: app.chat is not None and app.chat.connected and app.chat.conv is not None, "connected"
    )


async def type_and_send(pilot: Pilot[None], app: StrataChat, text: str) -> None:
    assert app.chat is not None
    app.chat.input.load_text(text)
    await pilot.press("enter")


async def setup_greedy(pilot: Pilot[None], app: StrataChat, max_tokens: int) -> None:
    await type_and_send(pilot, app, "/temp 0")
    await type_and_send(pilot, app, f"/max-tokens {max_tokens}")
    await pilot.pause()
    assert app.chat is not None and app.chat.conv is not None
    assert (app.chat.conv.settings.temperature, app.chat.conv.settings.max_tokens) == (0.0, max_tokens)


async def send_and_wait(pilot: Pilot[None], app: StrataChat, text: str) -> MessageView:
    n = len(views(app, "assistant"))
    await type_and_send(pilot, app, text)
    await wait_for(
        pilot,
        lambda: app.chat is not None and app.chat.reply is None and len(views(app, "assistant")) > n,
        "the reply",
    )
    return views(app, "assistant")[-1]


def status(url: str) -> dict:
    return httpx.get(f"{url}/v1/status", timeout=10).json()


def completion(url: str, messages: list[dict], max_tokens: int) -> str:
    r = httpx.post(
        f"{url}/v1/chat/completions",
        timeout=120,
        json={
            "model": "x",
            "messages": messages,
            "temperature": 0,
            "max_tokens": max_tokens,
            "chat_template_kwargs": {"enable_thinking": True},
        },
    )
    r.raise_for_status()
    msg = r.json()["choices"][0]["message"]
    return msg.get("content") or ""


def test_send_streams_the_servers_reply(server: ServerProcess, tmp_path: Path) -> None:
    async def run() -> None:
        app = StrataChat(server_url=server.url, db_path=tmp_path / "c.sqlite3")
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            assert app.chat is not None and app.chat.is_strata  # x-strata-server seen: engine panel shown
            assert app.chat.engine.display
            await setup_greedy(pilot, app, 24)
            reply = await send_and_wait(pilot, app, "Tell me about experts.")
            # the reply arrived in several pieces, and it is what the server answers without streaming
            assert reply.pieces > 1
            expected = completion(server.url, [{"role": "user", "content": "Tell me about experts."}], 24)
            assert reply.content.strip() == expected.strip()
            assert "tokens" in reply.footer_text
            assert views(app, "user")[0].content == "Tell me about experts."
            await pilot.press("f5")  # copy the reply (OSC 52 in a terminal; kept by the app here)
            assert app.clipboard == reply.content

    asyncio.run(run())


@pytest.fixture(scope="module")
def small_server() -> Iterator[ServerProcess]:
    """The small preset writes a few hundred tokens a second here: a long reply lasts seconds, so Esc
    lands while it is being written (made once into the cache folder, about 10 s)."""
    from strata.model import ensure_model

    proc = ServerProcess(ensure_model("small"), ["--threads", "2"])
    proc.start(timeout=240)
    yield proc
    proc.stop()


def test_cancel_while_the_prompt_is_read(small_server: ServerProcess, tmp_path: Path) -> None:
    url = small_server.url
    assert url is not None

    async def run() -> None:
        app = StrataChat(server_url=url, db_path=tmp_path / "c.sqlite3")
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await setup_greedy(pilot, app, 8)
            # about 3,800 tokens (the server holds 4,096): two seconds and more of reading for the small model
            await type_and_send(pilot, app, long_prompt("cancel test", 250))
            # the engine panel follows the prompt being read (all seen at one moment: no settling)
            await wait_for(
                pilot,
                lambda: (
                    app.chat.engine.state == "reading"
                    and app.chat.reply is not None
                    and "reading the prompt" in app.chat.reply.view.footer_text
                    and app.chat.query_one("#prompt-bar").display
                ),
                "reading",
                settle=False,
            )
            total = (app.chat.engine.status.get("prompt") or {}).get("total", 0)
            assert total > 3500
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.chat.reply is None, "the reply to end")
            assert views(app, "assistant") == []  # nothing arrived, nothing kept
            assert views(app, "user")[-1].footer_text == "cancelled before the reply started"
            # the server stopped: it went back to idle without writing the 8 tokens
            await wait_for(pilot, lambda: status(url)["state"] == "idle", "server idle", timeout=30)
            last = status(url)["last_request"]
            assert last["timings"]["predicted_n"] < 8
            # and the chat is ready for the next message
            reply = await send_and_wait(pilot, app, "Are you still there?")
            assert reply.content and reply.footer_text != "cancelled"

    asyncio.run(run())


def test_cancel_while_the_reply_is_written(small_server: ServerProcess, tmp_path: Path) -> None:
    url = small_server.url
    assert url is not None
    max_tokens = 4000  # several seconds of writing even on a quiet machine: only Esc ends it early
    db = tmp_path / "c.sqlite3"

    async def run() -> int | None:
        app = StrataChat(server_url=url, db_path=db)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await setup_greedy(pilot, app, max_tokens)
            await type_and_send(pilot, app, "Tell me a long story.")
            # the reply is on the screen and still growing, and the panel says the engine is writing it;
            # Esc at once (no settling: the app is never idle while a reply streams)
            await wait_for(
                pilot,
                lambda: (
                    app.chat.reply is not None
                    and len(app.chat.reply.view.content) > 20
                    and app.chat.engine.state == "generating"
                ),
                "the first words",
                settle=False,
            )
            shown = app.chat.reply.view.content
            received = app.chat.reply.n_pieces  # tokens that reached the chat before Esc
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.chat.reply is None, "the reply to end")
            reply = views(app, "assistant")[-1]
            # what arrived is kept, marked as cancelled
            assert reply.footer_text == "cancelled"
            assert reply.content.startswith(shown)
            # the server stopped writing: idle again, far short of max_tokens, and it says it was cancelled
            await wait_for(pilot, lambda: status(url)["state"] == "idle", "server idle", timeout=30)
            last = status(url)["last_request"]
            assert last["strata"]["engine_finish_reason"] == "cancelled"
            # it stopped soon after Esc (within a few hundred tokens, a fraction of a second), far short
            assert received <= last["timings"]["predicted_n"] < min(received + 400, max_tokens // 2)
            # the message box still takes keys, and the next message is answered in full
            app.chat.input.focus()
            await pilot.press(*"/max-tokens 12", "enter")
            await pilot.pause()
            assert app.chat.conv.settings.max_tokens == 12 and app.chat.input.text == ""
            nxt = await send_and_wait(pilot, app, "Are you still there?")
            assert nxt.content and nxt.footer_text.startswith("12 tokens")
            assert "stopped at max tokens" in nxt.footer_text
            assert status(url)["last_request"]["timings"]["predicted_n"] == 12
            return app.chat.conv.id

    conv_id = asyncio.run(run())
    assert conv_id is not None
    # the cancelled reply was saved as cancelled, and the conversation goes on after it
    s = Store(db)
    msgs = s.messages(conv_id)
    s.close()
    assert [m.role for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert msgs[1].meta.get("cancelled") is True and msgs[1].content
    assert not msgs[3].meta.get("cancelled")


def test_typing_while_a_reply_streams(small_server: ServerProcess, tmp_path: Path) -> None:
    url = small_server.url
    assert url is not None
    typed = "what about the second part of it"

    async def run() -> None:
        app = StrataChat(server_url=url, db_path=tmp_path / "c.sqlite3")
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await setup_greedy(pilot, app, 4000)
            await type_and_send(pilot, app, "Tell me a long story.")
            await wait_for(
                pilot,
                lambda: app.chat.reply is not None and app.chat.reply.view.content,
                "the first words",
                settle=False,
            )
            # keys come one at a time while the reply streams: each lands in the box in its order, and what
            # the reply showed stays as more words are added
            assert app.chat.reply is not None
            shown = [app.chat.reply.view.content]
            for i, ch in enumerate(typed):
                app.post_message(events.Key(ch, ch))
                await wait_for(
                    pilot,
                    lambda n=i + 1: app.chat.input.text == typed[:n],
                    f"key {i + 1} in the box",
                    settle=False,
                )
                assert app.chat.reply is not None, "the reply ended while the keys came"
                shown.append(app.chat.reply.view.content)
            for before, after in zip(shown, shown[1:], strict=False):
                assert after.startswith(before)
            # the stream goes on after the typing: words after the last key, the typed text untouched
            last = shown[-1]
            await wait_for(
                pilot,
                lambda: app.chat.reply is not None and len(app.chat.reply.view.content) > len(last),
                "more words after the last key",
                settle=False,
            )
            assert app.chat.reply.view.content.startswith(last) and app.chat.input.text == typed
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.chat.reply is None, "the reply to end")
            assert app.chat.input.text == typed  # the cancel leaves the text being written alone
            # full collections were held back while the reply streamed and the keys came
            assert app.collector.active

    gc_settings = gc.get_threshold()
    asyncio.run(run())
    assert gc.get_threshold() == gc_settings and gc.get_freeze_count() == 0  # given back on exit


def test_regenerate_replaces_the_reply(server: ServerProcess, tmp_path: Path) -> None:
    async def run() -> None:
        db = tmp_path / "c.sqlite3"
        app = StrataChat(server_url=server.url, db_path=db)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await setup_greedy(pilot, app, 16)
            first = await send_and_wait(pilot, app, "Hello there")
            first_text = first.content
            first_id = first.message_id
            await pilot.press("ctrl+r")
            await wait_for(
                pilot,
                lambda: (
                    app.chat.reply is None
                    and views(app, "assistant")
                    and views(app, "assistant")[-1].message_id not in (None, first_id)
                ),
                "regenerated reply",
            )
            # one reply, not two; greedy decoding gives the same text again; the database agrees
            assert [v.role for v in views(app)] == ["user", "assistant"]
            assert views(app, "assistant")[0].content == first_text
            conv_id = app.chat.conv.id
        s = Store(db)
        assert [m.role for m in s.messages(conv_id)] == ["user", "assistant"]
        assert s.messages(conv_id)[1].id != first_id
        s.close()

    asyncio.run(run())


def test_edit_and_resend(server: ServerProcess, tmp_path: Path) -> None:
    async def run() -> None:
        app = StrataChat(server_url=server.url, db_path=tmp_path / "c.sqlite3")
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await setup_greedy(pilot, app, 8)
            await send_and_wait(pilot, app, "first version")
            await pilot.press("ctrl+l")
            await pilot.pause()
            assert views(app) == [] and app.chat.input.text == "first version"
            app.chat.input.load_text("second version")
            await pilot.press("enter")
            await wait_for(
                pilot, lambda: app.chat.reply is None and len(views(app, "assistant")) == 1, "reply"
            )
            assert [v.content for v in views(app, "user")] == ["second version"]

    asyncio.run(run())


def test_new_conversation_persistence_and_export(server: ServerProcess, tmp_path: Path) -> None:
    db = tmp_path / "c.sqlite3"
    saved: dict[str, str] = {}

    async def first_run() -> None:
        app = StrataChat(server_url=server.url, db_path=db)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await setup_greedy(pilot, app, 12)
            reply = await send_and_wait(pilot, app, "Remember this conversation")
            saved["reply"] = reply.content
            await pilot.press("ctrl+n")
            await wait_for(
                pilot, lambda: views(app) == [] and app.chat.conv.title == "New conversation", "new conv"
            )
            sidebar = app.chat.query_one("#sidebar", ConversationList)
            await wait_for(pilot, lambda: len(sidebar.titles()) == 2, "two conversations listed")
            assert "Remember this conversation" in sidebar.titles()

    async def second_run() -> None:
        app = StrataChat(server_url=server.url, db_path=db)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            sidebar = app.chat.query_one("#sidebar", ConversationList)
            await wait_for(pilot, lambda: "Remember this conversation" in sidebar.titles(), "restored list")
            # open it from the sidebar
            sidebar.query_one("#conversations").focus()
            titles = sidebar.titles()
            for _ in range(titles.index("Remember this conversation")):
                await pilot.press("down")
            await pilot.press("enter")
            await wait_for(pilot, lambda: len(views(app)) == 2, "restored messages")
            assert [v.content for v in views(app)] == ["Remember this conversation", saved["reply"]]
            out = tmp_path / "out.md"
            await type_and_send(pilot, app, f"/export {out}")
            await wait_for(pilot, lambda: out.exists(), "the export")
            md = out.read_text()
            assert md.startswith("# Remember this conversation")
            assert "## You\n\nRemember this conversation" in md and saved["reply"].strip() in md

    asyncio.run(first_run())
    asyncio.run(second_run())


def test_engine_restart_is_shown_and_recovered(small_server: ServerProcess, tmp_path: Path) -> None:
    server = small_server  # its prompt reading lasts long enough to strike during it

    async def run() -> None:
        app = StrataChat(server_url=server.url, db_path=tmp_path / "c.sqlite3")
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot, app)
            await setup_greedy(pilot, app, 8)
            restarts = status(server.url)["engine"]["restarts"]
            text = long_prompt("crash test", 250)
            await type_and_send(pilot, app, text)
            # strike while the request is in flight: the server's own status is the ground truth (the
            # panel polls it and, on a loaded machine, can miss a short reading window)
            await wait_for(
                pilot,
                lambda: status(server.url)["state"] in ("reading", "generating"),
                "reading",
                settle=False,
            )
            pid = status(server.url)["engine"]["pid"]
            assert pid
            os.kill(pid, signal.SIGKILL)
            await wait_for(pilot, lambda: views(app, "error"), "the error in the conversation")
            err = views(app, "error")[0].content
            assert "stopped unexpectedly" in err and "restarts with your next message" in err
            assert app.chat.input.text == text  # the input is given back
            # the panel shows the restart
            await wait_for(
                pilot,
                lambda: (app.chat.engine.status.get("engine") or {}).get("restarts", 0) > restarts,
                "restart counted",
            )
            # and the next message is answered
            app.chat.input.clear()
            reply = await send_and_wait(pilot, app, "Hello again")
            assert reply.content and reply.footer_text != "cancelled"

    asyncio.run(run())


def test_unreachable_server_is_retried_until_it_answers(tmp_path: Path) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    proc = ServerProcess(None, SERVER_ARGS, port=port)

    async def run() -> None:
        app = StrataChat(server_url=f"http://127.0.0.1:{port}", db_path=tmp_path / "c.sqlite3")
        async with app.run_test(size=SIZE) as pilot:
            banner = app.chat.query_one("#banner", ConnectionBanner)
            await wait_for(
                pilot, lambda: banner.display and "retrying in" in str(banner.render()), "the countdown"
            )
            await asyncio.to_thread(proc.start, None, 240)
            await wait_for(pilot, lambda: app.chat.connected and not banner.display, "connected", timeout=60)
            assert app.chat.is_strata and app.chat.engine.display

    try:
        asyncio.run(run())
    finally:
        proc.stop()


def test_chat_starts_and_stops_its_own_server(tmp_path: Path) -> None:
    proc = ServerProcess(None, SERVER_ARGS)

    async def run() -> None:
        app = StrataChat(server_process=proc, db_path=tmp_path / "c.sqlite3")
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(
                pilot, lambda: app.chat is not None and app.chat.connected, "own server", timeout=240
            )
            assert proc.url and proc.url.startswith("http://127.0.0.1:")
            # the built-in model writes noise: the chat says so at once
            await wait_for(
                pilot,
                lambda: any("built-in test model" in v.content for v in views(app, "note")),
                "the note about the built-in model",
            )
            await setup_greedy(pilot, app, 4)
            reply = await send_and_wait(pilot, app, "hi")
            assert reply.content or reply.reasoning

    try:
        asyncio.run(run())
    finally:
        proc.stop()
    assert proc.exited() is not None


def test_a_settings_toast_leaves_no_text_behind_after_the_log_scrolled(
    server: ServerProcess, tmp_path: Path
) -> None:
    """The toast that confirms a setting, then a scroll of the log, then the toast expires: the terminal
    (the app's updates replayed, tests/_terminal.py) shows what the screen shows where it was."""
    from _terminal import now_drawn, record
    from textual.widgets._toast import Toast

    async def run() -> None:
        app = StrataChat(server_url=server.url, db_path=tmp_path / "c.sqlite3")
        app.NOTIFICATION_TIMEOUT = 1.5
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await ready(pilot, app)
            await setup_greedy(pilot, app, 300)
            await send_and_wait(pilot, app, "Tell me a long story.")
            log = app.chat.log_view
            await log.add(MessageView("note", "\n\n".join(f"line {i}" for i in range(30))))  # a full log
            await pilot.pause(0.2)
            assert log.scroll_y == log.max_scroll_y > 5
            await wait_for(pilot, lambda: not app.screen.query(Toast), "the earlier toasts to go")
            terminal = record(app)
            app.screen.refresh()  # one full paint, then only updates
            await pilot.pause(0.2)
            await type_and_send(pilot, app, "/max-tokens 3000")
            await wait_for(pilot, lambda: bool(app.screen.query(Toast)), "the toast")
            region = app.screen.query_one(Toast).region
            assert "max 3000" in "".join(terminal.text(region))
            log.scroll_to(y=log.max_scroll_y - 5, animate=False)  # the reader scrolls up a little
            await wait_for(pilot, lambda: not app.screen.query(Toast), "the toast to expire")
            await pilot.pause(0.3)
            assert terminal.text(region) == now_drawn(app).text(region)
            assert "max 3000" not in "".join(terminal.text(region))

    asyncio.run(run())
