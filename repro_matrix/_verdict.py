"""Verdicts: what a cell's recorded run means, judged against the reference cell.

A cell's record (written by ``_cell.run_cell``) holds, for each engine start, each request's outcome:
an error code and message, or the reply's token ids and top-2 logit margins. The verdict names the
worst thing that happened, in this order::

    engine start failed   no start got an engine up (a budget too small, a bad model)
    engine exited         the engine process stopped while serving a request
    lend failed           a request failed because its chunk's loan did not hold its layout
    request failed        a request failed for another reason (the code says which)
    nondeterministic      the same prompt got different replies in different starts of the cell
    reply differs         a reply differs from the reference cell's (first position, both tokens, near-tie?)
    halved                a request's chunk was halved to fit a loan (allowed; reported)
    ok                    every request served, every reply equal to the reference's

Every label that applies is kept in ``labels``; ``label`` is the first of them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "LABELS",
    "Difference",
    "Verdict",
    "compare_replies",
    "first_difference",
    "judge",
]

_EXIT_CODE = re.compile(r"exit code (-?\d+)")

LABELS: tuple[str, ...] = (
    "engine start failed",
    "engine exited",
    "lend failed",
    "request failed",
    "nondeterministic",
    "reply differs",
    "halved",
    "ok",
)
# the verdicts that fail a cell unless a matrix says otherwise: all but halved and ok
FAILING: tuple[str, ...] = LABELS[: LABELS.index("halved")]


@dataclass
class Difference:
    """Where two replies to the same prompt part ways."""

    prompt: int  # prompt index
    position: int  # first generated position where they differ
    token: int | None  # this cell's token there (None: its reply ended before)
    ref_token: int | None  # the reference's token there (None: its reply ended before)
    ref_margin: float | None  # the reference's top-2 logit margin at that position
    near_tie: bool  # ref_margin below the matrix's threshold

    def describe(self, what: str = "reference") -> str:
        tok = "end" if self.token is None else str(self.token)
        ref = "end" if self.ref_token is None else str(self.ref_token)
        s = f"prompt {self.prompt}, token {self.position}: {tok} vs {what} {ref}"
        if self.near_tie:
            s += f" (near-tie: {what} top-2 margin {self.ref_margin:.3g})"
        elif self.ref_margin is not None:
            s += f" ({what} top-2 margin {self.ref_margin:.3g})"
        return s


@dataclass
class Verdict:
    label: str
    labels: list[str]
    detail: str
    failing: bool
    starts: int = 0
    exits: int = 0  # starts in which the engine exited
    lend_failures: int = 0  # starts in which a loan failed
    exit_codes: list[int] = field(default_factory=list)
    start_exit_codes: list[int] = field(default_factory=list)  # exit codes of servers that never listened
    halvings: int = 0
    difference: Difference | None = None
    nondeterministic: Difference | None = None
    errors: list[str] = field(default_factory=list)  # distinct error messages, first few

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def first_difference(
    tokens: Sequence[int],
    ref_tokens: Sequence[int],
    ref_margins: Sequence[float],
    *,
    prompt: int,
    near_tie: float,
) -> Difference | None:
    """The first position where two replies differ, or None when they are equal token for token."""
    n = min(len(tokens), len(ref_tokens))
    for i in range(n):
        if tokens[i] != ref_tokens[i]:
            break
    else:
        if len(tokens) == len(ref_tokens):
            return None
        i = n
    tok = tokens[i] if i < len(tokens) else None
    ref = ref_tokens[i] if i < len(ref_tokens) else None
    margin = float(ref_margins[i]) if i < len(ref_margins) else None
    return Difference(
        prompt=prompt,
        position=i,
        token=tok,
        ref_token=ref,
        ref_margin=margin,
        near_tie=margin is not None and margin < near_tie,
    )


def _short(text: str, n: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _replies(start: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {r["prompt"]: r for r in start.get("requests", []) if r.get("status") == "ok"}


def _first_replies(record: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """For each prompt, its reply in the first start that served it."""
    out: dict[int, dict[str, Any]] = {}
    for st in record.get("starts", []):
        for k, r in _replies(st).items():
            out.setdefault(k, r)
    return out


def compare_replies(
    record: dict[str, Any], reference: dict[str, Any], *, near_tie: float = 1e-3
) -> Difference | None:
    """The first difference between two records' replies (each prompt's reply in its first start that
    served it), prompts in order; None when every prompt both served is answered alike."""
    ref = _first_replies(reference)
    mine = _first_replies(record)
    for k in sorted(mine):
        if k not in ref:
            continue
        d = first_difference(
            mine[k]["tokens"], ref[k]["tokens"], ref[k].get("margins", []), prompt=k, near_tie=near_tie
        )
        if d is not None:
            return d
    return None


def judge(
    record: dict[str, Any],
    reference: dict[str, Any] | None,
    *,
    near_tie: float = 1e-3,
    fail_on: Sequence[str] = FAILING,
) -> Verdict:
    """The verdict of one cell's record, replies compared with the reference record's (if any)."""
    starts = record.get("starts", [])
    n = len(starts)
    labels: set[str] = set()
    details: dict[str, str] = {}
    exits = lend = started = halvings = 0
    codes: list[int] = []
    start_codes: list[int] = []
    errors: list[str] = []
    failed_prompts: dict[str, set[int]] = {
        "lend failed": set(),
        "engine exited": set(),
        "request failed": set(),
    }
    other_codes: set[str] = set()
    for st in starts:
        if st.get("start_error"):
            if st["start_error"] not in errors:
                errors.append(st["start_error"])
            if st.get("start_exit_code") is not None:
                start_codes.append(int(st["start_exit_code"]))
            continue
        started += 1
        exited_here = lend_here = False
        for r in st.get("requests", []):
            halvings += int(r.get("halvings") or 0)
            if r.get("status") == "ok":
                continue
            code = r.get("error_code") or "error"
            msg = r.get("error_message") or ""
            if msg and msg not in errors:
                errors.append(msg)
            if code == "engine_exited":
                exited_here = True
                failed_prompts["engine exited"].add(r["prompt"])
                code_n = r.get("exit_code")
                if code_n is None:
                    m = _EXIT_CODE.search(msg)
                    code_n = int(m.group(1)) if m else None
                if code_n is not None:
                    codes.append(int(code_n))
            elif code == "lend_failed":
                lend_here = True
                failed_prompts["lend failed"].add(r["prompt"])
            else:
                failed_prompts["request failed"].add(r["prompt"])
                other_codes.add(code)
        if st.get("server_died"):  # the server itself went away before the harness stopped it
            exited_here = True
            if st.get("server_exit_code") is not None:
                codes.append(int(st["server_exit_code"]))
        exits += exited_here
        lend += lend_here
    if n and started == 0:
        labels.add("engine start failed")
        uniq = sorted(set(start_codes))
        code_s = f", exit code {', '.join(map(str, uniq))}" if uniq else ""
        words = next((st.get("start_message") for st in starts if st.get("start_message")), None)
        details["engine start failed"] = f"engine start failed, {n} of {n} starts{code_s}" + (
            f": {_short(words)}" if words else ""
        )
    if exits:
        labels.add("engine exited")
        uniq = sorted(set(codes))
        code_s = f" (exit code {', '.join(map(str, uniq))})" if uniq else ""
        details["engine exited"] = f"engine exits, {exits} of {n} starts{code_s}"
    if lend:
        labels.add("lend failed")
        ps = ", ".join(str(p) for p in sorted(failed_prompts["lend failed"]))
        details["lend failed"] = f"lend failed, {lend} of {n} starts (prompt {ps})"
    if failed_prompts["request failed"]:
        labels.add("request failed")
        details["request failed"] = f"request failed: {', '.join(sorted(other_codes))}"

    # replies between starts of this cell
    nondet: Difference | None = None
    by_start = [_replies(st) for st in starts]
    for later in by_start[1:]:
        for k, r in later.items():
            first = next((s[k] for s in by_start if k in s), None)
            if first is None or first is r:
                continue
            d = first_difference(
                r["tokens"], first["tokens"], first.get("margins", []), prompt=k, near_tie=near_tie
            )
            if d is not None and nondet is None:
                nondet = d
    if nondet is not None:
        labels.add("nondeterministic")
        details["nondeterministic"] = "replies differ between starts: " + nondet.describe("first start")

    # replies against the reference
    diff: Difference | None = None
    if reference is not None and reference.get("cell_id") != record.get("cell_id"):
        diff = compare_replies(record, reference, near_tie=near_tie)
        if diff is not None:
            labels.add("reply differs")
            details["reply differs"] = "reply differs: " + diff.describe()
    if halvings:
        labels.add("halved")
        details["halved"] = f"chunk halved {halvings} times"
    if not labels:
        labels.add("ok")
        details["ok"] = "every request served" + (", replies equal the reference" if reference else "")
    ordered = [lb for lb in LABELS if lb in labels]
    return Verdict(
        label=ordered[0],
        labels=ordered,
        detail="; ".join(details[lb] for lb in ordered),
        failing=any(lb in fail_on for lb in ordered),
        starts=n,
        exits=exits,
        lend_failures=lend,
        exit_codes=sorted(set(codes)),
        start_exit_codes=sorted(set(start_codes)),
        halvings=halvings,
        difference=diff,
        nondeterministic=nondet,
        errors=errors[:5],
    )
