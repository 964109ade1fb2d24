"""``repro_matrix plot``: the matrix's verdicts as a heat map, expert-cache size × prompt chunk.

Each square is one prompt of one cell (the y axis is the chunk the prompt was made for; with
``--y KNOB``, a swept knob, each square is a whole cell), coloured by what happened to it over all the
cell's starts, the worst first: the engine did not start, exited, the loan failed, the request failed,
the reply changed between starts, it differs from the reference's, the chunk was halved, ok. One panel
per value of the other swept knobs (legacy and current lend policy side by side). Written with
matplotlib's Agg canvas (no display needed) as PNG, SVG or PDF, by the file's suffix.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._matrix import Cell, Matrix
from ._verdict import first_difference, judge

__all__ = ["COLORS", "prompt_outcomes", "plot_verdicts"]

#: One colour per verdict (and for a square with no result), worst first.
COLORS: dict[str, str] = {
    "engine start failed": "#6a3d9a",
    "engine exited": "#8b0000",
    "lend failed": "#e31a1c",
    "request failed": "#b15928",
    "nondeterministic": "#ffd92f",
    "reply differs": "#ff7f00",
    "halved": "#a6d96a",
    "ok": "#1a9641",
    "not run": "#d9d9d9",
}
_ORDER = list(COLORS)


def _worst(labels: Sequence[str]) -> str:
    return min(labels, key=_ORDER.index) if labels else "ok"


def prompt_outcomes(rec: dict[str, Any], reference: dict[str, Any] | None, near_tie: float) -> dict[int, str]:
    """For each prompt of a cell's record, the worst thing that happened to it over the cell's starts."""
    prompts = [p["index"] for p in rec.get("prompts", [])]
    starts = rec.get("starts", [])
    if starts and all(st.get("start_error") for st in starts):
        return {k: "engine start failed" for k in prompts}
    ref: dict[int, list[int]] = {}
    if reference is not None and reference.get("cell_id") != rec.get("cell_id"):
        for st in reference.get("starts", []):
            for r in st.get("requests", []):
                if r.get("status") == "ok":
                    ref.setdefault(r["prompt"], r["tokens"])
    out: dict[int, list[str]] = {k: [] for k in prompts}
    first: dict[int, list[int]] = {}
    for st in starts:
        for r in st.get("requests", []):
            k = r["prompt"]
            seen = out.setdefault(k, [])
            if r.get("status") != "ok":
                code = r.get("error_code")
                seen.append(
                    {
                        "lend_failed": "lend failed",
                        "engine_exited": "engine exited",
                        "server_exited": "engine exited",
                    }.get(str(code), "request failed")
                )
                continue
            if r.get("halvings"):
                seen.append("halved")
            tokens = r.get("tokens", [])
            if k in first and first_difference(tokens, first[k], [], prompt=k, near_tie=near_tie) is not None:
                seen.append("nondeterministic")
            first.setdefault(k, tokens)
            if k in ref and tokens != ref[k]:
                seen.append("reply differs")
    return {k: _worst(v) for k, v in out.items()}


def _num(v: Any) -> tuple[int, float | str]:
    try:
        return (0, float(v))
    except (TypeError, ValueError):
        return (1, str(v))


def plot_verdicts(
    matrix: Matrix,
    records: Sequence[dict[str, Any]],
    path: str | Path,
    *,
    x: str = "expert_cache",
    y: str = "chunk",
    dpi: int = 100,
) -> Path:
    """Draw the heat map of ``records`` to ``path``; the path written."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    path = Path(path)
    ref = next((r for r in records if r["cell"].get("reference")), None)
    cells = [r for r in records if not r["cell"].get("reference")]
    if not cells:
        raise ValueError("the run holds no cell besides the reference: nothing to plot")
    knobs = [k for k in matrix.swept_knobs() if k not in (x, y)]
    # squares: (facet, x value, y value) -> verdict
    squares: dict[tuple[tuple[Any, ...], Any, Any], str] = {}
    for rec in cells:
        cell = Cell.from_dict(rec["cell"])
        facet = tuple(cell.knob(k) for k in knobs)
        xv = cell.knob(x)
        if y == "chunk":
            outcomes = prompt_outcomes(rec, ref, matrix.near_tie)
            for p in rec.get("prompts", []):
                yv = p.get("chunk") or f"{p['length']} tokens"
                key = (facet, xv, yv)
                squares[key] = (
                    _worst([squares[key], outcomes[p["index"]]]) if key in squares else outcomes[p["index"]]
                )
            if not rec.get("prompts"):  # no start got far enough to make the prompts
                v = judge(rec, ref, near_tie=matrix.near_tie, fail_on=matrix.fail_on)
                rows: list[Any] = list(matrix.chunks) or ["all prompts"]
                for c in rows:
                    squares[(facet, xv, c)] = v.label
        else:
            v = judge(rec, ref, near_tie=matrix.near_tie, fail_on=matrix.fail_on)
            squares[(facet, xv, cell.knob(y))] = v.label

    def facet_key(f: tuple[Any, ...]) -> tuple[Any, ...]:
        # the declared order of an axis (legacy before current), else by value
        return tuple(
            (0, matrix.axes[k].index(v)) if v in matrix.axes.get(k, []) else _num(v)
            for k, v in zip(knobs, f, strict=True)
        )

    facets = sorted({k[0] for k in squares}, key=facet_key)
    xs = sorted({k[1] for k in squares}, key=_num)
    ys = sorted({k[2] for k in squares}, key=_num)
    seen = [
        lb
        for lb in _ORDER
        if lb in squares.values() or (lb == "not run" and len(squares) < len(facets) * len(xs) * len(ys))
    ]
    index = {lb: i for i, lb in enumerate(seen)}
    cmap = ListedColormap([COLORS[lb] for lb in seen])
    width = min(24.0, max(6.0, 3.5 + 0.3 * len(xs)))
    height = min(24.0, max(3.0, 1.2 + len(facets) * (0.9 + 0.35 * len(ys))))
    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(facets), 1, squeeze=False)[:, 0]
    step = max(1, len(xs) // 24)
    for ax, facet in zip(axes, facets, strict=True):
        grid = [[index[squares.get((facet, xv, yv), "not run")] for xv in xs] for yv in ys]
        ax.imshow(
            grid,
            cmap=cmap,
            vmin=-0.5,
            vmax=len(seen) - 0.5,
            aspect="auto",
            interpolation="nearest",
            origin="lower",
        )
        ax.set_xticks(
            range(0, len(xs), step),
            [str(v) for v in xs[::step]],
            rotation=90 if len(xs) > 8 else 0,
            fontsize=8,
        )
        ax.set_yticks(range(len(ys)), [str(v) for v in ys], fontsize=8)
        ax.set_ylabel("prompt chunk" if y == "chunk" else y.replace("_", " "))
        ax.set_title(
            ", ".join(f"{k}={v}" for k, v in zip(knobs, facet, strict=True)) or matrix.name, fontsize=10
        )
    axes[-1].set_xlabel(x.replace("_", " "))
    n_bad = sum(1 for v in squares.values() if v not in ("ok", "halved", "not run"))
    fig.suptitle(
        f"repro_matrix {matrix.name}: {n_bad} of {len(squares)} "
        f"{'prompts' if y == 'chunk' else 'cells'} fail",
        fontsize=11,
    )
    fig.legend(
        handles=[Patch(color=COLORS[lb], label=lb) for lb in seen],
        loc="center right",
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0, 0.82, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
