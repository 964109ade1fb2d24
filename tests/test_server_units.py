"""Small parts of the server on their own: the worker's framing and the stop-string matcher."""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from strata.server.protocol import MAX_FRAME, ProtocolError, encode_frame, read_frame, write_frame
from strata.server.streaming import StopMatcher
from strata.think import ThinkSplitter


def test_frames_round_trip_and_end_cleanly() -> None:
    buf = io.BytesIO()
    msgs = [{"op": "generate", "prompt": list(range(1000)), "text": "é🦙"}, {"op": "cancel"}, {}]
    for m in msgs:
        write_frame(buf, m)
    data = buf.getvalue()
    r = io.BytesIO(data)
    assert [read_frame(r) for _ in msgs] == msgs
    assert read_frame(r) is None  # end of stream
    assert read_frame(io.BytesIO(data[:-3])) == msgs[0]  # a frame cut short ends the stream
    cut = io.BytesIO(encode_frame(msgs[1])[:-1])
    assert read_frame(cut) is None


def test_corrupt_frames_are_refused() -> None:
    with pytest.raises(ProtocolError, match="corrupt"):
        read_frame(io.BytesIO(struct.pack(">I", MAX_FRAME + 1) + b"x"))
    with pytest.raises(ProtocolError, match="JSON object"):
        read_frame(io.BytesIO(struct.pack(">I", 3) + b"[1]"))


def _run(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    m = StopMatcher(stops)
    out = ""
    for p in pieces:
        out += m.feed(p)
        if m.hit:
            return out, True
    return out + m.flush(), False


def test_stop_strings_across_pieces() -> None:
    assert _run(["o w"], ["Hel", "lo", " wor", "ld"]) == ("Hell", True)
    assert _run(["END"], ["abc E", "N", "D tail"]) == ("abc ", True)
    assert _run(["END"], ["abc E", "N", "x"]) == ("abc ENx", False)  # a prefix that did not finish is let out
    assert _run(["xyz", "b"], ["aab", "xyz"]) == ("aa", True)  # the earliest stop wins
    assert _run([], ["a", "b"]) == ("ab", False)


@given(
    st.text(alphabet="abc ", max_size=40),
    st.text(alphabet="abc", min_size=1, max_size=3),
    st.lists(st.integers(1, 5), max_size=20),
)
def test_stop_matcher_equals_cutting_the_whole_text(text: str, stop: str, cuts: list[int]) -> None:
    pieces, i = [], 0
    for c in cuts:
        pieces.append(text[i : i + c])
        i += c
    pieces.append(text[i:])
    out, hit = _run([stop], pieces)
    k = text.find(stop)
    assert (out, hit) == ((text[:k], True) if k >= 0 else (text, False))


def _split(pieces: list[str], inside: bool = False) -> tuple[str, str]:
    sp = ThinkSplitter(inside)
    r = c = ""
    for p in pieces:
        a, b = sp.feed(p)
        r, c = r + a, c + b
    a, b = sp.flush()
    return r + a, c + b


def test_think_tags_across_pieces() -> None:
    assert _split(["<thi", "nk>abc</th", "ink>done"]) == ("abc", "done")
    assert _split(["xyz</think>", "answer"], inside=True) == ("xyz", "answer")  # the prompt opened it
    assert _split(["no tags <thin", "g>"]) == ("", "no tags <thing>")
    assert _split(["<think>cut off"]) == ("cut off", "")


@given(
    st.lists(st.sampled_from(["<think>", "</think>", "a", "b ", "<", "</", "think", ">"]), max_size=30),
    st.lists(st.integers(1, 6), max_size=40),
    st.booleans(),
)
def test_think_splitter_equals_splitting_the_whole_text(
    tokens: list[str], cuts: list[int], inside: bool
) -> None:
    import re

    text = "".join(tokens)
    want_r = want_c = ""
    state = inside
    for part in re.split(r"(<think>|</think>)", text):
        if part == ("</think>" if state else "<think>"):
            state = not state
        elif state:
            want_r += part
        else:
            want_c += part
    pieces, i = [], 0
    for c in cuts:
        pieces.append(text[i : i + c])
        i += c
    pieces.append(text[i:])
    assert _split(pieces, inside) == (want_r, want_c)
