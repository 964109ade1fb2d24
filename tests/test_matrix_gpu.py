"""repro_matrix on the CUDA backend (marked gpu; skipped without a GPU): CUDA cells against a CPU reference.

Between backends replies are compared with the near-tie rule: a CUDA reply may differ from the CPU
reference's only where the reference's top-2 logit margin is below the matrix's threshold. The lend
invariant holds on the GPU too: the current policy serves every request.
"""

from __future__ import annotations

import importlib.util
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
