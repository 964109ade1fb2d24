"""The main screen: conversations on the left, the chat in the middle, the engine on the right.

Every call that can block (HTTP, SQLite, starting the server) runs in a named worker group; workers
report back with messages (``strata_tui.messages``) and only the handlers here change widgets. A
failing worker always posts a message that leaves the screen usable again: the reply state is
cleared, the user's text is back in the input, and the error is shown where it happened.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from textual import events, on, work
from textual.app import ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.timer import Timer
from textual.widgets import Footer, Header, ListView, Static

from .._compositor import RepaintingScreen
from .._gc import QUIET_S
from .._text import printable
from ..client import ApiError, Delta, Finished, Unreachable, friendly_error
from ..commands import SCREEN_KEYS, parse_slash
from ..messages import (
    ConversationLoaded,
    ConversationsListed,
    EngineStatus,
    Exported,
    ReplyDelta,
    ReplyEnded,
    ReplyFailed,
    ServerConnected,
    ServerDown,
    ServerStarting,
    WorkFailed,
)
from ..server_process import ServerStartError
from ..store import Conversation, Settings, StoredMessage, export_dir, to_markdown
from ..widgets import ChatInput, ChatLog, ConnectionBanner, ConversationList, EnginePanel, MessageView
from .confirm import ConfirmScreen
from .help import HelpScreen
from .prompt import PromptScreen
from .settings import SettingsResult, SettingsScreen, parse_optional

if TYPE_CHECKING:
    from ..connection import ChatContext

__all__ = ["ChatScreen"]

_NEW_TITLE = "New conversation"
_BUSY_STATES = ("loading", "reading", "generating", "restarting")
# Streamed text is drawn at most this often: every draw of a growing reply lays out and repaints the
# conversation (tens of milliseconds on a busy machine), and at one draw per token a fast model would
# keep the event loop busy enough to delay the keys the user types. Batches of ~80 ms still read as a
# smooth stream. While the user types (a key in the last _QUIET_S), draws are not timed by the clock,
# where they would land on a key at random, but follow the keys: each key is shown first, and right
# after its frame (every _TYPING_DRAW_INTERVAL_S at most) the text that arrived is drawn, at most
# _TYPING_DRAW_CHARS of it, so that the draw is over before the next key comes. The engine panel's
# updates wait for the same moment.
_DRAW_INTERVAL_S = 0.08
_QUIET_S = 0.15
_TYPING_DRAW_INTERVAL_S = 1.0
_TYPING_DRAW_CHARS = 2000
_BUILTIN_MODEL_NOTE = (
    "This is strata's built-in test model (tiny, random weights): it answers with nonsense, very fast. "
    "It is here to try the chat and the engine panel. For real answers: strata chat --model FILE.gguf "
    "(a qwen3moe GGUF), or strata chat --server URL for a server that is already running."
)
# below these widths (columns) the sidebar (28) and the engine panel (34) hide themselves
SIDEBAR_MIN_WIDTH = 90
ENGINE_MIN_WIDTH = 110
_POST_INTERVAL_S = 0.03  # how often the reply worker hands what arrived to the screen


class _Pending:
    """Pieces of a reply received by the worker and not yet posted to the screen.

    A fast model sends thousands of pieces a second; one message each would keep the event loop
    busy with bookkeeping, so the worker posts what arrived every _POST_INTERVAL_S instead.
    """

    def __init__(self) -> None:
        self.delta = Delta()
        self.n = 0
        self.total = 0

    def add(self, d: Delta) -> None:
        self.delta.content += d.content
        self.delta.reasoning += d.reasoning
        self.n += 1
        self.total += 1

    def post(self, screen: ChatScreen, rid: int) -> None:
        if self.n:
            screen.post_message(ReplyDelta(rid, self.delta, self.n))
            self.delta, self.n = Delta(), 0


class _Reply:
    """The reply in flight."""

    def __init__(
        self, rid: int, view: MessageView, user: StoredMessage | None, user_view: MessageView | None
    ) -> None:
        self.rid = rid
        self.view = view
        self.user = user
        self.user_view = user_view
        self.t0 = time.perf_counter()
        self.t_first: float | None = None
        self.n_pieces = 0
        self.pending = Delta()  # text received but not drawn yet (drawn in batches, see _flush)
        self.flush_timer: Timer | None = None
        self.last_draw = time.monotonic()


class ChatScreen(RepaintingScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        *(
            Binding(k, a, label, tooltip=d, show=k in ("escape", "ctrl+n", "ctrl+r", "f3", "f1"))
            for k, a, label, d in SCREEN_KEYS
        ),
        # before the focused widget sees them: the message box (a TextArea) would take them as cursor moves
        Binding("pageup", "page_log(-1)", "Scroll up", show=False, priority=True),
        Binding("pagedown", "page_log(1)", "Scroll down", show=False, priority=True),
    ]

    def __init__(self, ctx: ChatContext) -> None:
        super().__init__()
        self.ctx = ctx  # what the app hands this screen: connection, store, keys, collector
        self.conv: Conversation | None = None
        self.history: list[StoredMessage] = []
        self.reply: _Reply | None = None
        self._rid = 0
        self.connected = False
        self.is_strata = False
        self.models: list[str] = []
        self._status_state = ""
        # set when a request starts, so the engine panel polls at once instead of after its idle pause
        self._status_wake = asyncio.Event()
        self._held_status: dict[str, Any] | None = None
        self._told_builtin = False
        self._panels_fit: tuple[bool, bool] | None = None  # (sidebar, engine panel) fit the width

    # ---- layout -------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header(icon="≡")
        with Horizontal(id="main"):
            yield ConversationList(id="sidebar")
            with Vertical(id="chat"):
                yield Static("", id="conv-title", markup=False)
                yield ChatLog(id="log")
                yield ConnectionBanner(id="banner")
                yield ChatInput(id="input", newline_keys=self.ctx.newline_keys)
                yield Static(self._hint(), id="hint")
            yield EnginePanel(id="engine")
        yield Footer()

    def _hint(self) -> str:
        nl = self.ctx.newline_keys[0] if self.ctx.newline_keys else "ctrl+j"
        return f"Enter send · {nl} newline · Esc cancel · /help"

    def on_mount(self) -> None:
        self.title = "strata chat"
        self.sub_title = "connecting…"
        self._fit_panels(self.app.size.width)  # the engine panel shows while this chat's server starts
        self.query_one("#input", ChatInput).focus()
        self._connect()
        self._startup_conversation()
        # The screen's timer, not the app's: Textual stops a screen's timers before it removes the
        # screen's widgets, so the check never looks for an input that is gone. An app interval kept
        # firing while the app took the screen down at exit and found no #input (NoMatches), which
        # two busy cores made likely enough to fail a test.
        self.set_interval(QUIET_S / 2, self._collect_when_quiet)

    def on_resize(self, event: events.Resize) -> None:
        self._fit_panels(event.size.width)

    def _fit_panels(self, width: int) -> None:
        """Show the sidebar and the engine panel only where the conversation keeps room to read (at
        80 columns both side panels would leave it 16). A panel is shown or hidden only when the width
        crosses its threshold, so Ctrl+B and Ctrl+G still decide in between."""
        fits = (width >= SIDEBAR_MIN_WIDTH, width >= ENGINE_MIN_WIDTH)
        if fits == self._panels_fit:
            return
        self._panels_fit = fits
        self.query_one("#sidebar", ConversationList).display = fits[0]
        engine_wanted = self.is_strata or (not self.connected and self.ctx.connection.runs_server)
        self.engine.display = engine_wanted and fits[1]

    def _collect_when_quiet(self) -> None:
        """A full collection when one is due, with no reply streaming and no key for QUIET_S (_gc)."""
        if self.reply is None and time.monotonic() - self.input.last_key_at >= QUIET_S:
            self.ctx.collector.collect_if_due()

    @property
    def input(self) -> ChatInput:
        return self.query_one("#input", ChatInput)

    @property
    def log_view(self) -> ChatLog:
        return self.query_one("#log", ChatLog)

    @property
    def engine(self) -> EnginePanel:
        return self.query_one("#engine", EnginePanel)

    # ---- server: start, connect, poll ---------------------------------------------------------

    @work(group="server", exclusive=True)
    async def _connect(self) -> None:
        conn = self.ctx.connection
        if conn.needs_start():
            self.post_message(ServerStarting("starting strata serve…"))
            try:

                def on_line(line: str) -> None:
                    self.post_message(ServerStarting(line))

                await conn.start(on_line)
            except ServerStartError as e:
                self.post_message(ServerDown(str(e), None))
                return
            except Exception as e:  # the model maker or the spawn failed: say so, keep the UI usable
                self.post_message(ServerDown(f"could not start the server: {type(e).__name__}: {e}", None))
                return
        delay = 1.0
        while True:
            code = conn.server_exit()
            if code is not None:
                self.post_message(
                    ServerDown(f"strata serve stopped (exit code {code}):\n{conn.server_log()}", None)
                )
                return
            client = conn.client
            assert client is not None
            try:
                info = await client.probe()
            except (Unreachable, ApiError) as e:
                if isinstance(e, ApiError) and e.code == "invalid_api_key":
                    self.post_message(ServerDown(friendly_error(e), None))
                    return
                self.post_message(ServerDown(friendly_error(e), delay))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            self.post_message(ServerConnected(client.base_url, info))
            return

    @work(group="status", exclusive=True)
    async def _poll_status(self) -> None:
        client = self.ctx.connection.client
        assert client is not None
        while True:
            try:
                status = await client.status()
            except Unreachable as e:
                if self.reply is None:
                    self.post_message(ServerDown(friendly_error(e), 1.0))
                    return
                await asyncio.sleep(0.5)
                continue
            except ApiError:
                await asyncio.sleep(2.0)
                continue
            self.post_message(EngineStatus(status))
            busy = self.reply is not None or status.get("state") in _BUSY_STATES
            try:
                await asyncio.wait_for(self._status_wake.wait(), 0.25 if busy else 1.0)
            except asyncio.TimeoutError:
                pass
            self._status_wake.clear()

    def on_server_starting(self, msg: ServerStarting) -> None:
        self.engine.set_starting(msg.detail[:96])
        self.sub_title = "starting the server…"

    def on_server_connected(self, msg: ServerConnected) -> None:
        self.connected = True
        self.is_strata = msg.info.is_strata
        self.models = msg.info.models
        if not self.ctx.connection.model_name and msg.info.models:
            self.ctx.connection.model_name = msg.info.models[0]
        self.query_one("#banner", ConnectionBanner).clear()
        kind = "strata" if self.is_strata else "OpenAI-compatible server"
        self.sub_title = f"{self.ctx.connection.model_name or 'no model'} · {kind}"
        self.engine.display = self.is_strata and self._panels_fit is not None and self._panels_fit[1]
        if self.is_strata:
            self._poll_status()
        if self.ctx.connection.made_default and not self._told_builtin:
            # its replies are noise: say so before someone wonders what is broken
            self._told_builtin = True
            self.run_worker(self._note("note", _BUILTIN_MODEL_NOTE), group="ui")

    def on_server_down(self, msg: ServerDown) -> None:
        self.connected = False
        self.query_one("#banner", ConnectionBanner).show_down(msg.error.splitlines()[0], msg.retry_in)
        self.engine.set_unreachable()
        self.sub_title = "server unreachable"
        if msg.retry_in is None:
            # no retry coming: put the whole story in the conversation
            self.run_worker(self._note("error", msg.error), group="ui")
        elif self.ctx.connection.client is not None and not self._worker_running("server"):
            self._connect()

    def on_engine_status(self, msg: EngineStatus) -> None:
        if self._typing() is not None and self.reply is not None:
            self._held_status = msg.status  # shown after the next key's frame (see after_key)
            return
        self._held_status = None
        self._show_status(msg.status)

    def _show_status(self, status: dict[str, Any]) -> None:
        self._status_state = str(status.get("state") or "")
        self.engine.set_status(status)
        if self.reply is not None and not self.reply.view.content and not self.reply.view.reasoning:
            p = status.get("prompt") or {}
            if self._status_state == "reading" and p.get("total"):
                self.reply.view.set_footer(
                    f"reading the prompt: {p.get('done', 0):,} / {p['total']:,} tokens"
                )
                self.log_view.follow()
            elif self._status_state == "restarting":
                self.reply.view.set_footer("the engine is restarting…")

    def _worker_running(self, group: str) -> bool:
        return any(w.group == group and w.is_running for w in self.workers)

    # ---- conversations ------------------------------------------------------------------------

    @work(group="db-open", exclusive=True)
    async def _startup_conversation(self) -> None:
        store = self.ctx.store
        try:
            convs = await self.ctx.run_db(store.list)
            conv = None
            if (
                convs
                and convs[0].title == _NEW_TITLE
                and not await self.ctx.run_db(store.messages, convs[0].id)
            ):
                conv = convs[0]
            if conv is None:
                conv = await self.ctx.run_db(store.create, _NEW_TITLE)
                convs = await self.ctx.run_db(store.list)
        except Exception as e:
            self.post_message(WorkFailed(f"could not open the conversation database {store.path}: {e}"))
            return
        self.post_message(ConversationLoaded(conv, []))
        self.post_message(ConversationsListed(convs, conv.id))

    @work(group="db-list", exclusive=True)
    async def _list(self, select: int | None = None) -> None:
        sidebar = self.query_one("#sidebar", ConversationList)
        try:
            convs = await self.ctx.run_db(self.ctx.store.list, sidebar.search_text)
        except Exception as e:
            self.post_message(WorkFailed(f"could not list conversations: {e}"))
            return
        self.post_message(ConversationsListed(convs, select))

    @work(group="db-open", exclusive=True)
    async def _open(self, conversation_id: int) -> None:
        store = self.ctx.store
        try:
            conv = await self.ctx.run_db(store.get, conversation_id)
            msgs = await self.ctx.run_db(store.messages, conversation_id) if conv else []
        except Exception as e:
            self.post_message(WorkFailed(f"could not open the conversation: {e}"))
            return
        if conv is None:
            self.post_message(WorkFailed("that conversation no longer exists"))
            self._list()
            return
        self.post_message(ConversationLoaded(conv, msgs))

    @work(group="db-open", exclusive=True)
    async def _new(self, title: str = _NEW_TITLE) -> None:
        try:
            conv = await self.ctx.run_db(self.ctx.store.create, title)
        except Exception as e:
            self.post_message(WorkFailed(f"could not create a conversation: {e}"))
            return
        self.post_message(ConversationLoaded(conv, []))
        self._list(conv.id)

    @work(group="db", exclusive=False)
    async def _db(self, fn: Any, *args: Any, then_list: bool = False) -> None:
        try:
            await self.ctx.run_db(fn, *args)
        except Exception as e:
            self.post_message(WorkFailed(f"could not save: {e}"))
            return
        if then_list:
            self._list(self.conv.id if self.conv else None)

    async def on_conversations_listed(self, msg: ConversationsListed) -> None:
        select = msg.select if msg.select is not None else (self.conv.id if self.conv else None)
        await self.query_one("#sidebar", ConversationList).show(msg.conversations, select)

    async def on_conversation_loaded(self, msg: ConversationLoaded) -> None:
        self.conv = msg.conversation
        self.history = list(msg.messages)
        log = self.log_view
        await log.remove_children()
        views = [
            MessageView(m.role, m.content, m.reasoning, message_id=m.id, footer=_footer_for(m), stored=m)
            for m in msg.messages
        ]
        if views:
            await log.mount_all(views)
        # a conversation opens at its end and follows it, whatever was scrolled in the one before (the
        # released anchor of a log that never stopped overflowing, or never overflowed, stayed released)
        log.sticky = True
        log.scroll_end(animate=False)
        self._show_conv_title()
        last = next((m for m in reversed(msg.messages) if m.role == "assistant"), None)
        self.engine.set_live(
            context_used=_context_used(msg.messages), ttft_s=_ttft(last.meta) if last else None
        )

    def _show_conv_title(self) -> None:
        if self.conv is None:
            return
        sys = " · system prompt set" if self.conv.system_prompt else ""
        self.query_one("#conv-title", Static).update(
            printable(f"{self.conv.title} — {self.conv.settings.describe()}{sys}")
        )

    @on(ConversationList.Picked)
    def _picked(self, msg: ConversationList.Picked) -> None:
        if self.reply is not None:
            self.notify("A reply is streaming: Esc cancels it first.", severity="warning")
            return
        if self.conv is None or msg.conversation_id != self.conv.id:
            self._open(msg.conversation_id)
        self.input.focus()

    @on(ConversationList.SearchChanged)
    def _search(self, msg: ConversationList.SearchChanged) -> None:
        self._list()

    # ---- sending and streaming ----------------------------------------------------------------

    @on(ChatInput.Submitted)
    async def _submitted(self, msg: ChatInput.Submitted) -> None:
        text = msg.text
        if not text.strip():
            return
        # the box was emptied when Enter was pressed (keys typed since then are in it now)
        cmd = parse_slash(text)
        if cmd is not None:
            self.input.last_sent = text
            await self.run_slash(*cmd)
            return
        if self.reply is not None:
            self.input.give_back(text)
            self.notify(
                "A reply is still streaming: Esc cancels it. Your message stays in the box.",
                severity="warning",
            )
            return
        if self.conv is None or self.ctx.connection.client is None:
            self.input.give_back(text)
            self.notify("Not connected yet: your message stays in the box.", severity="warning")
            return
        self.input.last_sent = text
        user = StoredMessage("user", text)
        self.history.append(user)
        user_view = MessageView("user", text, stored=user)
        await self.log_view.add(user_view)
        if self.conv.title == _NEW_TITLE:
            title = _title_from(text)
            self.conv.title = title
            self.query_one("#sidebar", ConversationList).set_title(self.conv.id, title)
            self._show_conv_title()
            self._db(self.ctx.store.rename, self.conv.id, title)
        await self._start_reply(user, user_view)

    async def _start_reply(
        self, user: StoredMessage | None, user_view: MessageView | None, drop_from: int | None = None
    ) -> None:
        assert self.conv is not None
        self._rid += 1
        view = MessageView("assistant", streaming=True, footer="waiting for the server…")
        self.reply = _Reply(self._rid, view, user, user_view)
        self._status_wake.set()
        await self.log_view.add(view)
        self.engine.set_live(tps=0.0)
        self._stream_reply(self._rid, self.conv, user, drop_from)

    @work(group="reply", exclusive=True)
    async def _stream_reply(
        self, rid: int, conv: Conversation, user: StoredMessage | None, drop_from: int | None
    ) -> None:
        ctx = self.ctx
        store = ctx.store
        content, reasoning = "", ""
        fin: Finished | None = None
        pending = _Pending()
        try:
            if drop_from is not None:
                await ctx.run_db(store.delete_messages_from, conv.id, drop_from)
            if user is not None and user.id is None:
                user.id = (await ctx.run_db(store.add_message, conv.id, user)).id
            messages = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
            messages += [
                {"role": m.role, "content": m.content}
                for m in self.history
                if m.role in ("user", "assistant")
            ]
            client = ctx.connection.client
            if client is None:
                raise Unreachable("the server has not started yet")
            ticker = asyncio.create_task(self._post_pending_every(rid, pending))
            try:
                async for ev in client.stream_chat(
                    messages,
                    model=ctx.connection.model_name or "default",
                    params=conv.settings.request_params(),
                ):
                    if isinstance(ev, Delta):
                        content += ev.content
                        reasoning += ev.reasoning
                        pending.add(ev)
                        if pending.total == 1:
                            pending.post(self, rid)  # the first words go out at once
                    else:
                        fin = ev
            finally:
                ticker.cancel()
                pending.post(self, rid)
            stored = await ctx.run_db(
                store.add_message, conv.id, StoredMessage("assistant", content, reasoning, meta=_meta(fin))
            )
            self.post_message(ReplyEnded(rid, fin, stored))
        except asyncio.CancelledError:
            # Esc: the stream is closed (the server stops); keep what arrived
            stored = None
            if content or reasoning:
                msg = StoredMessage("assistant", content, reasoning, meta={"cancelled": True})
                try:
                    stored = await asyncio.shield(ctx.run_db(store.add_message, conv.id, msg))
                except Exception:
                    stored = msg
            self.post_message(ReplyEnded(rid, None, stored, cancelled=True))
            raise
        except Exception as e:
            if user is not None and user.id is not None:
                try:
                    await ctx.run_db(store.delete_messages_from, conv.id, user.id)
                except Exception:
                    pass
                user.id = None
            self.post_message(
                ReplyFailed(
                    rid,
                    friendly_error(e),
                    user.content if user else "",
                    unreachable=isinstance(e, Unreachable),
                )
            )

    async def _post_pending_every(self, rid: int, pending: _Pending) -> None:
        while True:
            await asyncio.sleep(_POST_INTERVAL_S)
            pending.post(self, rid)

    def _current_reply(self, reply_id: int) -> _Reply | None:
        """The reply streaming now when it is ``reply_id``'s; None for a message of an earlier reply."""
        r = self.reply
        return r if r is not None and r.rid == reply_id else None

    async def _end_reply(self, reply_id: int) -> _Reply | None:
        """``_current_reply``, all its text drawn and no longer the one streaming."""
        r = self._current_reply(reply_id)
        if r is not None:
            await self._flush(r)
            self.reply = None
        return r

    async def on_reply_delta(self, msg: ReplyDelta) -> None:
        r = self._current_reply(msg.reply_id)
        if r is None:
            return
        now = time.perf_counter()
        if r.t_first is None:
            r.t_first = now
            r.view.set_footer("")
            self.engine.set_live(ttft_s=now - r.t0)
        r.n_pieces += msg.n_pieces
        r.pending.content += msg.delta.content
        r.pending.reasoning += msg.delta.reasoning
        if r.n_pieces == msg.n_pieces:
            await self._flush(r)  # the first words show at once
        elif r.flush_timer is None:
            r.flush_timer = self.set_timer(_DRAW_INTERVAL_S, lambda: self._flush(r, timed=True))

    def _typing(self) -> float | None:
        """Seconds since the last key when the user is typing now, else None."""
        since_key = time.monotonic() - self.input.last_key_at
        return since_key if since_key < _QUIET_S else None

    async def _flush(self, r: _Reply, *, timed: bool = False, limit: int | None = None) -> None:
        """Draw what arrived since the last draw (``limit``: at most that many characters of it)."""
        if timed:
            r.flush_timer = None
            since_key = self._typing()
            if since_key is not None:
                # the keys draw the text now (after_key); take over again once they stop
                r.flush_timer = self.set_timer(_QUIET_S - since_key, lambda: self._flush(r, timed=True))
                return
        if self.reply is not r or not (r.pending.content or r.pending.reasoning):
            return
        r.last_draw = time.monotonic()
        piece, r.pending = _take(r.pending, limit)
        with self.app.batch_update():  # the text and the panel's figures in one frame
            await r.view.append(piece)
            now = time.perf_counter()
            if r.n_pieces > 1 and r.t_first is not None and now > r.t_first:
                self.engine.set_live(tps=(r.n_pieces - 1) / (now - r.t_first))
            self.log_view.follow()

    async def after_key(self) -> None:
        """Called once the frame that shows a key typed into the message box has been drawn."""
        r = self.reply
        if r is None or time.monotonic() - r.last_draw < _TYPING_DRAW_INTERVAL_S:
            return
        r.last_draw = time.monotonic()
        if self._held_status is not None:
            status, self._held_status = self._held_status, None
            self._show_status(status)
        await self._flush(r, limit=_TYPING_DRAW_CHARS)

    async def on_reply_ended(self, msg: ReplyEnded) -> None:
        r = await self._end_reply(msg.reply_id)
        if r is None:
            return
        r.view.pieces = r.n_pieces
        await r.view.end_stream()
        if msg.message is not None:
            self.history.append(msg.message)
            r.view.stored = msg.message
            r.view.message_id = msg.message.id
            r.view.set_footer(_footer_for(msg.message, msg.finished))
            self.log_view.follow()
        else:
            await r.view.remove()
            if msg.cancelled and r.user_view is not None:
                r.user_view.set_footer("cancelled before the reply started")
                self.log_view.follow()
        fin = msg.finished
        if fin is not None:
            t = fin.timings or {}
            tps = t.get("predicted_per_second")
            self.engine.set_live(
                tps=float(tps) if tps else None,
                ttft_s=_ttft(msg.message.meta if msg.message else {}),
                context_used=_context_used(self.history),
            )
        self._list()

    async def on_reply_failed(self, msg: ReplyFailed) -> None:
        r = await self._end_reply(msg.reply_id)
        if r is None:
            return
        await r.view.end_stream()
        if not r.view.content and not r.view.reasoning:
            await r.view.remove()
        if r.user is not None and r.user in self.history:
            self.history.remove(r.user)
        if r.user_view is not None:
            r.user_view.add_class("-failed")
            r.user_view.set_footer("not answered — the text is back in the box: Enter sends it again")
        await self._note("error", msg.error)
        if msg.text:
            self.input.give_back(msg.text)
        self.input.focus()
        if msg.unreachable:
            self.connected = False
            self._connect()

    def on_work_failed(self, msg: WorkFailed) -> None:
        self.run_worker(self._note("error", msg.error), group="ui")

    async def _note(self, role: str, text: str) -> None:
        log = self.log_view
        log.sticky = True  # a note or an error is news: show it
        await log.add(MessageView(role, text))

    # ---- actions ------------------------------------------------------------------------------

    def action_cancel(self) -> None:
        if self.reply is not None:
            self.workers.cancel_group(self, "reply")
        elif self.focused is not self.input:
            self.input.focus()

    def action_new_conversation(self) -> None:
        if self.reply is not None:
            self.notify("A reply is streaming: Esc cancels it first.", severity="warning")
            return
        if self.conv is not None and not self.history and self.conv.title == _NEW_TITLE:
            self.notify("This conversation is new already.")  # no pile of empty conversations
        else:
            self._new()
        self.input.focus()

    def _editable_conversation(self, busy: str) -> Conversation | None:
        """The conversation whose history may change now: none while a reply streams (``busy`` says so)
        or before there is a conversation."""
        if self.reply is not None:
            self.notify(busy, severity="warning")
            return None
        return self.conv

    def _target(self, from_view: MessageView | None, role: str, *, last_only: bool) -> int | None:
        """The history index of the ``role`` message to act on: the one ``from_view`` shows (None when it
        is another role's), else the last message if it is ``role``'s (``last_only``) or the last of
        ``role``'s messages."""
        if from_view is not None and from_view.stored in self.history:
            idx = self.history.index(from_view.stored)
            return idx if self.history[idx].role == role else None
        lo = max(len(self.history) - 1, 0) if last_only else 0
        return next(
            (i for i in range(len(self.history) - 1, lo - 1, -1) if self.history[i].role == role), None
        )

    async def action_regenerate(self, from_view: MessageView | None = None) -> None:
        if self._editable_conversation("A reply is already streaming.") is None:
            return
        # the reply to regenerate: the one given, or the last one
        idx = self._target(from_view, "assistant", last_only=True)
        if idx is None and not (self.history and self.history[-1].role == "user"):
            self.notify("Nothing to regenerate yet.", severity="warning")
            return
        drop_from = None
        if idx is not None:
            drop_from = self.history[idx].id
            await self._remove_from(idx)
        await self._start_reply(None, None, drop_from=drop_from)

    async def _remove_from(self, idx: int) -> None:
        """Forget history[idx:] and remove their views (and any notes after them)."""
        doomed = self.history[idx:]
        del self.history[idx:]
        views = self.log_view.messages()
        first = next((i for i, v in enumerate(views) if v.stored in doomed), None)
        if first is not None:
            for v in views[first:]:
                await v.remove()

    async def action_edit_last(self, from_view: MessageView | None = None) -> None:
        conv = self._editable_conversation("A reply is streaming: Esc cancels it first.")
        if conv is None:
            return
        idx = self._target(from_view, "user", last_only=False)
        if idx is None:
            self.notify("No message of yours to edit.", severity="warning")
            return
        msg = self.history[idx]
        if msg.id is not None:
            self._db(self.ctx.store.delete_messages_from, conv.id, msg.id)
        await self._remove_from(idx)
        self.input.load_text(msg.content)
        self.input.move_cursor(self.input.document.end)
        self.input.focus()
        self.notify("Edit the message and press Enter to send it again.")

    def _last_reply(self) -> StoredMessage | None:
        return next((m for m in reversed(self.history) if m.role == "assistant"), None)

    def action_copy_last(self) -> None:
        m = self._last_reply()
        if m is None:
            self.notify("No reply to copy yet.", severity="warning")
            return
        self._copy(m.content)

    def _copy(self, text: str) -> None:
        self.app.copy_to_clipboard(text)
        self.notify(f"Copied {len(text):,} characters (OSC 52).")

    @on(MessageView.Action)
    async def _message_action(self, msg: MessageView.Action) -> None:
        if msg.action == "copy":
            self._copy(msg.view.content)
        elif msg.action == "edit" and msg.view.role == "user":
            await self.action_edit_last(msg.view)
        elif msg.action == "regenerate" and msg.view.role == "assistant":
            await self.action_regenerate(msg.view)

    def action_export(self, path: str | None = None) -> None:
        """Ctrl+O, /export: ask where (the exports folder of the data folder is offered); /export FILE
        writes there at once."""
        if self.conv is None:
            return
        conv, history = self.conv, list(self.history)
        if path:
            self._export(conv, history, path)
            return

        def done(answer: str | None) -> None:
            if answer:
                self._export(conv, history, answer)

        default = export_dir() / f"strata-chat-{_slug(conv.title)}-{conv.id}.md"
        self.app.push_screen(PromptScreen("Export the conversation as Markdown to", str(default)), done)

    @work(group="export", exclusive=True)
    async def _export(self, conv: Conversation, history: list[StoredMessage], path: str) -> None:
        target = Path(path).expanduser()
        try:
            await asyncio.to_thread(_write_text, target, to_markdown(conv, history))
        except OSError as e:
            self.post_message(
                WorkFailed(
                    f"could not export to {target}: {e.strerror or e} — give another path: /export FILE"
                )
            )
            return
        self.post_message(Exported(str(target)))

    async def on_exported(self, msg: Exported) -> None:
        await self._note("note", f"exported to {msg.path}")
        self.notify(f"Exported to {msg.path}")

    def action_toggle_thinking(self) -> None:
        if self.conv is not None:
            self._set_settings(thinking=not self.conv.settings.thinking)

    def _set_settings(self, **changes: Any) -> None:
        assert self.conv is not None
        for k, v in changes.items():
            setattr(self.conv.settings, k, v)
        self._db(self.ctx.store.set_settings, self.conv.id, Settings(**vars(self.conv.settings)))
        self._show_conv_title()
        self.notify(self.conv.settings.describe())

    def _set_system(self, text: str) -> None:
        assert self.conv is not None
        self.conv.system_prompt = text
        self._db(self.ctx.store.set_system_prompt, self.conv.id, text)
        self._show_conv_title()

    def action_rename(self) -> None:
        if self.conv is None:
            return
        conv = self.conv

        def done(title: str | None) -> None:
            if title:
                self._rename(conv, title)

        self.app.push_screen(PromptScreen("Rename the conversation", conv.title), done)

    def _rename(self, conv: Conversation, title: str) -> None:
        conv.title = title
        self.query_one("#sidebar", ConversationList).set_title(conv.id, title)
        self._show_conv_title()
        self._db(self.ctx.store.rename, conv.id, title, then_list=True)

    def action_settings(self) -> None:
        if self.conv is None:
            return
        conv = self.conv

        def done(res: SettingsResult | None) -> None:
            if res is None or self.conv is not conv:
                return
            conv.system_prompt = res.system_prompt
            conv.settings = res.settings
            self._db(self.ctx.store.set_system_prompt, conv.id, res.system_prompt)
            self._db(self.ctx.store.set_settings, conv.id, res.settings)
            self._show_conv_title()

        self.app.push_screen(SettingsScreen(conv.system_prompt, conv.settings), done)

    def action_delete(self) -> None:
        if self.conv is None:
            return
        if self.reply is not None:
            self.notify("A reply is streaming: Esc cancels it first.", severity="warning")
            return
        conv = self.conv

        def done(yes: bool | None) -> None:
            if yes:
                self._delete(conv.id)

        self.app.push_screen(ConfirmScreen(f"Delete “{conv.title}” and all its messages?", "Delete"), done)

    @work(group="db-open", exclusive=True)
    async def _delete(self, conversation_id: int) -> None:
        store = self.ctx.store
        try:
            await self.ctx.run_db(store.delete, conversation_id)
            convs = await self.ctx.run_db(store.list)
            conv = convs[0] if convs else await self.ctx.run_db(store.create, _NEW_TITLE)
            msgs = await self.ctx.run_db(store.messages, conv.id)
            convs = convs or [conv]
        except Exception as e:
            self.post_message(WorkFailed(f"could not delete the conversation: {e}"))
            return
        self.post_message(ConversationLoaded(conv, msgs))
        self.post_message(ConversationsListed(convs, conv.id))

    def action_search(self) -> None:
        sidebar = self.query_one("#sidebar", ConversationList)
        sidebar.display = True
        sidebar.query_one("#search").focus()

    def action_toggle_sidebar(self) -> None:
        sidebar = self.query_one("#sidebar", ConversationList)
        sidebar.display = not sidebar.display

    def action_toggle_engine(self) -> None:
        if self.is_strata:
            self.engine.display = not self.engine.display

    def action_reconnect(self) -> None:
        """Try the server again now (and start it again when this chat started it and it stopped)."""
        if self._worker_running("server"):
            self.workers.cancel_group(self, "server")
        self.ctx.connection.forget_stopped_server()
        self._connect()

    def action_page_log(self, direction: int) -> None:
        """PageUp/PageDown: scroll the conversation by a page, whichever widget has the focus."""
        log = self.log_view
        if direction < 0:
            log.scroll_page_up(animate=False)
        else:
            log.scroll_page_down(animate=False)

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen())

    @on(ListView.Highlighted)
    def _noop(self) -> None:
        pass

    def system_commands(self) -> list[SystemCommand]:
        """This screen's entries in the command palette (the app lists them while the screen is open)."""
        return [
            SystemCommand(
                "New conversation", "Start a new conversation (/new)", self.action_new_conversation
            ),
            SystemCommand("Regenerate", "Regenerate the last reply (/regen)", self.action_regenerate),
            SystemCommand(
                "Edit last message", "Edit the last message and send it again (/edit)", self.action_edit_last
            ),
            SystemCommand("Cancel reply", "Stop the reply in flight (Esc)", self.action_cancel),
            SystemCommand(
                "Copy last reply", "Copy the last reply to the clipboard (/copy)", self.action_copy_last
            ),
            SystemCommand(
                "Export to Markdown", "Write the conversation as Markdown (/export)", self.action_export
            ),
            SystemCommand(
                "Rename conversation", "Give the conversation a title (/rename)", self.action_rename
            ),
            SystemCommand("Delete conversation", "Delete the conversation (/delete)", self.action_delete),
            SystemCommand(
                "System prompt and sampling",
                "System prompt, temperature, top-p, max tokens, seed, thinking (/settings)",
                self.action_settings,
            ),
            SystemCommand(
                "Thinking on/off",
                "Toggle thinking for this conversation (/think)",
                self.action_toggle_thinking,
            ),
            SystemCommand("Search conversations", "Search titles and messages (/search)", self.action_search),
            SystemCommand(
                "Model and server",
                "Show the server and model (/model)",
                lambda: self.run_worker(self.run_slash("/model", ""), group="ui"),
            ),
            SystemCommand("Reconnect", "Try the server again now (/reconnect)", self.action_reconnect),
            SystemCommand("Toggle sidebar", "Show or hide the conversation list", self.action_toggle_sidebar),
            SystemCommand("Toggle engine panel", "Show or hide the engine panel", self.action_toggle_engine),
            SystemCommand("Help", "Every key and command (F1)", self.action_help),
        ]

    # ---- slash commands -----------------------------------------------------------------------

    async def run_slash(self, name: str, arg: str) -> None:
        try:
            await self._run_slash(name, arg)
        except ValueError as e:
            await self._note("error", f"{e}")

    async def _run_slash(self, name: str, arg: str) -> None:
        if name == "/help":
            self.action_help()
        elif name == "/quit":
            self.app.exit()
        elif name == "/new":
            if arg and self.reply is None:
                self._new(arg)
            else:
                self.action_new_conversation()
        elif self.conv is None:
            raise ValueError("no conversation is open yet")
        elif name == "/rename":
            if not arg:
                self.action_rename()
            else:
                self._rename(self.conv, arg)
        elif name == "/delete":
            self.action_delete()
        elif name == "/system":
            if not arg:
                self.action_settings()
            else:
                self._set_system("" if arg.lower() in ("off", "clear", "none") else arg)
                await self._note(
                    "note",
                    "system prompt cleared"
                    if not self.conv.system_prompt
                    else f"system prompt: {self.conv.system_prompt}",
                )
        elif name in ("/temp", "/temperature"):
            self._set_settings(temperature=parse_optional(_need(arg, name), float, "temperature", 0.0, 5.0))
        elif name in ("/top-p", "/top_p", "/topp"):
            self._set_settings(top_p=parse_optional(_need(arg, name), float, "top-p", 0.0, 1.0))
        elif name in ("/max-tokens", "/max_tokens", "/max"):
            self._set_settings(max_tokens=parse_optional(_need(arg, name), int, "max tokens", 1, None))
        elif name == "/seed":
            self._set_settings(seed=parse_optional(_need(arg, name), int, "seed", 0, None))
        elif name == "/think":
            a = arg.lower()
            if a in ("", "toggle"):
                self.action_toggle_thinking()
            elif a in ("on", "off", "true", "false", "1", "0", "yes", "no"):
                self._set_settings(thinking=a in ("on", "true", "1", "yes"))
            else:
                raise ValueError(f"/think: {arg!r} is not on or off")
        elif name == "/settings":
            self.action_settings()
        elif name == "/export":
            self.action_export(arg or None)
        elif name == "/copy":
            self.action_copy_last()
        elif name in ("/regen", "/regenerate", "/retry"):
            await self.action_regenerate()
        elif name == "/edit":
            await self.action_edit_last()
        elif name == "/search":
            sidebar = self.query_one("#sidebar", ConversationList)
            sidebar.display = True
            sidebar.query_one("#search").value = arg  # type: ignore[attr-defined]
        elif name == "/model":
            await self._model(arg)
        elif name == "/reconnect":
            self.action_reconnect()
        else:
            raise ValueError(f"unknown command {name} — /help lists them")

    async def _model(self, arg: str) -> None:
        conn = self.ctx.connection
        if arg:
            if self.models and arg not in self.models:
                raise ValueError(f"/model: the server offers {', '.join(self.models)}; not {arg!r}")
            conn.model_name = arg
            self.sub_title = f"{arg} · {'strata' if self.is_strata else 'OpenAI-compatible server'}"
        lines = [
            f"server: {conn.url or '(not started)'} ({'strata' if self.is_strata else 'OpenAI-compatible'}"
            f"{', started by this chat' if conn.runs_server else ''})",
            f"model: {conn.model_name or '(none)'}",
        ]
        if conn.model_file is not None:
            lines.append(f"file: {conn.model_file}")
        if len(self.models) > 1:
            lines.append("offered: " + ", ".join(self.models) + "  (/model NAME picks one)")
        await self._note("note", "\n".join(lines))


