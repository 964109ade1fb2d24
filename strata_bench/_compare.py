"""``strata-bench compare OLD NEW``: match rows by a declared key, show ratios, apply gates.

Rows are matched on the key fields (by default: target, model, quant, test and every knob); when a
file holds the same key more than once (appended re-runs) its last row counts. The value compared is
a row's ``mean`` (tokens/s) unless a gate names another field.

A gate is ``[FIELD@]TEST:±X%``. ``TEST`` is a test name or a shell pattern (``tg128``, ``pp*``,
``*``); a negative threshold fails when the value fell by more than X% (speeds), a positive one
when it rose by more than X% (latencies: ``metrics.ttft_ms.p90@short:+10%``). A gate that matches no
row in OLD is an error, not a pass, and so is a gated row that NEW lacks.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ._records import flatten, to_markdown

__all__ = ["DEFAULT_KEY", "CompareResult", "Gate", "compare", "parse_gate"]

DEFAULT_KEY = ("target", "model", "quant", "test", "knobs")


@dataclass(frozen=True)
class Gate:
    field: str
    pattern: str
    threshold: float  # fraction: -0.05 for -5%

    def __str__(self) -> str:
        f = "" if self.field == "mean" else f"{self.field}@"
        return f"{f}{self.pattern}:{self.threshold * 100:+g}%"


def parse_gate(text: str) -> Gate:
    m = re.fullmatch(r"\s*(?:([\w.]+)@)?([^:]+):\s*([+-])\s*([0-9]*\.?[0-9]+)\s*%\s*", text)
    if not m:
        raise ValueError(
            f"--fail-if {text!r}: write TEST:-X% (fail when TEST's t/s drops more than X%) or "
            "FIELD@TEST:+X% (fail when FIELD rises more than X%), e.g. tg128:-5% or metrics.ttft_ms.p90@short:+10%"
        )
    sign = -1.0 if m.group(3) == "-" else 1.0
    return Gate(
        field=m.group(1) or "mean", pattern=m.group(2).strip(), threshold=sign * float(m.group(4)) / 100
    )


@dataclass
class CompareResult:
    headers: list[str]
    rows: list[list[str]]
    failures: list[str] = field(default_factory=list)
    only_old: int = 0
    only_new: int = 0
    matched: int = 0
    ignored_fields: list[str] = field(default_factory=list)  # key fields only one side has

    @property
    def ok(self) -> bool:
        return not self.failures

    def markdown(self) -> str:
        return to_markdown(self.headers, self.rows)


def _frame(
    records: Sequence[dict[str, Any]], key: Sequence[str], name: str
) -> tuple[pd.DataFrame, list[str]]:
    flat = [flatten(r) for r in records]
    cols: list[str] = []
    for k in key:
        if k == "knobs":
            for f in flat:
                cols += [c for c in f if c.startswith("knobs.") and c not in cols]
        elif k not in cols:
            cols.append(k)
    df = pd.DataFrame(flat, dtype=object)  # object: an int knob stays 2, not 2.0 next to a missing one
    for c in cols:
        if c not in df.columns:
            df[c] = None
    if df.empty:
        raise ValueError(f"{name} holds no records")
    # keys compare as text so that None, 4 and "4" from different writers line up the same way
    for c in cols:
        df[c] = df[c].map(lambda v: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
    df = df.drop_duplicates(subset=cols, keep="last")
    return df, cols


def compare(
    old: Sequence[dict[str, Any]],
    new: Sequence[dict[str, Any]],
    key: Sequence[str] = DEFAULT_KEY,
    gates: Sequence[Gate] = (),
) -> CompareResult:
    df_old, cols_old = _frame(old, key, "OLD")
    df_new, cols_new = _frame(new, key, "NEW")
    # A knob that only one side knows (added or removed between the two versions) cannot tell rows
    # apart across them: it leaves the key, and the result says so.
    cols = [c for c in cols_old if c in cols_new]
    ignored = [c for c in cols_old + cols_new if c not in cols]
    df_old = df_old.drop_duplicates(subset=cols, keep="last")
    df_new = df_new.drop_duplicates(subset=cols, keep="last")
    value_fields = sorted({"mean"} | {g.field for g in gates})
    for g in gates:
        if g.field not in df_old.columns and g.field not in df_new.columns:
            raise ValueError(f"--fail-if {g}: no record has a field {g.field!r}")
    keep = cols + [f for f in value_fields if f in df_old.columns or f in df_new.columns]
    merged = pd.merge(
        df_old.reindex(columns=keep),
        df_new.reindex(columns=keep),
        on=cols,
        how="outer",
        suffixes=(".old", ".new"),
        indicator=True,
        sort=False,
    )
    # columns worth showing: the test, and fields that tell rows of one target apart
    by_target = merged.groupby("target", dropna=False) if "target" in cols else [(None, merged)]
    shown = [
        c for c in cols
        if c == "test" or (c == "target" and merged[c].nunique() > 1)
        or (c != "target" and any(g[c].nunique(dropna=False) > 1 for _, g in by_target))
    ]  # fmt: skip
    headers = [c.removeprefix("knobs.") for c in shown] + ["old", "new", "new/old", "change", "verdict"]
    res = CompareResult(headers=headers, rows=[], ignored_fields=ignored)
    gate_hits = {g: 0 for g in gates}
    for _, row in merged.iterrows():
        old_v, new_v = row.get("mean.old"), row.get("mean.new")
        state = row["_merge"]
        verdict = ""
        if state == "left_only":
            res.only_old += 1
            verdict = "only in OLD"
        elif state == "right_only":
            res.only_new += 1
            verdict = "only in NEW"
        else:
            res.matched += 1
        for g in gates:
            if not fnmatch.fnmatchcase(str(row["test"]), g.pattern) or state == "right_only":
                continue
            gate_hits[g] += 1
            if state == "left_only":
                res.failures.append(f"{g}: {_describe(row, shown)} is missing in NEW")
                verdict = "FAIL (missing)"
                continue
            a, b = row.get(f"{g.field}.old"), row.get(f"{g.field}.new")
            if not _num(a) or not _num(b) or a == 0:
                res.failures.append(f"{g}: {_describe(row, shown)} has no {g.field} to compare ({a} -> {b})")
                verdict = "FAIL (no value)"
                continue
            change = b / a - 1
            bad = change < g.threshold if g.threshold < 0 else change > g.threshold
            if bad:
                res.failures.append(
                    f"{g}: {_describe(row, shown)} {g.field} {a:.4g} -> {b:.4g} ({change * 100:+.1f}%)"
                )
                verdict = "FAIL"
            elif not verdict.startswith("FAIL"):
                verdict = "ok"
        ratio = new_v / old_v if _num(old_v) and _num(new_v) and old_v else None
        res.rows.append(
            [str(row[c]) for c in shown]
            + [
                f"{old_v:.2f}" if _num(old_v) else "-",
                f"{new_v:.2f}" if _num(new_v) else "-",
                f"{ratio:.3f}" if ratio is not None else "-",
                f"{(ratio - 1) * 100:+.1f}%" if ratio is not None else "-",
                verdict,
            ]
        )
    for g, hits in gate_hits.items():
        if hits == 0:
            tests = sorted({str(t) for t in df_old["test"]})
            res.failures.append(f"{g}: matches no test in OLD (tests there: {', '.join(tests)})")
    return res


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _describe(row: Any, cols: Sequence[str]) -> str:
    return ", ".join(f"{c.removeprefix('knobs.')}={row[c]}" for c in cols)
