"""``strata-bench plot``: PNG charts from records (matplotlib, no display needed).

- ``tokens_per_s_vs_prompt.png``: prompt tokens/s (mean, stddev as error bars) against prompt length,
  one line per target and configuration (and depth, when several were measured);
- ``hit_rate_vs_cache.png``: decode hit rate of the expert cache against its size in slots (the plan's
  slot count, so ``--expert-cache auto`` rows land where they belong), one line per decode test.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._grid import swept_knobs
from ._records import failed

__all__ = ["plot_records"]


def _label(rec: dict[str, Any], knobs: Sequence[str], with_model: bool = False) -> str:
    k = rec.get("knobs") or {}
    parts = [str(rec.get("target"))] + ([str(rec.get("model"))] if with_model else [])
    if rec.get("target") == "strata":
        parts += [f"{n.replace('_', '-')}={k.get(n)}" for n in knobs]
    return " ".join(parts)


def _cache_slots(rec: dict[str, Any]) -> int | None:
    plan = rec.get("plan") or {}
    if plan.get("n_slots") is not None:
        return int(plan["n_slots"])
    v = (rec.get("knobs") or {}).get("expert_cache")
    return int(v) if isinstance(v, (int, str)) and str(v).isdigit() else None


def plot_records(records: Sequence[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """Write the charts the records have data for; returns the files written."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    speed = [r for r in records if r.get("unit") == "t/s" and not failed(r)]  # a failed test has no figure
    knobs = swept_knobs([r.get("knobs") or {} for r in speed if r.get("target") == "strata"])
    models = sorted({str(r.get("model")) for r in speed})
    many = len(models) > 1

    # ---- prompt tokens/s against prompt length --------------------------------------------------
    pp = [r for r in speed if (r.get("n_prompt") or 0) > 0 and not r.get("n_gen")]
    if pp:
        depths = {r.get("n_depth", 0) for r in pp}
        lines: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
        for r in pp:
            label = _label(r, [k for k in knobs if k != "max_context"], many)
            if len(depths) > 1:
                label += f" @ d{r.get('n_depth', 0)}"
            lines[label][int(r["n_prompt"])] = r
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
        for label, pts in lines.items():
            xs = sorted(pts)
            ax.errorbar(
                xs,
                [pts[x]["mean"] for x in xs],
                yerr=[pts[x].get("stddev") or 0 for x in xs],
                marker="o",
                capsize=3,
                label=label,
            )
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("prompt tokens/s")
        ax.set_title("prompt speed" if many else f"prompt speed — {models[0]} ({pp[0].get('quant')})")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / "tokens_per_s_vs_prompt.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)

    # ---- hit rate against cache size ------------------------------------------------------------
    hit_lines: dict[str, dict[int, float]] = defaultdict(dict)
    for r in speed:
        m = r.get("metrics") or {}
        slots = _cache_slots(r)
        if r.get("target") != "strata" or not r.get("n_gen") or m.get("hit_rate") is None or slots is None:
            continue
        other = [k for k in knobs if k not in ("expert_cache", "max_context")]
        hit_lines[f"{r['test']} " + _label(r, other, many).removeprefix("strata").strip()][slots] = (
            100 * float(m["hit_rate"])
        )
    if hit_lines:
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
        for label, rates in hit_lines.items():
            slots_sorted = sorted(rates)
            ax.plot(slots_sorted, [rates[x] for x in slots_sorted], marker="o", label=label.strip())
        ax.set_xlabel("expert-cache slots")
        ax.set_ylabel("decode hit rate (%)")
        ax.set_ylim(0, 100)
        ax.set_title("expert-cache hit rate against cache size")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / "hit_rate_vs_cache.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written
