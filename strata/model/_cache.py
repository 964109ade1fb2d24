"""Where made models and trained tokenizers are kept, and how files are published atomically."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "cache_dir", "file_lock"]


def cache_dir(sub: str = "") -> Path:
    """The strata cache folder (``STRATA_CACHE_DIR`` overrides the user cache dir), created."""
    env = os.environ.get("STRATA_CACHE_DIR")
    if env:
        base = Path(env).expanduser()
    else:
        import platformdirs

        base = Path(platformdirs.user_cache_dir("strata", appauthor=False))
    d = base / sub if sub else base
    d.mkdir(parents=True, exist_ok=True)
    return d


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (created if missing), held for the with-block.

    Several processes (parallel test runs) asking for the same model wait here instead of making it
    twice; readers never need the lock because files appear only by an atomic rename.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextlib.contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """A temporary path beside ``final``; renamed onto it when the block succeeds, removed otherwise."""
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".part", dir=final.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp makes 0600; a cached model is readable like any file
    try:
        yield tmp_path
        os.replace(tmp_path, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise
