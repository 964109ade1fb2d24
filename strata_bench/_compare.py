"""``strata-bench compare OLD NEW``: pair rows by a declared key, judge each change against its noise, apply gates.

**Pairing.** Rows are paired on the key fields (by default: target, model, quant, test, every knob and
every setting of the work: tokens generated, the effective context, the prompt set and its seed, a
server's concurrency and request rate). When a file holds the same key more than once (appended
re-runs) its last row counts. A field that a row lacks (a record written before the field existed)
matches nothing but another row that lacks it too: such rows stay unpaired, and the result says which
field kept them apart and how to pair them if the old run is known to have used a value
(``--assume work.max_tokens=64``). ``--ignore FIELD`` takes a field out of the key.

**Noise.** Each paired row's change is the relative change of the median of its raw samples (the
repetitions' tokens/s; a server row's per-request figures), with a seeded bootstrap interval
(``_stats.bootstrap_change``). A change whose interval holds 0 is "no significant change", however
far apart the two means are.

**Gates.** A gate is ``[FIELD@]TEST:±X%``. ``TEST`` is a test name or a shell pattern (``tg128``,
``pp*``, ``*``); a negative threshold is for speeds (fail when the value fell by more than X%), a
positive one for latencies (``metrics.ttft_ms.p90@short:+10%``). FIELD is a statistic of the samples
(``median``, the default; ``mean``, ``p90``, ...), a server latency ``metrics.NAME_ms.STAT`` (judged
over the per-request values), or any other field (judged on its one value, and said so). A gate fails
when the change is significant and beyond its threshold; when the noise is larger than the gate the
verdict is "no significant change" and the gate passes. A gate that matches no row in OLD is an
error, not a pass, and so is a gated row that NEW lacks or that failed in NEW.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._records import failed, flatten, to_markdown, work_of
from ._stats import STATISTICS, Change, bootstrap_change

__all__ = ["DEFAULT_KEY", "CompareResult", "Gate", "compare", "parse_assume", "parse_gate"]

DEFAULT_KEY = ("target", "model", "quant", "test", "knobs", "work")
_EXPANDED = ("knobs", "work")  # key entries that stand for every field under them
_NAMED_BY_TEST = ("work.n_prompt", "work.n_gen", "work.n_depth")  # in the key, not worth a column


@dataclass(frozen=True)
class Gate:
    field: str
    pattern: str
    threshold: float  # fraction: -0.05 for -5%

    def __str__(self) -> str:
        f = "" if self.field == "median" else f"{self.field}@"
        return f"{f}{self.pattern}:{self.threshold * 100:+g}%"


def parse_gate(text: str) -> Gate:
    m = re.fullmatch(r"\s*(?:([\w.]+)@)?([^:]+):\s*([+-])\s*([0-9]*\.?[0-9]+)\s*%\s*", text)
    if not m:
        raise ValueError(
            f"--fail-if {text!r}: write TEST:-X% (fail when TEST's median t/s drops more than X%) or "
            "FIELD@TEST:+X% (fail when FIELD rises more than X%), e.g. tg128:-5% or metrics.ttft_ms.p90@short:+10%"
        )
    sign = -1.0 if m.group(3) == "-" else 1.0
    return Gate(
        field=m.group(1) or "median", pattern=m.group(2).strip(), threshold=sign * float(m.group(4)) / 100
    )


def parse_assume(text: str) -> tuple[str, str]:
    """``FIELD=VALUE`` of ``--assume``."""
    name, eq, value = text.partition("=")
    if not eq or not name.strip():
        raise ValueError(
            f"--assume {text!r}: write FIELD=VALUE, e.g. --assume work.max_tokens=64 (the value the rows "
            "that lack FIELD were measured with)"
        )
    return name.strip(), value.strip()


@dataclass
class CompareResult:
    headers: list[str]
    rows: list[list[str]]
    failures: list[str] = field(default_factory=list)
    only_old: int = 0
    only_new: int = 0
    matched: int = 0
    notes: list[str] = field(
        default_factory=list
    )  # rows kept apart by a field one side lacks, and how to pair them
    changes: list[Change | None] = field(default_factory=list)  # per row: the change of the median t/s

    @property
    def ok(self) -> bool:
        return not self.failures

    def markdown(self) -> str:
        return to_markdown(self.headers, self.rows)


# ---- rows and keys ------------------------------------------------------------------------------


def _flat(rec: dict[str, Any]) -> dict[str, Any]:
    return flatten({**rec, "work": work_of(rec)})


def _cell(v: Any) -> str | None:
    """A key value as text (None, 4 and "4" from different writers line up); None when it is missing."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return str(v)


