"""strata against llama.cpp on the quantized small model (``make bench``; not part of ``make test``).

One run on this machine, the same GGUF files and the same thread count for both engines: prompt
tokens/s (pp128, pp512) and decode tokens/s (tg64) for the small preset at Q8_0, Q4_K_M and IQ4_XS,
through ``strata-bench run --target strata --target llama.cpp``. Then the roofline figure of a decode
step: the weight bytes one decoded token reads (every non-expert matrix, one embedding row, K experts
per layer) times tokens/s, next to this machine's memory read bandwidth measured here.

llama.cpp's ``llama-bench`` comes from ``STRATA_LLAMA_BENCH`` or PATH (build it from the llama.cpp
sources, CPU only); without it only strata is measured. ``STRATA_BENCH_THREADS`` sets the threads
(default: all cores). On a shared machine the load changes from minute to minute, so the whole
comparison runs ``STRATA_BENCH_ROUNDS`` times (default 3), the two engines back to back in each round,
and the table gives per engine the median and the best of the rounds' means, with both ratios.
The table is printed and written to ``results/quant-bench-<UTC time>.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.bench

QUANTS = ["q8_0", "q4_k_m", "iq4_xs"]
TESTS = ["pp128", "pp512", "tg64"]


def _memory_bandwidth(threads: int) -> float:
    """Read bandwidth in GB/s: `threads` threads reducing their share of a 1 GiB array (NumPy releases
    the GIL in its reduction loops); the best of 5."""
    a = np.ones(1 << 27, dtype=np.uint64)
    parts = np.array_split(a, threads)
    best = 0.0
    with ThreadPoolExecutor(threads) as ex:
        for _ in range(5):
            t = time.perf_counter()
            list(ex.map(np.bitwise_or.reduce, parts))
            best = max(best, a.nbytes / (time.perf_counter() - t) / 1e9)
    return best


def _decode_bytes(path: Path) -> int:
    """Weight bytes one decoded token reads: non-expert matrices whole, one embedding row, K experts."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    k = int(r.fields["qwen3moe.expert_used_count"].contents())
    n_expert = int(r.fields["qwen3moe.expert_count"].contents())
    total = 0
    for t in r.tensors:
        if "_exps" in t.name:
            total += int(t.n_bytes) // n_expert * k
        elif t.name == "token_embd.weight":
            total += int(t.n_bytes) // int(t.shape[1])
        elif len(t.shape) > 1 or t.name.endswith("norm.weight"):
            total += int(t.n_bytes)
    if not any(t.name == "output.weight" for t in r.tensors):  # tied head: the embedding is read whole
        total += sum(int(t.n_bytes) for t in r.tensors if t.name == "token_embd.weight")
    return total


def test_quantized_speed_against_llama_cpp(tmp_path: Path) -> None:
    from strata.model import ensure_model

    threads = int(os.environ.get("STRATA_BENCH_THREADS", os.cpu_count() or 1))
    rounds = int(os.environ.get("STRATA_BENCH_ROUNDS", "3"))
    llama = os.environ.get("STRATA_LLAMA_BENCH") or shutil.which("llama-bench")
    bw = _memory_bandwidth(threads)
    means: dict[tuple[str, str, str], list[float]] = {}
    loads = []
    for rnd in range(rounds):
        for quant in QUANTS:
            path = ensure_model("small", quant, 0)
            out = tmp_path / f"{quant}-{rnd}.jsonl"
            cmd = [sys.executable, "-m", "strata_bench.cli", "run", "-m", str(path), "--target", "strata",
                   "-p", "128,512", "-n", "64", "-r", "5", "--threads", str(threads), "-O", str(out)]  # fmt: skip
            if llama:
                cmd += ["--target", "llama.cpp", "--llama-bench", llama]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            recs = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
            got = {(r["target"], r["test"]) for r in recs}
            assert {("strata", t) for t in TESTS} <= got, (
                f"{quant}: strata-bench left out tests: {sorted(got)}"
            )
            for r in recs:
                means.setdefault((quant, r["target"], r["test"]), []).append(float(r["mean"]))
                loads.append(r.get("load_avg_1m") or 0.0)

    rows = []
    for quant in QUANTS:
        per_token = _decode_bytes(ensure_model("small", quant, 0))
        for test in TESTS:
            s = means[(quant, "strata", test)]
            ll = means.get((quant, "llama.cpp", test))
            row = {
                "quant": quant,
                "test": test,
                "threads": threads,
                "strata_rounds": s,
                "llama_rounds": ll,
                "strata_median": float(np.median(s)),
                "strata_best": max(s),
                "llama_median": float(np.median(ll)) if ll else None,
                "llama_best": max(ll) if ll else None,
            }
            row["ratio_median"] = row["strata_median"] / row["llama_median"] if ll else None
            row["ratio_best"] = row["strata_best"] / row["llama_best"] if ll else None
            if test.startswith("tg"):
                row["weight_bytes_per_token"] = per_token
                row["strata_weight_gbps"] = per_token * row["strata_best"] / 1e9
                row["llama_weight_gbps"] = per_token * row["llama_best"] / 1e9 if ll else None
            rows.append(row)

    lines = [
        f"memory read bandwidth ({threads} threads): {bw:.1f} GB/s; {rounds} rounds; "
        f"load average (1 min) {min(loads):.1f}-{max(loads):.1f}",
        "| quant | test | strata t/s median (best) | llama.cpp t/s median (best) | ratio median (best) "
        "| weight GB/s at best tg, strata / llama.cpp |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        st = f"{r['strata_median']:.1f} ({r['strata_best']:.1f})"
        ll = f"{r['llama_median']:.1f} ({r['llama_best']:.1f})" if r["llama_median"] else "-"
        ratio = f"{r['ratio_median']:.2f}x ({r['ratio_best']:.2f}x)" if r["ratio_median"] else "-"
        gb = ""
        if "strata_weight_gbps" in r:
            gb = f"{r['strata_weight_gbps']:.1f}"
            if r["llama_weight_gbps"]:
                gb += f" / {r['llama_weight_gbps']:.1f}"
            gb += f" ({r['weight_bytes_per_token'] / 1e6:.1f} MB/token)"
        lines.append(f"| {r['quant']} | {r['test']} | {st} | {ll} | {ratio} | {gb} |")
    print("\n" + "\n".join(lines))
    results = Path("results")
    results.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    (results / f"quant-bench-{stamp}.json").write_text(
        json.dumps({"memory_read_gbps": bw, "threads": threads, "rounds": rounds, "rows": rows}, indent=1)
    )
