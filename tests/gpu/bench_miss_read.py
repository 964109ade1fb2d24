"""GPU benchmark of the decode miss policies on the 30B preset at Q4_K_M.

Per policy at 12 GiB (and every expert resident): greedy tg128 after a 512-token prompt, the hit rate, the
misses read over the bus and run on the host per token, the first decode steps after a 512- and a
4096-token prompt (the refill runs under them) and whether the reply equals the first row's.

    python3 tests/gpu/bench_miss_read.py MODEL.gguf
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from strata import Engine, EngineConfig

RUNS = [("12GiB", "read"), ("12GiB", "host"), ("12GiB", "copy"), ("all", "auto")]


def prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 150000, n).tolist()


def run(model: str, budget: str, miss: str) -> dict:
    cfg = EngineConfig(
        device="cuda",
        vram_budget=(12 << 30) if budget == "12GiB" else None,
        miss=miss,
        threads=8,
        max_context=8192,
    )
    t0 = time.perf_counter()
    with Engine(model, cfg) as eng:
        r: dict = {
            "budget": budget,
            "miss": miss,
            "open_s": round(time.perf_counter() - t0, 2),
            "slots": eng.plan.n_slots,
        }
        for n in (512, 4096):
            eng.kv_reset()
            eng.prefill(prompt(n, 3))
            eng.reset_stats()
            tok, ms, toks = int(np.argmax(eng.logits())), [], []
            steps = 128 if n == 512 else 16
            for _ in range(steps):
                a = time.perf_counter()
                eng.decode(tok)
                ms.append((time.perf_counter() - a) * 1e3)
                tok = int(np.argmax(eng.logits()))
                toks.append(tok)
            st = eng.stats()
            r[f"first_ms_{n}"] = [round(x, 1) for x in ms[:4]]
            if n == 512:
                r["tg128"] = round(1e3 * (len(ms) - 1) / sum(ms[1:]), 1)
                r["hit"] = round(st.hits / max(1, st.lookups), 3)
                r["bus_reads_per_tok"] = round(st.bus_reads / steps, 1)
                r["host_runs_per_tok"] = round(st.host_expert_runs / steps, 1)
                r["toks"] = toks[:24]
        r["peak_gib"] = round(eng.stats().device_peak_bytes / 2**30, 2)
    return r


def main() -> int:
    model = sys.argv[1]
    rows = []
    for budget, miss in RUNS:
        r = run(model, budget, miss)
        r["same_reply"] = r["toks"] == rows[0]["toks"] if rows else True
        rows.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "toks"}), flush=True)
    print(
        "| budget | miss | slots | tg128 | hit | bus reads/tok | host runs/tok | first steps after 512 (ms) "
        "| after 4096 | same reply | peak GiB |"
    )
    for r in rows:
        print(
            f"| {r['budget']} | {r['miss']} | {r['slots']} | {r['tg128']} | {r['hit']} | {r['bus_reads_per_tok']} "
            f"| {r['host_runs_per_tok']} | {r['first_ms_512']} | {r['first_ms_4096']} | {r['same_reply']} "
            f"| {r['peak_gib']} |"
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
