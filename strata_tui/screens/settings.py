"""A conversation's system prompt and sampling settings."""

from __future__ import annotations

from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.widgets import Button, Input, Label, Static, Switch, TextArea

from .._compositor import RepaintingModalScreen
from ..store import Settings

__all__ = ["SettingsResult", "SettingsScreen", "parse_optional"]


@dataclass
class SettingsResult:
    system_prompt: str
    settings: Settings


def parse_optional(
    text: str, kind: type, name: str, lo: float | None = None, hi: float | None = None
) -> float | int | None:
    """``""`` or ``default`` -> None; otherwise a number of ``kind`` in [lo, hi], or ValueError naming the field."""
    t = text.strip().lower()
    if t in ("", "default", "none", "off"):
        return None
    try:
        v = kind(t)
    except ValueError:
        raise ValueError(f"{name}: {text!r} is not a{'n integer' if kind is int else ' number'}") from None
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ValueError(f"{name}: {v} is outside {lo}..{hi}")
    return v  # type: ignore[no-any-return]


class SettingsScreen(RepaintingModalScreen[SettingsResult | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save")]

    def __init__(self, system_prompt: str, settings: Settings) -> None:
        super().__init__()
        self.system_prompt = system_prompt
        self.settings = settings

    def compose(self) -> ComposeResult:
        s = self.settings

        def v(x: object) -> str:
            return "" if x is None else str(x)

        with Vertical(classes="dialog settings"):
            yield Static("System prompt", classes="dialog-title")
            yield TextArea(self.system_prompt, id="system", soft_wrap=True)
            with Grid(id="sampling"):
                yield Label("temperature")
                yield Input(v(s.temperature), placeholder="default", id="temperature")
                yield Label("top-p")
                yield Input(v(s.top_p), placeholder="default", id="top_p")
                yield Label("max tokens")
                yield Input(v(s.max_tokens), placeholder="default", id="max_tokens")
                yield Label("seed")
                yield Input(v(s.seed), placeholder="default", id="seed")
                yield Label("thinking")
                yield Switch(s.thinking, id="thinking")
            yield Static("", id="settings-error")
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def _value(self, wid: str) -> str:
        return self.query_one(f"#{wid}", Input).value

    def action_save(self) -> None:
        try:
            settings = Settings(
                temperature=parse_optional(self._value("temperature"), float, "temperature", 0.0, 5.0),  # type: ignore[arg-type]
                top_p=parse_optional(self._value("top_p"), float, "top-p", 0.0, 1.0),  # type: ignore[arg-type]
                max_tokens=parse_optional(self._value("max_tokens"), int, "max tokens", 1, None),  # type: ignore[arg-type]
                seed=parse_optional(self._value("seed"), int, "seed", 0, None),  # type: ignore[arg-type]
                thinking=self.query_one("#thinking", Switch).value,
            )
        except ValueError as e:
            self.query_one("#settings-error", Static).update(str(e))
            return
        self.dismiss(SettingsResult(self.query_one("#system", TextArea).text, settings))

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#save")
    def _save(self) -> None:
        self.action_save()

    @on(Button.Pressed, "#cancel")
    def _cancel(self) -> None:
        self.dismiss(None)
