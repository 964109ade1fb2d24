"""``strata profile save`` writes a ranked profile that ``--expert-profile`` reads back."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from strata import Engine, EngineConfig
from strata.cli import main


def test_profile_save_round_trip(tmp_path: Path, capsys) -> None:
    from strata.model import ensure_model

    model = ensure_model("tiny")
    out = tmp_path / "p.txt"
    rc = main(
        [
            "profile",
            "save",
            "--model",
            str(model),
            "--out",
            str(out),
            "--tokens",
            "48",
            "--max-tokens",
            "48",
            "--threads",
            "1",
            "--expert-cache",
            "40",
            "--adapt-every",
            "8",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    assert (
        f"wrote {out}: 128 experts ranked after 48 prompt and 48 generated tokens" in capsys.readouterr().out
    )
    rows = [ln.split() for ln in out.read_text().splitlines() if not ln.startswith("#")]
    assert len(rows) == 128 and len({(r[0], r[1]) for r in rows}) == 128
    scores = [float(r[2]) for r in rows]
    assert scores == sorted(scores, reverse=True) and scores[0] > 0
    with Engine(model, EngineConfig(threads=1, expert_cache="16", expert_profile=str(out))) as eng:
        res = eng.residency()
        assert [int(res[int(r[0]), int(r[1])]) for r in rows[:16]] == list(range(16))
        assert int((res >= 0).sum()) == 16 and np.all(res[res >= 0] < 16)


def test_profile_save_reports_errors(tmp_path: Path, capsys) -> None:
    from strata.model import ensure_model

    rc = main(
        [
            "profile",
            "save",
            "--model",
            str(ensure_model("tiny")),
            "--out",
            str(tmp_path / "no" / "dir" / "p.txt"),
            "--tokens",
            "8",
            "--max-tokens",
            "4",
            "--threads",
            "1",
        ]
    )
    assert rc == 1
    assert "cannot write the profile to" in capsys.readouterr().err
