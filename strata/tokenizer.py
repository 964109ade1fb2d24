"""Text <-> token ids, built from a GGUF file's own vocabulary with the ``tokenizers`` library.

``Tokenizer.from_gguf(path)`` reads ``tokenizer.ggml.*`` from the file and builds:

- ``gpt2`` vocabularies (byte-level BPE: Qwen, Llama 3, GPT-2, DeepSeek, ...): a ``tokenizers`` BPE
  model over the file's tokens and merges, split first by the patterns of the file's pre-tokenizer
  type (``tokenizer.ggml.pre``: ``qwen2``, ``llama-bpe``, ``gpt-2``, ...) and then mapped byte-to-unicode;
- ``llama`` vocabularies (SentencePiece BPE: Llama 1/2, Mistral, Mixtral, Phi-3): a BPE model whose
  merges are ranked by the scores in the file, with byte fallback (``<0xXX>`` tokens), spaces written
  as ``▁`` and a space put in front of the text (and after each special token), as SentencePiece does.

Special tokens (control and user-defined tokens) are found in the text before the ordinary tokenizer
runs, longest first; with ``parse_special=False`` only user-defined ones are. A chat prompt mixes the
two: the template's own markers must become control tokens while the text of the messages must not
(a user who types ``<|im_end|>`` gets those characters, not the end of a turn). ``encode`` takes the
prompt with that text masked (``placeholders``: see ``strata.chat_template.Prompt``), finds control
tokens in the rest, and tokenizes the masked text as plain text. Decoding works on bytes:
each token stands for a byte string, and ``StreamDecoder`` turns a stream of ids into text without
ever splitting a UTF-8 character across two pieces.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from os import PathLike, fspath
from typing import Any

from ._gguf_meta import read_gguf_metadata
from ._tok_pre import IGNORE_MERGES, patterns_for

__all__ = ["StreamDecoder", "Tokenizer", "TokenizerError"]

# GGUF token types
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5
TOKEN_BYTE = 6

# texts of tokens that end a turn in the chat formats of common model families
_EOG_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<|return|>",
        "<|call|>",
    }
)
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenizerError(ValueError):
    """The file's vocabulary cannot be turned into a tokenizer (says what is missing)."""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of the 256 byte values to printable characters."""
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


_BYTE_ENCODER = _bytes_to_unicode()
_BYTE_DECODER = {c: b for b, c in _BYTE_ENCODER.items()}


def _byte_level_bytes(text: str) -> bytes:
    """The bytes a byte-level token stands for (characters outside the map stand for themselves)."""
    out = bytearray()
    for ch in text:
        b = _BYTE_DECODER.get(ch)
        if b is None:
            out += ch.encode("utf-8")
        else:
            out.append(b)
    return bytes(out)


def _spm_merges(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """Merges for a SentencePiece BPE vocabulary: every split (a, b) of a token whose halves are both
    tokens, ranked by the merged token's score (higher first), then by the halves' ids."""
    index: dict[str, int] = {}
    for i, t in enumerate(tokens):
        index.setdefault(t, i)
    found: list[tuple[float, int, int, int, str, str]] = []
    for i, t in enumerate(tokens):
        if len(t) < 2 or index.get(t) != i:
            continue
        for k in range(1, len(t)):
            a, b = t[:k], t[k:]
            ia, ib = index.get(a), index.get(b)
            if ia is not None and ib is not None:
                found.append((-float(scores[i]), i, ia, ib, a, b))
    found.sort()
    return [(a, b) for *_, a, b in found]


def _bpe(source: str, models: Any, **kwargs: Any) -> Any:
    try:
        return models.BPE(**kwargs)
    except Exception as e:  # the tokenizers library raises plain Exception for a vocabulary it refuses
        raise TokenizerError(
            f"{source}: the vocabulary is damaged ({e}); the file is corrupt or was written by a "
            f"converter that strata does not know"
        ) from None


class Tokenizer:
    """A tokenizer for one model's vocabulary. Build it with ``from_gguf`` or ``from_metadata``."""

    def __init__(self, meta: dict[str, Any], *, source: str = "model") -> None:
        from tokenizers import Regex, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        self.source = source
        self.kind = str(meta.get("tokenizer.ggml.model", ""))
        tokens = meta.get("tokenizer.ggml.tokens")
        if not tokens:
            raise TokenizerError(f"{source}: the file has no vocabulary (tokenizer.ggml.tokens is missing)")
        self.tokens: list[str] = list(tokens)
        n = len(self.tokens)
        types = meta.get("tokenizer.ggml.token_type")
        self.token_types: list[int] = [int(t) for t in types] if types is not None else [TOKEN_NORMAL] * n
        if len(self.token_types) != n:
            raise TokenizerError(f"{source}: {len(self.token_types)} token types for {n} tokens")
        self.pre = str(meta.get("tokenizer.ggml.pre") or "default")
        self.chat_template: str | None = meta.get("tokenizer.chat_template") or None

        def _id(key: str) -> int:
            v = meta.get(key)
            return int(v) if v is not None and 0 <= int(v) < n else -1

        self.bos_id = _id("tokenizer.ggml.bos_token_id")
        self.eos_id = _id("tokenizer.ggml.eos_token_id")
        self.eot_id = _id("tokenizer.ggml.eot_token_id")
        self.unk_id = _id("tokenizer.ggml.unknown_token_id")

        index: dict[str, int] = {}
        for i, t in enumerate(self.tokens):
            index.setdefault(t, i)
        self._index = index

        if self.kind == "gpt2":
            patterns = patterns_for(self.pre)
            if patterns is None:
                raise TokenizerError(
                    f"{source}: pre-tokenizer type {self.pre!r} is not supported "
                    f"(supported: qwen2, llama-bpe, gpt-2, deepseek-llm, deepseek-coder, falcon, starcoder, ...)"
                )
            raw_merges = meta.get("tokenizer.ggml.merges")
            if raw_merges is None:
                raise TokenizerError(f"{source}: a gpt2 vocabulary needs tokenizer.ggml.merges")
            merges = []
            for m in raw_merges:
                a, sep, b = m.partition(" ")
                if sep:
                    merges.append((a, b))
            bpe = _bpe(source, models, vocab=index, merges=merges, ignore_merges=self.pre in IGNORE_MERGES)
            hf = HFTokenizer(bpe)
            splits = [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in patterns]
            hf.pre_tokenizer = pre_tokenizers.Sequence(
                [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
            )
            self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", self.pre in IGNORE_MERGES))
            self.add_space_prefix = False
            self._token_bytes = [self._bpe_piece(i) for i in range(n)]
        elif self.kind == "llama":
            scores = meta.get("tokenizer.ggml.scores")
            if scores is None:
                raise TokenizerError(
                    f"{source}: a llama (SentencePiece) vocabulary needs tokenizer.ggml.scores"
                )
            unk = self.tokens[self.unk_id] if self.unk_id >= 0 else None
            bpe = _bpe(
                source,
                models,
                vocab=index,
                merges=_spm_merges(self.tokens, scores),
                unk_token=unk,
                byte_fallback=True,
                fuse_unk=True,
            )
            hf = HFTokenizer(bpe)
            self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", True))
            self.add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
            self._token_bytes = [self._spm_piece(i) for i in range(n)]
        else:
            raise TokenizerError(
                f"{source}: tokenizer model {self.kind!r} is not supported (gpt2 byte-level BPE and llama "
                f"SentencePiece vocabularies are)"
            )
        self.add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
        self._hf = hf

        # special tokens are matched in the text before the ordinary tokenizer runs, longest first
        special = [
            i
            for i, t in enumerate(self.token_types)
            if t in (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNKNOWN) and self.tokens[i]
        ]
        self._special_all = self._matcher(special)
        self._special_user = self._matcher([i for i in special if self.token_types[i] == TOKEN_USER_DEFINED])
        # the texts that only parse_special turns into tokens (the rest are matched either way)
        self.control_texts: frozenset[str] = frozenset(self._special_all[1]) - frozenset(
            self._special_user[1]
        )
        self._max_token_bytes = max((len(b) for b in self._token_bytes), default=1) or 1

        eog = {i for i in (self.eos_id, self.eot_id) if i >= 0}
        eog |= {i for i in special if self.tokens[i] in _EOG_TEXTS and self.token_types[i] != TOKEN_UNKNOWN}
        self.eog_ids: frozenset[int] = frozenset(eog)

    # ---- construction ------------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, path: str | PathLike[str]) -> Tokenizer:
        """The tokenizer stored in a GGUF file's metadata."""
        return cls(read_gguf_metadata(path), source=fspath(path))

    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> Tokenizer:
        return cls(meta)

    def _matcher(self, ids: Iterable[int]) -> tuple[re.Pattern[str] | None, dict[str, int]]:
        by_text: dict[str, int] = {}
        for i in ids:
            by_text.setdefault(self.tokens[i], i)
        if not by_text:
            return None, by_text
        texts = sorted(by_text, key=lambda t: (-len(t), t))
        return re.compile("|".join(re.escape(t) for t in texts)), by_text

    def _bpe_piece(self, i: int) -> bytes:
        t, ty = self.tokens[i], self.token_types[i]
        if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNKNOWN):
            return t.encode("utf-8")
        return _byte_level_bytes(t)

    def _spm_piece(self, i: int) -> bytes:
        t, ty = self.tokens[i], self.token_types[i]
        if ty == TOKEN_BYTE:
            m = _BYTE_TOKEN.fullmatch(t)
            if m:
                return bytes([int(m.group(1), 16)])
        if ty == TOKEN_UNKNOWN:
            return " \u2047 ".encode()
        if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
            return t.encode("utf-8")
        return t.replace("\u2581", " ").encode("utf-8")

    # ---- properties --------------------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    @property
    def bos_token(self) -> str:
        return self.tokens[self.bos_id] if self.bos_id >= 0 else ""

    @property
    def eos_token(self) -> str:
        return self.tokens[self.eos_id] if self.eos_id >= 0 else ""

    def is_special(self, token_id: int) -> bool:
        """Control and unknown tokens: left out of decoded text unless asked for."""
        return self.token_types[token_id] in (TOKEN_CONTROL, TOKEN_UNKNOWN)

    def token_id(self, text: str) -> int | None:
        """The id of the token spelled exactly ``text`` in the vocabulary, or None."""
        return self._index.get(text)

    # ---- encoding ----------------------------------------------------------------------------------

    def _partition(self, text: str, parse_special: bool) -> Iterator[tuple[int | None, str]]:
        """Pieces of text: (special id, text) for special tokens, (None, text) for ordinary text."""
        pattern, by_text = self._special_all if parse_special else self._special_user
        if pattern is None:
            if text:
                yield None, text
            return
        pos = 0
        for m in pattern.finditer(text):
            if m.start() > pos:
                yield None, text[pos : m.start()]
            yield by_text[m.group(0)], m.group(0)
            pos = m.end()
        if pos < len(text):
            yield None, text[pos:]

    def _encode_ordinary(self, text: str) -> list[int]:
        if not text:
            return []
        # encode_batch lets go of the GIL while it works (encode does not): a long prompt tokenized in
        # a thread leaves the server's event loop running
        return list(self._hf.encode_batch([text], add_special_tokens=False)[0].ids)

    def _pieces(
        self, text: str, parse_special: bool, placeholders: Mapping[str, str] | None
    ) -> Iterator[tuple[int | None, str]]:
        if not placeholders:
            yield from self._partition(text, parse_special)
            return
        table = {ord(k): v for k, v in placeholders.items()}
        for tid, piece in self._partition(text, parse_special):
            if tid is not None or not any(k in piece for k in placeholders):
                yield tid, piece
            else:
                # masked text is plain text: only the tokens that are matched in any text are found in it
                yield from self._partition(piece.translate(table), False)

    def min_tokens(self, text: str) -> int:
        """A lower bound on ``len(encode(text))``, found without tokenizing (0 when none is known).

        In a byte-level vocabulary every byte of the text belongs to exactly one token, and no token
        stands for more than the longest token's bytes; a prompt that cannot fit the context is refused
        at once instead of after seconds of tokenizing."""
        if self.kind != "gpt2":
            return 0
        return -(-len(text.encode("utf-8", "surrogatepass")) // self._max_token_bytes)

    def encode(
        self,
        text: str,
        *,
        add_special: bool = False,
        parse_special: bool = True,
        placeholders: Mapping[str, str] | None = None,
    ) -> list[int]:
        """Token ids of ``text``. ``add_special`` adds BOS/EOS as the model asks for them;
        ``parse_special`` turns the text of control tokens (``<|im_start|>``) into those tokens.

        ``placeholders`` maps single characters in ``text`` to the text they stand for: that text is
        put back after the control tokens are found, so it is always tokenized as plain text."""
        out: list[int] = []
        if add_special and self.add_bos and self.bos_id >= 0:
            out.append(self.bos_id)
        prev_special = True
        for tid, piece in self._pieces(text, parse_special, placeholders):
            if tid is not None:
                out.append(tid)
                prev_special = True
                continue
            if self.kind == "llama":
                if self.add_space_prefix and prev_special:
                    piece = " " + piece
                piece = piece.replace(" ", "\u2581")
            out.extend(self._encode_ordinary(piece))
            prev_special = False
        if add_special and self.add_eos and self.eos_id >= 0:
            out.append(self.eos_id)
        return out

    # ---- decoding ----------------------------------------------------------------------------------

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (its raw text for special tokens)."""
        return self._token_bytes[token_id]

    def decode_bytes(self, ids: Iterable[int], *, skip_special: bool = True) -> bytes:
        out = bytearray()
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self._token_bytes):
                raise TokenizerError(
                    f"token id {i} is outside the vocabulary (0..{len(self._token_bytes) - 1})"
                )
            if skip_special and self.is_special(i):
                continue
            out += self._token_bytes[i]
        return bytes(out)

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        """Text of ``ids``; bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids, skip_special=skip_special).decode("utf-8", errors="replace")

    def stream_decoder(self, *, skip_special: bool = True) -> StreamDecoder:
        return StreamDecoder(self, skip_special=skip_special)


class StreamDecoder:
    """Text of a growing list of token ids, piece by piece.

    A token can end in the middle of a UTF-8 character (byte tokens, byte-level merges); those bytes
    are held back until the character is complete, so every piece is whole characters.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        if self._skip and self._tok.is_special(token_id):
            return ""
        return self._dec.decode(self._tok.token_bytes(token_id))

    def flush(self) -> str:
        """Whatever is held back (an incomplete character at the end becomes U+FFFD)."""
        return self._dec.decode(b"", final=True)
