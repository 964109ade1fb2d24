"""Malformed GGUF files: each gets an error status and a message, never a crash.

A small valid qwen3moe file is written with GGUFWriter, then truncated and mutated: the magic, the
version, the counts, string lengths, tensor offsets, dimensions and types, random header bytes, a
missing tensor and an unknown architecture. Every case either opens (the damage hit something
harmless) or raises a StrataError carrying a status and a message; the process never dies. Runs under
AddressSanitizer too (`make test-asan`), where an out-of-bounds read would abort the run.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from _gguf_helper import TinyConfig, write_qwen3moe
from gguf import GGUFReader, GGUFWriter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata import EngineConfig, StrataError
from strata._engine import Engine

pytestmark = pytest.mark.asan

SMALL = TinyConfig(
    n_embd=32,
    n_layer=1,
    n_head=2,
    n_head_kv=1,
    head_dim=16,
    n_expert=4,
    n_expert_used=2,
    n_ff_exp=32,
    n_vocab=64,
)
CFG = EngineConfig(threads=1, max_context=64)
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def valid(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, GGUFReader, Path]:
    path = write_qwen3moe(tmp_path_factory.mktemp("fuzz") / "valid.gguf", SMALL)
    return path.read_bytes(), GGUFReader(path), path.parent


def open_bytes(data: bytes, folder: Path, name: str = "case.gguf") -> Engine | StrataError:
    """Open data as a model; return the engine (after one decode step) or the error raised."""
    path = folder / name
    path.write_bytes(data)
    try:
        eng = Engine(path, CFG)
    except StrataError as e:
        assert e.status in (2, 3, 4), f"unexpected status {e.status}: {e}"
        assert str(e).strip(), "an error without a message"
        return e
    with eng:
        eng.decode(1)
        eng.logits()  # damaged values may give inf or nan logits; reading them must not crash
    return eng


def expect_error(data: bytes, folder: Path, *words: str) -> StrataError:
    r = open_bytes(data, folder)
    assert isinstance(r, StrataError), "a damaged file opened without an error"
    for w in words:
        assert w in str(r), f"message {str(r)!r} does not mention {w!r}"
    return r


def tensor_part_offsets(reader: GGUFReader, index: int) -> dict[str, int]:
    """Byte offsets of one tensor info's parts: name_len, name, n_dims, dims, type, offset."""
    f = reader.tensors[index].field
    pos, out = f.offset, {}
    for key, part in zip(("name_len", "name", "n_dims", "dims", "type", "offset"), f.parts, strict=True):
        out[key] = pos
        pos += part.nbytes
    return out


def test_valid_file_opens(valid: tuple[bytes, GGUFReader, Path]) -> None:
    data, _, folder = valid
    assert isinstance(open_bytes(data, folder), Engine)


def test_bad_magic(valid: tuple[bytes, GGUFReader, Path]) -> None:
    data, _, folder = valid
    expect_error(b"GGML" + data[4:], folder, "not a GGUF file")


@pytest.mark.parametrize("version", [0, 1, 4, 0x03000000, 0xFFFFFFFF])
def test_bad_version(valid: tuple[bytes, GGUFReader, Path], version: int) -> None:
    data, _, folder = valid
    expect_error(data[:4] + struct.pack("<I", version) + data[8:], folder, "version")


@pytest.mark.parametrize("field,value", [(8, 2**63), (8, 10**6), (16, 2**40), (16, 10**5), (8, 0)])
def test_bad_counts(valid: tuple[bytes, GGUFReader, Path], field: int, value: int) -> None:
    data, _, folder = valid
    expect_error(data[:field] + struct.pack("<Q", value) + data[field + 8 :], folder)


@pytest.mark.parametrize("value", [2**64 - 1, 2**32, 10**7])
def test_bad_string_length(valid: tuple[bytes, GGUFReader, Path], value: int) -> None:
    data, _, folder = valid
    # the first metadata key's length sits right after the 24-byte header
    expect_error(data[:24] + struct.pack("<Q", value) + data[32:], folder, "claims")


def test_bad_tensor_offset(valid: tuple[bytes, GGUFReader, Path]) -> None:
    data, reader, folder = valid
    off = tensor_part_offsets(reader, 0)["offset"]
    for value in (2**63, len(data), 3):
        expect_error(data[:off] + struct.pack("<Q", value) + data[off + 8 :], folder, "token_embd.weight")