def _columns(flats: Sequence[dict[str, Any]], key: Sequence[str], ignore: Sequence[str]) -> list[str]:
    cols: list[str] = []
    for k in key:
        if k in _EXPANDED:
            for f in flats:
                cols += [c for c in f if c.startswith(k + ".") and c not in cols]
        elif k not in cols:
            cols.append(k)
    unknown = [i for i in ignore if i not in cols]
    if unknown:
        raise ValueError(f"--ignore {', '.join(unknown)}: not a key field (the key has: {', '.join(cols)})")
    return [c for c in cols if c not in ignore]


def _resolve(name: str, cols: Sequence[str]) -> str:
    if name in cols:
        return name
    found = [c for c in cols if c.split(".", 1)[-1] == name and c.split(".", 1)[0] in _EXPANDED]
    if len(found) == 1:
        return found[0]
    raise ValueError(
        f"--assume {name}: " + (f"ambiguous ({', '.join(found)})" if found else "not a key field")
        + f"; the key has: {', '.join(cols)}"
    )  # fmt: skip


def _index(flats: Sequence[dict[str, Any]], cols: Sequence[str]) -> dict[tuple[str | None, ...], int]:
    out: dict[tuple[str | None, ...], int] = {}
    for i, f in enumerate(flats):
        k = tuple(_cell(f.get(c)) for c in cols)
        out.pop(k, None)  # the last row of a key counts, in the place it was appended
        out[k] = i
    return out


def _missing_only(a: tuple[str | None, ...], b: tuple[str | None, ...]) -> list[int] | None:
    """Column indexes where exactly one side is missing, when those are all the two keys differ in."""
    diff = []
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x == y:
            continue
        if x is None or y is None:
            diff.append(i)
        else:
            return None
    return diff


# ---- the samples a field is judged on -----------------------------------------------------------


def _samples(rec: dict[str, Any], fld: str) -> tuple[list[float], str] | None:
    """(values, statistic) over which FIELD of a row is judged; None for a field without raw samples."""
    if fld in STATISTICS:
        return [float(x) for x in rec.get("samples") or [] if x is not None], fld
    m = re.fullmatch(r"metrics\.(\w+)_ms\.(\w+)", fld)
    if m and m.group(2) in STATISTICS and isinstance(rec.get("requests"), list):
        name = m.group(1) + "_ms"
        vals: list[float] = []
        for r in rec["requests"]:
            v = r.get(name) if isinstance(r, dict) else None
            if isinstance(v, list):  # inter-token latencies: every gap of every request
                vals += [float(x) for x in v if x is not None]
            elif v is not None:
                vals.append(float(v))
        return vals, m.group(2)
    return None


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _point(flat: dict[str, Any], fld: str) -> Any:
    return flat.get(fld)


# ---- compare ------------------------------------------------------------------------------------


