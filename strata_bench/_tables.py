"""Tables made from records: what ``strata-bench run`` prints and what ``--format md`` writes.

- **speed**: one row per target and configuration, one column per test (``pp512``, ``tg128``,
  ``pp512 @ d4096``) holding ``mean ± stddev`` t/s; with two targets, a ratio row follows each strata
  row (strata / llama.cpp for the llama.cpp run with the same threads, device and KV type).
- **engine**: one row per test with what the engine did while it was timed: expert-cache hit
  rate, bytes streamed through the prompt ring, slots lent, the chunk, and the GB/s achieved.
- **server**: one row per suite with TTFT, TPOT, ITL and end-to-end latency percentiles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._grid import swept_knobs
from ._records import to_markdown

__all__ = [
    "Table",
    "engine_table",
    "fmt_bytes",
    "peer_key",
    "render_markdown",
    "server_table",
    "speed_table",
    "tables",
]


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]

    def markdown(self) -> str:
        return to_markdown(self.headers, self.rows)


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f} B"


def _fmt_ts(rec: dict[str, Any]) -> str:
    mean, sd = rec.get("mean"), rec.get("stddev")
    if mean is None:
        return "-"
    return f"{mean:.2f} ± {sd or 0:.2f}"


def _fmt_gbps(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}" if x >= 1 else f"{x:.3g}"


def _knob_str(v: Any) -> str:
    return "-" if v is None else str(v)


def peer_key(rec: dict[str, Any]) -> tuple[Any, ...]:
    """What a strata row and a llama.cpp row must share to be compared: model, threads, device, KV type."""
    k = rec.get("knobs") or {}
    return (
        rec.get("model"),
        k.get("threads") or rec.get("n_cpu"),
        k.get("device", "cpu"),
        k.get("kv", "f16"),
    )


def _group_key(rec: dict[str, Any]) -> tuple[Any, ...]:
    k = rec.get("knobs") or {}
    return (
        rec.get("target"),
        rec.get("model"),
        rec.get("quant"),
        tuple(sorted((n, repr(v)) for n, v in k.items())),
    )


def speed_table(records: Sequence[dict[str, Any]]) -> Table | None:
    recs = [r for r in records if r.get("unit") == "t/s"]
    if not recs:
        return None
    tests: list[str] = []
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in recs:
        if r["test"] not in tests:
            tests.append(r["test"])
        g = groups.setdefault(_group_key(r), {"first": r, "tests": {}})
        g["tests"][r["test"]] = r  # a later row of the same test wins (appended re-runs)
    knobs = swept_knobs([r.get("knobs") or {} for r in recs if r.get("target") == "strata"])
    multi_model = len({r.get("model") for r in recs}) > 1
    headers = ["target"] + (["model"] if multi_model else []) + ["quant"] + knobs + tests
    rows: list[list[str]] = []
    peers = {peer_key(g["first"]): g for g in groups.values() if g["first"].get("target") == "llama.cpp"}
    for g in groups.values():
        first = g["first"]
        k = first.get("knobs") or {}
        lead = (
            [first.get("target", "?")]
            + ([first.get("model", "?")] if multi_model else [])
            + [first.get("quant") or "-"]
        )
        knob_cells = [_knob_str(k.get(n)) if first.get("target") == "strata" else "-" for n in knobs]
        rows.append(lead + knob_cells + [_fmt_ts(g["tests"][t]) if t in g["tests"] else "-" for t in tests])
        if first.get("target") == "strata":
            peer = peers.get(peer_key(first))
            if peer is not None:
                cells = []
                for t in tests:
                    a, b = g["tests"].get(t), peer["tests"].get(t)
                    ok = a and b and a.get("mean") and b.get("mean")
                    cells.append(f"{a['mean'] / b['mean']:.2f}x" if ok else "-")
                ratio_lead = ["strata / llama.cpp"] + ([""] if multi_model else []) + [""]
                rows.append(ratio_lead + [""] * len(knobs) + cells)
    return Table("speed (tokens/s, mean ± stddev)", headers, rows)


def engine_table(records: Sequence[dict[str, Any]]) -> Table | None:
    recs = [r for r in records if r.get("unit") == "t/s" and r.get("metrics")]
    if not recs:
        return None
    knobs = swept_knobs([r.get("knobs") or {} for r in recs if r.get("target") == "strata"])
    targets = len({r.get("target") for r in recs}) > 1
    headers = (
        (["target"] if targets else [])
        + knobs
        + ["test", "t/s", "hit rate", "streamed", "lent", "chunk", "GB/s"]
    )
    rows = []
    for r in recs:
        m = r["metrics"]
        k = r.get("knobs") or {}
        hr = m.get("hit_rate")
        rows.append(
            ([r.get("target", "?")] if targets else [])
            + [_knob_str(k.get(n)) if r.get("target") == "strata" else "-" for n in knobs]
            + [
                r["test"],
                f"{r['mean']:.2f}" if r.get("mean") is not None else "-",
                f"{100 * hr:.1f}%" if hr is not None else "-",
                fmt_bytes(m.get("bytes_streamed")) if "bytes_streamed" in m else "-",
                str(m["slots_lent"]) if m.get("slots_lent") is not None else "-",
                str(m["chunk"]) if m.get("chunk") else "-",
                _fmt_gbps(m.get("gbps")),
            ]
        )
    return Table("engine (counters while timed; GB/s = weight and KV bytes read / time)", headers, rows)


def server_table(records: Sequence[dict[str, Any]]) -> Table | None:
    recs = [r for r in records if r.get("kind") == "server"]
    if not recs:
        return None
    headers = [
        "target",
        "suite",
        "requests",
        "TTFT ms mean/med/p90/p99",
        "TPOT ms mean/med/p90/p99",
        "ITL ms mean/med/p90/p99",
        "E2E ms mean/med/p90/p99",
        "tok/s",
    ]
    rows = []
    for r in recs:
        m = r.get("metrics") or {}

        def pct(name: str, m: dict[str, Any] = m) -> str:
            s = m.get(name) or {}
            if s.get("mean") is None:
                return "-"
            return "/".join(f"{s[k]:.1f}" for k in ("mean", "median", "p90", "p99"))

        rows.append(
            [
                r.get("target", "?"),
                r["test"],
                str(m.get("requests", "-")),
                pct("ttft_ms"),
                pct("tpot_ms"),
                pct("itl_ms"),
                pct("e2e_ms"),
                f"{r['mean']:.2f}" if r.get("mean") is not None else "-",
            ]
        )
    return Table(
        "server (latency in ms: mean / median / p90 / p99; tok/s = output tokens per second)", headers, rows
    )


def tables(records: Sequence[dict[str, Any]]) -> list[Table]:
    return [t for t in (speed_table(records), engine_table(records), server_table(records)) if t is not None]


def render_markdown(records: Sequence[dict[str, Any]]) -> str:
    parts = []
    for t in tables(records):
        parts.append(f"**{t.title}**\n\n{t.markdown()}")
    return "\n".join(parts)
