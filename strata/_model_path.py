"""What is wrong with a path given as a model file, in words (checked before anything opens it).

A model is mapped, so it must be a regular file: a pipe would block the open until something writes
to it, and a device or a folder cannot be mapped. A NUL character cannot be in a path at all (the C
side would read the path only up to it and open another file).
"""

from __future__ import annotations

import os
import stat
from os import PathLike, fspath

__all__ = ["model_path_problem"]

_HINT = "give --model FILE.gguf, or leave --model out for the synthetic tiny model"


def model_path_problem(model: str | PathLike[str], hint: str = _HINT) -> str | None:
    """The problem with ``model`` as a model file, or None when it is an existing regular file."""
    path = fspath(model)
    if "\x00" in path:
        return f"the model path {path!r} holds a NUL character, which no file name can: {hint}"
    try:
        st = os.stat(path)  # stat, not open: it does not block on a pipe
    except FileNotFoundError:
        return f"model file not found: {path} ({hint})"
    except OSError as e:
        return f"cannot read the model file {path}: {e.strerror or e} ({hint})"
    if stat.S_ISDIR(st.st_mode):
        try:
            found = sorted(n for n in os.listdir(path) if n.endswith(".gguf"))[:5]
        except OSError:
            found = []
        inside = f" (it holds {', '.join(found)})" if found else " (it holds no .gguf file)"
        return f"{path} is a folder{inside}: {hint}"
    if not stat.S_ISREG(st.st_mode):
        kind = "a pipe" if stat.S_ISFIFO(st.st_mode) else "a device or a socket"
        return f"{path} is {kind}, not a regular file, and a model file must be mapped: {hint}"
    return None