def compare(
    old: Sequence[dict[str, Any]],
    new: Sequence[dict[str, Any]],
    key: Sequence[str] = DEFAULT_KEY,
    gates: Sequence[Gate] = (),
    *,
    assume: Mapping[str, str] | None = None,
    ignore: Sequence[str] = (),
    confidence: float = 0.95,
    n_boot: int = 10_000,
    seed: int = 0,
) -> CompareResult:
    if not old:
        raise ValueError("OLD holds no records")
    if not new:
        raise ValueError("NEW holds no records")
    fo, fn = [_flat(r) for r in old], [_flat(r) for r in new]
    cols = _columns(fo + fn, key, ignore)
    for name, value in (assume or {}).items():
        c = _resolve(name, cols)
        for f in fo + fn:
            if _cell(f.get(c)) is None:
                f[c] = value
    io, inew = _index(fo, cols), _index(fn, cols)

    for g in gates:
        if g.field not in STATISTICS and _samples({"requests": []}, g.field) is None:
            if not any(g.field in f for f in fo + fn):
                raise ValueError(f"--fail-if {g}: no record has a field {g.field!r}")

    # rows that would pair but for a field one side lacks: say which, and how to pair them
    lacking: dict[tuple[str, str], set[str]] = {}
    for ko in io:
        if ko in inew:
            continue
        for kn in inew:
            if kn in io:
                continue
            d = _missing_only(ko, kn)
            if d:
                for i in d:
                    side = "OLD" if ko[i] is None else "NEW"
                    lacking.setdefault((side, cols[i]), set()).add(str(kn[i] if ko[i] is None else ko[i]))
    notes = [
        f"rows of {side} lack {c} (the other side has {', '.join(sorted(vals))}): they are not paired; if "
        f"{side} was measured with a known value, pair them with --assume {c}=VALUE"
        for (side, c), vals in sorted(lacking.items())
    ]

    # columns worth showing: the test, and fields that tell rows of one target apart
    keys = list(io) + [k for k in inew if k not in io]
    ti = cols.index("target") if "target" in cols else None
    shown = []
    for i, c in enumerate(cols):
        if c == "test":
            shown.append(i)
            continue
        if c in _NAMED_BY_TEST:
            continue
        groups: dict[str | None, set[str | None]] = {}
        for k in keys:
            groups.setdefault(k[ti] if ti is not None and c != "target" else None, set()).add(k[i])
        if any(len(v) > 1 for v in groups.values()):
            shown.append(i)
    pct = f"{confidence * 100:g}%"
    headers = [cols[i].removeprefix("knobs.") for i in shown] + [
        "old", "new", "change", f"{pct} interval", "verdict",
    ]  # fmt: skip
    res = CompareResult(headers=headers, rows=[], notes=notes)
    gate_hits = {g: 0 for g in gates}
    stats: dict[str, Any] = {"confidence": confidence, "n_boot": n_boot, "seed": seed}

    def describe(k: tuple[str | None, ...]) -> str:
        return ", ".join(
            f"{cols[i].removeprefix('knobs.')}={k[i] if k[i] is not None else '-'}" for i in shown
        )

    for k in keys:
        ro = old[io[k]] if k in io else None
        rn = new[inew[k]] if k in inew else None
        flo = fo[io[k]] if k in io else None
        fln = fn[inew[k]] if k in inew else None
        verdict = ""
        change: Change | None = None
        if ro is None:
            res.only_new += 1
            verdict = "only in NEW"
        elif rn is None:
            res.only_old += 1
            verdict = "only in OLD"
        else:
            res.matched += 1
            if failed(rn):
                verdict = "failed in NEW"
            elif failed(ro):
                verdict = "failed in OLD"
            else:
                try:
                    change = bootstrap_change(
                        ro.get("samples") or [], rn.get("samples") or [], "median", **stats
                    )
                except ValueError:
                    change = None
                if change is not None:
                    verdict = (
                        "no significant change" if not change.significant
                        else ("faster" if change.change > 0 else "slower")
                    )  # fmt: skip
        test = k[cols.index("test")] if "test" in cols else ""
        for g in gates:
            if ro is None or not fnmatch.fnmatchcase(str(test), g.pattern):
                continue
            gate_hits[g] += 1
            v, why = _judge(g, ro, rn, flo, fln, stats)
            if v.startswith("FAIL"):
                res.failures.append(f"{g}: {describe(k)} {why}")
                verdict = v
            elif not verdict.startswith("FAIL"):
                verdict = v
        res.changes.append(change)
        old_v = change.old if change else _fallback(ro)
        new_v = change.new if change else _fallback(rn)
        res.rows.append(
            [str(k[i]) if k[i] is not None else "-" for i in shown]
            + [
                f"{old_v:.2f}" if _num(old_v) else "-",
                f"{new_v:.2f}" if _num(new_v) else "-",
                f"{change.change * 100:+.1f}%" if change else _ratio_text(old_v, new_v),
                change.interval_text() if change else "-",
                verdict,
            ]
        )
    for g, hits in gate_hits.items():
        if hits == 0:
            tests = sorted({str(r.get("test")) for r in old})
            res.failures.append(f"{g}: matches no test in OLD (tests there: {', '.join(tests)})")
    return res


