"""Tables like a maintainer writes them: one row per cell, grouped by expert-cache size.

Each row names the cell's knobs (always its lend policy), the plan the engine made (slots, auto chunk
and its ring, the loan), what the prompts' shorter chunks need (``layout(T)``: slots and ring), and the
verdict in words ("engine exits, 3 of 3 starts"). Printed as Markdown; saved as CSV and JSONL.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ._matrix import Cell, Matrix
from ._verdict import Verdict, judge

__all__ = ["build_table", "markdown_table", "save_table", "summarize", "verdicts"]

_DISPLAY = ["slots", "auto chunk", "ring", "loan", "short chunk needs", "verdict", "what happened"]


def verdicts(records: Sequence[dict[str, Any]], matrix: Matrix) -> dict[str, Verdict]:
    """Each record's verdict, replies compared with the reference cell's record."""
    ref = next((r for r in records if r["cell"].get("reference")), None)
    return {r["cell_id"]: judge(r, ref, near_tie=matrix.near_tie, fail_on=matrix.fail_on) for r in records}


def _short_chunks(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """layout(T) of each prompt chunk below the auto chunk, most demanding first."""
    plan = rec.get("plan") or {}
    auto = plan.get("auto_chunk")
    lay = (rec.get("layouts") or {}).get("layouts") or {}
    out = []
    for t, lo in lay.items():
        if auto and int(t) < int(auto):
            out.append({"chunk": int(t), "slots": lo.get("slots_needed"), "ring": lo.get("ring_slots")})
    out.sort(key=lambda d: (-(d["slots"] or 0), d["chunk"]))
    return out


def _sort_key(v: Any) -> tuple[int, Any]:
    if isinstance(v, (int, float)):
        return (1, v)
    try:
        return (1, float(v))
    except (TypeError, ValueError):
        return (0, str(v))


def build_table(records: Sequence[dict[str, Any]], matrix: Matrix) -> pd.DataFrame:
    """One row per cell (the reference first), sorted by cache size, then by the other knobs."""
    vs = verdicts(records, matrix)
    knobs = matrix.swept_knobs()
    if "lend_policy" not in knobs:
        knobs.append("lend_policy")
    if "expert_cache" in knobs:
        knobs.remove("expert_cache")
        knobs.insert(0, "expert_cache")
    rows = []
    for rec in records:
        cell = Cell.from_dict(rec["cell"])
        v = vs[rec["cell_id"]]
        plan = rec.get("plan") or {}
        short = _short_chunks(rec)
        row: dict[str, Any] = {k: cell.knob(k) for k in knobs}
        loan = plan.get("auto_loan_slots")
        row.update(
            {
                "cell": "reference" if cell.reference else cell.origin,
                "slots": plan.get("n_slots"),
                "auto chunk": plan.get("auto_chunk"),
                "ring": plan.get("auto_ring_slots"),
                "loan": None
                if loan is None
                else (
                    f"{loan} of {plan['max_lend_slots']}"
                    if plan.get("max_lend_slots") is not None
                    else str(loan)
                ),
                "short chunk needs": "; ".join(
                    f"{s['chunk']}: {s['slots']} (ring {s['ring']})" for s in short
                )
                or "-",
                "verdict": v.label,
                "what happened": v.detail,
                "failing": v.failing,
                "expected": bool(v.failing and matrix.expected_to_fail(cell)),
                "labels": ",".join(v.labels),
                "starts": v.starts,
                "exits": v.exits,
                "lend failures": v.lend_failures,
                "exit codes": ",".join(map(str, v.exit_codes)),
                "halvings": v.halvings,
                "differs at": None if v.difference is None else v.difference.position,
                "near tie": None if v.difference is None else v.difference.near_tie,
                "prompt tok/s": _mean_tps(rec),
                "cell_id": rec["cell_id"],
            }
        )
        rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    df["_ref"] = df["cell"] != "reference"

    def key_of(k: str, v: Any) -> tuple[int, Any]:
        # a swept knob's values sort in the order they were declared (legacy before current, say)
        vals = matrix.axes.get(k)
        if vals is not None and v in vals and not all(_sort_key(x)[0] == 1 for x in vals):
            return (0, vals.index(v))
        return _sort_key(v)

    df["_keys"] = [tuple(key_of(k, r[k]) for k in knobs) for _, r in df.iterrows()]
    df = (
        df.sort_values(["_ref", "_keys"], kind="stable")
        .drop(columns=["_ref", "_keys"])
        .reset_index(drop=True)
    )
    df.attrs["knobs"] = knobs
    return df


def _mean_tps(rec: dict[str, Any]) -> float | None:
    vals = []
    for st in rec.get("starts", []):
        for r in st.get("requests", []):
            t = r.get("timings") or {}
            if t.get("prompt_per_second"):
                vals.append(float(t["prompt_per_second"]))
    return round(sum(vals) / len(vals), 1) if vals else None


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return ""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(df: pd.DataFrame, columns: Sequence[str] | None = None) -> str:
    """A GitHub Markdown table; a cache size is written once for the rows of its group."""
    if df.empty:
        return "_no cells_\n"
    knobs = list(df.attrs.get("knobs", []))
    cols = list(columns) if columns else [*knobs, *_DISPLAY]
    cols = [c for c in cols if c in df.columns]
    head = "| " + " | ".join(c.replace("_", " ") for c in cols) + " |"
    sep = "|" + "|".join("---:" if pd.api.types.is_numeric_dtype(df[c]) else "---" for c in cols) + "|"
    lines = [head, sep]
    prev: Any = object()
    for _, r in df.iterrows():
        vals = [_fmt(r[c]) for c in cols]
        if cols[0] == "expert_cache" and r["cell"] != "reference":
            if r["expert_cache"] == prev:
                vals[0] = ""
            prev = r["expert_cache"]
        if r["cell"] == "reference":
            vals[0] = f"{vals[0]} (reference)"
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines) + "\n"


def _ranges(values: Sequence[Any], domain: Sequence[Any] | None = None) -> str:
    """900, 901, 902, 905 → "900..902, 905" (non-numbers listed as they are).

    With ``domain`` (every value that was run), values are neighbours when no other value of the
    domain lies between them: 60, 70, 80 sampled every 10 read "60..80".
    """
    nums = sorted({int(v) for v in values if _sort_key(v)[0] == 1})
    other = [str(v) for v in values if _sort_key(v)[0] == 0]
    dom = sorted({int(v) for v in (domain or []) if _sort_key(v)[0] == 1})
    pos = {v: i for i, v in enumerate(dom)}

    def next_to(a: int, b: int) -> bool:
        if a in pos and b in pos:
            return pos[b] == pos[a] + 1
        return b == a + 1

    parts: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and next_to(nums[j], nums[j + 1]):
            j += 1
        parts.append(str(nums[i]) if i == j else f"{nums[i]}..{nums[j]}")
        i = j + 1
    return ", ".join(parts + other)


def summarize(df: pd.DataFrame) -> str:
    """One line per lend policy (and other knobs' groups): how many cells failed and at which cache sizes."""
    if df.empty:
        return ""
    lines = []
    group_by = [k for k in df.attrs.get("knobs", []) if k != "expert_cache"]
    cells = df[df["cell"] != "reference"]
    if cells.empty:  # a matrix of its reference alone
        cells = df
    groups = cells.groupby(group_by, dropna=False, sort=False) if group_by else [((), cells)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        name = ", ".join(f"{k}={v}" for k, v in zip(group_by, key, strict=True)) or "all cells"
        bad = g[g["failing"]]
        counts = bad["verdict"].value_counts()
        what = ", ".join(f"{n} {lab}" for lab, n in counts.items())
        if bad.empty:
            extra = ""
            halved = int((g["verdict"] == "halved").sum())
            if halved:
                extra = f" ({halved} halved a chunk, as the invariant allows)"
            lines.append(f"- {name}: all {len(g)} cells pass{extra}")
        elif "expert_cache" in g:
            lines.append(
                f"- {name}: {len(bad)} of {len(g)} cells fail ({what}) at expert_cache "
                f"{_ranges(list(bad['expert_cache']), list(g['expert_cache']))}"
            )
        else:
            lines.append(f"- {name}: {len(bad)} of {len(g)} cells fail ({what})")
    return "\n".join(lines) + "\n"


def save_table(df: pd.DataFrame, out: Path, verdict_map: dict[str, Verdict] | None = None) -> None:
    """table.csv, table.jsonl, table.md (and verdicts.jsonl when given) in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "table.csv", index=False)
    df.to_json(out / "table.jsonl", orient="records", lines=True)
    (out / "table.md").write_text(markdown_table(df) + "\n" + summarize(df))
    if verdict_map is not None:
        with open(out / "verdicts.jsonl", "w") as f:
            for cid, v in verdict_map.items():
                f.write(json.dumps({"cell_id": cid, **v.to_dict()}) + "\n")
