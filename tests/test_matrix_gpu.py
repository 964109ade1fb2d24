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
        '[prompts]\nchunks = [256, 512]\n'
        '[reference]\ndevice = "cpu"\nlend_policy = "current"\n'
    )
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "repro_matrix.cli", "run", str(m), "--out", str(out), "--jobs", "4",
                        "--no-progress"], capture_output=True, text=True, timeout=900)
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
    return subprocess.run([sys.executable, "-m", "repro_matrix.cli", *args], capture_output=True, text=True,
                          timeout=900, cwd=cwd)


@pytest.mark.skipif(not _cuda(), reason="no CUDA device")
def test_the_builtin_matrix_on_the_gpu_finds_and_pins_the_legacy_band(tmp_path: Path):
    out = tmp_path / "out"
    p = _cli("run", "builtin", "--out", str(out), "--set", "device=cuda", "--set", "max_tokens=8", "--set",
             "chunks=2048", "--starts", "3", "--no-progress")
    assert p.returncode in (0, 1), p.stderr
    b = _cli("bisect", str(out), "--knob", "expert_cache", "--where", "lend_policy=legacy")
    assert b.returncode in (0, 1), b.stderr
    rd = RunDir(out)
    recs = rd.records()
    ref = next(r for r in recs if r["cell"].get("reference"))
    assert Cell.from_dict(ref["cell"]).knob("device") == "cuda" and ref["plan"]["device"] == 1
    ref_tokens = {r["prompt"]: r["tokens"] for st in ref["starts"] for r in st["requests"] if r["status"] == "ok"}
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
            # every start of every current cell replies exactly as the all-resident reference
            for st in rec["starts"]:
                assert {r["prompt"]: r["tokens"] for r in st["requests"]} == ref_tokens
            n_current += 1
    assert n_current >= 5
    failing = sorted(k for k, v in legacy.items() if v)
    assert failing, f"legacy never failed on the GPU: {sorted(legacy)}"
    # bisect's edges were run, and the records agree with them
    res = json.loads((out / "bisect.json").read_text())
    rng = next(r for r in res if r["group"].get("lend_policy") == "legacy")["ranges"][0]
    assert rng["below"] == rng["first"] - 1 and rng["above"] == rng["last"] + 1
    assert legacy[rng["below"]] is False and legacy[rng["first"]] is True
    assert legacy[rng["last"]] is True and legacy[rng["above"]] is False
    # the report's one-cell matrix reproduces the failure on the device
    r = _cli("report", str(out))
    assert r.returncode == 0, r.stderr
    text = (out / "report.md").read_text()
    assert "lending the prompt path its slots failed" in text
    one = next(ln for ln in text.splitlines() if ln.startswith("repro_matrix run -"))
    assert "device=cuda" in one
    again = tmp_path / "again"
    q = _cli(*shlex.split(one)[1:], "--out", str(again), "--no-progress")
    assert q.returncode in (0, 1), q.stderr
    cell_recs = [x for x in RunDir(again).records() if not x["cell"].get("reference")]
    assert cell_recs and all("lend failed" in judge(x, None, near_tie=1e-3).labels for x in cell_recs)
