"""The default vocabulary: a byte-level BPE trained with ``tokenizers`` on text found on this machine.

The corpus is the documentation strings of Python's own standard library (plus some of its source,
so that code tokenizes sensibly), read in sorted order so that training is deterministic for a given
Python. The pre-tokenizer is Qwen2's split pattern followed by GPT-2's byte-to-unicode mapping, so
the vocabulary is a valid ``gpt2`` / ``qwen2`` vocabulary as llama.cpp reads it: ``tokens`` are the
byte-level strings, ``merges`` are ``"left right"`` pairs, special tokens follow the BPE tokens, and
any rows that the corpus cannot fill are ``[PADn]`` tokens of type UNUSED, as in real Qwen files.
"""

from __future__ import annotations

import json
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ._cache import atomic_path, cache_dir, file_lock

__all__ = [
    "QWEN2_SPLIT_PATTERN",
    "SPECIAL_TOKENS",
    "Vocab",
    "build_vocab",
    "corpus_texts",
    "train_bpe",
]

# Qwen2's pre-tokenizer split (a property of the format that llama.cpp's "qwen2" pre type applies).
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# special token -> GGUF token type (3 CONTROL, 4 USER_DEFINED), in id order after the BPE tokens
SPECIAL_TOKENS: dict[str, int] = {
    "<|endoftext|>": 3,
    "<|im_start|>": 3,
    "<|im_end|>": 3,
    "<think>": 4,
    "</think>": 4,
}

TOKEN_NORMAL = 1
TOKEN_UNUSED = 5

_CORPUS_VERSION = 1
_CODE_CAP = 2_000_000  # characters of plain source added after the docstrings
_SKIP_DIRS = {"test", "tests", "site-packages", "dist-packages", "idlelib", "lib2to3", "__pycache__"}
_DOCSTRING = re.compile(r'"""(.*?)"""', re.S)


def corpus_texts() -> list[str]:
    """Docstrings of the standard library, then up to ``_CODE_CAP`` characters of its source."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in root.rglob("*.py") if not _SKIP_DIRS.intersection(p.relative_to(root).parts[:-1])
    )
    if not files:
        raise RuntimeError(
            f"no Python sources under {root}: the default tokenizer is trained on the standard "
            "library's documentation strings; install the full Python standard library"
        )
    docs: list[str] = []
    code: list[str] = []
    n_code = 0
    for p in files:
        try:
            src = p.read_bytes().decode("utf-8", "replace")
        except OSError:
            continue
        docs.extend(m.group(1) for m in _DOCSTRING.finditer(src))
        if n_code < _CODE_CAP:
            code.append(src[: _CODE_CAP - n_code])
            n_code += len(code[-1])
    return docs + code


def _new_tokenizer():  # type: ignore[no-untyped-def]
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def train_bpe(n_regular: int):  # type: ignore[no-untyped-def]
    """A trained ``tokenizers.Tokenizer`` with at most ``n_regular`` BPE tokens (cached on disk).

    Special tokens are added after the BPE tokens. The corpus may support fewer merges than asked
    for; then the vocabulary is smaller and :func:`build_vocab` pads it.
    """
    from tokenizers import Tokenizer, pre_tokenizers, trainers

    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    path = cache_dir("tokenizers") / f"bpe-{n_regular}-c{_CORPUS_VERSION}-py{py}.json"
    with file_lock(path.with_suffix(".lock")):
        if path.exists():
            return Tokenizer.from_file(str(path))
        tok = _new_tokenizer()
        trainer = trainers.BpeTrainer(
            vocab_size=n_regular,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(corpus_texts(), trainer)
        tok.add_special_tokens(list(SPECIAL_TOKENS))
        with atomic_path(path) as tmp:
            tok.save(str(tmp))
        return tok


@dataclass
class Vocab:
    """A vocabulary as GGUF stores it, plus the ``tokenizers`` object that encodes with it."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_id: int
    eos_id: int
    pad_id: int
    tokenizer: object  # tokenizers.Tokenizer

    def id_of(self, token: str) -> int:
        return self.tokens.index(token)


def build_vocab(n_vocab: int) -> Vocab:
    """Exactly ``n_vocab`` tokens: BPE tokens, the special tokens, then ``[PADn]`` fillers."""
    n_special = len(SPECIAL_TOKENS)
    if n_vocab < 256 + n_special + 1:
        raise ValueError(f"a vocabulary of {n_vocab} tokens cannot hold the 256 bytes and the special tokens")
    tok = train_bpe(n_vocab - n_special)
    data = json.loads(tok.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    n_bpe = len(vocab)
    tokens = [""] * n_bpe
    for t, i in vocab.items():
        tokens[i] = t
    types = [TOKEN_NORMAL] * n_bpe
    for added in sorted(data["added_tokens"], key=lambda a: a["id"]):
        if added["id"] != len(tokens):
            raise RuntimeError(
                f"special token {added['content']!r} has id {added['id']}, expected {len(tokens)}"
            )
        tokens.append(added["content"])
        types.append(SPECIAL_TOKENS[added["content"]])
    while len(tokens) < n_vocab:
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(TOKEN_UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    eot = tokens.index("<|endoftext|>")
    return Vocab(
        tokens=tokens,
        token_types=types,
        merges=merges,
        bos_id=eot,
        eos_id=tokens.index("<|im_end|>"),
        pad_id=eot,
        tokenizer=tok,
    )