def _need(arg: str, name: str) -> str:
    if not arg:
        raise ValueError(f"{name} needs a value (or 'default') — e.g. {name} 0.7")
    return arg


def _title_from(text: str) -> str:
    line = " ".join(text.strip().split())
    return line if len(line) <= 40 else line[:39] + "…"


def _slug(title: str) -> str:
    s = re.sub(r"[^a-zA-Z0-9]+", "-", title).strip("-").lower()
    return s[:40] or "conversation"


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # an export holds the conversation: readable by its owner only (0600), like the database
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def _meta(fin: Finished | None) -> dict[str, Any]:
    if fin is None:
        return {}
    return {
        "finish_reason": fin.finish_reason,
        "usage": fin.usage,
        "timings": fin.timings,
        "ttft_s": fin.ttft_s,
    }


def _footer_for(m: StoredMessage, fin: Finished | None = None) -> str:
    if m.role != "assistant":
        return ""
    meta = m.meta or {}
    if meta.get("cancelled"):
        return "cancelled"
    parts = []
    t = meta.get("timings") or {}
    u = meta.get("usage") or {}
    n = t.get("predicted_n") or u.get("completion_tokens")
    if n:
        parts.append(f"{int(n)} tokens")
    if t.get("predicted_per_second"):
        parts.append(f"{float(t['predicted_per_second']):.1f} tok/s")
    ttft = _ttft(meta)
    if ttft is not None:
        parts.append(f"first token {ttft:.2f} s")
    if meta.get("finish_reason") == "length":
        parts.append("stopped at max tokens (/max-tokens)")
    return " · ".join(parts)


def _ttft(meta: dict[str, Any]) -> float | None:
    """Time to the first token as the user saw it: from sending the request to the first text."""
    v = meta.get("ttft_s")
    return None if v is None else float(v)


def _context_used(history: list[StoredMessage]) -> int | None:
    for m in reversed(history):
        u = (m.meta or {}).get("usage") or {}
        if u.get("total_tokens"):
            return int(u["total_tokens"])
    return None


def _take(d: Delta, limit: int | None) -> tuple[Delta, Delta]:
    """Split ``d`` into its first ``limit`` characters (reasoning first, as it arrived) and the rest."""
    if limit is None or len(d.reasoning) + len(d.content) <= limit:
        return d, Delta()
    nr = min(len(d.reasoning), limit)
    nc = limit - nr
    head = Delta(content=d.content[:nc], reasoning=d.reasoning[:nr])
    return head, Delta(content=d.content[nc:], reasoning=d.reasoning[nr:])
