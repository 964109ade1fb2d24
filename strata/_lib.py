"""Finding and loading libstrata.so.

Search order: ``$STRATA_LIB`` (a file), then ``strata/lib/libstrata.so`` next to this package (where
``make native`` and the wheel put it), then ``strata/lib/libstrata.so`` in every site-packages
directory. The error lists every path that was tried and why each failed. ``$STRATA_LIB``, when set, is
the only candidate: a library asked for by name that does not load is an error, never a quiet fallback
to another build (a sanitizer run would otherwise test the ordinary library).
"""

from __future__ import annotations

import ctypes
import os
import site
import sys
import threading
from pathlib import Path

from ._exceptions import LibraryNotFoundError

__all__ = ["candidate_paths", "load_from", "load_library"]

_LIB_NAME = "libstrata.so"
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def candidate_paths() -> list[Path]:
    """Every place the loader looks, in order."""
    paths: list[Path] = []
    env = os.environ.get("STRATA_LIB")
    if env:
        return [Path(env)]
    paths.append(Path(__file__).resolve().parent / "lib" / _LIB_NAME)
    dirs: list[str] = []
    try:
        dirs += site.getsitepackages()
    except AttributeError:  # virtualenvs without getsitepackages
        pass
    user = site.getusersitepackages() if hasattr(site, "getusersitepackages") else None
    if isinstance(user, str):
        dirs.append(user)
    dirs += [p for p in sys.path if p.endswith("site-packages")]
    for d in dirs:
        p = Path(d) / "strata" / "lib" / _LIB_NAME
        if p not in paths:
            paths.append(p)
    return paths


def load_from(paths: list[Path]) -> ctypes.CDLL:
    """Load the first of paths that loads; the error lists every path tried and why it failed."""
    tried: list[str] = []
    for path in paths:
        if not path.is_file():
            tried.append(f"{path} (no such file)")
            continue
        try:
            return ctypes.CDLL(str(path))
        except OSError as e:
            tried.append(f"{path} ({e})")
    raise LibraryNotFoundError(
        "libstrata.so could not be loaded. Tried:\n  "
        + "\n  ".join(tried)
        + (
            "\nSTRATA_LIB names the library to load; unset it to use the package's own build."
            if os.environ.get("STRATA_LIB")
            else "\nBuild it with `make native` (or `pip install .`), or point STRATA_LIB at a built libstrata.so."
        )
    )


def load_library() -> ctypes.CDLL:
    """Load libstrata once per process and declare its functions (see ``_cdefs``)."""
    global _lib
    with _lock:
        if _lib is None:
            lib = load_from(candidate_paths())
            from ._cdefs import declare

            declare(lib)
            _lib = lib
        return _lib
