"""Constrained decoding: a grammar (a JSON schema, or tool calls in a model's syntax) enforced token by
token on the engine's logits.

The grammar library is llguidance, not xgrammar, for three reasons. It computes each step's mask
lazily from the grammar and the token trie (tens of microseconds per token on a CPU, with no
ahead-of-time compilation per schema, so a new schema in every request costs nothing up front); its
wheel is self-contained (xgrammar's Python package needs torch, which strata does not otherwise
install); and its matcher is a plain object with ``compute_bitmask`` / ``consume_token``, which fits
the engine's sampling as it is: each step the logits of tokens the grammar forbids are set to -inf in
a copy, and the engine's own sampler (``strata_sampler_sample``) picks from that copy. At temperature
0 the pick is the argmax of the allowed tokens, so a constrained reply is as deterministic as a free
one. Once the grammar is complete only the model's end-of-generation tokens are allowed.

A model can write a string or a list for as long as it likes, and a random-weight model always does:
a reply cut at ``max_tokens`` would not parse. So a constraint knows the reply's token budget, and
for its last ``reserve`` tokens it closes what is open: among the tokens the grammar allows it takes
the first of a fixed list of one-character closers (a quote, a closing brace or bracket, a comma, a
digit) that the grammar allows, or else the shortest token it allows (the next piece of a literal such
as a closing tag), and ends the reply as soon as the grammar is complete. The
reply then parses and fits the schema; ``closed_early`` tells the server to report
``finish_reason: "length"`` for it, as the reply was shortened.

``Grammars`` holds the tokenizer that llguidance needs (built from the model's own vocabulary,
``strata.tokenizer.Tokenizer``); ``check`` returns the library's own words for a grammar it rejects,
which the server sends back as a 400. ``Constraint`` is one request's matcher.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from .tokenizer import Tokenizer

__all__ = ["Constraint", "GrammarError", "Grammars", "grammars_for", "json_schema_grammar", "lark_grammar"]

# compact JSON: no free whitespace (a model cannot pad a reply with blank lines until max_tokens)
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """The grammar library rejected a grammar; the message is its own."""


def json_schema_grammar(schema: dict[str, Any]) -> str:
    """The llguidance grammar for a JSON schema (raises GrammarError when it is not a JSON object)."""
    import llguidance

    try:
        return str(llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=_JSON_OPTIONS))  # type: ignore[arg-type]
    except (ValueError, TypeError) as e:
        raise GrammarError(str(e)) from None


def lark_grammar(lark: str) -> str:
    import llguidance

    return str(llguidance.LLMatcher.grammar_from_lark(lark))


def json_lark(schema: dict[str, Any]) -> str:
    """``%json`` with the compact options, for use inside a Lark grammar."""
    return "%json " + json.dumps({**schema, "x-guidance": _JSON_OPTIONS}, ensure_ascii=False)


class _Vocab:
    """What ``llguidance.TokenizerWrapper`` reads from a tokenizer."""

    def __init__(self, tok: Tokenizer) -> None:
        eog = sorted(tok.eog_ids)
        self.eos_token_id = tok.eos_id if tok.eos_id >= 0 else (eog[0] if eog else 0)
        self.bos_token_id = tok.bos_id if tok.bos_id >= 0 else None
        self.tokens = [tok.token_bytes(i) for i in range(tok.n_vocab)]
        self.special_token_ids = [i for i in range(tok.n_vocab) if tok.is_special(i)]
        self._tok = tok

    def __call__(self, text: str | bytes) -> list[int]:
        s = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        return self._tok.encode(s, add_special=False, parse_special=False)


_CLOSERS = [
    b'"',
    b"}",
    b"]",
    b",",
    b"0",
    b"1",
    b"e",
    b"l",
    b"r",
    b"u",
    b"a",
    b"s",
    b"n",
    b"f",
    b"t",
]  # see the module docstring


class Grammars:
    """llguidance's view of one model's vocabulary (built once per process: a second or so)."""

    def __init__(self, tok: Tokenizer) -> None:
        import llguidance

        self.tok = tok
        self.eog = sorted(tok.eog_ids) or ([tok.eos_id] if tok.eos_id >= 0 else [])
        vocab = _Vocab(tok)
        wrapper = llguidance.TokenizerWrapper(vocab)
        try:  # newer llguidance releases end a grammar on any of the model's end-of-generation tokens
            self.lltok = llguidance.LLTokenizer(wrapper, eos_token=self.eog or None)
        except TypeError:  # older ones (the newest that glibc 2.28 and earlier get) take one token
            self.lltok = llguidance.LLTokenizer(wrapper, eos_token=self.eog[0] if self.eog else None)
        one = {
            b: i
            for i, b in reversed(list(enumerate(vocab.tokens)))
            if len(b) == 1 and i not in vocab.special_token_ids
        }
        self.closers = [one[c] for c in _CLOSERS if c in one]
        self.lengths = np.array([len(b) for b in vocab.tokens], dtype=np.int64)

    def check(self, grammar: str) -> str:
        """'' when the library accepts ``grammar``, else its message."""
        import llguidance

        try:
            return str(llguidance.LLMatcher.validate_grammar(grammar, self.lltok))
        except Exception as e:  # the library raises for a grammar that is not even JSON
            return str(e) or type(e).__name__

    def constraint(self, grammar: str, budget: int = 0) -> Constraint:
        return Constraint(self, grammar, budget)


class Constraint:
    """One request's grammar state: ``mask`` the logits of a step, then ``accept`` the token chosen."""

    def __init__(self, grammars: Grammars, grammar: str, budget: int = 0) -> None:
        """``budget``: the reply's max_tokens (0: no closing at the end; see the module docstring)."""
        import llguidance

        self.g = grammars
        self.budget = budget
        self.reserve = max(8, min(64, budget // 4)) if budget > 0 else 0
        self.n = 0  # tokens accepted
        self.closed_early = False
        self.matcher = llguidance.LLMatcher(grammars.lltok, grammar, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(self.matcher.get_error())
        self.n_vocab = grammars.tok.n_vocab

    def allowed(self) -> np.ndarray:
        """Boolean [n_vocab]: the tokens the grammar allows next (end-of-generation once it is complete)."""
        m = self.matcher
        if m.is_stopped() or m.is_error():
            ok = np.zeros(self.n_vocab, dtype=bool)
        else:
            bits = np.frombuffer(m.compute_bitmask(), dtype=np.uint8)
            n = min(self.n_vocab, bits.size * 8)
            ok = np.unpackbits(bits, count=n, bitorder="little").view(bool)  # a fresh array: writable
            if ok.shape[0] < self.n_vocab:
                ok = np.concatenate([ok, np.zeros(self.n_vocab - ok.shape[0], dtype=bool)])
        if m.is_stopped() or m.is_accepting() or any(ok[t] for t in self.g.eog):
            ok[self.g.eog] = True
            if self.reserve and self.budget - self.n <= self.reserve:
                ok[:] = False  # near the budget's end a complete reply ends here
                ok[self.g.eog] = True
        if not ok.any():  # the grammar is in an error state: end the reply rather than write anything
            ok[self.g.eog] = True
        return ok

    def mask(self, logits: np.ndarray) -> None:
        """Set the logits of forbidden tokens to -inf, in place (near the budget's end: all but one closer)."""
        ok = self.allowed()
        if self.reserve and self.budget - self.n <= self.reserve and not ok[self.g.eog].any():
            pick = next((t for t in self.g.closers if ok[t]), -1)
            if pick < 0 and ok.any():  # no closer allowed (a literal of the grammar): its shortest token
                allowed = np.flatnonzero(ok)
                pick = int(allowed[np.argmin(self.g.lengths[allowed])])
            if pick >= 0:
                self.closed_early = True
                ok = np.zeros_like(ok)
                ok[pick] = True
        logits[~ok] = -np.inf

    def accept(self, token: int) -> bool:
        """Advance past ``token``; False when the grammar did not allow it."""
        if token in self.g.eog:
            return True
        self.n += 1
        return bool(self.matcher.consume_token(int(token)))


_BY_TOKENIZER: dict[int, tuple[Tokenizer, Grammars]] = {}


def grammars_for(tok: Tokenizer) -> Grammars:
    """The ``Grammars`` of a tokenizer, built on first use."""
    held = _BY_TOKENIZER.get(id(tok))
    if held is None or held[0] is not tok:
        held = _BY_TOKENIZER[id(tok)] = (tok, Grammars(tok))
    return held[1]
