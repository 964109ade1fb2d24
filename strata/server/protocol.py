"""The framed protocol between the server and its engine worker.

Each message is one JSON object, UTF-8, preceded by its length as a 4-byte big-endian unsigned
integer. The server writes commands to the worker's stdin; the worker writes events to its own copy
of the original stdout (its file descriptor 1 is pointed at stderr, so that anything printed by the
native library lands in the engine log instead of corrupting the stream).

Commands (server -> worker), field ``op``:
    generate   a ``GenerateCommand`` (its fields are documented there)
    cancel     {"op": "cancel"}: stop the running generate after at most one more token
    shutdown   {"op": "shutdown"}: close the engine and exit
Events (worker -> server), field ``ev``:
    ready         {"pid", "info", "plan", "devices", "stats"}   the engine is open (devices: each device's
                                                        layers, plan and counters; one without a split)
    start_failed  {"error", "status", "message"}        the engine did not open (the worker then exits)
    heartbeat     {}                                    the worker is alive (every ``--heartbeat`` seconds)
    progress      {"done", "total", "stats"}            prompt progress
    token         {"id", "logprob"?, "top_logprobs"?, "stats"?}   one generated token
    done          {"tokens", "finish_reason", "prompt_tokens", "prompt_ms", "decode_ms", "margins",
                   "stats", "delta", "cancel_seen_at", "cached_tokens", "closed_early"}
    error         {"error", "status", "message", "stats"}  the engine reported a failure
"""

from __future__ import annotations

import dataclasses
import json
import struct
from dataclasses import dataclass, field
from typing import IO, Any

__all__ = [
    "MAX_FRAME",
    "GenerateCommand",
    "ProtocolError",
    "decode_frame",
    "encode_frame",
    "frame_length",
    "read_frame",
    "write_frame",
]

MAX_FRAME = 256 << 20  # no message is near this; a larger length means the stream is corrupt
_HEADER = struct.Struct(">I")


class ProtocolError(RuntimeError):
    """The byte stream is not a sequence of frames."""


@dataclass
class GenerateCommand:
    """One generation, as the server hands it to the worker (``op: "generate"``)."""

    prompt: list[int]  # the prompt's token ids, BOS included where the model wants one
    max_tokens: int  # tokens to generate at most; the server has already fitted it to the context
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    seed: int = 0  # the sampler's seed (64 bits)
    stop_tokens: list[int] = field(default_factory=list)  # token ids that end the reply (not included in it)
    stop_at_eos: bool = True  # the model's end-of-generation tokens end the reply
    logprobs: bool = False  # send the chosen token's log-probability with each token
    top_logprobs: int = 0  # and the log-probabilities of this many most likely tokens
    top_logits: int = 2  # highest logits the engine keeps per token (2: the top-2 margins in the result)
    cache_prompt: bool = False  # keep the part of the KV cache that the prompt shares with what it holds
    cache_scope: str = ""  # the client the request came from: a prefix is reused only within one scope
    grammar: str = ""  # an llguidance grammar the reply must follow (strata.grammar); "" for none

    def to_message(self) -> dict[str, Any]:
        return {"op": "generate", **dataclasses.asdict(self)}

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> GenerateCommand:
        """The command in a ``generate`` frame (raises ProtocolError for a field it does not know)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        args = {k: v for k, v in msg.items() if k != "op"}
        unknown = sorted(set(args) - fields)
        if unknown:
            raise ProtocolError(f"generate: unknown fields {', '.join(unknown)}")
        try:
            return cls(**args)
        except TypeError as e:
            raise ProtocolError(f"generate: {e}") from None


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
        raise ProtocolError(
            f"frame of {n} bytes is larger than the limit ({MAX_FRAME}); the stream is corrupt"
        )
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
