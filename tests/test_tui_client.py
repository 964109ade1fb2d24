"""The chat client's pieces that need no server: splitting reasoning out of streamed text, error words."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from strata_tui.client import ApiError, ThinkSplitter, Unreachable, friendly_error


def split(pieces: list[str]) -> tuple[str, str]:
    s = ThinkSplitter()
    content = reasoning = ""
    for p in pieces:
        d = s.feed(p)
        content += d.content
        reasoning += d.reasoning
    d = s.flush()
    return content + d.content, reasoning + d.reasoning


def test_think_tags_split_reasoning_from_answer() -> None:
    assert split(["<think>plan it</think>The answer"]) == ("The answer", "plan it")
    assert split(["no tags at all"]) == ("no tags at all", "")
    # tags cut across pieces
    assert split(["<th", "ink>a", "b</thi", "nk>c"]) == ("c", "ab")
    # a '<' that is not a tag is kept
    assert split(["1 <", " 2 and <b>"]) == ("1 < 2 and <b>", "")


@settings(deadline=None)  # a loaded CI machine must not turn a slow example into a failure
@given(
    st.text(alphabet="ab<>/thinkx", max_size=40),
    st.text(alphabet="ab<x", max_size=40),
    st.lists(st.integers(min_value=1, max_value=7), max_size=20),
)
def test_any_cut_gives_the_same_split(reasoning: str, answer: str, cuts: list[int]) -> None:
    if "</think>" in reasoning or "<think>" in answer:
        return
    text = f"<think>{reasoning}</think>{answer}"
    pieces, i = [], 0
    for c in cuts:
        pieces.append(text[i : i + c])
        i += c
    pieces.append(text[i:])
    assert split(pieces) == (answer, reasoning)


def test_errors_say_what_to_do() -> None:
    e = ApiError("the engine stopped unexpectedly (exit code 1)", code="engine_exited", status=500)
    assert (
        friendly_error(e)
        == "the engine stopped unexpectedly (exit code 1) — it restarts with your next message."
    )
    e = ApiError("prompt has 5000 tokens, the context holds 4096", code="context_length_exceeded")
    assert "/new" in friendly_error(e) and "5000" in friendly_error(e)
    assert "--api-key" in friendly_error(ApiError("bad key", code="invalid_api_key", status=401))
    assert friendly_error(Unreachable("cannot reach http://x")) == "cannot reach http://x"
