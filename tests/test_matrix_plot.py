"""repro_matrix plot: the heat map is written, opened, and shows the failing squares where they are."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from matplotlib import image

from repro_matrix import Cell, Matrix
from repro_matrix._plot import COLORS, prompt_outcomes
from repro_matrix._runner import RunDir


def _matrix() -> Matrix:
    return Matrix.from_dict(
        {
            "name": "sweep",
            "axes": {"expert_cache": [3840, 4352, 4864, 5376], "lend_policy": ["legacy", "current"]},
            "prompts": {"chunks": [2048, 3072]},
            "reference": {"expert_cache": "auto"},
        }
    )


def _rec(cell: Cell, failing_prompts: set[int]) -> dict:
    reqs = [
        {"prompt": k, "status": "error", "error_code": "lend_failed", "error_message": "lending failed"}
        if k in failing_prompts
        else {"prompt": k, "status": "ok", "tokens": [1, 2, 3]}
        for k in (0, 1)
    ]
    return {
        "cell_id": cell.cell_id,
        "cell": cell.to_dict(),
        "starts": [{"start": 0, "requests": reqs}],
        "prompts": [{"index": 0, "length": 2008, "chunk": 2048}, {"index": 1, "length": 3032, "chunk": 3072}],
    }


def _run(tmp: Path, fail: bool) -> Path:
    m = _matrix()
    rd = RunDir(tmp / ("fail" if fail else "pass"))
    rd.start(m, {}, {}, resume=False)
    for c in m.cells():
        bad = (
            fail
            and not c.reference
            and c.knob("lend_policy") == "legacy"
            and c.knob("expert_cache") in ("4352", "4864")
        )
        rd.append(_rec(c, {0} if bad else set()))
    return rd.path


def _pixels(png: Path, color: str) -> int:
    img = image.imread(png)[:, :, :3]
    want = np.array([int(color[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(img - want).max(axis=2) < 0.02).sum())


def test_the_heat_map_shows_the_failing_squares(tmp_path: Path):
    out = _run(tmp_path, fail=True)
    p = subprocess.run(
        [sys.executable, "-m", "repro_matrix", "plot", str(out)], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    png = out / "verdicts.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = image.imread(png)
    assert img.shape[0] >= 300 and img.shape[1] >= 600  # at least 6 x 3 inches at 100 dpi
    red, green = _pixels(png, COLORS["lend failed"]), _pixels(png, COLORS["ok"])
    # 2 of the 16 squares (legacy, 4352 and 4864, the 2048-token chunk) fail, 14 pass; the legend's two
    # patches are small beside them
    assert red > 0 and green > 0
    assert 0.09 < red / (red + green) < 0.16, (red, green)
    # the failing squares are in the upper panel (legacy), its lower row (the 2048 chunk), the middle columns
    mask = np.abs(img[:, :, :3] - np.array([0xE3, 0x1A, 0x1C]) / 255).max(axis=2) < 0.02
    rows, cols = np.nonzero(mask[:, : int(img.shape[1] * 0.8)])  # without the legend
    assert rows.min() > img.shape[0] * 0.1 and rows.max() < img.shape[0] * 0.6  # legacy: the upper panel
    width = cols.max() - cols.min()
    assert 0.3 < width / (img.shape[1] * 0.8) < 0.6  # two of four columns


def test_no_failure_no_red_and_prompt_outcomes(tmp_path: Path):
    out = _run(tmp_path, fail=False)
    png = tmp_path / "heat.png"
    p = subprocess.run(
        [sys.executable, "-m", "repro_matrix", "plot", str(out), "-o", str(png)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert _pixels(png, COLORS["lend failed"]) == 0 and _pixels(png, COLORS["ok"]) > 0
    m = _matrix()
    ref = _rec(m.cells()[0], set())
    c = m.cells()[1]
    rec = _rec(c, set())
    rec["starts"][0]["requests"][1]["tokens"] = [1, 9, 3]
    rec["starts"].append(
        {
            "start": 1,
            "requests": [
                {"prompt": 0, "status": "ok", "tokens": [1, 2, 4]},
                {"prompt": 1, "status": "error", "error_code": "engine_exited"},
            ],
        }
    )
    assert prompt_outcomes(rec, ref, 1e-3) == {0: "nondeterministic", 1: "engine exited"}
    bad = subprocess.run(
        [sys.executable, "-m", "repro_matrix", "plot", str(out), "--x", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "--x 'nope'" in bad.stderr
