"""Text from a model or a user made safe to draw: no control character reaches the terminal raw.

A terminal acts on control characters wherever they appear: C0 (ESC starts a sequence that can move
the cursor, retitle the window or write to the clipboard) and C1, U+0080..U+009F (U+009B is a one-byte
CSI on terminals that read 8-bit controls). Rich keeps most of them in a text, so every text the chat
did not write itself is passed through ``printable`` before it is drawn; it shows each such character
as a visible escape (``\\x9b``). Tab and newline stay; the stored text is unchanged (copy and export
give it back as it was).
"""

from __future__ import annotations

import re

__all__ = ["printable"]

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with every C0 control but tab and newline, DEL and every C1 control shown as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
