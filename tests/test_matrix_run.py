"""repro_matrix end to end: real engines behind real `strata serve` processes on loopback, tiny preset.

The built-in matrix must find the legacy lend bug (and bisect must pin its range), the current policy
must serve everything with replies equal to the reference's, a planted change must be reported with
its position, a killed sweep must resume without redoing cells, shards must cover the matrix once,
and cells sent to a local Ray cluster must reach the same verdicts and resume after a killed driver.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from repro_matrix import Cell, judge, load_matrix
from repro_matrix._runner import RunDir

_FAILURES = {"lend failed", "engine exited"}
# CI speed: short replies (the built-in matrix asks for 64 tokens), only the 2048-token prompt (it fails
# throughout the legacy window; the 3072-token one only in part of it), two cells at a time
_FAST = ["--set", "max_tokens=16", "--set", "chunks=2048", "--jobs", "2", "--no-progress"]


def _cli(*args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(
        [sys.executable, "-m", "repro_matrix.cli", *args], capture_output=True, text=True, timeout=timeout
    )
    if check and p.returncode not in (0, 1):
        raise AssertionError(f"repro_matrix {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


def _verdicts(out: Path) -> dict[str, tuple[Cell, list[str], dict]]:
    rd = RunDir(out)
    m = rd.matrix()
    recs = rd.records()
    ref = next((r for r in recs if r["cell"].get("reference")), None)
    return {
        r["cell_id"]: (Cell.from_dict(r["cell"]), judge(r, ref, near_tie=m.near_tie).labels, r) for r in recs
    }


def _replies(rec: dict) -> dict[int, list[int]]:
    return {r["prompt"]: r["tokens"] for st in rec["starts"] for r in st["requests"] if r["status"] == "ok"}


# ---- the built-in matrix: the bug it exists for ------------------------------------------------------


@pytest.fixture(scope="module")
def builtin_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("builtin")
    p = _cli("run", "builtin", "--out", str(out), *_FAST)
    assert "lend policy" in p.stdout and "verdict" in p.stdout  # the printed table names both
    b = _cli("bisect", str(out), "--knob", "expert_cache", "--where", "lend_policy=legacy", "--jobs", "2")
    assert b.returncode == 0, b.stderr
    return out


def test_builtin_finds_legacy_failures_in_one_range_and_none_for_current(builtin_run: Path):
    m = RunDir(builtin_run).matrix()
    sampled = sorted(int(v) for v in m.axes["expert_cache"])
    by_policy: dict[str, dict[int, bool]] = {"legacy": {}, "current": {}}
    for cell, labels, _ in _verdicts(builtin_run).values():
        if cell.reference or cell.origin != "matrix":
            continue
        by_policy[cell.knob("lend_policy")][int(cell.knob("expert_cache"))] = bool(_FAILURES & set(labels))
    assert set(by_policy["legacy"]) == set(sampled) == set(by_policy["current"])
    assert not any(by_policy["current"].values()), by_policy["current"]
    failing = [i for i, v in enumerate(sampled) if by_policy["legacy"][v]]
    assert failing, f"legacy never failed on {sampled}"
    # contiguous among the sampled sizes, with passing sizes on both sides
    assert failing == list(range(failing[0], failing[-1] + 1))
    assert failing[0] > 0 and failing[-1] < len(sampled) - 1


def test_bisect_pins_the_range_exactly(builtin_run: Path):
    res = json.loads((builtin_run / "bisect.json").read_text())
    legacy = next(r for r in res if r["group"].get("lend_policy") == "legacy")
    assert len(legacy["ranges"]) == 1
    rng = legacy["ranges"][0]
    assert rng["below"] == rng["first"] - 1 and rng["above"] == rng["last"] + 1
    # each edge was really run, and the records say what bisect says
    seen = {
        int(c.knob("expert_cache")): bool(_FAILURES & set(lb))
        for c, lb, _ in _verdicts(builtin_run).values()
        if not c.reference and c.knob("lend_policy") == "legacy"
    }
    assert seen[rng["below"]] is False and seen[rng["first"]] is True
    assert seen[rng["last"]] is True and seen[rng["above"]] is False
    assert all(v == (rng["first"] <= k <= rng["last"]) for k, v in seen.items())


def test_current_replies_equal_the_reference_token_for_token(builtin_run: Path):
    vs = _verdicts(builtin_run)
    ref = next(rec for c, _, rec in vs.values() if c.reference)
    ref_replies = _replies(ref)
    assert ref_replies and all(len(t) == 16 for t in ref_replies.values())
    n = 0
    for cell, labels, rec in vs.values():
        if cell.reference or cell.knob("lend_policy") != "current":
            continue
        assert _replies(rec) == ref_replies, cell.label(["expert_cache"])
        assert set(labels) <= {"ok", "halved"}
        n += 1
    assert n >= 5


def test_report_of_the_legacy_run(builtin_run: Path):
    p = _cli("report", str(builtin_run))
    assert p.returncode == 0, p.stderr
    assert "scrubbed" in p.stderr  # the user is told what was removed (or that nothing was)
    text = (builtin_run / "report.md").read_text()
    for section in (
        "## Setup",
        "## What happens",
        "## The matrix",
        "## Boundaries",
        "## Expected",
        "## How to reproduce",
        "## What was not run",
    ):
        assert section in text
    res = json.loads((builtin_run / "bisect.json").read_text())
    rng = next(r for r in res if r["group"].get("lend_policy") == "legacy")["ranges"][0]
    assert f"{rng['first']}..{rng['last']}" in text.splitlines()[0]
    assert "lending the prompt path its slots failed" in text
    # the shortest command carries the failing cell's flags
    repro = text.split("## How to reproduce")[1]
    assert "--lend-policy legacy" in repro and "--expert-cache" in repro
    assert os.path.expanduser("~") + "/" not in text


# ---- identity: a planted change is found, with its position ------------------------------------------


def _small_toml(tmp: Path, body: str, max_tokens: int = 8, starts: int = 1) -> Path:
    """A fast matrix: a context of 512 makes the auto chunk 512, and a 256-token chunk gets the deep ring."""
    p = tmp / "m.toml"
    p.write_text(
        f'model = "tiny"\nmax_tokens = {max_tokens}\nstarts = {starts}\n[engine]\ndevice = "cpu"\nmax_context = 512\n'
        'vram_budget = "64MiB"\n' + body
    )
    return p


def test_planted_change_is_reported_with_its_position_and_near_tie_rule(tmp_path: Path):
    m = _small_toml(
        tmp_path,
        "[prompts]\nchunks = [256]\n[[cells]]\ntemperature = 0.8\nseed = 7\n",
        max_tokens=16,
        starts=2,
    )
    out = tmp_path / "out"
    p = _cli("run", str(m), "--out", str(out), "--no-progress")
    assert p.returncode == 1  # an unexpected failure fails the run
    vs = _verdicts(out)
    ref = next(rec for c, _, rec in vs.values() if c.reference)
    planted = next(rec for c, _, rec in vs.values() if c.request["temperature"] == 0.8)
    a, b = _replies(planted)[0], _replies(ref)[0]
    pos = next(i for i in range(min(len(a), len(b))) if a[i] != b[i])  # computed here, not by the harness
    # two fresh engines per cell: greedy and seeded replies alike are the same on both starts
    for rec in (ref, planted):
        per_start = [[r["tokens"] for r in st["requests"]] for st in rec["starts"]]
        assert len(per_start) == 2 and per_start[0] == per_start[1]
    assert judge(ref, ref).labels == ["ok"]
    v = judge(planted, ref, near_tie=1e-3)
    assert v.labels == ["reply differs"]
    assert (v.difference.position, v.difference.token, v.difference.ref_token) == (pos, a[pos], b[pos])
    assert f"token {pos}:" in p.stdout
    margin = ref["starts"][0]["requests"][0]["margins"][pos]
    assert judge(planted, ref, near_tie=margin * 2 + 1e-9).difference.near_tie
    assert not judge(planted, ref, near_tie=margin / 2).difference.near_tie


# ---- scale: resume, shards, Ray ----------------------------------------------------------------------


def _scale_matrix(tmp: Path) -> Path:
    """Four cells and a reference. With a 512-token context the legacy policy fails for 256-token chunks
    at some cache sizes (1024 slots) and not at others (600): the verdicts to compare are not all alike."""
    return _small_toml(
        tmp,
        '[axes]\nexpert_cache = [600, 1024]\nlend_policy = ["legacy", "current"]\n'
        '[prompts]\nchunks = [256]\n[reference]\nlend_policy = "current"\n',
    )


def test_killed_sweep_resumes_without_redoing_cells(tmp_path: Path):
    m = _scale_matrix(tmp_path)
    out = tmp_path / "out"
    total = len(load_matrix(m).cells())
    proc = subprocess.Popen(
        [sys.executable, "-m", "repro_matrix.cli", "run", str(m), "--out", str(out), "--no-progress"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    cells = out / "cells.jsonl"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if cells.is_file() and len(cells.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = cells.read_text()
    done = [json.loads(line)["cell_id"] for line in before.splitlines() if line.endswith("}")]
    assert 2 <= len(done) < total, "the sweep was not killed half way"
    p = _cli("run", "--resume", str(out), "--no-progress")
    assert f"skipped {len(done)} finished cells, ran {total - len(done)}" in p.stderr
    after = cells.read_text()
    assert after.startswith(before.rsplit("}\n", 1)[0])  # finished records untouched
    ids = [json.loads(line)["cell_id"] for line in after.splitlines()]
    assert sorted(ids) == sorted(c.cell_id for c in load_matrix(m).cells())  # each cell exactly once


@pytest.fixture(scope="module")
def local_scale_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("scale")
    m = _scale_matrix(tmp)
    out = tmp / "local"
    _cli("run", str(m), "--out", str(out), "--jobs", "2", "--no-progress")
    return m, out


def test_two_shards_cover_the_matrix_exactly_once(tmp_path: Path, local_scale_run: tuple[Path, Path]):
    m, local = local_scale_run
    ids: list[str] = []
    for k in (1, 2):
        out = tmp_path / f"shard{k}"
        _cli("run", str(m), "--out", str(out), "--shard", f"{k}/2", "--no-progress")
        recs = RunDir(out).records()
        assert sum(r["cell"]["reference"] for r in recs) == 1  # each shard ran the reference it compares with
        ids += [r["cell_id"] for r in recs if not r["cell"]["reference"]]
    assert sorted(ids) == sorted(c.cell_id for c in load_matrix(m).cells() if not c.reference)
    # merged, the shards reach the local run's verdicts, and the merge gates on the legacy failure
    p = _cli("merge", str(tmp_path / "merged"), str(tmp_path / "shard1"), str(tmp_path / "shard2"))
    assert p.returncode == 1 and "lend failed" in p.stdout
    merged = {cid: lb for cid, (_, lb, _) in _verdicts(tmp_path / "merged").items()}
    assert merged == {cid: lb for cid, (_, lb, _) in _verdicts(local).items()}
    # a missing shard is a failure of the merge, not a note beside a green verdict
    p = _cli("merge", str(tmp_path / "half"), str(tmp_path / "shard2"), check=False)
    assert p.returncode == 3 and "have no result" in p.stderr and "shard 1/2 missing" in p.stderr, (
        p.stdout,
        p.stderr,
    )


def test_a_matrix_that_expects_failures_and_sees_none_fails(tmp_path: Path):
    """Like a strict xpass: a legacy matrix whose cache is too large for the short chunk's window expects
    'lend failed' and gets none, so the harness has lost the failure it exists to find."""
    m = tmp_path / "m.toml"
    m.write_text(
        'model = "tiny"\nmax_tokens = 4\nexpect_fail = [{ lend_policy = "legacy" }]\n'
        '[engine]\ndevice = "cpu"\nmax_context = 512\nvram_budget = "64MiB"\n'
        '[axes]\nexpert_cache = [600]\nlend_policy = ["legacy"]\n[prompts]\nchunks = [256]\n'
    )
    p = _cli("run", str(m), "--out", str(tmp_path / "out"), "--no-progress")
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "expects failures (lend_policy=legacy) and none happened" in p.stdout
    assert "no longer sees the failure" in p.stdout
    # a shard of it only notes it: the merge decides
    q = _cli("run", str(m), "--out", str(tmp_path / "s1"), "--shard", "1/1", "--no-progress")
    assert q.returncode == 0 and "the merge of the shards decides" in q.stdout, (q.stdout, q.stderr)
    r = _cli("merge", str(tmp_path / "merged"), str(tmp_path / "s1"))
    assert r.returncode == 1 and "none happened" in r.stdout


@pytest.fixture
def ray_cluster(tmp_path: Path):
    """A local Ray cluster of one node and 2 CPUs, started and stopped by the test (its own process group)."""
    import ray  # noqa: F401 - make test installs the ray extra; a missing one is an error, not a skip

    ray_bin = Path(sys.executable).parent / "ray"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "ray.log", "w")  # noqa: SIM115 - closed below
    temp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # Ray's socket paths must stay short
    proc = subprocess.Popen(
        [
            str(ray_bin),
            "start",
            "--head",
            "--port",
            str(port),
            "--num-cpus",
            "2",
            "--num-gpus",
            "0",
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--object-store-memory",
            str(100 * 1024 * 1024),
            "--temp-dir",
            str(temp),
            "--block",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in (tmp_path / "ray.log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "ray.log").read_text()
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the head, its GCS, raylet and workers: one process group
        try:
            proc.wait(5)  # `ray start --block` takes its time; the cluster is gone with its group either way
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def test_ray_cells_on_a_cluster_resume_after_a_killed_driver(
    tmp_path: Path, local_scale_run: tuple[Path, Path], ray_cluster: str
):
    m, local = local_scale_run
    out = tmp_path / "ray"
    cells = out / "cells.jsonl"
    total = len(load_matrix(m).cells())
    driver = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "repro_matrix.cli",
            "run",
            str(m),
            "--out",
            str(out),
            "--ray",
            ray_cluster,
            "--no-progress",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and driver.poll() is None:
        if cells.is_file() and cells.read_text().count("\n") >= 1:  # results appended as they finish
            break
        time.sleep(0.05)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    done = [json.loads(line)["cell_id"] for line in cells.read_text().splitlines() if line.endswith("}")]
    assert 1 <= len(done) < total, "the driver was not killed half way"
    p = _cli("run", "--resume", str(out), "--ray", ray_cluster, "--no-progress")
    assert f"skipped {len(done)} finished cells, ran {total - len(done)}" in p.stderr, p.stderr
    recs = RunDir(out).records()
    ids = [json.loads(line)["cell_id"] for line in cells.read_text().splitlines()]
    assert sorted(ids) == sorted(c.cell_id for c in load_matrix(m).cells())  # each cell exactly once
    assert all(r.get("backend") == "ray" for r in recs)
    # the cluster's tasks reach the local run's verdicts, the legacy failure among them
    ray_v = {cid: lb for cid, (_, lb, _) in _verdicts(out).items()}
    local_v = {cid: lb for cid, (_, lb, _) in _verdicts(local).items()}
    assert ray_v == local_v, p.stdout
    assert any(_FAILURES & set(lb) for lb in ray_v.values())
