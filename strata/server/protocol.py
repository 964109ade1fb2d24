"""The framed protocol between the server and its engine worker.

Each message is one JSON object, UTF-8, preceded by its length as a 4-byte big-endian unsigned
integer. The server writes commands to the worker's stdin; the worker writes events to its own copy
of the original stdout (its file descriptor 1 is pointed at stderr, so that anything printed by the
native library lands in the engine log instead of corrupting the stream).

Commands (server -> worker), field ``op``:
    generate   {"op": "generate", "prompt": [ids], "max_tokens", "temperature", "top_k", "top_p",
                "min_p", "seed", "stop_tokens": [ids], "top_logits": 2, "logprobs": int}
    cancel     {"op": "cancel"}: stop the running generate after at most one more token
    shutdown   {"op": "shutdown"}
Events (worker -> server), field ``ev``:
    ready         {"pid", "info", "plan", "stats"}     the engine is open
    start_failed  {"error", "status", "message"}        the engine did not open (the worker then exits)
    progress      {"done", "total", "stats"}            prompt progress
    token         {"id", "logprob"?, "top_logprobs"?}   one generated token
    stats         {"stats"}                             counters while generating
    done          {"tokens", "finish_reason", "prompt_tokens", "prompt_ms", "decode_ms", "margins",
                   "stats", "delta", "cancel_seen_at"}
    error         {"error", "status", "message", "stats"}  the engine reported a failure
"""

from __future__ import annotations

import json
import struct
from typing import IO, Any

__all__ = ["MAX_FRAME", "ProtocolError", "decode_frame", "encode_frame", "frame_length", "read_frame", "write_frame"]

MAX_FRAME = 256 << 20  # no message is near this; a larger length means the stream is corrupt
_HEADER = struct.Struct(">I")


class ProtocolError(RuntimeError):
    """The byte stream is not a sequence of frames."""


def encode_frame(msg: dict[str, Any]) -> bytes:
    data = json.dumps(msg, separators=(",", ":")).encode("utf-8")
    return _HEADER.pack(len(data)) + data


def decode_frame(data: bytes) -> dict[str, Any]:
    msg = json.loads(data.decode("utf-8"))
    if not isinstance(msg, dict):
        raise ProtocolError("a frame must hold a JSON object")
    return msg


def frame_length(header: bytes) -> int:
    (n,) = _HEADER.unpack(header)
    if n > MAX_FRAME:
        raise ProtocolError(f"frame of {n} bytes is larger than the limit ({MAX_FRAME}); the stream is corrupt")
    return int(n)


def _read_exact(f: IO[bytes], n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def read_frame(f: IO[bytes]) -> dict[str, Any] | None:
    """The next message, or None at end of stream (a partial frame at the end is also the end)."""
    header = _read_exact(f, _HEADER.size)
    if header is None:
        return None
    data = _read_exact(f, frame_length(header))
    if data is None:
        return None
    return decode_frame(data)


def write_frame(f: IO[bytes], msg: dict[str, Any]) -> None:
    f.write(encode_frame(msg))
    f.flush()
