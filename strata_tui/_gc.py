"""Full garbage collections at quiet moments, not in the middle of a streamed reply.

CPython's full (oldest generation) collection walks every object the process holds: with a long reply
on the screen that is 100-300 ms on a busy machine, long enough to freeze the stream and hold back the
keys typed meanwhile. So the objects made while the chat starts (modules, styles, the first screen)
are frozen once, and no collection walks them again; the automatic full collection is switched off,
and the chat runs one itself when it is quiet: no reply streaming and no key for ``QUIET_S`` seconds,
and only when one would have been due. Young collections (a few milliseconds) run as before.
Everything is put back when the chat closes.
"""

from __future__ import annotations

import gc

__all__ = ["QuietCollector"]

QUIET_S = 1.0
_OFF = 1 << 30  # a threshold for the oldest generation that is never reached


class QuietCollector:
    """Owns the collector's settings while the app runs."""

    def __init__(self) -> None:
        self._saved: tuple[int, int, int] | None = None
        self.full_runs = 0

    @property
    def active(self) -> bool:
        return self._saved is not None

    def start(self) -> None:
        """Freeze what exists now and take over the full collections (call once the UI is up)."""
        if self._saved is not None:
            return
        self._saved = gc.get_threshold()
        gc.collect()
        gc.freeze()
        t0, t1, _ = self._saved
        gc.set_threshold(t0, t1, _OFF)

    def due(self) -> bool:
        """Whether CPython would have run a full collection by now."""
        return self._saved is not None and gc.get_count()[2] >= max(1, self._saved[2])

    def collect_if_due(self) -> bool:
        """Run the full collection when one is due (call it when the app is quiet)."""
        if not self.due():
            return False
        gc.collect()
        self.full_runs += 1
        return True

    def stop(self) -> None:
        """Give the collector back its own settings."""
        if self._saved is None:
            return
        gc.set_threshold(*self._saved)
        gc.unfreeze()
        self._saved = None