def _fallback(rec: dict[str, Any] | None) -> Any:
    """A row's figure when it has too few samples for an interval: its recorded median (or mean)."""
    if rec is None or failed(rec):
        return None
    return rec.get("median") if _num(rec.get("median")) else rec.get("mean")


def _ratio_text(a: Any, b: Any) -> str:
    return f"{(b / a - 1) * 100:+.1f}%" if _num(a) and _num(b) and a else "-"


def _judge(
    g: Gate,
    ro: dict[str, Any],
    rn: dict[str, Any] | None,
    flo: dict[str, Any] | None,
    fln: dict[str, Any] | None,
    stats: dict[str, Any],
) -> tuple[str, str]:
    """(verdict, what to say when it fails) of one gate on one row."""
    if rn is None or fln is None:
        return "FAIL (missing)", "is missing in NEW"
    if failed(rn):
        msg = " ".join(str((rn.get("error") or {}).get("message") or "").split())[:300]
        return "FAIL (failed)", f"failed in NEW, so it has no {g.field} to compare: {msg or 'no message'}"
    if failed(ro):
        return "FAIL (failed)", f"failed in OLD, so it has no {g.field} to compare against"
    so, sn = _samples(ro, g.field), _samples(rn, g.field)
    if so is not None and sn is not None:
        try:
            c = bootstrap_change(so[0], sn[0], so[1], **stats)
        except ValueError as e:
            return "FAIL (no value)", f"cannot be judged on {g.field}: {e}"
        beyond = c.change < g.threshold if g.threshold < 0 else c.change > g.threshold
        figures = (
            f"{g.field} {c.old:.4g} -> {c.new:.4g} ({c.change * 100:+.1f}%, interval {c.interval_text()})"
        )
        if c.significant and beyond:
            return "FAIL", figures
        if not c.significant:
            # noise larger than the gate: the interval reaches past it, so a change that large is not ruled out
            wide = c.lo < g.threshold if g.threshold < 0 else c.hi > g.threshold
            return (
                "no significant change (noise exceeds the gate)" if wide else "no significant change"
            ), figures
        better = c.change > 0 if g.threshold < 0 else c.change < 0
        return ("ok (better)" if better else "ok (within the gate)"), figures
    # a field with one value per run: nothing to judge its noise by, and the verdict says so
    assert flo is not None
    a, b = _point(flo, g.field), _point(fln, g.field)
    if not _num(a) or not _num(b) or a == 0:
        return "FAIL (no value)", f"has no {g.field} to compare ({a} -> {b})"
    change = b / a - 1
    bad = change < g.threshold if g.threshold < 0 else change > g.threshold
    figures = f"{g.field} {a:.4g} -> {b:.4g} ({change * 100:+.1f}%; one value per run, no samples to judge noise by)"
    return ("FAIL (one value)" if bad else "ok (one value)"), figures