def test_bad_dims_and_types(valid: tuple[bytes, GGUFReader, Path]) -> None:
    data, reader, folder = valid
    parts = tensor_part_offsets(reader, 0)
    d = parts["dims"]
    for value in (0, 2**62, 33):
        expect_error(data[:d] + struct.pack("<Q", value) + data[d + 8 :], folder)
    n = parts["n_dims"]
    for value in (0, 5, 2**31):
        expect_error(data[:n] + struct.pack("<I", value) + data[n + 4 :], folder)
    t = parts["type"]
    for value in (5, 99, 2**31, 12):  # a removed type id, unknown ids, a K-quant row that is not 256-aligned
        expect_error(data[:t] + struct.pack("<I", value) + data[t + 4 :], folder)


def test_truncated_everywhere_quick(valid: tuple[bytes, GGUFReader, Path]) -> None:
    data, reader, folder = valid
    end = max(t.data_offset + t.n_bytes for t in reader.tensors)
    for cut in list(range(0, 64, 3)) + list(range(64, end, max(1, end // 97))):
        r = open_bytes(data[:cut], folder)
        assert isinstance(r, StrataError), f"a file cut at {cut} of {end} bytes opened"


@FUZZ
@given(cut=st.integers(min_value=0))
def test_truncation(valid: tuple[bytes, GGUFReader, Path], cut: int) -> None:
    data, reader, folder = valid
    end = max(t.data_offset + t.n_bytes for t in reader.tensors)
    cut = cut % (len(data) + 1)
    r = open_bytes(data[:cut], folder)
    if cut < end:
        assert isinstance(r, StrataError)


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 2**20), st.integers(0, 255)), min_size=1, max_size=8))
def test_random_header_bytes(valid: tuple[bytes, GGUFReader, Path], edits: list[tuple[int, int]]) -> None:
    raw, reader, folder = valid
    header_end = int(reader.tensors[0].data_offset)  # tensor data starts after the header and infos
    buf = bytearray(raw)
    for pos, byte in edits:
        buf[pos % header_end] = byte
    open_bytes(bytes(buf), folder)


ADVERSARIAL = [2**64 - 1, 2**63, 2**32 - 1, 2**32 + 7, 2**31, 2**31 - 1]


@FUZZ
@given(
    index=st.integers(0, 2**16),
    key=st.sampled_from(["name_len", "n_dims", "dims", "type", "offset"]),
    value=st.one_of(st.integers(0, 300), st.sampled_from(ADVERSARIAL)),
)
def test_random_integer_fields(
    valid: tuple[bytes, GGUFReader, Path], index: int, key: str, value: int
) -> None:
    """Overwrite one whole count, length, dimension, type or offset with an adversarial value."""
    raw, reader, folder = valid
    parts = tensor_part_offsets(reader, index % len(reader.tensors))
    width = 4 if key in ("n_dims", "type") else 8
    value %= 2 ** (8 * width)
    pos = parts[key]
    fmt = "<I" if width == 4 else "<Q"
    open_bytes(raw[:pos] + struct.pack(fmt, value) + raw[pos + width :], folder)


def _rewrite(src: GGUFReader, path: Path, *, drop: str | None = None, arch: str | None = None) -> Path:
    """Copy a file through GGUFWriter, leaving out one tensor or changing the architecture."""
    w = GGUFWriter(str(path), arch or "qwen3moe")
    for f in src.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        if f.name.startswith("qwen3moe.") and arch:
            name = arch + f.name[len("qwen3moe") :]
        else:
            name = f.name
        val = f.contents()
        w.add_key_value(name, val, f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)
    for t in src.tensors:
        if t.name == drop:
            continue
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(
    "name", ["token_embd.weight", "blk.0.attn_k_norm.weight", "blk.0.ffn_down_exps.weight"]
)
def test_missing_tensor(valid: tuple[bytes, GGUFReader, Path], name: str) -> None:
    _, reader, folder = valid
    path = _rewrite(reader, folder / "missing.gguf", drop=name)
    expect_error(path.read_bytes(), folder, name)


def test_missing_output_means_tied(valid: tuple[bytes, GGUFReader, Path]) -> None:
    _, reader, folder = valid
    path = _rewrite(reader, folder / "tied.gguf", drop="output.weight")
    with Engine(path, CFG) as eng:
        assert eng.info.tied_embeddings == 1


def test_unknown_architecture(valid: tuple[bytes, GGUFReader, Path]) -> None:
    _, reader, folder = valid
    path = _rewrite(reader, folder / "arch.gguf", arch="llama4moe")
    e = expect_error(path.read_bytes(), folder, "llama4moe", "qwen3moe")
    assert e.status == 4


def test_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(StrataError) as ei:
        Engine(tmp_path / "does-not-exist.gguf", CFG)
    assert "does-not-exist.gguf" in str(ei.value) and ei.value.status == 2
    with pytest.raises(StrataError):
        Engine(tmp_path, CFG)
