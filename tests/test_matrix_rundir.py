"""Run directories: records appended per cell, a line cut short by a kill, earlier runs kept."""

from __future__ import annotations

import json
from pathlib import Path

from repro_matrix import Matrix
from repro_matrix._runner import RunDir


def _m() -> Matrix:
    return Matrix.from_dict({"axes": {"expert_cache": [1, 2, 3]}, "reference": False})


def test_records_survive_a_kill_mid_line_and_appends_continue(tmp_path: Path):
    rd = RunDir(tmp_path / "run")
    rd.start(_m(), {}, {}, resume=False)
    ids = [c.cell_id for c in _m().cells()]
    rd.append({"cell_id": ids[0], "cell": {}, "n": 1})
    # a kill while writing the second record leaves half a line
    with open(rd.cells_file, "a") as f:
        f.write('{"cell_id": "' + ids[1] + '", "cell": {}, "n"')
    assert [r["cell_id"] for r in rd.records()] == [ids[0]]
    assert rd.finished_ids() == {ids[0]}
    # resuming repairs the file, so the next record starts on its own line
    RunDir(rd.path).start(_m(), {}, {}, resume=True)
    rd.append({"cell_id": ids[1], "cell": {}, "n": 2})
    lines = rd.cells_file.read_text().splitlines()
    assert [json.loads(x)["cell_id"] for x in lines] == ids[:2]
    assert len(json.loads((rd.path / "run.json").read_text())) == 2  # both runs recorded


def test_a_complete_last_record_without_its_newline_is_kept_and_the_first_env_stays(tmp_path: Path):
    rd = RunDir(tmp_path / "run")
    rd.start(_m(), {"host": "first"}, {}, resume=False)
    ids = [c.cell_id for c in _m().cells()]
    rd.append({"cell_id": ids[0], "cell": {}, "n": 1})
    with open(rd.cells_file, "a") as f:  # written whole, killed before the newline
        f.write(json.dumps({"cell_id": ids[1], "cell": {}, "n": 2}))
    assert rd.finished_ids() == {ids[0], ids[1]}  # what --resume skips ...
    RunDir(rd.path).start(_m(), {"host": "second"}, {}, resume=True)
    assert rd.finished_ids() == {ids[0], ids[1]}  # ... is still there after the repair
    rd.append({"cell_id": ids[2], "cell": {}, "n": 3})
    assert [json.loads(x)["cell_id"] for x in rd.cells_file.read_text().splitlines()] == ids
    # the first run's environment is not overwritten; the resume's is added
    assert json.loads((rd.path / "env.json").read_text()) == {"host": "first"}
    assert [json.loads(x) for x in (rd.path / "env-resumes.jsonl").read_text().splitlines()] == [{"host": "second"}]


def test_a_new_run_in_the_same_place_keeps_the_earlier_one(tmp_path: Path):
    rd = RunDir(tmp_path / "run")
    rd.start(_m(), {}, {}, resume=False)
    rd.append({"cell_id": "x", "cell": {}})
    RunDir(rd.path).start(_m(), {}, {}, resume=False)
    assert not rd.cells_file.exists()
    rd.append({"cell_id": "y", "cell": {}})
    RunDir(rd.path).start(_m(), {}, {}, resume=False)  # again within the same second
    kept = sorted(json.loads(p.read_text())["cell_id"] for p in rd.path.glob("earlier-*/cells.jsonl"))
    assert kept == ["x", "y"]
