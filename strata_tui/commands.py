"""Every key and every slash command of the chat, in one table (the help screen reads it from here)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KEYS", "SLASH_COMMANDS", "SlashCommand", "parse_slash"]

# (key, what it does); the screen's bindings are built from the first block
SCREEN_KEYS: list[tuple[str, str, str, str]] = [
    # (key, action, footer label, what it does)
    ("escape", "cancel", "Cancel", "Cancel the reply in flight (the server stops generating)"),
    ("ctrl+n", "new_conversation", "New", "New conversation"),
    ("ctrl+r", "regenerate", "Regenerate", "Regenerate the last reply"),
    ("ctrl+l", "edit_last", "Edit last", "Edit the last message and send it again"),
    ("f5", "copy_last", "Copy reply", "Copy the last reply (OSC 52: works over SSH)"),
    ("ctrl+o", "export", "Export", "Export the conversation to Markdown"),
    ("ctrl+t", "toggle_thinking", "Thinking", "Thinking on/off for this conversation"),
    ("f2", "rename", "Rename", "Rename the conversation"),
    ("f3", "settings", "Settings", "System prompt and sampling settings of the conversation"),
    ("f8", "delete", "Delete", "Delete the conversation"),
    ("ctrl+f", "search", "Search", "Search conversations"),
    ("ctrl+b", "toggle_sidebar", "Sidebar", "Show/hide the conversation list"),
    ("ctrl+g", "toggle_engine", "Engine", "Show/hide the engine panel"),
    ("f1", "help", "Help", "This help"),
]

KEYS: list[tuple[str, str]] = [
    ("enter", "Send the message"),
    ("ctrl+j / shift+enter / alt+enter", "New line in the message (--newline-key changes it)"),
    ("up", "In an empty message box: recall the last message sent"),
    *[(k, d) for k, _a, _l, d in SCREEN_KEYS],
    ("ctrl+p", "Command palette"),
    ("tab / shift+tab", "Move between the message box, the messages and the sidebar"),
    ("c (on a message)", "Copy that message"),
    ("e (on a message)", "Edit that message and send it again"),
    ("r (on a reply)", "Regenerate from that reply"),
    ("t (on a reply)", "Show/hide its reasoning"),
    ("pageup / pagedown", "Scroll the conversation"),
    ("ctrl+q", "Quit (stops the server the chat started)"),
]


@dataclass(frozen=True)
class SlashCommand:
    name: str
    args: str
    help: str


SLASH_COMMANDS: list[SlashCommand] = [
    SlashCommand("/new", "[TITLE]", "start a new conversation"),
    SlashCommand("/rename", "TITLE", "rename this conversation"),
    SlashCommand("/delete", "", "delete this conversation"),
    SlashCommand("/system", "[TEXT|off]", "set the system prompt (no text: open the settings)"),
    SlashCommand("/temp", "X|default", "sampling temperature"),
    SlashCommand("/top-p", "X|default", "nucleus sampling threshold"),
    SlashCommand("/max-tokens", "N|default", "most tokens in a reply"),
    SlashCommand("/seed", "N|default", "sampling seed"),
    SlashCommand("/think", "[on|off]", "thinking on or off (no argument: toggle)"),
    SlashCommand("/settings", "", "open the system prompt and sampling settings"),
    SlashCommand("/export", "[FILE]", "write the conversation as Markdown"),
    SlashCommand("/copy", "", "copy the last reply"),
    SlashCommand("/regen", "", "regenerate the last reply"),
    SlashCommand("/edit", "", "edit the last message and send it again"),
    SlashCommand("/search", "TEXT", "search conversations"),
    SlashCommand("/model", "[NAME]", "show the server and model, or pick a model the server offers"),
    SlashCommand("/reconnect", "", "try the server again now (restarts the server this chat started)"),
    SlashCommand("/help", "", "keys and commands"),
    SlashCommand("/quit", "", "quit"),
]


def parse_slash(text: str) -> tuple[str, str] | None:
    """``"/temp 0.7"`` -> ``("/temp", "0.7")``; None when the text is not a command."""
    t = text.strip()
    if not t.startswith("/") or t.startswith("//"):
        return None
    name, _, rest = t.partition(" ")
    return name.lower(), rest.strip()
