"""Split GGUF models (NAME-00001-of-0000N.gguf ...): written as gguf-py's writer and llama.cpp's gguf-split
lay them out, opened by the engine as one model with logits bit-identical to the unsplit file's, and a
bad or missing part named in the error.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter

from strata import Engine, EngineConfig
from strata._exceptions import StrataError
from strata.cli import main
from strata.model import ensure_model
from strata.model._split import SplitError, parse_size, part_names, split_model

# the engine's split reader runs under the sanitizers too (make test-asan)
pytestmark = pytest.mark.asan

PROMPT = [int(t) for t in np.random.default_rng(3).integers(10, 2000, size=70)]


@pytest.fixture(scope="module")
def unsplit() -> Path:
    return Path(ensure_model("tiny"))


@pytest.fixture(scope="module")
def parts(unsplit: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return split_model(unsplit, tmp_path_factory.mktemp("split") / "tiny.gguf", max_tensors=10)


def _copy(parts: list[Path], tmp_path: Path) -> list[Path]:
    out = []
    for p in parts:
        out.append(tmp_path / p.name)
        shutil.copyfile(p, out[-1])
    return out


def _fields(path: Path) -> dict[str, object]:
    r = GGUFReader(str(path))
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def test_parts_are_laid_out_as_gguf_split_writes_them(unsplit: Path, parts: list[Path]) -> None:
    src = GGUFReader(str(unsplit))
    n = len(parts)
    assert n == 6 and [p.name for p in parts] == [f"tiny-{k:05d}-of-00006.gguf" for k in range(1, 7)]
    whole = {k: v for k, v in _fields(unsplit).items()}
    seen: dict[str, bytes] = {}
    for i, p in enumerate(parts):
        f = _fields(p)
        assert (f["split.no"], f["split.count"], f["split.tensors.count"]) == (i, n, len(src.tensors))
        # the metadata is in the first part only
        rest = {k: v for k, v in f.items() if not k.startswith("split.")}
        assert rest == whole if i == 0 else rest == {}
        for t in GGUFReader(str(p)).tensors:
            seen[t.name] = bytes(t.data.tobytes())
    assert {t.name: bytes(t.data.tobytes()) for t in src.tensors} == seen


def _steps(path: Path, cfg: EngineConfig, n: int = 12) -> tuple[list[int], list[np.ndarray]]:
    """Greedy decode with the logits of every step."""
    toks, logits = [], []
    with Engine(path, cfg) as eng:
        eng.prefill(PROMPT)
        for _ in range(n):
            lg = eng.logits().copy()
            logits.append(lg)
            toks.append(int(lg.argmax()))
            eng.decode(toks[-1])
        eng.kv_reset()
        reply = eng.generate(PROMPT, max_tokens=n, stop_at_eos=False).tokens
    return toks + list(reply), logits


@pytest.mark.parametrize(
    "cfg",
    [
        EngineConfig(),
        # a cache of a few slots: experts are copied from the parts' mappings on every miss
        EngineConfig(vram_budget=64 << 20, expert_cache="12", miss="copy", prefill="16"),
    ],
    ids=["default", "small-cache"],
)
def test_split_model_decodes_bit_for_bit_as_the_unsplit_file(
    unsplit: Path, parts: list[Path], cfg: EngineConfig
) -> None:
    want_toks, want = _steps(unsplit, cfg)
    got_toks, got = _steps(parts[0], cfg)
    assert got_toks == want_toks
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"logits differ at step {i}"
    with Engine(parts[0]) as a, Engine(unsplit) as b:
        assert a.info.n_params == b.info.n_params
        assert a.info.file_bytes == sum(p.stat().st_size for p in parts)


def _error(path: Path) -> str:
    with pytest.raises(StrataError) as e:
        Engine(path)
    return str(e.value)


def test_a_missing_part_is_named(parts: list[Path], tmp_path: Path) -> None:
    mine = _copy(parts, tmp_path)
    mine[3].unlink()
    msg = _error(mine[0])
    assert f"part 4 of 6 of the split model {mine[0]}" in msg and str(mine[3]) in msg
    assert "No such file" in msg


def test_opening_a_later_part_names_the_first(parts: list[Path]) -> None:
    msg = _error(parts[2])
    assert f"{parts[2]} is part 3 of 6 of a split model: open its first part, {parts[0]}" in msg


def test_a_renamed_first_part_says_the_names_matter(parts: list[Path], tmp_path: Path) -> None:
    first = tmp_path / "model.gguf"
    shutil.copyfile(parts[0], first)
    msg = _error(first)
    assert "is the first of 6 parts of a split model" in msg and "-00001-of-00006.gguf" in msg


def _rewrite(src: Path, dst: Path, **split: int) -> None:
    """A copy of part src with its split keys (and optionally one tensor's name) changed."""
    r = GGUFReader(str(src))
    rename = split.pop("rename_to", None)
    w = GGUFWriter(dst, "qwen3moe")
    w.add_uint16("split.no", split.get("no", int(r.fields["split.no"].contents())))
    w.add_uint16("split.count", split.get("count", int(r.fields["split.count"].contents())))
    w.add_int32("split.tensors.count", split.get("tensors", int(r.fields["split.tensors.count"].contents())))
    for i, t in enumerate(r.tensors):
        name = rename if (rename and i == 0) else t.name
        w.add_tensor_info(name, t.data.shape, t.data.dtype, int(t.n_bytes), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in r.tensors:
        w.write_tensor_data(t.data)
    w.close()


@pytest.mark.parametrize(
    "change,words",
    [
        ({"count": 3}, "says its model has 3 parts (split.count) but the first part"),
        ({"no": 4}, "says it is part 5 (split.no = 4) but its name makes it part 2 of 6"),
        ({"tensors": 99}, "belongs to another model: it counts 99 tensors over all parts"),
        ({"rename_to": "token_embd.weight"}, "tensor 'token_embd.weight' is in two of its parts"),
    ],
    ids=["count", "number", "other-model", "duplicate-tensor"],
)
def test_a_part_of_another_split_is_named(
    parts: list[Path], tmp_path: Path, change: dict[str, object], words: str
) -> None:
    mine = _copy(parts, tmp_path)
    if "rename_to" in change:  # token_embd.weight is in the first part
        assert "token_embd.weight" in {t.name for t in GGUFReader(str(mine[0])).tensors}
    _rewrite(parts[1], mine[1], **change)  # type: ignore[arg-type]
    msg = _error(mine[0])
    assert words in msg, msg
    if "rename_to" not in change:
        assert str(mine[1]) in msg


def test_a_part_with_fewer_tensors_is_caught_by_the_total(parts: list[Path], tmp_path: Path) -> None:
    mine = _copy(parts, tmp_path)
    r = GGUFReader(str(parts[1]))
    w = GGUFWriter(mine[1], "qwen3moe")  # part 2 with only its first tensor
    w.add_uint16("split.no", 1)
    w.add_uint16("split.count", 6)
    w.add_int32("split.tensors.count", int(r.fields["split.tensors.count"].contents()))
    t = r.tensors[0]
    w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    msg = _error(mine[0])
    assert f"its 6 parts hold {51 - len(r.tensors) + 1} tensors but split.tensors.count says 51" in msg


def test_a_plain_file_in_place_of_a_part_is_named(unsplit: Path, parts: list[Path], tmp_path: Path) -> None:
    mine = _copy(parts, tmp_path)
    shutil.copyfile(unsplit, mine[1])
    msg = _error(mine[0])
    assert f"{mine[1]} is not a part of a split model (it has no split.count)" in msg


def test_parse_size() -> None:
    assert parse_size("512M") == 512 << 20 and parse_size("2G") == 2 << 30 and parse_size("4096") == 4096
    assert parse_size("1.5K") == 1536 and parse_size("3MiB") == 3 << 20
    for bad in ("", "M", "-1G", "1Q", "0"):
        with pytest.raises(SplitError):
            parse_size(bad)


def test_model_make_and_split_write_split_models(
    unsplit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "made.gguf"
    assert main(["model", "make", "--out", str(out), "--split-max-size", "1M"]) == 0
    first = Path(capsys.readouterr().out.strip().splitlines()[-1])
    made = sorted(tmp_path.glob("made-*.gguf"))
    assert first == made[0] and not out.exists()  # the parts replace the file written to --out
    assert made == part_names(out, len(made)) and len(made) >= 3
    for p in made:
        r = GGUFReader(str(p))
        assert sum(int(t.n_bytes) for t in r.tensors) <= 1 << 20 or len(r.tensors) == 1
    # the maker is deterministic: the split of the made file computes what the cached tiny model does
    assert _steps(first, EngineConfig(), 4)[0] == _steps(unsplit, EngineConfig(), 4)[0]

    assert main(["model", "split", str(unsplit), str(tmp_path / "s.gguf"), "--split-max-tensors", "20"]) == 0
    assert Path(capsys.readouterr().out.strip()) == tmp_path / "s-00001-of-00003.gguf"
    assert main(["model", "split", str(first), "--split-max-tensors", "2"]) == 1
    assert "is already one part of a split model" in capsys.readouterr().err
    assert main(["model", "split", str(unsplit), str(tmp_path / "t.gguf")]) == 1
    assert "give a limit per part" in capsys.readouterr().err


def test_model_info_describes_every_part(unsplit: Path, parts: list[Path], tmp_path: Path) -> None:
    from strata.model.cli import describe

    whole, split = describe(unsplit), describe(parts[0])
    assert split["parts"] == [str(p) for p in parts] and whole["parts"] == [str(unsplit)]
    for k in ("tensors", "resident_bytes", "expert_bytes_per_layer", "dimensions", "vocab_size"):
        assert split[k] == whole[k], k
    renamed = tmp_path / "model.gguf"
    shutil.copyfile(parts[0], renamed)
    with pytest.raises(SplitError, match="-00001-of-00006.gguf, so the other parts cannot be found"):
        describe(renamed)
