"""Matrix declarations: TOML and flags, ranges, validation, shards."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro_matrix import Matrix, MatrixError, load_matrix, shard_cells
from repro_matrix._matrix import expand_values, prompt_length_for_chunk


def test_ranges_and_lists_expand_in_order():
    assert expand_values("expert_cache", [900, 905, "910..915"]) == [900, 905, 910, 911, 912, 913, 914, 915]
    assert expand_values("expert_cache", "40..60:10") == [40, 50, 60]
    assert expand_values("prefill", ["auto", 4096]) == ["auto", 4096]
    assert expand_values("expert_cache", "1,2,4..5") == ["1", "2", 4, 5]
    # repeats run once
    assert expand_values("expert_cache", [3, "2..4"]) == [3, 2, 4]


@pytest.mark.parametrize("bad", ["9..3", "1..5:0"])
def test_bad_ranges_say_what_to_write(bad):
    with pytest.raises(MatrixError, match="expert_cache"):
        expand_values("expert_cache", [bad])


def test_toml_matrix(tmp_path: Path):
    p = tmp_path / "m.toml"
    p.write_text(
        """
name = "sweep"
model = "tiny"
starts = 3
[engine]
vram_budget = "12MiB"
prefill = "auto"
[axes]
expert_cache = [900, 905, "910..912"]
lend_policy = ["legacy", "current"]
[prompts]
chunks = [2048, 3072]
[reference]
lend_policy = "current"
expert_cache = "auto"
[[cells]]
temperature = 0.8
seed = 7
"""
    )
    m = load_matrix(p)
    assert m.starts == 3 and m.name == "sweep"
    cells = m.cells()
    # reference + 5 sizes x 2 policies + 1 extra
    assert len(cells) == 1 + 10 + 1
    assert cells[0].reference and cells[0].knob("expert_cache") == "auto"
    assert {c.knob("vram_budget") for c in cells} == {12 << 20}
    sizes = sorted({int(c.knob("expert_cache")) for c in cells if c.origin == "matrix"})
    assert sizes == [900, 905, 910, 911, 912]
    extra = [c for c in cells if c.origin == "extra"]
    assert extra[0].request["temperature"] == 0.8 and extra[0].request["seed"] == 7
    # cell ids are stable and distinct
    assert len({c.cell_id for c in cells}) == len(cells)
    assert [c.cell_id for c in load_matrix(p).cells()] == [c.cell_id for c in cells]
    # the flags of a cell reproduce it
    c = next(c for c in cells if c.knob("expert_cache") == "905" and c.knob("lend_policy") == "legacy")
    args = c.config.to_cli_args()
    assert args[args.index("--expert-cache") + 1] == "905" and "--lend-policy" in args


def test_command_line_declaration_matches_toml(tmp_path: Path):
    m = load_matrix(
        "-",
        ["model=tiny", "vram_budget=12MiB", "chunks=2048,4096"],
        ["expert_cache=900,905,910..912", "lend_policy=legacy,current"],
    )
    assert len([c for c in m.cells() if not c.reference]) == 10
    assert m.chunks == [2048, 4096]
    # --set wins over the file's axis
    p = tmp_path / "m.toml"
    p.write_text('[axes]\nexpert_cache = ["1..4"]\n')
    m2 = load_matrix(p, ["expert_cache=7"])
    assert {c.knob("expert_cache") for c in m2.cells()} == {"7"}


@pytest.mark.parametrize(
    "decl, match",
    [
        ({"axes": {"expert_cahce": [1, 2]}}, "unknown knob 'expert_cahce'"),
        ({"axes": {"lend_policy": ["legacy", "newest"]}}, "lend-policy"),
        ({"engine": {"vram_budget": "lots"}}, "vram_budget"),
        ({"engine": {"expert_cache": [1, 2]}}, "belongs under \\[axes\\]"),
        ({"starts": 0}, "at least one engine start"),
        ({"prompts": {"sizes": [1]}}, "chunks = \\[...\\] or lengths"),
    ],
)
def test_bad_declarations_name_the_problem(decl, match):
    with pytest.raises(MatrixError, match=match):
        Matrix.from_dict(decl)


def test_missing_matrix_lists_the_builtin_ones():
    with pytest.raises(MatrixError, match="builtin"):
        load_matrix("no-such-matrix.toml")


def test_builtin_matrix_sweeps_cache_sizes_and_both_policies():
    m = load_matrix("builtin")
    assert m.model == "tiny"
    assert set(m.axes["lend_policy"]) == {"legacy", "current"}
    assert len(m.axes["expert_cache"]) >= 5
    assert m.reference_cell() is not None
    assert m.engine.get("prefill", "auto") == "auto" and m.engine["device"] == "cpu"


def test_prompt_lengths_round_to_their_chunk_and_fit_the_context():
    for chunk in (2048, 3072, 4096, 6144):
        n = prompt_length_for_chunk(chunk, 8192, 64)
        assert chunk - 64 < n <= chunk
    assert prompt_length_for_chunk(6144, 4096, 64) + 64 < 4096


@given(n_cells=st.integers(1, 60), n_shards=st.integers(1, 9))
def test_shards_cover_the_matrix_exactly_once(n_cells, n_shards):
    m = Matrix.from_dict({"axes": {"expert_cache": [f"1..{n_cells}"]}, "reference": False})
    cells = m.cells()
    assert len(cells) == n_cells
    seen = [c.cell_id for k in range(1, n_shards + 1) for c in shard_cells(cells, f"{k}/{n_shards}")]
    assert sorted(seen) == sorted(c.cell_id for c in cells)


@given(n_cells=st.integers(1, 40), n_shards=st.integers(1, 6))
def test_every_shard_runs_the_reference_and_the_rest_once(n_cells, n_shards):
    m = Matrix.from_dict({"axes": {"expert_cache": [f"1..{n_cells}"]}, "reference": {"expert_cache": "auto"}})
    cells = m.cells()
    ref = cells[0]
    assert ref.reference
    shards = [shard_cells(cells, f"{k}/{n_shards}") for k in range(1, n_shards + 1)]
    assert all(s[0] == ref for s in shards)  # each shard compares with a reference it ran itself
    rest = [c.cell_id for s in shards for c in s if not c.reference]
    assert sorted(rest) == sorted(c.cell_id for c in cells if not c.reference)


def test_a_toml_file_that_is_not_utf8_is_a_message(tmp_path: Path):
    p = tmp_path / "latin1.toml"
    p.write_bytes('name = "caf\u00e9"\n[axes]\nexpert_cache = [1, 2]\n'.encode("latin-1"))
    with pytest.raises(MatrixError, match=r"not UTF-8 text \(byte 0xe9 on line 1\).*save it as UTF-8"):
        load_matrix(p)
    r = subprocess.run(
        [sys.executable, "-m", "repro_matrix", "run", str(p)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr and "not UTF-8" in r.stderr, r.stderr


@pytest.mark.parametrize("bad", ["0/2", "3/2", "1-2", "x"])
def test_bad_shard(bad):
    with pytest.raises(MatrixError, match="--shard"):
        shard_cells([], bad)


def test_a_cell_equal_to_the_reference_runs_once_as_the_reference():
    m = Matrix.from_dict(
        {"axes": {"lend_policy": ["legacy", "current"]}, "reference": {"lend_policy": "current"}}
    )
    cells = m.cells()
    assert len(cells) == 2 and cells[0].reference and cells[0].knob("lend_policy") == "current"
    assert not cells[1].reference and cells[1].knob("lend_policy") == "legacy"
    # a matrix declared by flags alone is its reference
    one = load_matrix("-", ["expert_cache=4132", "lend_policy=legacy"])
    assert [c.reference for c in one.cells()] == [True]


def test_a_huge_range_is_an_error_before_it_is_expanded():
    import time

    t = time.monotonic()
    with pytest.raises(MatrixError, match=r"100,000,000 values.*A\.\.B:S"):
        load_matrix("-", axes=["expert_cache=1..100000000"])
    assert time.monotonic() - t < 5  # counted, not expanded


def test_a_matrix_of_more_than_ten_thousand_cells_asks_for_yes(tmp_path):
    import subprocess
    import sys

    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "repro_matrix.cli",
            "run",
            "-",
            "--model",
            "tiny",
            "--axis",
            "expert_cache=1..20000",
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "20,001 cells" in p.stderr and "--yes" in p.stderr, (p.stdout, p.stderr)
    assert not (tmp_path / "out" / "cells.jsonl").exists()  # nothing ran
