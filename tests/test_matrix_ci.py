"""What CI reads: JUnit XML, the Markdown summary, exit statuses, merges with a shard missing, and the
records and report of an engine that cannot start. Records are written by hand in the recorded format
(no engine) except for the start failure, which is a real `strata serve` refusing a budget."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from repro_matrix import Cell, Matrix, shard_cells
from repro_matrix._ci import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_PASS, Gate, junit_xml, summary_markdown
from repro_matrix._report import expected_text
from repro_matrix._runner import RunDir
from repro_matrix._scrub import Scrubber
from repro_matrix._table import verdicts

_SC = Scrubber(homes=["/home/alice"], users=["alice"], hosts=["box-7"])


def _matrix(**extra: object) -> Matrix:
    return Matrix.from_dict(
        {
            "name": "ci",
            "axes": {"expert_cache": [600, 1024], "lend_policy": ["legacy", "current"]},
            "prompts": {"chunks": [256]},
            "reference": {"lend_policy": "current"},
            **extra,
        }
    )


def _rec(cell: Cell, outcome: str) -> dict:
    if outcome == "ok":
        req = {"prompt": 0, "status": "ok", "tokens": [3, 1, 4], "margins": [2.0, 2.0, 2.0]}
    elif outcome == "differs":
        req = {"prompt": 0, "status": "ok", "tokens": [3, 9, 4], "margins": [2.0, 2.0, 2.0]}
    else:
        req = {
            "prompt": 0,
            "status": "error",
            "error_code": "lend_failed",
            "error_message": "lending the prompt path its slots failed (/home/alice/m.gguf on box-7) \x1b[0m",
        }
    return {
        "cell_id": cell.cell_id,
        "cell": cell.to_dict(),
        "wall_s": 2.5,
        "prompts": [{"index": 0, "length": 216, "chunk": 256}],
        "starts": [{"start": 0, "requests": [req], "log_tail": "engine: lend failed <here> & there"}],
    }


def _records(m: Matrix, outcomes: dict[tuple[str, str], str]) -> list[dict]:
    out = []
    for c in m.cells():
        key = ("ref", "") if c.reference else (c.knob("expert_cache"), c.knob("lend_policy"))
        out.append(_rec(c, outcomes.get(key, "ok")))
    return out


def _gate(m: Matrix, recs: list[dict], **kw: object) -> Gate:
    return Gate(matrix=m, records=recs, verdicts=verdicts(recs, m), **kw)  # type: ignore[arg-type]


def _check_junit_shape(text: str) -> ET.Element:
    """The structure GitHub, GitLab and Jenkins read: counts that add up, a name, classname and time on
    every test case, at most one outcome element each, of the known kinds."""
    root = ET.fromstring(text.encode())
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert suites
    for suite in suites:
        cases = suite.findall("testcase")
        kinds = {"failure": 0, "error": 0, "skipped": 0}
        for tc in cases:
            assert tc.get("name") and tc.get("classname") and float(tc.get("time")) >= 0
            outcome = [el.tag for el in tc if el.tag in kinds]
            assert len(outcome) <= 1
            for tag in outcome:
                kinds[tag] += 1
            for el in tc:
                assert el.tag in ("failure", "error", "skipped", "system-out", "system-err")
                if el.tag in ("failure", "error"):
                    assert el.get("message") and el.get("type")
        assert int(suite.get("tests")) == len(cases)
        assert int(suite.get("failures")) == kinds["failure"]
        assert int(suite.get("errors")) == kinds["error"]
        assert int(suite.get("skipped")) == kinds["skipped"]
        assert float(suite.get("time")) >= 0 and suite.get("timestamp")
    for k in ("tests", "failures", "errors", "skipped"):
        assert int(root.get(k)) == sum(int(s.get(k)) for s in suites)
    return root


def test_junit_has_one_case_per_cell_with_the_verdict_as_the_failure():
    m = _matrix()
    recs = _records(m, {("1024", "legacy"): "lend", ("600", "current"): "differs"})
    g = _gate(m, recs)
    assert g.exit_code == EXIT_FAILED
    root = _check_junit_shape(junit_xml(g, _SC))
    cases = {tc.get("name"): tc for tc in root.iter("testcase")}
    assert len(cases) == len(m.cells()) == 5
    lend = cases["expert_cache=1024 lend_policy=legacy"]
    f = lend.find("failure")
    assert f.get("type") == "lend failed" and "1 of 1 starts" in f.get("message")
    assert (
        "lending the prompt path its slots failed" in f.text
        and "engine: lend failed <here> & there" in f.text
    )
    assert (
        "/home/alice" not in f.text and "box-7" not in f.text and "\x1b" not in f.text
    )  # scrubbed, XML-clean
    assert cases["expert_cache=600 lend_policy=current"].find("failure").get("type") == "reply differs"
    assert cases["reference expert_cache=auto lend_policy=current"].find("failure") is None


def test_expected_failures_are_skipped_and_a_missing_cell_is_an_error():
    m = _matrix(expect_fail=[{"lend_policy": "legacy"}])
    recs = _records(m, {("1024", "legacy"): "lend"})
    missing = recs.pop(-1)["cell_id"]
    g = _gate(m, recs, missing=[missing], incomplete=["shard 2/2 missing"])
    assert g.exit_code == EXIT_INCOMPLETE  # nothing failed unexpectedly, but not every cell has a result
    root = _check_junit_shape(junit_xml(g, _SC))
    kinds = {tc.get("name"): [el.tag for el in tc] for tc in root.iter("testcase")}
    assert kinds["expert_cache=1024 lend_policy=legacy"] == ["skipped"]
    assert (
        sum(1 for v in kinds.values() if v == ["error"]) == 2
    )  # the missing cell, and the completeness case
    # a failure outranks incompleteness
    recs2 = _records(m, {("1024", "current"): "lend"})
    assert _gate(m, recs2, missing=[missing]).exit_code == EXIT_FAILED
    assert _gate(m, _records(m, {("1024", "legacy"): "lend"})).exit_code == EXIT_PASS


def test_summary_is_a_markdown_table_failing_first():
    m = _matrix()
    recs = _records(m, {("1024", "legacy"): "lend"})
    text = summary_markdown(_gate(m, recs, shard="1/2"), _SC)
    lines = text.splitlines()
    assert lines[0] == "### repro_matrix `ci` (shard 1/2): FAILED (exit status 1)"
    assert "5 cells run, 4 pass, 1 failing." in text
    rows = [ln for ln in lines if ln.startswith("| ")]
    assert rows[0] == "| cell | verdict | what happened |"
    assert rows[1].startswith("| expert_cache=1024 lend_policy=legacy | **lend failed** |")
    assert len(rows) == 1 + 5 and all(r.count(" | ") == 2 for r in rows)


def test_the_expected_section_fits_the_verdict():
    assert "refuses at once" in expected_text(["engine start failed"])
    assert "loan" not in expected_text(["engine start failed"])
    assert "token for token" in expected_text(["reply differs"]) and "loan" not in expected_text(
        ["reply differs"]
    )
    assert "loan" in expected_text(["lend failed"])
    both = expected_text(["reply differs", "lend failed"])
    assert both.index("**lend failed**") < both.index("**reply differs**")
    assert "Every cell passes" in expected_text([])


def _write_shard(base: Path, m: Matrix, recs: list[dict], k: int, n: int) -> Path:
    rd = RunDir(base / f"shard-{k}")
    rd.start(m, {}, {"shard": f"{k}/{n}"}, resume=False)
    ids = {c.cell_id for c in shard_cells(m.cells(), f"{k}/{n}")}
    for r in recs:
        if r["cell_id"] in ids:
            rd.append(r)
    return rd.path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "repro_matrix", *args], capture_output=True, text=True, timeout=120
    )


def test_merge_exit_statuses_and_the_files_ci_reads(tmp_path: Path):
    m = _matrix()
    good = _records(m, {})
    s1, s2 = (_write_shard(tmp_path / "good", m, good, k, 2) for k in (1, 2))
    junit, summary = tmp_path / "junit.xml", tmp_path / "summary.md"
    p = _cli(
        "merge", str(tmp_path / "merged"), str(s1), str(s2), "--junit", str(junit), "--summary", str(summary)
    )
    assert p.returncode == 0, (p.stdout, p.stderr)
    root = _check_junit_shape(junit.read_text())
    assert int(root.get("tests")) == 5 and int(root.get("failures")) == 0
    assert "pass (exit status 0)" in summary.read_text()
    # a shard directory that was never written: 3, and the report says which shard
    p = _cli(
        "merge",
        str(tmp_path / "half"),
        str(s1),
        str(tmp_path / "good" / "shard-9"),
        "--summary",
        str(summary),
    )
    assert p.returncode == 3, (p.stdout, p.stderr)
    assert "shard-9 holds no run" in p.stderr and "shard 2/2 missing" in p.stderr
    assert summary.read_text().count("### repro_matrix") == 2  # appended, as $GITHUB_STEP_SUMMARY wants
    assert "INCOMPLETE (exit status 3)" in summary.read_text()
    _cli("report", str(tmp_path / "half"))
    report = (tmp_path / "half" / "report.md").read_text()
    assert "Shard 2/2 missing from the merge" in report and "have no result here" in report
    # a failing cell in shard 2: 1, even with shard 1 missing
    bad = _records(m, {("1024", "current"): "differs"})
    b1, b2 = (_write_shard(tmp_path / "bad", m, bad, k, 2) for k in (1, 2))
    p = _cli("merge", str(tmp_path / "m2"), str(b2))
    assert p.returncode == 1 and "reply differs" in p.stdout, (p.stdout, p.stderr)


def test_shards_whose_references_disagree_fail_the_merge(tmp_path: Path):
    m = _matrix()
    recs = _records(m, {})
    s1 = _write_shard(tmp_path, m, recs, 1, 2)
    other = _records(m, {("ref", ""): "differs"})
    s2 = _write_shard(tmp_path, m, other, 2, 2)
    p = _cli("merge", str(tmp_path / "merged"), str(s1), str(s2), "--junit", str(tmp_path / "j.xml"))
    assert p.returncode == 1
    assert "the reference cell replied otherwise in" in p.stderr and "shard 2/2" in p.stderr
    root = _check_junit_shape((tmp_path / "j.xml").read_text())
    assert any(tc.get("name").startswith("the matrix as a whole") for tc in root.iter("testcase"))


def test_a_server_that_refuses_to_start_is_recorded_in_its_own_words(tmp_path: Path):
    m = tmp_path / "m.toml"
    m.write_text(
        'model = "tiny"\nmax_tokens = 2\n[engine]\ndevice = "cpu"\nvram_budget = "1MiB"\n'
        "[prompts]\nlengths = [16]\n[reference]\n"
    )
    out = tmp_path / "out"
    p = _cli("run", str(m), "--out", str(out), "--no-progress", "--junit", str(tmp_path / "j.xml"))
    assert p.returncode == 1, (p.stdout, p.stderr)
    rec = RunDir(out).records()[0]
    st = rec["starts"][0]
    assert st["start_exit_code"] == 1  # what `strata serve` exits with when the engine cannot start
    assert st["start_message"].startswith("strata serve: the engine could not start:")
    assert "--vram-budget" in st["start_message"]
    assert "did not start in time" not in st["start_error"] and "exit code 1" in st["start_error"]
    _cli("report", str(out))
    report = (out / "report.md").read_text()
    happens = report.split("## What happens")[1].split("## The matrix")[0]
    assert "exited with exit code 1" in happens and "strata serve: the engine could not start:" in happens
    expected = report.split("## Expected")[1].split("## How to reproduce")[0]
    assert "refuses at once" in expected and "loan" not in expected
    failure = ET.parse(tmp_path / "j.xml").getroot().find(".//failure")
    assert failure.get("type") == "engine start failed" and "exit code 1" in failure.get("message")
    assert json.loads((out / "verdicts.jsonl").read_text().splitlines()[0])["start_exit_codes"] == [1]


# ---- the example CI: the workflow and its script, end to end on two "runners" (two processes) -----------

_ROOT = Path(__file__).resolve().parent.parent
_SCRIPT = _ROOT / "ci" / "matrix-shards.sh"


def _ci_matrix(path: Path, planted: bool) -> Path:
    """Fast: a 512-token context, one 216-token prompt, 4 tokens. Without the plant: the reference and two
    cache sizes (one per shard). With it: one cache size (shard 1) and a cell at temperature 0.8 (shard 2),
    whose reply differs from the reference's."""
    body = (
        'name = "ci"\nmodel = "tiny"\nmax_tokens = 4\n[engine]\ndevice = "cpu"\nmax_context = 512\n'
        'vram_budget = "64MiB"\n[prompts]\nchunks = [256]\n[reference]\nexpert_cache = "auto"\n'
        "[axes]\nexpert_cache = "
        + ("[600]\n[[cells]]\ntemperature = 0.8\nseed = 7\n" if planted else "[600, 1024]\n")
    )
    path.write_text(body)
    return path


