"""The tokenizer built from a GGUF file's metadata: the tiny model's vocabulary against the trained
tokenizer it was written from, round trips, streaming, and clear errors for what it cannot read."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata._gguf_meta import GGUFMetadataError, read_gguf_metadata
from strata.model import ensure_model
from strata.model._tokenizer import build_vocab
from strata.tokenizer import Tokenizer, TokenizerError

TRICKY = [
    "Hello world",
    "  leading spaces and trailing   ",
    "tabs\tand\nnew\r\nlines\n\n\n",
    "numbers 1234567 3.14159 -42 1e10",
    "émigré naïve Ünïcödé — “quotes” ‘single’",
    "日本語のテキストと中文",
    "emoji 🦙🚀👍🏽 and flags 🇺🇸",
    "def f(x):\n    return x ** 2  # code\n",
    "don't won't it's I'll we've they're",
    "<|im_start|>user\nhi<|im_end|>",
    "a" * 300,
]


def test_tiny_vocabulary_matches_the_tokenizer_it_was_made_from(tiny_tok: Tokenizer) -> None:
    assert tiny_tok.kind == "gpt2" and tiny_tok.pre == "qwen2"
    ref = build_vocab(tiny_tok.n_vocab)
    assert ref.tokens == tiny_tok.tokens
    for text in TRICKY:
        assert tiny_tok.encode(text) == ref.tokenizer.encode(text).ids, text


def test_tiny_special_tokens(tiny_tok: Tokenizer) -> None:
    im_end = tiny_tok.token_id("<|im_end|>")
    assert tiny_tok.eos_id == im_end and im_end in tiny_tok.eog_ids
    assert tiny_tok.token_id("<|endoftext|>") in tiny_tok.eog_ids
    assert tiny_tok.token_id("<think>") not in tiny_tok.eog_ids
    # user-defined tokens are text: they are decoded, control tokens are not
    ids = tiny_tok.encode("<think>x</think><|im_end|>")
    assert ids[0] == tiny_tok.token_id("<think>") and ids[-1] == im_end
    assert tiny_tok.decode(ids) == "<think>x</think>"
    assert tiny_tok.chat_template and "<|im_start|>" in tiny_tok.chat_template


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=80))
def test_round_trip_and_streaming(text: str) -> None:
    tok = _tiny_cached()
    ids = tok.encode(text, parse_special=False)
    assert tok.decode(ids) == text
    dec = tok.stream_decoder()
    pieces = [dec.feed(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces) or "\ufffd" in text


_CACHE: list[Tokenizer] = []


def _tiny_cached() -> Tokenizer:
    if not _CACHE:
        _CACHE.append(Tokenizer.from_gguf(ensure_model("tiny")))
    return _CACHE[0]


def test_token_ids_outside_the_vocabulary_are_refused(tiny_tok: Tokenizer) -> None:
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tiny_tok.decode([tiny_tok.n_vocab])


def test_metadata_reader_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 64)
    with pytest.raises(GGUFMetadataError, match="not a GGUF file"):
        read_gguf_metadata(bad)
    full = ensure_model("tiny").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(full[:4000])
    with pytest.raises(GGUFMetadataError, match="truncated"):
        read_gguf_metadata(cut)
    meta = read_gguf_metadata(ensure_model("tiny"))
    assert meta["general.architecture"] == "qwen3moe" and len(meta["tokenizer.ggml.tokens"]) == 2048


def test_unsupported_vocabularies_are_named() -> None:
    meta = read_gguf_metadata(ensure_model("tiny"))
    with pytest.raises(TokenizerError, match="'bert' is not supported"):
        Tokenizer({**meta, "tokenizer.ggml.model": "bert"})
    with pytest.raises(TokenizerError, match="'klingon' is not supported"):
        Tokenizer({**meta, "tokenizer.ggml.pre": "klingon"})
    with pytest.raises(TokenizerError, match="no vocabulary"):
        Tokenizer({k: v for k, v in meta.items() if k != "tokenizer.ggml.tokens"})
