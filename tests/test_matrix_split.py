"""repro_matrix and the layer split: a ``gpus`` (``split``) axis whose values are device lists, cells that
take as many cards as they split over (the placement checked with a fake GPU count), and a CPU matrix whose
split cells reply as the one-device reference does."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from repro_matrix import Cell, judge, load_matrix
from repro_matrix._matrix import Matrix, MatrixError
from repro_matrix._runner import RunDir, cards_needed, plan_jobs, run_pool


def _matrix(tmp: Path, body: str) -> Path:
    p = tmp / "m.toml"
    p.write_text('model = "tiny"\nmax_tokens = 8\n[engine]\nmax_context = 512\n' + body)
    return p


def test_a_gpus_axis_sweeps_device_lists(tmp_path: Path) -> None:
    m = load_matrix(
        _matrix(
            tmp_path, 'split = "layer"\nvram_budgets = "40MiB,40MiB"\n[axes]\ngpus = ["0,0", "0,1", "1,0"]\n'
        )
    )
    assert m.axes["gpus"] == ["0,0", "0,1", "1,0"]  # a comma inside a device list is not a sweep
    assert m.engine["vram_budgets"] == [40 << 20, 40 << 20]
    assert len(m.cells()) == 4  # the reference (the first value) and the three
    same = load_matrix(_matrix(tmp_path, ""), overrides=["split=layer"], axes=["gpus=0;0,1;1,0"])
    assert same.axes["gpus"] == ["0", "0,1", "1,0"]
    cells = Matrix.from_dict(
        {"engine": {"split": "layer", "vram_budgets": "40MiB,40MiB"}, "axes": {"gpus": ["0,1", "1,0"]}}
    ).cells()
    assert [c.config.split_devices() for c in cells if not c.reference] == [[0, 1], [1, 0]]
    assert all(c.config.vram_budgets == [40 << 20, 40 << 20] for c in cells)
    with pytest.raises(MatrixError, match=r"--gpus 2, --vram-budget 3"):
        Matrix.from_dict(
            {"engine": {"split": "layer", "vram_budgets": "1GiB,1GiB,1GiB"}, "axes": {"gpus": ["0,1"]}}
        )


def _cell(**engine: object) -> Cell:
    return Cell.make(dict(engine))


def test_cards_a_cell_takes() -> None:
    assert cards_needed(_cell(device="cpu", split="layer", gpus="0,1")) == 1  # emulated budgets: no card
    assert cards_needed(_cell(device="cuda")) == 1
    assert cards_needed(_cell(device="cuda", split="layer", gpus="0,0")) == 1  # two plans on one card
    assert cards_needed(_cell(device="cuda", split="layer", gpus="0,1")) == 2
    assert cards_needed(_cell(device="cuda", split="layer", tensor_split="1,1,2")) == 3


def test_jobs_and_cards_with_a_fake_gpu_count(monkeypatch: pytest.MonkeyPatch) -> None:
    from repro_matrix import _runner

    m = Matrix.from_dict({"engine": {"device": "cuda"}, "axes": {"gpus": ["0", "0,1"], "split": ["layer"]}})
    monkeypatch.setattr(_runner, "gpu_count", lambda: 1)
    monkeypatch.setattr(_runner.os, "sched_getaffinity", lambda _pid: set(range(16)), raising=False)
    with pytest.raises(MatrixError, match=r"splits its layers over 2 cards .* this machine has 1"):
        plan_jobs(4, m, m.cells())
    monkeypatch.setattr(_runner, "gpu_count", lambda: 2)
    assert plan_jobs(4, m, m.cells()) == (2, ["--jobs 4 cut to 2: one cell per GPU"])
    cpu = Matrix.from_dict({"engine": {"device": "cpu", "split": "layer"}, "axes": {"gpus": ["0,1,2"]}})
    assert plan_jobs(4, cpu, cpu.cells())[0] == 4  # a CPU matrix's split cells take no card


def test_placement_gives_every_running_cell_cards_of_its_own() -> None:
    cells = [
        _cell(device="cuda", split="layer", gpus=g, max_context=n)
        for n, g in enumerate(["0,1", "0", "0,1,2", "0", "0,0", "1,0", "0", "0,1,2,3"], start=100)
    ]
    held: set[int] = set()
    lock = threading.Lock()
    got: dict[str, list[int]] = {}
    most = [0]

    def run_one(cell: Cell, cards: list[int] | None) -> dict[str, object]:
        assert cards is not None
        with lock:
            assert not held & set(cards), (held, cards)  # no card is given to two cells at once
            held.update(cards)
            most[0] = max(most[0], len(held))
            got[cell.cell_id] = cards
        time.sleep(0.02)
        with lock:
            held.difference_update(cards)
        return {"cell_id": cell.cell_id}

    done: list[str] = []
    run_pool(
        cells, jobs=4, cards=[0, 1, 2, 3], run_one=run_one, on_done=lambda r: done.append(str(r["cell_id"]))
    )
    assert sorted(done) == sorted(c.cell_id for c in cells)
    for c in cells:
        assert len(got[c.cell_id]) == cards_needed(c) == len(set(got[c.cell_id]))
        assert set(got[c.cell_id]) <= {0, 1, 2, 3}
    assert most[0] <= 4


def test_a_cpu_matrix_with_split_cells_replies_as_its_reference(tmp_path: Path) -> None:
    m = _matrix(
        tmp_path,
        'device = "cpu"\n[axes]\nsplit = ["layer"]\ngpus = ["0,1", "0,1,2,3"]\n'
        '[prompts]\nchunks = [256]\n[reference]\nsplit = "none"\n',
    )
    out = tmp_path / "out"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "repro_matrix.cli",
            "run",
            str(m),
            "--out",
            str(out),
            "--no-progress",
            "--jobs",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    recs = RunDir(out).records()
    ref = next(r for r in recs if r["cell"].get("reference"))
    split = [r for r in recs if not r["cell"].get("reference")]
    assert len(split) == 2
    for rec in split:
        assert judge(rec, ref, near_tie=1e-3).labels == ["ok"]
        pred = next(iter(rec["layouts"]["predicted"].values()))
        n_dev = len(Cell.from_dict(rec["cell"]).config.split_devices())
        assert len(pred["devices"]) == n_dev
