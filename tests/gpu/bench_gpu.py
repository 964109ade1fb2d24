"""GPU benchmark: prompt and decode tokens/s on the CUDA backend, with every expert resident and with
smaller device budgets, plus hit rates and the bandwidth achieved. Prints a short table last.

    STRATA_GPU_BENCH_PRESET=qwen3-30b-a3b STRATA_GPU_BENCH_QUANT=q8_0 python3 tests/gpu/bench_gpu.py
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from strata import Engine, EngineConfig, _engine
from strata.model import ensure_model


def bench(path, budget: str | None, pp: list[int], tg: int, reps: int = 2) -> list[dict]:
    cfg = EngineConfig(
        device="cuda", vram_budget=None if budget is None else int(budget), max_context=max(pp) + tg + 8
    )
    rows = []
    with Engine(path, cfg) as eng:
        info, plan = eng.info, eng.plan
        rng = np.random.default_rng(0)
        for n in pp:
            times = []
            for r in range(reps + 1):
                eng.kv_reset()
                prompt = [int(t) for t in rng.integers(10, info.n_vocab - 10, size=n)]
                t0 = time.perf_counter()
                eng.prefill(prompt)
                dt = time.perf_counter() - t0
                if r:
                    times.append(dt)
            rows.append(
                {
                    "test": f"pp{n}",
                    "budget": budget or "all",
                    "tok_s": n / float(np.median(times)),
                    "slots": plan.n_slots,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
        times, hit = [], []
        for r in range(reps + 1):
            eng.kv_reset()
            eng.prefill([int(t) for t in rng.integers(10, info.n_vocab - 10, size=16)])
            eng.reset_stats()
            t0 = time.perf_counter()
            res = eng.generate([int(rng.integers(10, 1000))], max_tokens=tg, stop_at_eos=False)
            dt = time.perf_counter() - t0
            st = eng.stats()
            if r:
                times.append(dt / len(res.tokens))
                hit.append(st.hits / max(1, st.lookups))
        per_tok = float(np.median(times))
        # bytes a decode step must read: the resident weights once plus K experts per layer
        moved = info.resident_bytes + info.n_layer * info.n_expert_used * info.expert_bytes
        rows.append(
            {
                "test": f"tg{tg}",
                "budget": budget or "all",
                "tok_s": 1 / per_tok,
                "slots": plan.n_slots,
                "hit_rate": float(np.mean(hit)),
                "GB_s": moved / per_tok / 1e9,
            }
        )
    return rows


def main() -> int:
    if not _engine.cuda_available():
        print("no CUDA device: nothing to benchmark")
        return 0
    preset = os.environ.get("STRATA_GPU_BENCH_PRESET", "small")
    quant = os.environ.get("STRATA_GPU_BENCH_QUANT", "q8_0")
    # every expert resident (the device's free memory), then each budget in GiB
    budgets: list[str | None] = [None] + [
        str(int(float(b) * (1 << 30))) for b in os.environ.get("STRATA_GPU_BENCH_BUDGETS", "").split(",") if b
    ]
    pp = [int(x) for x in os.environ.get("STRATA_GPU_BENCH_PP", "512").split(",")]
    t0 = time.perf_counter()
    path = ensure_model(preset, quant=quant, seed=0)
    print(f"model {path} ready in {time.perf_counter() - t0:.1f} s", flush=True)
    rows = []
    for b in budgets:
        rows += bench(path, b, pp, int(os.environ.get("STRATA_GPU_BENCH_TG", "64")))
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n{preset} {quant} on {_engine.cpu_features()[:0]}GPU")
    print(f"{'test':8} {'budget':>12} {'slots':>6} {'tok/s':>10} {'hit':>6} {'GB/s':>8}")
    for r in rows:
        b = r["budget"] if r["budget"] == "all" else f"{int(r['budget']) / (1 << 30):.0f}GiB"
        print(
            f"{r['test']:8} {b:>12} {r['slots']:6d} {r['tok_s']:10.1f} {r.get('hit_rate', float('nan')):6.2f} "
            f"{r.get('GB_s', float('nan')):8.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
