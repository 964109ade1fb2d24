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


async def _stream(view: MessageView, text: str, piece: int = 7, batch: int = 40) -> int:
    """Stream ``text`` into ``view`` in pieces; returns the most segments seen while streaming."""
    pieces = [text[i : i + piece] for i in range(0, len(text), piece)]
    most = 1
    for i in range(0, len(pieces), batch):
        await view.append(Delta(content="".join(pieces[i : i + batch])))
        most = max(most, len(view.query(".body")))
    return most


def test_long_reply_streams_in_segments_cut_between_blocks() -> None:
    paragraphs = [" ".join(f"p{j}w{i}" for i in range(60)) for j in range(12)]
    text = (
        "\n\n".join(paragraphs[:6])
        + "\n\n```python\n"
        + "\n\nx = 1\n" * 10
        + "```\n\n"
        + "\n\n".join(paragraphs[6:])
    )

    async def run() -> None:
        view = MessageView("assistant", streaming=True)
        async with _One(view).run_test(size=(100, 40)) as pilot:
            assert await _stream(view, text) > 2
            await view.end_stream()
            await pilot.pause()
            bodies = list(view.query(".body").results(Markdown))
            # every segment ends where a block ends: never inside the code block
            assert "".join(b.source for b in bodies) == text == view.content
            for b in bodies:
                assert _open_fence(b.source) is None
            assert all(b.source.endswith("\n\n") for b in bodies[:-1])

    asyncio.run(run())


def test_reply_with_no_block_boundary_ends_as_one_document() -> None:
    # one code block far longer than a segment: cut inside it while streaming, merged at the end
    code = "\n".join(f"line_{i} = {i}" for i in range(600))
    text = f"Intro\n\n```python\n{code}\n```\nThe end."

    async def run() -> None:
        view = MessageView("assistant", streaming=True)
        async with _One(view).run_test(size=(100, 40)) as pilot:
            assert await _stream(view, text) > 1
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
            await view.append(Delta(content="\n"))  # whitespace before the answer does not fold it
            assert not box.collapsed  # type: ignore[attr-defined]
            await view.append(Delta(content="Answer."))
            await view.end_stream()
            await pilot.pause()
            assert box.collapsed  # type: ignore[attr-defined]
            assert view.reasoning == "Thinking about it. " * 100 and view.content == "\nAnswer."
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
            await pilot.press("h", "i", "ctrl+j", "y", "o", "enter", "n", "e", "x", "t")
            await pilot.pause()
            assert sent == ["hi\nyo"]
            assert box.text == "next"  # typed after Enter: kept, not swept away with the sent text
            box.give_back("refused")  # a message that could not be sent goes back first
            assert box.text == "refused\nnext"
            box.last_sent = sent[0]
            box.clear()
            await pilot.press("enter")  # an empty box sends nothing
            assert sent == ["hi\nyo"]
            await pilot.press("up")
            assert box.text == "hi\nyo"
            await pilot.press("x")  # with text in the box, up moves the cursor instead
            await pilot.press("up")
            assert box.text.count("x") == 1

    asyncio.run(run())


def test_log_follows_a_growing_reply_until_scrolled_up() -> None:
    from strata_tui.widgets import ChatLog

    async def run() -> None:
        log = ChatLog()
        async with _One(log).run_test(size=(80, 20)) as pilot:
            view = MessageView("assistant", streaming=True)
            await log.add(view)
            # a big jump of content at once (a fast model between two draws) is still followed
            await view.append(Delta(content="\n\n".join(f"paragraph {i}" for i in range(60))))
            await pilot.pause(0.3)  # laid out in the frames that follow
            log.follow()
            await pilot.pause(0.1)
            assert log.scroll_y == log.max_scroll_y > 0
            # the user scrolls up to read: new text no longer moves the view
            log.scroll_to(y=0, animate=False)
            await pilot.pause()
            await view.append(Delta(content="\n\nmore text"))
            await pilot.pause(0.3)  # laid out in the frames that follow
            log.follow()
            await pilot.pause(0.1)
            assert log.scroll_y == 0
            # back at the end, it follows again
            log.scroll_end(animate=False)
            await pilot.pause()
            await view.append(Delta(content="\n\n" + "\n\n".join(f"tail {i}" for i in range(20))))
            await pilot.pause(0.3)  # laid out in the frames that follow
            log.follow()
            await pilot.pause(0.1)
            assert log.scroll_y == log.max_scroll_y
            # text laid out after the last follow() (Markdown mounts its blocks in a later turn, as after
            # the last draw of a cancelled reply) is followed too
            end = log.max_scroll_y
            await view.append(Delta(content="\n\n" + "\n\n".join(f"late {i}" for i in range(10))))
            await pilot.pause(0.3)
            assert log.max_scroll_y > end and log.scroll_y == log.max_scroll_y

    asyncio.run(run())


