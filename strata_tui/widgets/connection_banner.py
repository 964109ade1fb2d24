"""A line above the input that says when the server is unreachable and counts down to the next try."""

from __future__ import annotations

import time

from textual.widgets import Static

__all__ = ["ConnectionBanner"]


class ConnectionBanner(Static):
    """Hidden while the server answers."""

    def __init__(self, **kw: object) -> None:
        super().__init__("", **kw)  # type: ignore[arg-type]
        self._error = ""
        self._retry_at: float | None = None
        self.display = False

    def on_mount(self) -> None:
        self.set_interval(0.5, self._tick)

    def show_down(self, error: str, retry_in: float | None) -> None:
        self._error = error
        self._retry_at = None if retry_in is None else time.monotonic() + retry_in
        self.display = True
        self._tick()

    def show_text(self, text: str) -> None:
        self._error = text
        self._retry_at = None
        self.display = True
        self._tick()

    def clear(self) -> None:
        self.display = False
        self._error = ""
        self._retry_at = None

    def _tick(self) -> None:
        if not self.display:
            return
        if self._retry_at is None:
            self.update(self._error)
            return
        left = max(0, round(self._retry_at - time.monotonic()))
        when = f"retrying in {left} s" if left > 0 else "retrying now"
        self.update(f"{self._error} — {when}")
