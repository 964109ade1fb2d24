"""GPU benchmark: prompt and decode tokens/s with an f16 KV cache against an int8 one (``--kv``), on one
model made by strata.model.make_model, all resident or at a device budget. Prints one JSON line per
run, then a table with int8 / f16 per row.

    python3 tests/gpu/bench_kv_int8.py                         # qwen3-30b-a3b, 8 layers, Q4_K_M, 3000 tokens
    python3 tests/gpu/bench_kv_int8.py --layers 0 --budget 12G # the whole preset at 12 GiB

--layers 0 keeps the preset's layer count (48 for qwen3-30b-a3b: a 17 GiB file at Q4_K_M, made once
under the model cache). Prompt: the median of --reps timed prefills of --prompt random tokens after one
untimed; decode: --gen tokens generated after a prompt of the same length, so that decode attention reads
a cache of that many positions.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from strata import Engine, EngineConfig
from strata._config import parse_size
from strata.model import ensure_model, make_model
from strata.model._writer import model_cache_path


def _model(preset: str, quant: str, layers: int) -> Path:
    if layers <= 0:
        return Path(ensure_model(preset, quant=quant, seed=0))
    out = model_cache_path(preset, quant, 0, n_layer=layers)
    if not out.exists():
        make_model(preset, quant, 0, out, n_layer=layers)
    return out


def run(path: Path, kv: str, budget: str | None, n_prompt: int, n_gen: int, reps: int) -> dict:
    cfg = EngineConfig(
        device="cuda",
        kv=kv,
        vram_budget=None if budget is None else parse_size(budget),
        max_context=n_prompt + n_gen + 8,
    )
    rng = np.random.default_rng(0)
    with Engine(path, cfg) as eng:
        vocab = eng.info.n_vocab
        prompt = [int(t) for t in rng.integers(10, vocab - 10, size=n_prompt)]
        times = []
        for r in range(reps + 1):
            eng.kv_reset()
            t0 = time.perf_counter()
            eng.prefill(prompt)
            dt = time.perf_counter() - t0
            if r:
                times.append(dt)
        dec = []
        for r in range(2):
            eng.kv_reset()
            eng.prefill(prompt[:-1])
            t0 = time.perf_counter()
            res = eng.generate(prompt[-1:], max_tokens=n_gen, stop_at_eos=False)
            dt = time.perf_counter() - t0
            if r:
                dec.append(len(res.tokens) / dt)
    return {
        "kv": kv,
        "budget": budget or "all",
        "prompt": n_prompt,
        "pp_tok_s": n_prompt / float(np.median(times)),
        "tg_tok_s": float(np.median(dec)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="qwen3-30b-a3b")
    ap.add_argument("--quant", default="q4_k_m")
    ap.add_argument("--layers", type=int, default=8, help="layers of the made model (0: the preset's)")
    ap.add_argument("--budget", default=None, help="--vram-budget, e.g. 12G (default: all resident)")
    ap.add_argument("--prompt", type=int, default=3000)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    path = _model(a.preset, a.quant, a.layers)
    rows = {}
    for kv in ("f16", "int8"):
        rows[kv] = run(path, kv, a.budget, a.prompt, a.gen, a.reps)
        print(json.dumps(rows[kv]), flush=True)
    f, i = rows["f16"], rows["int8"]
    print(f"\n{path.name}, budget {f['budget']}, {a.prompt}-token prompt")
    print(f"{'test':<10} {'f16 KV':>10} {'int8 KV':>10} {'int8/f16':>9}")
    for key, name in (("pp_tok_s", f"pp{a.prompt}"), ("tg_tok_s", f"tg{a.gen}")):
        print(f"{name:<10} {f[key]:>10.1f} {i[key]:>10.1f} {i[key] / f[key]:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
