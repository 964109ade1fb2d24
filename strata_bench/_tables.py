"""Tables made from records: what ``strata-bench run`` prints and what ``--format md`` writes.

- **speed**: one row per target and configuration, one column per test (``pp512``, ``tg128``,
  ``pp512 @ d4096``) holding ``mean ± stddev`` t/s; with two targets, a ratio row follows each strata
  row: strata / llama.cpp for the llama.cpp runs with the same threads, device, KV type (and budget).
  Where llama.cpp ran a test more than one way (``-ub 512`` and ``-ub 4096 -b 4096``), the ratio is
  against the faster of them that kept to the budget, and its cell names the flags that won.
- **engine**: one row per test with what the engine did while it was timed: expert-cache hit
  rate, bytes streamed through the prompt ring, slots lent, the chunk, and the GB/s achieved.
- **server**: one row per suite step and load (concurrency, request rate) with TTFT, TPOT, ITL and
  end-to-end latency percentiles (p50, p90, p99) and the throughput at that load.
- **failed**: one row per configuration that failed (a test of it, or all of them), with the error.

On the GPU each row also shows the device memory the target used at its peak (NVML; the process's
own figure where NVML lists processes, else the device's peak less what was in use before the
target started), marked "over" where it exceeds the row's ``--vram-budget``, and the mean GPU
utilization while it ran. A llama.cpp row on the GPU stands for the
strata rows with the same ``--vram-budget`` (``-ngl 99 --n-cpu-moe N`` chosen for that budget).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from strata._config import EngineConfig

from ._grid import swept_knobs
from ._records import failed, to_markdown

__all__ = [
    "Table",
    "engine_table",
    "failed_table",
    "best_peer",
    "fmt_bytes",
    "knob_str",
    "over_budget",
    "peer_key",
    "render_markdown",
    "server_table",
    "speed_table",
    "tables",
    "vram_used",
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


def vram_used(rec: dict[str, Any]) -> int | None:
    """The device memory a row's target used at its peak, from its NVML samples; None without them."""
    nv = rec.get("nvml") or {}
    if nv.get("process_memory_max") is not None:
        return int(nv["process_memory_max"])
    if nv.get("memory_used_max") is None:
        return None
    return int(nv["memory_used_max"] - (nv.get("memory_baseline") or 0))


def _fmt_ts(rec: dict[str, Any]) -> str:
    if failed(rec):
        return "failed"
    mean, sd = rec.get("mean"), rec.get("stddev")
    if mean is None:
        return "-"
    return f"{mean:.2f} ± {sd or 0:.2f}"


def _fmt_gbps(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}" if x >= 1 else f"{x:.3g}"


_SIZE_KNOBS = ("vram_budget", "host_ram_budget")


def knob_str(v: Any, name: str = "") -> str:
    """A knob's value as a table cell: sizes in the flag's own spelling, no budget as ``auto``."""
    if v is None:
        return "auto" if name in _SIZE_KNOBS else "-"
    if name in _SIZE_KNOBS and isinstance(v, int):
        cfg = EngineConfig()
        setattr(cfg, name, v)
        return " ".join(cfg.to_cli_args()[1:])  # the flag's own spelling: 12GiB
    return str(v)


def _gpu(rec: dict[str, Any]) -> bool:
    k = rec.get("knobs") or {}
    return k.get("device") == "cuda" or (k.get("device") == "auto" and bool(rec.get("gpu")))


def peer_key(rec: dict[str, Any]) -> tuple[Any, ...] | None:
    """What a strata row and a llama.cpp row must share to be compared: model, threads, device, KV type,
    and on the GPU the device memory (strata's ``--vram-budget``, for which llama.cpp's ``--n-cpu-moe``
    was chosen). None for a llama.cpp GPU row that stands for no budget (an extra ``--n-cpu-moe`` value)."""
    k = rec.get("knobs") or {}
    key: tuple[Any, ...] = (
        rec.get("model"),
        k.get("threads") or rec.get("n_cpu"),
        k.get("device", "cpu"),
        k.get("kv", "f16"),
    )
    # a layer split pairs with the same split (llama.cpp's -sm layer over the same cards and shares)
    key += (k.get("split", "none"), k.get("gpus"), k.get("tensor_split"))
    if _gpu(rec):
        if rec.get("target") == "llama.cpp" and "vram_budget" not in k:
            return None
        key += (k.get("vram_budget"), tuple(k.get("vram_budgets") or ()))
    return key


def _group_key(rec: dict[str, Any]) -> tuple[Any, ...]:
    k = rec.get("knobs") or {}
    return (
        rec.get("target"),
        rec.get("model"),
        rec.get("quant"),
        tuple(sorted((n, repr(v)) for n, v in k.items())),
    )


