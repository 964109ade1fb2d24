"""What CI reads: the gate's exit status, JUnit XML (one test case per cell) and a Markdown summary.

Exit statuses of ``repro_matrix run`` and ``merge`` (``EXIT_*``)::

    0  pass        every cell passes, or fails as the matrix expects (``expect_fail``)
    1  failed      a cell failed that the matrix does not expect to, a matrix that expects failures saw
                   none, or the shards' reference cells replied differently
    2  usage       the command line, the matrix or a run directory cannot be used (the message says why)
    3  incomplete  no failure, but cells of the matrix have no result (a shard missing or cut short)

A failure outranks incompleteness: 1 when both. ``130`` when interrupted (Ctrl-C).

The JUnit file holds one ``<testsuite>`` per matrix with one ``<testcase>`` per cell (its name is the
cell's knobs): a ``<failure>`` whose type is the verdict for a failing cell, ``<skipped>`` for a failure
the matrix expects (as pytest writes an xfail), ``<error type="missing">`` for a cell without a result,
and one more test case per failure of the run as a whole. GitHub (test-reporter actions), GitLab
(``artifacts:reports:junit``) and Jenkins (``junit``) read this shape. Every text in both files is
scrubbed like the report.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ._matrix import Cell, Matrix
from ._scrub import Scrubber
from ._verdict import Verdict

__all__ = [
    "EXIT_FAILED",
    "EXIT_INCOMPLETE",
    "EXIT_PASS",
    "EXIT_USAGE",
    "Gate",
    "junit_xml",
    "summary_markdown",
    "write_ci_files",
]

EXIT_PASS = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INCOMPLETE = 3

_SUMMARY_ROWS = 200  # passing rows shown in the summary before "and N more"


@dataclass
class Gate:
    """A run's or a merge's outcome as CI sees it."""

    matrix: Matrix
    records: list[dict[str, Any]]
    verdicts: dict[str, Verdict]
    missing: list[str] = field(default_factory=list)  # cell ids of the matrix without a result
    problems: list[str] = field(default_factory=list)  # failures of the run as a whole
    incomplete: list[str] = field(default_factory=list)  # why it is incomplete, in words
    shard: str | None = None

    def unexpected(self) -> list[str]:
        """Ids of failing cells the matrix does not expect to fail."""
        return [
            r["cell_id"]
            for r in self.records
            if self.verdicts[r["cell_id"]].failing
            and not self.matrix.expected_to_fail(Cell.from_dict(r["cell"]))
        ]

    def expected(self) -> list[str]:
        return [
            r["cell_id"]
            for r in self.records
            if self.verdicts[r["cell_id"]].failing and self.matrix.expected_to_fail(Cell.from_dict(r["cell"]))
        ]

    @property
    def exit_code(self) -> int:
        if self.unexpected() or self.problems:
            return EXIT_FAILED
        if self.missing or self.incomplete:
            return EXIT_INCOMPLETE
        return EXIT_PASS

    def status_word(self) -> str:
        return {EXIT_PASS: "pass", EXIT_FAILED: "FAILED", EXIT_INCOMPLETE: "INCOMPLETE"}[self.exit_code]


def _names(matrix: Matrix, cells: Sequence[Cell]) -> dict[str, str]:
    """A readable, unique test-case name per cell: its swept knobs (its id where two read alike)."""
    knobs = matrix.swept_knobs()
    out: dict[str, str] = {}
    for c in cells:
        name = c.label(knobs).strip() or ("reference" if c.reference else c.cell_id)
        if c.origin == "extra":
            name = f"{name} (extra)"
        out[c.cell_id] = name
    counts: dict[str, int] = {}
    for n in out.values():
        counts[n] = counts.get(n, 0) + 1
    return {cid: (f"{n} [{cid}]" if counts[n] > 1 else n) for cid, n in out.items()}


def _start_text(rec: dict[str, Any], lines: int = 20) -> str:
    """The engine's own words from the first start that went wrong: its error and its last log lines."""
    for st in rec.get("starts", []):
        bad = [r for r in st.get("requests", []) if r.get("status") != "ok"]
        if st.get("start_error") or bad or st.get("server_died"):
            parts = []
            if st.get("start_error"):
                parts.append(f"start {st.get('start', 0)}: {st['start_error']}")
            for r in bad[:3]:
                parts.append(
                    f"start {st.get('start', 0)}, prompt {r.get('prompt')}: {r.get('error_code')}: "
                    f"{r.get('error_message', '')}"
                )
            tail = (st.get("log_tail") or "").splitlines()[-lines:]
            if tail:
                parts.append("server log:\n" + "\n".join(tail))
            return "\n".join(parts)
    return ""


