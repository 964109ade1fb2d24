"""Run directories: records appended per cell, a line cut short by a kill, earlier runs kept."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from repro_matrix import Matrix
from repro_matrix._runner import RunDir


def _m() -> Matrix:
    return Matrix.from_dict({"axes": {"expert_cache": [1, 2, 3]}, "reference": False})


def _rec(i: int, **extra: object) -> dict:
    c = _m().cells()[i]
    return {"cell_id": c.cell_id, "cell": c.to_dict(), "starts": [], **extra}


def test_records_survive_a_kill_mid_line_and_appends_continue(tmp_path: Path):
    rd = RunDir(tmp_path / "run")
    rd.start(_m(), {}, {}, resume=False)
    ids = [c.cell_id for c in _m().cells()]
    rd.append(_rec(0, n=1))
    # a kill while writing the second record leaves half a line
    with open(rd.cells_file, "a") as f:
        f.write(json.dumps(_rec(1, n=2))[:-10])
    assert [r["cell_id"] for r in rd.records()] == [ids[0]]
    assert rd.finished_ids() == {ids[0]}
    # resuming repairs the file, so the next record starts on its own line
    RunDir(rd.path).start(_m(), {}, {}, resume=True)
    rd.append(_rec(1, n=2))
    lines = rd.cells_file.read_text().splitlines()
    assert [json.loads(x)["cell_id"] for x in lines] == ids[:2]
    assert len(json.loads((rd.path / "run.json").read_text())) == 2  # both runs recorded


def test_a_complete_last_record_without_its_newline_is_kept_and_the_first_env_stays(tmp_path: Path):
    rd = RunDir(tmp_path / "run")
    rd.start(_m(), {"host": "first"}, {}, resume=False)
    ids = [c.cell_id for c in _m().cells()]
    rd.append(_rec(0, n=1))
    with open(rd.cells_file, "a") as f:  # written whole, killed before the newline
        f.write(json.dumps(_rec(1, n=2)))
    assert rd.finished_ids() == {ids[0], ids[1]}  # what --resume skips ...
    RunDir(rd.path).start(_m(), {"host": "second"}, {}, resume=True)
    assert rd.finished_ids() == {ids[0], ids[1]}  # ... is still there after the repair
    rd.append(_rec(2, n=3))
    assert [json.loads(x)["cell_id"] for x in rd.cells_file.read_text().splitlines()] == ids
    # the first run's environment is not overwritten; the resume's is added
    assert json.loads((rd.path / "env.json").read_text()) == {"host": "first"}
    assert [json.loads(x) for x in (rd.path / "env-resumes.jsonl").read_text().splitlines()] == [
        {"host": "second"}
    ]


def test_a_new_run_in_the_same_place_keeps_the_earlier_one(tmp_path: Path):
    rd = RunDir(tmp_path / "run")
    rd.start(_m(), {}, {}, resume=False)
    rd.append(_rec(0, tag="x"))
    RunDir(rd.path).start(_m(), {}, {}, resume=False)
    assert not rd.cells_file.exists()
    rd.append(_rec(0, tag="y"))
    RunDir(rd.path).start(_m(), {}, {}, resume=False)  # again within the same second
    kept = sorted(json.loads(p.read_text())["tag"] for p in rd.path.glob("earlier-*/cells.jsonl"))
    assert kept == ["x", "y"]


@pytest.mark.parametrize(
    "line",
    [
        "null",
        "[]",
        "42",
        '"text"',
        '{"cell_id": 7}',
        '{"cell_id": "a", "cell": null}',
        '{"cell_id": "a", "cell": {"engine": {}}}',
        "not json at all",
    ],
)
def test_a_damaged_line_in_cells_jsonl_is_skipped_with_a_message_not_a_traceback(tmp_path: Path, line: str):
    rd = RunDir(tmp_path / "run")
    rd.start(_m(), {}, {}, resume=False)
    rd.append(_rec(0))
    with open(rd.cells_file, "a") as f:
        f.write(line + "\n")
    rd.append(_rec(1))
    assert [r["cell_id"] for r in rd.records()] == [c.cell_id for c in _m().cells()[:2]]
    assert len(rd.notes) == 1 and "line 2" in rd.notes[0] and "skipped" in rd.notes[0]


def test_commands_reading_a_null_line_say_so_and_go_on(tmp_path: Path):
    rd = RunDir(tmp_path / "run")
    rd.start(_m(), {}, {}, resume=False)
    rd.append(_rec(0))
    with open(rd.cells_file, "a") as f:
        f.write("null\n")
    p = subprocess.run(
        [sys.executable, "-m", "repro_matrix", "report", str(rd.path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert "line 2 is not a cell record (null)" in (rd.path / "report.md").read_text()
    p = subprocess.run(
        [sys.executable, "-m", "repro_matrix", "bisect", str(rd.path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in p.stderr and "line 2 is not a cell record" in p.stderr, p.stderr


def test_a_damaged_matrix_json_is_a_message(tmp_path: Path):
    rd = RunDir(tmp_path / "run")
    rd.start(_m(), {}, {}, resume=False)
    (rd.path / "matrix.json").write_bytes(b"\xff\xfe{")
    p = subprocess.run(
        [sys.executable, "-m", "repro_matrix", "report", str(rd.path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "matrix.json cannot be read" in p.stderr and "damaged" in p.stderr