def _script(*args: str, matrix: Path, out: Path, summary: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "MATRIX": str(matrix),
        "OUT": str(out),
        "PYTHON": sys.executable,
        "GITHUB_STEP_SUMMARY": str(summary),
    }
    return subprocess.run(["bash", str(_SCRIPT), *args], capture_output=True, text=True, timeout=600, env=env)


def test_the_workflow_runs_the_script_per_shard_and_merges_always():
    import yaml

    wf = yaml.safe_load((_ROOT / ".github" / "workflows" / "matrix-gpu.yml").read_text())
    shard, merge = wf["jobs"]["shard"], wf["jobs"]["merge"]
    assert "self-hosted" in shard["runs-on"] and "gpu" in shard["runs-on"]
    assert shard["strategy"]["fail-fast"] is False
    n = int(wf["env"]["SHARDS"])
    assert shard["strategy"]["matrix"]["shard"] == list(range(1, n + 1))
    runs = [s.get("run", "") for s in shard["steps"]]
    assert "ci/matrix-shards.sh build" in runs
    assert any(r.startswith("ci/matrix-shards.sh shard ${{ matrix.shard }}") for r in runs)
    assert (
        merge["needs"] == "shard" and merge["if"] == "always()"
    )  # a failed or missing shard is still merged
    assert any(s.get("run", "").startswith("ci/matrix-shards.sh merge") for s in merge["steps"])
    subprocess.run(["bash", "-n", str(_SCRIPT)], check=True)
    # the CI matrix itself loads, expects no failure and fails on the verdicts the workflow promises
    from repro_matrix import load_matrix

    m = load_matrix(_ROOT / "ci" / "ci.toml")
    assert not m.expect_fail and {"lend failed", "engine exited", "reply differs"} <= set(m.fail_on)
    assert m.reference_cell() is not None and m.engine["device"] == "cuda"