def test_folding_the_reasoning_when_the_answer_starts_keeps_the_log_at_its_end() -> None:
    from strata_tui.widgets import ChatLog

    async def run() -> None:
        log = ChatLog()
        async with _One(log).run_test(size=(80, 20)) as pilot:
            view = MessageView("assistant", streaming=True)
            await log.add(view)
            await view.append(Delta(reasoning="Thinking about it at length. " * 120))  # taller than the view
            view.set_footer("a line below the reasoning")  # the box does not end at the view's bottom edge
            await pilot.pause(0.3)
            assert log.scroll_y == log.max_scroll_y > 0
            # the answer starts: the reasoning is folded away (above the view), the answer grows
            await view.append(Delta(content="\n\n".join(f"answer paragraph {i}" for i in range(40))))
            await pilot.pause(0.5)  # longer than a scroll animation
            await view.append(Delta(content="\n\nthe last words"))
            await view.end_stream()
            await pilot.pause(0.5)
            assert view.query_one(".reasoning-box").collapsed  # type: ignore[attr-defined]
            assert log.sticky  # still following: nothing scrolled it up
            assert log.scroll_y == log.max_scroll_y > 0
            # the user's own toggle (t) still shows the reasoning box
            view.action_toggle_reasoning()
            await pilot.pause(0.5)
            box = view.query_one(".reasoning-box")
            assert not box.collapsed  # type: ignore[attr-defined]
            assert box.region.overlaps(log.region)

    asyncio.run(run())


def test_a_log_that_is_not_full_starts_at_the_top() -> None:
    from strata_tui.widgets import ChatLog

    async def run() -> None:
        log = ChatLog()
        async with _One(log).run_test(size=(60, 6)) as pilot:
            first = MessageView("note", "short")
            await log.add(first)
            await pilot.pause(0.1)
            assert log.max_scroll_y == 0 and log.scroll_y == 0
            assert first.region.y <= log.region.y + 1  # at the top, not pushed to the bottom
            await first.remove()
            note = MessageView("note", "\n".join(f"line {i}" for i in range(8)))
            await log.add(note)
            await pilot.pause(0.1)
            assert log.scroll_y == log.max_scroll_y > 0  # full: it follows the end
            # the terminal grows (as at start-up, when the first layout is of a smaller screen)
            await pilot.resize_terminal(60, 30)
            await pilot.pause(0.1)
            assert log.max_scroll_y == 0 and log.scroll_y == 0
            assert note.region.y <= log.region.y + 1  # at the top, not pushed to the bottom
            # growing past the view again follows the end again
            await log.add(MessageView("note", "\n".join(f"more {i}" for i in range(60))))
            await pilot.pause(0.1)
            assert log.scroll_y == log.max_scroll_y > 0

    asyncio.run(run())


def test_one_layout_markdown_lays_out_and_draws_like_textuals_while_it_grows() -> None:
    from textual.containers import VerticalScroll
    from textual.geometry import Region
    from textual.widget import Widget

    from strata_tui.widgets._one_layout import OneLayoutMarkdown

    text = (
        "# Title\n\nSome **bold** text that wraps " + "word " * 40 + "\n\n- one\n- two\n  - nested\n\n"
        "```python\nfor i in range(3):\n    print(i)  # "
        + "x" * 80
        + "\n```\n\n> quoted "
        + "q " * 30
        + "\n\n"
        "| a | b |\n|---|---|\n| 1 | 2 |\n\nThe end " + "z " * 50
    )
    pieces = [text[i : i + 11] for i in range(0, len(text), 11)]

    def picture(md: Widget) -> list[tuple[str, Region, list[str]]]:
        # every widget of the document: its kind, where it is, and the text it draws there
        out = []
        for w in [md, *md.query("*")]:
            lines = [s.text for s in w.render_lines(Region(0, 0, w.size.width, w.size.height))]
            out.append((type(w).__name__, w.region, lines))
        return out

    async def grow(cls: type[Widget]) -> list[list[tuple[str, Region, list[str]]]]:
        md = cls()
        seen = []
        async with _One(VerticalScroll(md)).run_test(size=(70, 30)) as pilot:
            for i in range(0, len(pieces), 6):
                await md.append("".join(pieces[i : i + 6]))  # type: ignore[attr-defined]
                await pilot.pause(0.1)
                seen.append(picture(md))
        return seen

    async def run() -> None:
        theirs = await grow(Markdown)
        ours = await grow(OneLayoutMarkdown)
        assert len(ours) == len(theirs) > 5
        for step, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert [(k.replace("OneLayout", ""), r, t) for k, r, t in a] == b, f"differs after draw {step}"

    asyncio.run(run())


def test_engine_panel_line_of_the_sequences() -> None:
    from strata_tui.widgets.engine_panel import sequences_line

    assert sequences_line({}) is None and sequences_line({"parallel": 1, "sequences": []}) is None
    assert sequences_line({"parallel": 4, "sequences": []}) == "0 / 4"
    running = [
        {"seq": 3, "state": "generating"},
        {"seq": 5, "state": "reading"},
        {"seq": 6, "state": "reading"},
    ]
    assert sequences_line({"parallel": 4, "sequences": running}) == "3 / 4 · 2 reading"
    assert sequences_line({"parallel": 8, "sequences": running[:1]}) == "1 / 8 · generating"