def _llama_flags(k: dict[str, Any]) -> str:
    parts = []
    if "n_gpu_layers" in k:
        parts.append(f"-ngl {k['n_gpu_layers']}")
        if k.get("n_cpu_moe"):
            parts.append(f"-ncmoe {k['n_cpu_moe']}")
    if k.get("split") == "layer":
        shares = str(k.get("tensor_split") or "").replace(",", "/")
        parts.append("-sm layer" + (f" -ts {shares}" if shares else ""))
    ub, b = k.get("n_ubatch"), k.get("n_batch")
    if ub is not None and (ub, b) != (512, 2048):
        parts.append(f"-ub {ub}" + (f" -b {b}" if b is not None else ""))
    if k.get("llama_args"):
        parts.append(str(k["llama_args"]))
    return " ".join(parts) or "-"


def over_budget(rec: dict[str, Any]) -> bool:
    """Whether a row's device memory peak exceeded the budget it stands for."""
    budget = (rec.get("knobs") or {}).get("vram_budget")
    used = vram_used(rec)
    return isinstance(budget, int) and used is not None and used > budget


def _winner_flags(rec: dict[str, Any], others: Sequence[dict[str, Any]]) -> str:
    """The llama.cpp flags that set the faster row apart from the others it was chosen over."""
    k = rec.get("knobs") or {}
    parts = [f"-ub {k.get('n_ubatch', 512)}"]
    if any((o.get("knobs") or {}).get("n_cpu_moe") != k.get("n_cpu_moe") for o in others):
        parts.append(f"-ncmoe {k.get('n_cpu_moe') or 0}")
    return " ".join(parts)