def test_two_runners_through_the_script_pass_then_fail_on_a_plant_and_on_a_missing_shard(tmp_path: Path):
    summary = tmp_path / "step-summary.md"
    out = tmp_path / "ci"
    p = _script(
        "local", "2", matrix=_ci_matrix(tmp_path / "ok.toml", planted=False), out=out, summary=summary
    )
    assert p.returncode == 0, (p.stdout, p.stderr, [f.read_text() for f in out.glob("*.log")])
    for name in ("shard-1", "shard-2", "merged"):
        _check_junit_shape((out / f"{name}.junit.xml").read_text())
    merged = ET.parse(out / "merged.junit.xml").getroot()
    assert int(merged.get("tests")) == 3 and int(merged.get("failures")) == int(merged.get("errors")) == 0
    assert (out / "report.md").read_text().startswith("# No failures")
    assert summary.read_text().count("### repro_matrix `ci`") == 3  # two shards and the merge
    assert "### repro_matrix `ci`: pass (exit status 0)" in summary.read_text()
    # a runner's results lost: the merge is incomplete, and says which shard
    shutil.rmtree(out / "shard-2")
    p = _script("merge", "2", matrix=tmp_path / "ok.toml", out=out, summary=summary)
    assert p.returncode == 3 and "shard-2 holds no run" in p.stderr, (p.stdout, p.stderr)
    assert "Shard 2/2 missing" in (out / "report.md").read_text()
    # a changed reply in shard 2 fails shard 2 on its own: it ran the reference itself
    bad = tmp_path / "bad"
    p = _script(
        "shard", "2", "2", matrix=_ci_matrix(tmp_path / "bad.toml", planted=True), out=bad, summary=summary
    )
    assert p.returncode == 1, (p.stdout, p.stderr)
    failures = ET.parse(bad / "shard-2.junit.xml").getroot().findall(".//failure")
    assert [f.get("type") for f in failures] == ["reply differs"]
    p = _script("merge", "2", matrix=tmp_path / "bad.toml", out=bad, summary=summary)
    assert p.returncode == 1, (p.stdout, p.stderr)  # a failure outranks the missing shard 1