def junit_xml(gate: Gate, scrubber: Scrubber | None = None) -> str:
    """The JUnit XML of a run or a merge (a ``<testsuites>`` document, UTF-8)."""
    sc = scrubber or Scrubber.for_this_machine()

    def clean(text: str) -> str:
        # XML 1.0 has no place for most control characters (a log may hold them)
        text = "".join(ch for ch in str(text) if ch in "\t\n\r" or ord(ch) >= 0x20)
        return sc.scrub(text)[0]

    m = gate.matrix
    cells = {c.cell_id: c for c in m.cells()}
    for r in gate.records:
        cells.setdefault(r["cell_id"], Cell.from_dict(r["cell"]))
    names = _names(m, list(cells.values()))
    suite_name = f"repro_matrix.{m.name}"
    suites = ET.Element("testsuites", name="repro_matrix")
    suite = ET.SubElement(suites, "testsuite", name=suite_name)
    props = ET.SubElement(suite, "properties")
    for key, value in (
        ("matrix", m.name),
        ("model", m.model),
        ("starts", str(m.starts)),
        ("shard", gate.shard or ""),
        ("exit_status", str(gate.exit_code)),
    ):
        ET.SubElement(props, "property", name=key, value=clean(value))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    total_time = 0.0
    by_id = {r["cell_id"]: r for r in gate.records}
    expected = set(gate.expected())
    order = [cid for cid in cells if cid in by_id or cid in gate.missing]
    for cid in order:
        counts["tests"] += 1
        rec = by_id.get(cid)
        t = float(rec.get("wall_s") or 0.0) if rec else 0.0
        total_time += t
        tc = ET.SubElement(suite, "testcase", classname=suite_name, name=clean(names[cid]), time=f"{t:.3f}")
        if rec is None:
            counts["errors"] += 1
            ET.SubElement(
                tc,
                "error",
                type="missing",
                message="no result: the shard that holds this cell is missing or did not finish",
            ).text = f"cell {cid} has no record in the merged runs"
            continue
        v = gate.verdicts[cid]
        if v.failing and cid in expected:
            counts["skipped"] += 1
            ET.SubElement(tc, "skipped", message=clean(f"expected by the matrix (expect_fail): {v.detail}"))
        elif v.failing:
            counts["failures"] += 1
            f = ET.SubElement(tc, "failure", type=v.label, message=clean(v.detail))
            f.text = clean(_start_text(rec) or v.detail)
        else:
            out = ET.SubElement(tc, "system-out")
            out.text = clean(v.detail)
    for i, problem in enumerate(gate.problems, 1):
        counts["tests"] += 1
        counts["failures"] += 1
        tc = ET.SubElement(
            suite, "testcase", classname=suite_name, name=f"the matrix as a whole #{i}", time="0.000"
        )
        ET.SubElement(tc, "failure", type="matrix", message=clean(problem.splitlines()[0])).text = clean(
            problem
        )
    for i, why in enumerate(gate.incomplete, 1):
        counts["tests"] += 1
        counts["errors"] += 1
        tc = ET.SubElement(suite, "testcase", classname=suite_name, name=f"completeness #{i}", time="0.000")
        ET.SubElement(tc, "error", type="incomplete", message=clean(why.splitlines()[0])).text = clean(why)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    for el in (suite, suites):
        for k, n in counts.items():
            el.set(k, str(n))
        el.set("time", f"{total_time:.3f}")
    suite.set("timestamp", stamp)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def summary_markdown(gate: Gate, scrubber: Scrubber | None = None) -> str:
    """A Markdown summary for the CI page (``$GITHUB_STEP_SUMMARY``): the outcome, then one row per cell,
    the failing first."""
    sc = scrubber or Scrubber.for_this_machine()
    m = gate.matrix
    cells = {c.cell_id: c for c in m.cells()}
    for r in gate.records:
        cells.setdefault(r["cell_id"], Cell.from_dict(r["cell"]))
    names = _names(m, list(cells.values()))
    unexpected, expected = set(gate.unexpected()), set(gate.expected())
    n = len(gate.records)
    where = f" (shard {gate.shard})" if gate.shard else ""
    lines = [f"### repro_matrix `{m.name}`{where}: {gate.status_word()} (exit status {gate.exit_code})", ""]
    parts = [
        f"{n} cell{'s' if n != 1 else ''} run",
        f"{n - len(unexpected) - len(expected)} pass",
        f"{len(unexpected)} failing",
    ]
    if expected:
        parts.append(f"{len(expected)} failing as the matrix expects")
    if gate.missing:
        parts.append(f"{len(gate.missing)} without a result")
    lines += [", ".join(parts) + ".", ""]
    for p in gate.problems:
        lines.append(f"- **failed**: {_md(p)}")
    for w in gate.incomplete:
        lines.append(f"- **incomplete**: {_md(w)}")
    if gate.problems or gate.incomplete:
        lines.append("")
    lines += ["| cell | verdict | what happened |", "|---|---|---|"]
    by_id = {r["cell_id"]: r for r in gate.records}

    def rank(cid: str) -> int:
        return 0 if cid in unexpected else 1 if cid in gate.missing else 2 if cid in expected else 3

    shown_ok = 0
    hidden = 0
    for cid in sorted((c for c in cells if c in by_id or c in gate.missing), key=rank):
        if cid not in by_id:
            lines.append(
                f"| {_md(names[cid])} | **missing** | no result (its shard is missing or did not finish) |"
            )
            continue
        v = gate.verdicts[cid]
        if v.failing:
            word = f"expected: {v.label}" if cid in expected else f"**{v.label}**"
        else:
            if shown_ok >= _SUMMARY_ROWS:
                hidden += 1
                continue
            shown_ok += 1
            word = v.label
        lines.append(f"| {_md(names[cid])} | {word} | {_md(v.detail)} |")
    if hidden:
        lines.append(f"| … | | and {hidden} more passing cells |")
    text = "\n".join(lines) + "\n"
    return sc.scrub(text)[0]


def write_ci_files(gate: Gate, junit: Path | None, summary: Path | None) -> None:
    """Write the JUnit file and append the summary (``$GITHUB_STEP_SUMMARY`` is appended to, as GitHub
    asks; a new file is created)."""
    if junit is None and summary is None:
        return
    sc = Scrubber.for_this_machine()
    if junit is not None:
        junit.parent.mkdir(parents=True, exist_ok=True)
        junit.write_text(junit_xml(gate, sc), encoding="utf-8")
    if summary is not None:
        summary.parent.mkdir(parents=True, exist_ok=True)
        with open(summary, "a", encoding="utf-8") as f:
            f.write(summary_markdown(gate, sc) + "\n")
