"""plot: PNG charts of prompt tokens/s against prompt length (log axis) and of decode tokens/s with the
hit rate against the expert cache's size for a budget sweep; the figures' data are checked, the PNGs opened."""

from __future__ import annotations

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import pytest

from strata_bench._plot import decode_vs_cache_figure, plot_records, prompt_figure
from strata_bench._records import RecordWriter
from strata_bench.cli import main

GIB = 1 << 30
SLOT = 9 << 20  # bytes of one expert-cache slot


def _rec(
    target: str, test: str, mean: float, cache: str | None = None, hit: float | None = None, **knobs
) -> dict:
    n_prompt = int(test[2:]) if test.startswith("pp") else 0
    n_gen = int(test[2:]) if test.startswith("tg") else 0
    k = {"expert_cache": cache, "threads": 2, **knobs} if target == "strata" else {"threads": 2, **knobs}
    rec = {
        "target": target, "model": "m.gguf", "quant": "Q4_K_M", "test": test, "n_prompt": n_prompt,
        "n_gen": n_gen, "n_depth": 0, "unit": "t/s", "mean": mean, "stddev": 1.0, "knobs": k,
        "metrics": {"hit_rate": hit} if hit is not None else None,
    }  # fmt: skip
    return rec


def _budget_sweep() -> list[dict]:
    """strata decoding at four budgets (its plan: slots x slot bytes), and llama.cpp at two of them."""
    recs = []
    for budget, slots, tps, hit in ((8, 300, 40.0, 0.35), (12, 750, 82.0, 0.62), (16, 1200, 120.0, 0.84),
                                    (24, 2100, 190.0, 0.99)):  # fmt: skip
        r = _rec("strata", "tg128", tps, hit=hit, vram_budget=budget * GIB, device="cuda")
        r["plan"] = {"n_slots": slots, "slot_bytes": SLOT}
        recs.append(r)
        recs.append({**_rec("strata", "pp512", 1000.0 + budget, vram_budget=budget * GIB, device="cuda"),
                     "plan": r["plan"]})  # fmt: skip
    for budget, ncmoe_tps in ((12, (79.0, 70.0)), (24, (150.0, 140.0))):
        for n, tps in zip((19, 22), ncmoe_tps, strict=True):
            recs.append(_rec("llama.cpp", "tg128", tps, vram_budget=budget * GIB, device="cuda",
                             n_gpu_layers=99, n_cpu_moe=n))  # fmt: skip
    return recs


def test_decode_against_the_cache_with_hit_rate_on_a_second_axis() -> None:
    fig = decode_vs_cache_figure(_budget_sweep())
    assert fig is not None
    ax, hit_ax = fig.axes
    assert ax.get_xlabel() == "expert cache (GiB)" and ax.get_ylabel() == "decode tokens/s"
    assert hit_ax.get_ylabel().startswith("expert-cache hit rate") and hit_ax.get_ylim() == (0, 100)
    sizes = [slots * SLOT / GIB for slots in (300, 750, 1200, 2100)]
    (bars,) = ax.containers  # strata's decode speed, with its stddev as error bars
    assert bars.get_label() == "strata tg128 t/s"
    speed = bars.lines[0]
    (peer,) = [line for line in ax.get_lines() if "t/s" in line.get_label()]
    assert list(speed.get_xdata()) == pytest.approx(sizes)
    assert list(speed.get_ydata()) == [40.0, 82.0, 120.0, 190.0]
    (hits,) = hit_ax.get_lines()
    assert list(hits.get_xdata()) == pytest.approx(sizes) and list(hits.get_ydata()) == pytest.approx(
        [35, 62, 84, 99]
    )
    assert hits.get_linestyle() == "--" and hits.get_color() == speed.get_color()
    # llama.cpp at 12 and 24 GiB: at strata's cache size of those budgets, its faster --n-cpu-moe
    assert peer.get_label() == "llama.cpp tg128 t/s (same budget)"
    assert list(peer.get_xdata()) == pytest.approx([sizes[1], sizes[3]]) and list(peer.get_ydata()) == [
        79.0,
        150.0,
    ]
    plt.close(fig)


def test_prompt_speed_on_a_log_axis_with_each_llama_setting() -> None:
    recs = [_rec("strata", f"pp{p}", 100.0 + p / 10, "64") for p in (64, 512, 4096)]
    recs += [_rec("llama.cpp", f"pp{p}", 90.0 + p / 20, n_ubatch=512, n_batch=2048) for p in (64, 512, 4096)]
    recs.append(_rec("llama.cpp", "pp4096", 400.0, n_ubatch=4096, n_batch=4096))
    fig = prompt_figure(recs)
    (ax,) = fig.axes
    assert ax.get_xscale() == "log" and "log scale" in ax.get_xlabel()
    labels = sorted(t.get_text() for t in ax.get_legend().get_texts())
    assert labels == [
        "llama.cpp -ub 4096 -b 4096",
        "llama.cpp -ub 512",
        "strata",
    ]  # the two llama.cpp runs apart
    plt.close(fig)


def test_the_pngs(tmp_path) -> None:
    written = plot_records(_budget_sweep(), tmp_path / "plots")
    assert sorted(p.name for p in written) == ["decode_vs_cache.png", "tokens_per_s_vs_prompt.png"]
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = mpimg.imread(p)
        assert img.shape[:2] == (540, 840)  # 7 x 4.5 inches at 120 dpi
        assert img[..., :3].std() > 0.05  # something was drawn
    # an --expert-cache sweep without slot sizes: the axis is in slots
    recs = [_rec("strata", "tg32", 20.0 + int(c), c, 0.3 + int(c) / 100) for c in ("8", "16", "32")]
    fig = decode_vs_cache_figure(recs)
    assert fig.axes[0].get_xlabel() == "expert cache (slots)"
    assert list(fig.axes[0].containers[0].lines[0].get_xdata()) == [8, 16, 32]
    plt.close(fig)


def test_only_what_the_records_support(tmp_path, capsys) -> None:
    recs = [_rec("llama.cpp", "pp64", 90.0), _rec("llama.cpp", "tg32", 20.0)]
    assert [p.name for p in plot_records(recs, tmp_path)] == ["tokens_per_s_vs_prompt.png"]
    f = tmp_path / "tg.jsonl"
    w = RecordWriter(f)
    w.append(_rec("llama.cpp", "tg32", 20.0))
    assert main(["plot", str(f), "--out", str(tmp_path / "none")]) == 1
    assert "nothing to plot" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()
    f = tmp_path / "sweep.jsonl"
    w = RecordWriter(f)
    for r in _budget_sweep():
        w.append(r)
    assert main(["plot", str(f), "--out", str(tmp_path / "p")]) == 0
    assert sorted(capsys.readouterr().out.split()) == sorted(str(tmp_path / "p" / n) for n in
                                                             ("decode_vs_cache.png", "tokens_per_s_vs_prompt.png"))  # fmt: skip


def test_failed_rows_are_left_out(tmp_path) -> None:
    ok = [_rec("strata", f"pp{p}", 100.0 + p, "8") for p in (64, 256)]
    lost = [
        {**_rec("strata", f"pp{p}", 0.0, "16"), "mean": None, "stddev": None, "status": "failed"}
        for p in (64, 256)
    ]
    written = plot_records(ok + lost, tmp_path)
    assert [p.name for p in written] == ["tokens_per_s_vs_prompt.png"]
    assert plot_records(lost, tmp_path / "none") == []  # nothing measured, nothing drawn
