"""Read the key/value metadata of a GGUF file (not its tensors), fast.

The tokenizer needs only the metadata: ``tokenizer.ggml.*`` and ``tokenizer.chat_template``. gguf-py's
``GGUFReader`` also parses every tensor and makes one view per array element, which takes seconds for
a 150k-token vocabulary; this reader walks the header once and returns plain Python values (numeric
arrays as NumPy arrays). Layout: magic ``GGUF``, u32 version (2 or 3), u64 tensor count, u64 key/value
count, then each key (u64 length + UTF-8), a u32 value type and the value; little-endian throughout.
"""

from __future__ import annotations

import mmap
import struct
from os import PathLike, fspath
from typing import Any

import numpy as np

__all__ = ["GGUFMetadataError", "read_gguf_metadata"]


class GGUFMetadataError(ValueError):
    """The file is not a GGUF file or its metadata is malformed."""


# GGUF value type id -> (struct format, NumPy dtype) for scalars
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("<B", "<u1"),
    1: ("<b", "<i1"),
    2: ("<H", "<u2"),
    3: ("<h", "<i2"),
    4: ("<I", "<u4"),
    5: ("<i", "<i4"),
    6: ("<f", "<f4"),
    7: ("<?", "<u1"),  # bool, one byte
    10: ("<Q", "<u8"),
    11: ("<q", "<i8"),
    12: ("<d", "<f8"),
}
_STRING = 8
_ARRAY = 9


class _Cursor:
    def __init__(self, buf: Any, path: str) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path

    def take(self, n: int) -> Any:
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFMetadataError(f"{self.path}: metadata runs past the end of the file (truncated?)")
        b = self.buf[self.pos : self.pos + n]
        self.pos += n
        return b

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self.take(size))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        return bytes(self.take(n)).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            v = self.unpack(_SCALARS[vtype][0])
            return bool(v) if vtype == 7 else v
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.unpack("<I")
            count = self.unpack("<Q")
            if etype in _SCALARS:
                dtype = np.dtype(_SCALARS[etype][1])
                raw = self.take(count * dtype.itemsize)
                arr = np.frombuffer(bytes(raw), dtype=dtype)
                return arr.astype(bool) if etype == 7 else arr
            if etype == _STRING:
                return [self.string() for _ in range(count)]
            if etype == _ARRAY:
                return [self.value(_ARRAY) for _ in range(count)]
            raise GGUFMetadataError(f"{self.path}: unknown array element type {etype}")
        raise GGUFMetadataError(f"{self.path}: unknown value type {vtype}")


def read_gguf_metadata(path: str | PathLike[str]) -> dict[str, Any]:
    """All key/value pairs of a GGUF file, plus ``GGUF.version`` and ``GGUF.tensor_count``."""
    p = fspath(path)
    with open(p, "rb") as f:
        try:
            buf: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as e:  # empty file
            raise GGUFMetadataError(f"{p}: not a GGUF file (empty)") from e
    try:
        cur = _Cursor(buf, p)
        if bytes(cur.take(4)) != b"GGUF":
            raise GGUFMetadataError(f"{p}: not a GGUF file (the first bytes are not 'GGUF')")
        version = cur.unpack("<I")
        if version not in (2, 3):
            raise GGUFMetadataError(f"{p}: GGUF version {version} is not supported (2 or 3 are)")
        n_tensors = cur.unpack("<Q")
        n_kv = cur.unpack("<Q")
        out: dict[str, Any] = {"GGUF.version": version, "GGUF.tensor_count": n_tensors}
        for _ in range(n_kv):
            key = cur.string()
            out[key] = cur.value(cur.unpack("<I"))
        return out
    finally:
        buf.close()
