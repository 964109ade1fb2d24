"""plot: PNG charts of tokens/s against prompt length and hit rate against cache size."""

from __future__ import annotations

import matplotlib.image as mpimg

from strata_bench._plot import plot_records
from strata_bench._records import RecordWriter
from strata_bench.cli import main


def _rec(target: str, test: str, mean: float, cache: str | None = None, hit: float | None = None) -> dict:
    n_prompt = int(test[2:]) if test.startswith("pp") else 0
    n_gen = int(test[2:]) if test.startswith("tg") else 0
    knobs = {"expert_cache": cache, "threads": 2} if target == "strata" else {"threads": 2}
    return {
        "target": target,
        "model": "tiny.gguf",
        "quant": "Q8_0",
        "test": test,
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "n_depth": 0,
        "unit": "t/s",
        "mean": mean,
        "stddev": 1.0,
        "knobs": knobs,
        "metrics": {"hit_rate": hit} if hit is not None else None,
    }


def test_both_charts(tmp_path) -> None:
    recs = []
    for cache, hit in (("8", 0.3), ("16", 0.55), ("32", 0.9)):
        recs += [_rec("strata", f"pp{p}", 100.0 + p / 10, cache) for p in (64, 256, 1024)]
        recs.append(_rec("strata", "tg32", 20.0, cache, hit))
    recs += [_rec("llama.cpp", f"pp{p}", 90.0 + p / 20) for p in (64, 256, 1024)]
    written = plot_records(recs, tmp_path / "plots")
    assert sorted(p.name for p in written) == ["hit_rate_vs_cache.png", "tokens_per_s_vs_prompt.png"]
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = mpimg.imread(p)
        assert img.shape[:2] == (540, 840)  # 7 x 4.5 inches at 120 dpi
        assert img[..., :3].std() > 0.05  # something was drawn


def test_only_what_the_records_support(tmp_path, capsys) -> None:
    recs = [_rec("llama.cpp", "pp64", 90.0), _rec("llama.cpp", "tg32", 20.0)]
    assert [p.name for p in plot_records(recs, tmp_path)] == ["tokens_per_s_vs_prompt.png"]
    f = tmp_path / "tg.jsonl"
    w = RecordWriter(f)
    w.append(_rec("llama.cpp", "tg32", 20.0))
    assert main(["plot", str(f), "--out", str(tmp_path / "none")]) == 1
    assert "nothing to plot" in capsys.readouterr().err


def test_failed_rows_are_left_out(tmp_path) -> None:
    ok = [_rec("strata", f"pp{p}", 100.0 + p, "8") for p in (64, 256)]
    lost = [
        {**_rec("strata", f"pp{p}", 0.0, "16"), "mean": None, "stddev": None, "status": "failed"}
        for p in (64, 256)
    ]
    written = plot_records(ok + lost, tmp_path)
    assert [p.name for p in written] == ["tokens_per_s_vs_prompt.png"]
    assert plot_records(lost, tmp_path / "none") == []  # nothing measured, nothing drawn