def _cuda() -> bool:
    from repro_matrix._runner import gpu_count
    from strata import _engine

    try:
        return bool(_engine.cuda_available()) and gpu_count() > 0
    except OSError:  # no libstrata built here
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="no CUDA device")
def test_the_ci_matrix_on_the_gpu_through_the_script(tmp_path: Path):
    """ci/ci.toml as the workflow runs it (CUDA cells, two shards as two processes, then the merge): it must
    pass, and its JUnit list every cell. Run by hand on a GPU host: pytest -m gpu tests/test_matrix_ci.py."""
    summary = tmp_path / "summary.md"
    out = tmp_path / "ci"
    p = _script("local", "2", matrix=_ROOT / "ci" / "ci.toml", out=out, summary=summary)
    assert p.returncode == 0, (p.stdout, p.stderr, [f.read_text()[-3000:] for f in out.glob("*.log")])
    root = _check_junit_shape((out / "merged.junit.xml").read_text())
    from repro_matrix import load_matrix

    assert int(root.get("tests")) == len(load_matrix(_ROOT / "ci" / "ci.toml").cells())
    assert int(root.get("failures")) == int(root.get("errors")) == 0
    recs = RunDir(out / "merged").records()
    assert all(Cell.from_dict(r["cell"]).knob("device") == "cuda" for r in recs)


def test_a_shards_resume_knows_its_shard(tmp_path: Path):
    from repro_matrix._runner import _shard_of

    m = _matrix()
    rd = RunDir(tmp_path / "s")
    rd.start(m, {}, {"shard": "2/3"}, resume=False)
    rd.start(m, {}, {"shard": "2/3", "resume": True}, resume=True)  # what `run --resume` records
    assert _shard_of(rd) == "2/3"
    assert _shard_of(RunDir(tmp_path / "none")) is None
