"""repro_matrix on the CUDA backend (marked gpu; skipped without a GPU).

1. CUDA cells against a CPU reference: between backends replies are compared with the near-tie rule (a
   CUDA reply may differ from the CPU reference's only where the reference's top-2 logit margin is below
   the matrix's threshold); the current policy serves every request.
2. The built-in matrix on the GPU, three starts per cell: the loan is real device memory there, so the
   legacy policy fails in a band of cache sizes, bisect pins the band exactly, the report's one-cell
   command reproduces it, and the current policy's replies equal the all-resident reference bit for bit.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from repro_matrix import Cell, judge
from repro_matrix._runner import RunDir, gpu_count

pytestmark = [
    pytest.mark.gpu,
    # the matrix runs its cells through `strata serve`: on a host without the server's dependencies
    # (a GPU host often has no package registry) there is nothing to run
    pytest.mark.skipif(
        any(importlib.util.find_spec(m) is None for m in ("strata.server.cli", "starlette", "uvicorn")),
        reason="needs the server (strata.server, starlette, uvicorn)",
    ),
]


def _cuda() -> bool:
    try:
        from strata import _engine

        return bool(_engine.cuda_available()) and gpu_count() > 0
    except Exception:  # noqa: BLE001 - no library, no driver: no GPU
        return False


@pytest.mark.skipif(not _cuda(), reason="no CUDA device")
def test_cuda_cells_match_the_cpu_reference_or_differ_at_a_near_tie(tmp_path: Path):
    m = tmp_path / "gpu.toml"
    m.write_text(
        'model = "tiny"\nmax_tokens = 16\nnear_tie = 0.01\n'
        '[engine]\ndevice = "cuda"\nmax_context = 512\nvram_budget = "64MiB"\n'
        '[axes]\nexpert_cache = [600, 1024]\nlend_policy = ["legacy", "current"]\n'
        "[prompts]\nchunks = [256, 512]\n"
        '[reference]\ndevice = "cpu"\nlend_policy = "current"\n'
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
            "--jobs",
            "4",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode in (0, 1), p.stderr
    if gpu_count() < 4:
        assert "one cell per GPU" in p.stderr
    recs = RunDir(out).records()
    ref = next(r for r in recs if r["cell"].get("reference"))
    assert Cell.from_dict(ref["cell"]).knob("device") == "cpu"
    n = 0
    for rec in recs:
        cell = Cell.from_dict(rec["cell"])
        if cell.reference or cell.knob("lend_policy") != "current":
            continue
        v = judge(rec, ref, near_tie=0.01)
        assert set(v.labels) <= {"ok", "halved", "reply differs"}, v.detail
        if v.difference is not None:
            assert v.difference.near_tie, v.detail
        assert rec["plan"]["device"] == 1  # the engine planned for CUDA
        n += 1
    assert n == 2
    print(p.stdout)


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "repro_matrix.cli", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=cwd,
    )


def legacy_band(
    device: str, n_tokens: int = 2000, lo: int = 2000, hi: int = 9000, step: int = 100
) -> tuple[int, int]:
    """The exact first and last --expert-cache sizes at which the built-in matrix's engine (on `device`)
    fails a prompt of n_tokens under the legacy policy, by the device's own plan (_memplan.predict):
    sampled every `step` sizes, then each edge by bisection. One band is assumed (the built-in matrix's)."""
    from strata import Engine, EngineConfig
    from strata._memplan import predict
    from strata.model import ensure_model

    tiny = ensure_model("tiny")

    def fails(n: int) -> bool:
        cfg = EngineConfig(
            device=device, threads=2, vram_budget=256 << 20, expert_cache=str(n), lend_policy="legacy"
        )
        try:
            with Engine(tiny, cfg) as eng:
                return predict(eng, n_tokens).verdict == "lend failed"
        except Exception:  # noqa: BLE001 - a size the budget cannot hold
            return False

    sampled = [n for n in range(lo, hi, step) if fails(n)]
    assert sampled, f"no legacy failure between {lo} and {hi} on {device}"

    def edge(ok: int, bad: int) -> int:  # the failing size next to the passing one
        while abs(bad - ok) > 1:
            mid = (ok + bad) // 2
            if fails(mid):
                bad = mid
            else:
                ok = mid
        return bad

    return edge(sampled[0] - step, sampled[0]), edge(sampled[-1] + step, sampled[-1])


def check_builtin_matrix_finds_the_band(tmp_path: Path, device: str) -> None:
    """A small version of the built-in matrix on `device`, three starts per cell: cache sizes just outside
    and inside the legacy band that the device's plan predicts; bisect must pin the band's edges to the
    predicted ones, the report's one-cell command must reproduce the failure, and the current policy's
    replies must equal the all-resident reference's on every start."""
    first, last = legacy_band(device)
    sizes = [first - 9, first + 3, last - 3, last + 9]  # bisect searches the sizes between, around each edge
    out = tmp_path / "out"
    p = _cli(
        "run",
        "builtin",
        "--out",
        str(out),
        "--set",
        f"device={device}",
        "--set",
        "max_tokens=8",
        "--set",
        "chunks=2048",
        "--axis",
        "expert_cache=" + ",".join(map(str, sizes)),
        "--starts",
        "3",
        "--no-progress",
    )
    assert p.returncode in (0, 1), p.stderr
    b = _cli("bisect", str(out), "--knob", "expert_cache", "--where", "lend_policy=legacy")
    assert b.returncode in (0, 1), b.stderr
    recs = RunDir(out).records()
    ref = next(r for r in recs if r["cell"].get("reference"))
    assert Cell.from_dict(ref["cell"]).knob("device") == device
    ref_tokens = {
        r["prompt"]: r["tokens"] for st in ref["starts"] for r in st["requests"] if r["status"] == "ok"
    }
    assert ref_tokens
    legacy: dict[int, bool] = {}
    n_current = 0
    for rec in recs:
        cell = Cell.from_dict(rec["cell"])
        if cell.reference:
            continue
        assert len(rec["starts"]) == 3
        labels = set(judge(rec, ref, near_tie=1e-3).labels)
        if cell.knob("lend_policy") == "legacy":
            legacy[int(cell.knob("expert_cache"))] = "lend failed" in labels
        else:
            assert labels <= {"ok", "halved"}, (cell.label(["expert_cache"]), labels)
            for st in rec["starts"]:  # every start replies exactly as the all-resident reference
                assert {r["prompt"]: r["tokens"] for r in st["requests"]} == ref_tokens
            n_current += 1
    assert n_current == 4
    assert [legacy[n] for n in sizes] == [False, True, True, False], legacy
    # bisect's edges: the exact first and last failing sizes, each run, and in the predicted sample
    res = json.loads((out / "bisect.json").read_text())
    rng = next(r for r in res if r["group"].get("lend_policy") == "legacy")["ranges"][0]
    assert rng["below"] == rng["first"] - 1 and rng["above"] == rng["last"] + 1
    assert legacy[rng["below"]] is False and legacy[rng["first"]] is True
    assert legacy[rng["last"]] is True and legacy[rng["above"]] is False
    assert (rng["first"], rng["last"]) == (first, last)  # the matrix's edges are the plan's, exactly
    # the report's one-cell matrix reproduces the failure on the device
    r = _cli("report", str(out))
    assert r.returncode == 0, r.stderr
    text = (out / "report.md").read_text()
    assert "lending the prompt path its slots failed" in text
    one = next(ln for ln in text.splitlines() if ln.startswith("repro_matrix run -"))
    assert device == "cpu" or f"device={device}" in one  # (cpu is the default: not written)
    again = tmp_path / "again"
    q = _cli(*shlex.split(one)[1:], "--out", str(again), "--no-progress")
    assert q.returncode in (0, 1), q.stderr
    cell_recs = RunDir(again).records()  # one cell (a one-cell matrix is its own reference)
    assert cell_recs and all("lend failed" in judge(x, None, near_tie=1e-3).labels for x in cell_recs), (
        one,
        [judge(x, None, near_tie=1e-3).labels for x in cell_recs],
    )


@pytest.mark.skipif(not _cuda(), reason="no CUDA device")
def test_the_builtin_matrix_on_the_gpu_finds_and_pins_the_legacy_band(tmp_path: Path):
    check_builtin_matrix_finds_the_band(tmp_path, "cuda")


@pytest.mark.skipif(not _cuda(), reason="no CUDA device")
def test_cuda_split_cells_reply_as_the_one_device_reference(tmp_path: Path):
    """A CUDA matrix whose cells split the layers: over two plans on one card (gpus 0,0: one card each
    cell), and over two cards where the machine has them; every split cell replies as the one-device CUDA
    reference does, bit for bit."""
    gpus = ['"0,0"'] + (['"0,1"'] if gpu_count() >= 2 else [])
    m = tmp_path / "split.toml"
    m.write_text(
        'model = "tiny"\nmax_tokens = 16\n'
        '[engine]\ndevice = "cuda"\nmax_context = 512\nsplit = "layer"\n'
        f'[axes]\ngpus = [{", ".join(gpus)}]\nexpert_cache = ["auto", "48"]\n'
        "[prompts]\nchunks = [256, 512]\n"
        '[reference]\nsplit = "none"\nexpert_cache = "auto"\n'
    )
    out = tmp_path / "out"
    p = _cli("run", str(m), "--out", str(out), "--jobs", "2", "--no-progress")
    assert p.returncode == 0, p.stdout + p.stderr
    recs = RunDir(out).records()
    ref = next(r for r in recs if r["cell"].get("reference"))
    split = [r for r in recs if not r["cell"].get("reference")]
    assert len(split) == 2 * len(gpus)
    for rec in split:
        assert judge(rec, ref, near_tie=0.0).labels == ["ok"], rec["cell"]
