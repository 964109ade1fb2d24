"""Reasoning split out of reply text: what a model writes inside ``<think>...</think>`` is its
reasoning, the rest is the answer.

Replies stream in pieces, and a tag can arrive cut across two pieces, so ``ThinkSplitter`` holds back a
tail that could be the start of a tag until the next piece decides it. The server uses it for
``reasoning_format: "deepseek"`` and the chat for servers that send the tags inline.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["THINK_CLOSE", "THINK_OPEN", "Split", "ThinkSplitter"]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


class Split(NamedTuple):
    """One piece of reply text, divided."""

    reasoning: str
    content: str


class ThinkSplitter:
    """Splits streamed reply text into reasoning and content.

    ``inside`` is True when the prompt itself opened the think block (a template that ends the
    generation prompt with ``<think>``), so that the reply starts as reasoning.
    """

    def __init__(self, inside: bool = False) -> None:
        self.inside = inside
        self._held = ""

    def feed(self, text: str) -> Split:
        """The reasoning and content that ``text`` (after what was held back) decides."""
        text, self._held = self._held + text, ""
        reasoning = content = ""
        while text:
            tag = THINK_CLOSE if self.inside else THINK_OPEN
            i = text.find(tag)
            if i >= 0:
                if self.inside:
                    reasoning += text[:i]
                else:
                    content += text[:i]
                text = text[i + len(tag) :]
                self.inside = not self.inside
                continue
            # keep back the longest tail that is a prefix of the tag
            keep = next(
                (n for n in range(min(len(tag) - 1, len(text)), 0, -1) if tag.startswith(text[-n:])), 0
            )
            out, self._held = text[: len(text) - keep], text[len(text) - keep :]
            if self.inside:
                reasoning += out
            else:
                content += out
            break
        return Split(reasoning, content)

    def flush(self) -> Split:
        """What was held back, at the end of the reply (an unfinished tag is plain text)."""
        out, self._held = self._held, ""
        return Split(out, "") if self.inside else Split("", out)
