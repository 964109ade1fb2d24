"""``strata-bench plot``: PNG charts from records (matplotlib, no display needed).

- ``tokens_per_s_vs_prompt.png``: prompt tokens/s (mean, stddev as error bars) against prompt length
  on a log axis, one line per target and configuration (each llama.cpp setting its own line, named by
  its flags; and per depth, when several were measured);
- ``decode_vs_cache.png``: decode tokens/s (mean ± stddev, solid) against the size of the expert cache,
  and on a second axis the cache's hit rate while it decoded (dashed, same colour), one line pair per
  decode test (and other swept knobs). The size is the plan's (slots x slot bytes, in GiB; slots when
  a row has no slot size), so a ``--vram-budget`` sweep and an ``--expert-cache`` sweep both land where
  they belong. llama.cpp's decode at the same budget, where measured, is drawn at the strata cache
  size of that budget (its fastest setting there).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._grid import swept_knobs
from ._records import failed
from ._tables import _llama_flags, best_peer, knob_str

__all__ = ["decode_vs_cache_figure", "plot_records", "prompt_figure"]

_SIZE = (7, 4.5)
_DPI = 120


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label(rec: dict[str, Any], knobs: Sequence[str], with_model: bool = False, flags: bool = False) -> str:
    k = rec.get("knobs") or {}
    parts = [str(rec.get("target"))] + ([str(rec.get("model"))] if with_model else [])
    if rec.get("target") == "strata":
        parts += [f"{n.replace('_', '-')}={knob_str(k.get(n), n)}" for n in knobs]
    else:
        if "vram_budget" in knobs and "vram_budget" in k:
            parts.append(f"budget={knob_str(k.get('vram_budget'), 'vram_budget')}")
        if flags:
            f = _llama_flags(k)
            parts.append(f if f != "-" else f"-ub {k.get('n_ubatch', 512)}")
    return " ".join(parts)


def _cache_size(rec: dict[str, Any]) -> tuple[float, str] | None:
    """(size, unit) of a row's expert cache: GiB from its plan, else slots from its plan or its knob."""
    plan = rec.get("plan") or {}
    if plan.get("n_slots") is not None and plan.get("slot_bytes"):
        return int(plan["n_slots"]) * int(plan["slot_bytes"]) / (1 << 30), "GiB"
    if plan.get("n_slots") is not None:
        return float(plan["n_slots"]), "slots"
    v = (rec.get("knobs") or {}).get("expert_cache")
    return (float(v), "slots") if isinstance(v, (int, str)) and str(v).isdigit() else None


def _measured(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("unit") == "t/s" and not failed(r) and r.get("mean") is not None]


def prompt_figure(records: Sequence[dict[str, Any]]) -> Any | None:
    """The prompt-speed figure, or None when the records hold no prompt test."""
    speed = _measured(records)
    pp = [r for r in speed if (r.get("n_prompt") or 0) > 0 and not r.get("n_gen")]
    if not pp:
        return None
    plt = _pyplot()
    import matplotlib.ticker

    knobs = [k for k in swept_knobs([r.get("knobs") or {} for r in speed if r.get("target") == "strata"])
             if k != "max_context"]  # fmt: skip
    models = sorted({str(r.get("model")) for r in speed})
    many = len(models) > 1
    peer_settings = {_llama_flags(r.get("knobs") or {}) for r in pp if r.get("target") != "strata"}
    depths = {r.get("n_depth", 0) for r in pp}
    lines: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in pp:
        label = _label(r, knobs, many, flags=len(peer_settings) > 1)
        if len(depths) > 1:
            label += f" @ d{r.get('n_depth', 0)}"
        lines[label][int(r["n_prompt"])] = r
    fig, ax = plt.subplots(figsize=_SIZE, dpi=_DPI)
    for label, pts in lines.items():
        xs = sorted(pts)
        ax.errorbar(xs, [pts[x]["mean"] for x in xs], yerr=[pts[x].get("stddev") or 0 for x in xs],
                    marker="o", capsize=3, label=label)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("prompt length (tokens, log scale)")
    ax.set_ylabel("prompt tokens/s")
    ax.set_title("prompt speed" if many else f"prompt speed — {models[0]} ({pp[0].get('quant')})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def decode_vs_cache_figure(records: Sequence[dict[str, Any]]) -> Any | None:
    """Decode tokens/s and hit rate against the expert cache's size, or None without such rows."""
    speed = _measured(records)
    dec = [r for r in speed if r.get("target") == "strata" and r.get("n_gen") and not r.get("n_prompt")]
    dec = [r for r in dec if _cache_size(r) is not None]
    if not dec:
        return None
    units = {_cache_size(r)[1] for r in dec}  # type: ignore[index]
    unit = "GiB" if units == {"GiB"} else "slots"

    def size(r: dict[str, Any]) -> float:
        s, u = _cache_size(r)  # type: ignore[misc]
        plan = r.get("plan") or {}
        return float(plan.get("n_slots") or s) if unit == "slots" and u == "GiB" else s

    knobs = swept_knobs([r.get("knobs") or {} for r in speed if r.get("target") == "strata"])
    other = [k for k in knobs if k not in ("expert_cache", "vram_budget", "max_context")]
    models = sorted({str(r.get("model")) for r in dec})
    many = len(models) > 1
    lines: dict[str, dict[float, dict[str, Any]]] = defaultdict(dict)
    for r in dec:
        lines[f"{_label(r, other, many)} {r['test']}"][size(r)] = r
    # llama.cpp at each budget: drawn at the cache size strata had at that budget
    at_budget: dict[tuple[Any, Any, Any], float] = {}
    for r in dec:
        k = r.get("knobs") or {}
        if k.get("vram_budget") is not None:
            at_budget[(r.get("model"), k["vram_budget"], r["test"])] = size(r)
    peers: dict[str, dict[float, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in speed:
        k = r.get("knobs") or {}
        x = at_budget.get((r.get("model"), k.get("vram_budget"), r.get("test")))
        if r.get("target") == "llama.cpp" and r.get("n_gen") and x is not None:
            peers[f"llama.cpp {r['test']} t/s (same budget)"][x].append(r)

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=_SIZE, dpi=_DPI)
    hit_ax = ax.twinx()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, pts) in enumerate(lines.items()):
        c = colors[i % len(colors)]
        xs = sorted(pts)
        ax.errorbar(xs, [pts[x]["mean"] for x in xs], yerr=[pts[x].get("stddev") or 0 for x in xs],
                    marker="o", capsize=3, color=c, label=f"{label} t/s")  # fmt: skip
        hx = [x for x in xs if (pts[x].get("metrics") or {}).get("hit_rate") is not None]
        if hx:
            hit_ax.plot(hx, [100 * float(pts[x]["metrics"]["hit_rate"]) for x in hx], linestyle="--",
                        marker="s", markersize=4, color=c, label=f"{label} hit rate")  # fmt: skip
    for j, (label, by_x) in enumerate(peers.items()):
        xs = sorted(by_x)
        best = [best_peer(by_x[x]) for x in xs]
        ax.plot(xs, [b["mean"] if b else float("nan") for b in best], marker="^", linestyle=":",
                color=colors[(len(lines) + j) % len(colors)], label=label)  # fmt: skip
    ax.set_xlabel(f"expert cache ({unit})")
    ax.set_ylabel("decode tokens/s")
    ax.set_ylim(bottom=0)
    hit_ax.set_ylabel("expert-cache hit rate (%, dashed)")
    hit_ax.set_ylim(0, 100)
    ax.set_title("decode speed and hit rate against the expert cache"
                 + ("" if many else f" — {models[0]} ({dec[0].get('quant')})"))  # fmt: skip
    ax.grid(True, alpha=0.3)
    handles = ax.get_legend_handles_labels()
    hit_handles = hit_ax.get_legend_handles_labels()
    ax.legend(handles[0] + hit_handles[0], handles[1] + hit_handles[1], fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def plot_records(records: Sequence[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """Write the charts the records have data for; returns the files written."""
    out = Path(out_dir)
    written: list[Path] = []
    for name, make in (
        ("tokens_per_s_vs_prompt.png", prompt_figure),
        ("decode_vs_cache.png", decode_vs_cache_figure),
    ):
        fig = make(records)
        if fig is None:
            continue
        out.mkdir(parents=True, exist_ok=True)
        path = out / name
        fig.savefig(path)
        _pyplot().close(fig)
        written.append(path)
    return written
