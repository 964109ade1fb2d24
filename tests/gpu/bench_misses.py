"""GPU benchmark of the expert store and the miss path: prompt and decode tokens/s under a device budget
for each miss policy, with the copy rate achieved, the hit rate, the host's share of the misses and the
engine's open time (which includes registering the mapped file). Prints a short table last.

    STRATA_BENCH_BUDGETS=12,24 STRATA_BENCH_DEADLINE=150 python3 tests/gpu/bench_misses.py

Rows run in order and are skipped once the deadline (seconds from the start) is near.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from strata import Engine, EngineConfig, _engine
from strata.model import ensure_model

T0 = time.perf_counter()


def left(deadline: float) -> float:
    return deadline - (time.perf_counter() - T0)


def prompt(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    return [int(t) for t in rng.integers(10, vocab - 10, size=n)]


def run_row(
    path, budget_gib: float, miss: str, env: dict[str, str], pp: list[int], tg: int, deadline: float
) -> dict:
    for k, v in env.items():
        os.environ[k] = v
    lines: list[str] = []
    row: dict = {
        "budget": f"{budget_gib:g}GiB",
        "miss": miss,
        "env": " ".join(f"{k}={v}" for k, v in env.items()),
    }
    cfg = EngineConfig(device="cuda", vram_budget=int(budget_gib * 2**30), max_context=4096 + 256, miss=miss)
    t0 = time.perf_counter()
    try:
        with Engine(path, cfg, trace=lines.append) as eng:
            row["open_s"] = time.perf_counter() - t0
            row["chunk"] = eng.plan.auto_chunk
            row["slots"] = eng.plan.n_slots
            rng = np.random.default_rng(0)
            V = eng.info.n_vocab
            for n in pp:
                if left(deadline) < 8:
                    break
                for _r in range(2 if n <= 512 else 1):  # one warm-up for pp512
                    eng.kv_reset()
                    p = prompt(rng, n, V)
                    eng.reset_stats()
                    t1 = time.perf_counter()
                    eng.prefill(p)
                    dt = time.perf_counter() - t1
                st = eng.stats()
                row[f"pp{n}"] = n / dt
                row[f"pp{n}_GBps"] = st.bytes_copied / dt / 1e9
                row[f"pp{n}_hit"] = st.hits / max(1, st.lookups)
                row[f"pp{n}_chunk"] = st.last_chunk
            if tg and left(deadline) > 10:
                for r in range(2):  # one warm-up
                    n_tok = tg if r else min(tg, 32)
                    eng.kv_reset()
                    eng.prefill(prompt(rng, 16, V))
                    eng.reset_stats()
                    t1 = time.perf_counter()
                    res = eng.generate([int(rng.integers(10, 1000))], max_tokens=n_tok, stop_at_eos=False)
                    dt = time.perf_counter() - t1
                    if left(deadline) < 6:
                        break
                st = eng.stats()
                row[f"tg{n_tok}"] = len(res.tokens) / dt
                row["tg_hit"] = st.hits / max(1, st.lookups)
                row["tg_misses_per_tok"] = st.misses / max(1, len(res.tokens))
                row["tg_host_share"] = st.host_expert_runs / max(1, st.misses)
                row["tg_GBps"] = st.bytes_copied / dt / 1e9
    except Exception as ex:  # a failure is a row of the table, not the end of the run
        row["error"] = f"{type(ex).__name__}: {ex}"
    for k in env:
        del os.environ[k]
    row["trace"] = [ln for ln in lines if ln.startswith("cuda:") or "plan" in ln][:12]
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    if not _engine.cuda_available():
        print("no CUDA device: nothing to benchmark")
        return 0
    deadline = float(os.environ.get("STRATA_BENCH_DEADLINE", "170"))
    budgets = [float(b) for b in os.environ.get("STRATA_BENCH_BUDGETS", "12,24").split(",")]
    path = ensure_model("qwen3-30b-a3b", quant="q8_0", seed=0)
    rows = []
    plan = []
    for b in budgets:
        if b == budgets[0]:
            plan += [
                (b, "copy", {}, [512, 4096], 128),
                (b, "auto", {}, [512, 4096], 128),
                (b, "host", {}, [], 128),
                (b, "copy", {"STRATA_CUDA_STORE": "arena"}, [512, 4096], 128),
                (b, "auto", {"STRATA_CUDA_STORE": "arena"}, [], 128),
                (b, "read", {}, [], 128),
                (b, "copy", {"STRATA_CUDA_OVERLAP": "0"}, [512], 64),
                (b, "copy", {"STRATA_CUDA_STORE": "register"}, [512], 64),
            ]
        else:
            plan += [(b, "auto", {}, [512, 4096], 128)]
    for b, miss, env, pp, tg in plan:
        if left(deadline) < 25:
            print(f"skipped {b}GiB {miss} {env}: {left(deadline):.0f} s left", flush=True)
            continue
        rows.append(run_row(path, b, miss, env, pp, tg, deadline))
    for r in rows:
        print(
            r["budget"],
            r["miss"],
            r["env"],
            f"open {r.get('open_s', 0):.1f} s:",
            " / ".join(
                ln
                for ln in r["trace"]
                if "store" in ln or "filled" in ln or "auto" in ln or "plan:" in ln[:6]
            ),
        )
    cols = [
        "budget",
        "miss",
        "env",
        "open_s",
        "chunk",
        "pp512",
        "pp512_GBps",
        "pp512_hit",
        "pp4096",
        "pp4096_GBps",
        "tg128",
        "tg64",
        "tg_hit",
        "tg_misses_per_tok",
        "tg_host_share",
        "tg_GBps",
        "error",
    ]
    print("\n" + " | ".join(cols))
    for r in rows:
        print(" | ".join(f"{r[c]:.3g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
