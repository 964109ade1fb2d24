"""Widgets on their own, in a bare Textual app: the streaming message view and the input box."""

from __future__ import annotations

import asyncio

from textual.app import App, ComposeResult
from textual.widgets import Markdown

from strata_tui.client import Delta
from strata_tui.widgets import ChatInput, MessageView
from strata_tui.widgets.message_view import _open_fence


class _One(App[None]):
    def __init__(self, widget: object) -> None:
        super().__init__()
        self.widget = widget

    def compose(self) -> ComposeResult:
        yield self.widget  # type: ignore[misc]


def test_open_fence() -> None:
    assert _open_fence("text\n```python\nx = 1\n") == "```python"
    assert _open_fence("```\nx\n```\nafter") is None
    assert _open_fence("  ~~~\ncode") == "  ~~~"
    assert _open_fence("no fences") is None


def test_long_streamed_reply_ends_as_one_document() -> None:
    # a reply long enough to be drawn in several segments, with a code block cut across segments
    words = " ".join(f"w{i}" for i in range(400))
    code = "\n".join(f"line_{i} = {i}" for i in range(200))
    text = f"{words}\n\n```python\n{code}\n```\n\nThe end."
    pieces = [text[i : i + 7] for i in range(0, len(text), 7)]

    async def run() -> None:
        view = MessageView("assistant", streaming=True)
        app = _One(view)
        async with app.run_test(size=(100, 40)) as pilot:
            seen_segments = 1
            for i in range(0, len(pieces), 40):
                await view.append(Delta(content="".join(pieces[i : i + 40])))
                seen_segments = max(seen_segments, len(view.query(".body")))
            assert seen_segments > 2  # it was drawn in segments while streaming
            await view.end_stream()
            await pilot.pause()
            bodies = list(view.query(".body").results(Markdown))
            assert len(bodies) == 1
            assert bodies[0].source == text == view.content

    asyncio.run(run())


def test_reasoning_is_kept_apart_and_folded_when_the_answer_starts() -> None:
    async def run() -> None:
        view = MessageView("assistant", streaming=True)
        app = _One(view)
        async with app.run_test(size=(100, 30)) as pilot:
            await view.append(Delta(reasoning="Thinking about it. " * 100))
            box = view.query_one(".reasoning-box")
            assert box.display and not box.collapsed  # type: ignore[attr-defined]
            await view.append(Delta(content="Answer."))
            await view.end_stream()
            await pilot.pause()
            assert box.collapsed  # type: ignore[attr-defined]
            assert view.reasoning == "Thinking about it. " * 100 and view.content == "Answer."
            assert "300 words" in box.title  # type: ignore[attr-defined]
            assert len(view.query(".reasoning")) == 1

    asyncio.run(run())


def test_enter_sends_newline_key_inserts_up_recalls() -> None:
    async def run() -> None:
        box = ChatInput(newline_keys=("ctrl+j",))
        sent: list[str] = []

        class _App(_One):
            def on_chat_input_submitted(self, msg: ChatInput.Submitted) -> None:
                sent.append(msg.text)

        app = _App(box)
        async with app.run_test() as pilot:
            box.focus()
            await pilot.press("h", "i", "ctrl+j", "y", "o", "enter")
            await pilot.pause()
            assert sent == ["hi\nyo"]
            box.last_sent = sent[0]
            box.clear()
            await pilot.press("up")
            assert box.text == "hi\nyo"
            await pilot.press("x")  # with text in the box, up moves the cursor instead
            await pilot.press("up")
            assert box.text.count("x") == 1

    asyncio.run(run())