def best_peer(candidates: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The fastest measured llama.cpp row of a test, among those that kept to their budget when any did."""
    ok = [r for r in candidates if not failed(r) and r.get("mean")]
    within = [r for r in ok if not over_budget(r)] or ok
    return max(within, key=lambda r: r["mean"]) if within else None


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
    peer_cols = any(_llama_flags(r.get("knobs") or {}) != "-" for r in recs if r.get("target") == "llama.cpp")
    vram_col = any(vram_used(r) is not None for r in recs)
    headers = (
        ["target"]
        + (["model"] if multi_model else [])
        + ["quant"]
        + knobs
        + (["llama.cpp flags"] if peer_cols else [])
        + (["VRAM peak"] if vram_col else [])
        + tests
    )

    def vram_cell(g: dict[str, Any]) -> str:
        rows = [r for r in g["tests"].values() if vram_used(r) is not None]
        if not rows:
            return "-"
        peak = max(rows, key=lambda r: vram_used(r) or 0)
        return fmt_bytes(vram_used(peak)) + (" (over)" if over_budget(peak) else "")

    def row_of(g: dict[str, Any]) -> list[str]:
        first = g["first"]
        k = first.get("knobs") or {}
        strata = first.get("target") == "strata"
        return (
            [first.get("target", "?")]
            + ([first.get("model", "?")] if multi_model else [])
            + [first.get("quant") or "-"]
            # a llama.cpp GPU row shows the budget it stands for
            + [knob_str(k.get(n), n) if strata or (n == "vram_budget" and n in k) else "-" for n in knobs]
            + ([("-" if strata else _llama_flags(k))] if peer_cols else [])
            + ([vram_cell(g)] if vram_col else [])
            + [_fmt_ts(g["tests"][t]) if t in g["tests"] else "-" for t in tests]
        )

    rows: list[list[str]] = []
    peers: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for g in groups.values():
        if g["first"].get("target") == "llama.cpp" and (pk := peer_key(g["first"])) is not None:
            peers.setdefault(pk, []).append(g)
    paired = {
        id(p)
        for g in groups.values()
        if g["first"].get("target") == "strata"
        for p in peers.get(peer_key(g["first"]) or (), [])
    }
    shown: set[int] = set()
    for g in groups.values():
        first = g["first"]
        if id(g) in shown or id(g) in paired and first.get("target") == "llama.cpp":
            continue  # a paired llama.cpp row is printed under the first strata row it stands against
        rows.append(row_of(g))
        shown.add(id(g))
        if first.get("target") != "strata":
            continue
        mine = peers.get(peer_key(first) or (), [])
        if not mine:
            continue
        for p in mine:
            if id(p) not in shown:
                rows.append(row_of(p))
                shown.add(id(p))
        cells = []
        for t in tests:
            a = g["tests"].get(t)
            cands = [p["tests"][t] for p in mine if t in p["tests"]]
            b = best_peer(cands)
            if not (a and b and not failed(a) and a.get("mean")):
                cells.append("-")
                continue
            cell = f"{a['mean'] / b['mean']:.2f}x"
            rivals = [c for c in cands if c is not b and not failed(c)]
            if rivals:
                cell += f" ({_winner_flags(b, rivals)})"
            cells.append(cell)
        ratio_lead = ["strata / llama.cpp"] + ([""] if multi_model else []) + [""]
        pad = len(knobs) + int(peer_cols) + int(vram_col)
        rows.append(ratio_lead + [""] * pad + cells)
    return Table(
        "speed (tokens/s, mean ± stddev; a ratio is against llama.cpp's faster setting of that test)",
        headers,
        rows,
    )


def engine_table(records: Sequence[dict[str, Any]]) -> Table | None:
    recs = [r for r in records if r.get("unit") == "t/s" and r.get("metrics")]
    if not recs:
        return None
    knobs = swept_knobs([r.get("knobs") or {} for r in recs if r.get("target") == "strata"])
    targets = len({r.get("target") for r in recs}) > 1
    gpu_cols = any(r.get("nvml") for r in recs)
    headers = (
        (["target"] if targets else [])
        + knobs
        + ["test", "t/s", "hit rate", "streamed", "lent", "chunk", "GB/s"]
        + (["VRAM peak", "GPU util"] if gpu_cols else [])
    )
    rows = []
    for r in recs:
        m = r["metrics"]
        k = r.get("knobs") or {}
        hr = m.get("hit_rate")
        rows.append(
            ([r.get("target", "?")] if targets else [])
            + [knob_str(k.get(n), n) if r.get("target") == "strata" else "-" for n in knobs]
            + [
                r["test"],
                f"{r['mean']:.2f}" if r.get("mean") is not None else "-",
                f"{100 * hr:.1f}%" if hr is not None else "-",
                fmt_bytes(m.get("bytes_streamed")) if "bytes_streamed" in m else "-",
                str(m["slots_lent"]) if m.get("slots_lent") is not None else "-",
                str(m["chunk"]) if m.get("chunk") else "-",
                _fmt_gbps(m.get("gbps")),
            ]
            + (_gpu_cells(r) if gpu_cols else [])
        )
    return Table("engine (counters while timed; GB/s = weight and KV bytes read / time)", headers, rows)


def _gpu_cells(r: dict[str, Any]) -> list[str]:
    nv = r.get("nvml") or {}
    util = nv.get("utilization_mean")
    return [fmt_bytes(vram_used(r)), f"{util:.0f}%" if util is not None else "-"]


def failed_table(records: Sequence[dict[str, Any]]) -> Table | None:
    """One row per failed configuration: its target and flags, the tests it lost, where and why."""
    groups: dict[tuple[str, str, str, str], list[str]] = {}
    for r in records:
        if not failed(r):
            continue
        e = r.get("error") or {}
        msg = " ".join(str(e.get("message") or "").split())
        phase = str(e.get("phase") or "")
        if phase.startswith(str(r.get("test"))):
            phase = phase[len(str(r.get("test"))) :].lstrip(", ") or "test"
        key = (str(r.get("target")), str(e.get("flags") or "-"), phase, msg)
        groups.setdefault(key, []).append(str(r.get("test")))
    if not groups:
        return None
    rows = [[t, f, ", ".join(tests), ph, m] for (t, f, ph, m), tests in groups.items()]
    return Table("failed (these configurations were not measured; the others were)",
                 ["target", "flags", "tests", "where", "error"], rows)  # fmt: skip


def _load_cells(r: dict[str, Any]) -> tuple[str, str]:
    w = r.get("work") or {}
    if "max_concurrency" not in w:
        return "-", "-"  # a row of a version that sent one request at a time and did not say so
    c = w.get("max_concurrency")
    rate = w.get("request_rate")
    return ("inf" if c is None else str(c)), ("inf" if rate is None else f"{rate:g}/s")


def server_table(records: Sequence[dict[str, Any]]) -> Table | None:
    recs = [r for r in records if r.get("kind") == "server"]
    if not recs:
        return None
    headers = [
        "target",
        "suite",
        "concurrency",
        "rate",
        "requests",
        "TTFT ms p50/p90/p99",
        "TPOT ms p50/p90/p99",
        "ITL ms p50/p90/p99",
        "E2E ms p50/p90/p99",
        "out tok/s",
        "req/s",
    ]
    rows = []
    for r in recs:
        m = r.get("metrics") or {}
        conc, rate = _load_cells(r)
        if failed(r):
            rows.append([r.get("target", "?"), r["test"], conc, rate, "-", "failed", "-", "-", "-", "-", "-"])
            continue

        def pct(name: str, m: dict[str, Any] = m) -> str:
            s = m.get(name) or {}
            if s.get("p90") is None:
                return "-"
            return "/".join(f"{s.get(k, s.get('median')):.1f}" for k in ("p50", "p90", "p99"))

        def num(x: Any) -> str:
            return f"{x:.2f}" if isinstance(x, (int, float)) else "-"

        rows.append(
            [
                r.get("target", "?"),
                r["test"],
                conc,
                rate,
                str(m.get("requests", "-")),
                pct("ttft_ms"),
                pct("tpot_ms"),
                pct("itl_ms"),
                pct("e2e_ms"),
                num(m.get("throughput_tok_s")),
                num(m.get("request_throughput")),
            ]
        )
    return Table(
        "server (latency in ms: p50 / p90 / p99; out tok/s and req/s = output tokens and requests per second of "
        "wall time at that load)",
        headers,
        rows,
    )


def tables(records: Sequence[dict[str, Any]]) -> list[Table]:
    made = (speed_table(records), engine_table(records), server_table(records), failed_table(records))
    return [t for t in made if t is not None]


def render_markdown(records: Sequence[dict[str, Any]]) -> str:
    parts = []
    for t in tables(records):
        parts.append(f"**{t.title}**\n\n{t.markdown()}")
    return "\n".join(parts)
