"""A stand-in for llama.cpp's ``llama-bench`` that prints rows in its real ``-o jsonl`` format.

It takes the flags strata-bench passes (-m -p -n -d -r -t -ngl -ncmoe -lm -b -ub -o -ctk -ctv -sm -ts -dev), runs the tests in
llama-bench's order (for each depth, prompt tests then generation tests) and prints one JSON
object per test with llama-bench's field names. The speeds are made up but deterministic: they
depend only on the test, so a test can check that each row is the right row. Environment:

- ``FAKE_LLAMA_BENCH_DELAY``: seconds to wait before each row (to interrupt a run mid-way);
- ``FAKE_LLAMA_BENCH_FAIL``: exit with status 1 and llama-bench's message after this many rows;
- ``FAKE_LLAMA_BENCH_FAIL_NCMOE``: fail to load the model (status 1, before any row) with this ``-ncmoe``;
- ``FAKE_LLAMA_BENCH_MAX_UBATCH``: fail to allocate the compute buffers (status 1, before any row, with
  llama.cpp's out-of-memory message) when ``-ub`` is larger than this.

With ``-ncmoe N`` the made-up speeds are divided by 1 + N (experts on the host are slower); a prompt
longer than 512 tokens runs sqrt(min(ub, prompt) / 512) times faster (larger micro-batches pay off).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def speed(n_prompt: int, n_gen: int, n_depth: int, n_cpu_moe: int = 0, n_ubatch: int = 512) -> float:
    """Made-up tokens/s: prompt tests faster than generation, both slower at depth and with host experts,
    long prompts faster at a large micro-batch."""
    base = 900.0 if n_prompt else 40.0
    if n_prompt > 512:
        base *= (max(512, min(n_ubatch, n_prompt)) / 512) ** 0.5
    return base / (1.0 + n_depth / 4096.0) / (1.0 + n_cpu_moe)


def main() -> int:
    p = argparse.ArgumentParser(prog="llama-bench")
    p.add_argument("-m", "--model", required=True)
    p.add_argument("-p", "--n-prompt", type=ints, default=[512])
    p.add_argument("-n", "--n-gen", type=ints, default=[128])
    p.add_argument("-d", "--n-depth", type=ints, default=[0])
    p.add_argument("-r", "--repetitions", type=int, default=5)
    p.add_argument("-t", "--threads", type=ints, default=[4])
    p.add_argument("-ngl", "--n-gpu-layers", type=ints, default=[99])
    p.add_argument("-ncmoe", "--n-cpu-moe", type=ints, default=[0])
    p.add_argument("-lm", "--load-mode", default="auto", choices=["auto", "none", "mmap", "mlock"])
    p.add_argument("-b", "--batch-size", type=ints, default=[2048])
    p.add_argument("-ub", "--ubatch-size", type=ints, default=[512])
    p.add_argument("-ctk", "--cache-type-k", default="f16")
    p.add_argument("-ctv", "--cache-type-v", default="f16")
    p.add_argument("-o", "--output", default="md")
    p.add_argument("-sm", "--split-mode", default="layer", choices=["none", "layer", "row"])
    p.add_argument("-ts", "--tensor-split", default="0")
    p.add_argument("-dev", "--device", default="auto")
    a = p.parse_args()
    if a.output != "jsonl":
        print(f"fake llama-bench only speaks jsonl, not {a.output}", file=sys.stderr)
        return 2
    if not os.path.isfile(a.model):
        print(f"error: failed to load model '{a.model}'", file=sys.stderr)
        return 1
    delay = float(os.environ.get("FAKE_LLAMA_BENCH_DELAY", "0"))
    fail_after = int(os.environ.get("FAKE_LLAMA_BENCH_FAIL", "-1"))
    if str(a.n_cpu_moe[0]) == os.environ.get("FAKE_LLAMA_BENCH_FAIL_NCMOE"):
        print(f"main: error: failed to load model '{a.model}'", file=sys.stderr)
        return 1
    max_ub = os.environ.get("FAKE_LLAMA_BENCH_MAX_UBATCH")
    if max_ub and a.ubatch_size[0] > int(max_ub):
        print("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 2304.00 MiB on device 0: cudaMalloc "
              "failed: out of memory", file=sys.stderr)  # fmt: skip
        print("main: error: failed to create context with model", file=sys.stderr)
        return 1
    # llama-bench's order: for each depth, the prompt tests and then the generation tests
    tests = []
    for d in a.n_depth:
        tests += [(pp, 0, d) for pp in a.n_prompt if pp > 0]
        tests += [(0, tg, d) for tg in a.n_gen if tg > 0]
    for i, (n_prompt, n_gen, n_depth) in enumerate(tests):
        if i == fail_after:
            print("main: error: failed to create context with model", file=sys.stderr)
            return 1
        if delay:
            time.sleep(delay)
        ts = speed(n_prompt, n_gen, n_depth, a.n_cpu_moe[0], a.ubatch_size[0])
        samples_ts = [round(ts * (1 + 0.01 * ((k % 3) - 1)), 3) for k in range(a.repetitions)]
        n_tok = n_prompt or n_gen
        samples_ns = [int(n_tok / s * 1e9) for s in samples_ts]
        mean_ts = sum(samples_ts) / len(samples_ts)
        var = sum((s - mean_ts) ** 2 for s in samples_ts) / max(1, len(samples_ts) - 1)
        mean_ns = sum(samples_ns) // len(samples_ns)
        row = {
            "build_commit": "fake0000",
            "build_number": 1,
            "cpu_info": "Fake CPU",
            "gpu_info": "",
            "backends": "CPU",
            "model_filename": a.model,
            "model_type": "qwen3moe ?B Q8_0",
            "model_size": os.path.getsize(a.model),
            "model_n_params": 1000000,
            "n_batch": a.batch_size[0],
            "n_ubatch": a.ubatch_size[0],
            "n_threads": a.threads[0],
            "cpu_mask": "0x0",
            "cpu_strict": False,
            "poll": 50,
            "type_k": a.cache_type_k,
            "type_v": a.cache_type_v,
            "n_gpu_layers": a.n_gpu_layers[0],
            "n_cpu_moe": a.n_cpu_moe[0],
            "split_mode": a.split_mode,
            "main_gpu": 0,
            "no_kv_offload": False,
            "flash_attn": False,
            "tensor_split": "/".join(f"{float(x):.2f}" for x in a.tensor_split.split("/")),
            "devices": a.device,
            "load_mode": a.load_mode,
            "embeddings": False,
            "n_prompt": n_prompt,
            "n_gen": n_gen,
            "n_depth": n_depth,
            "test_time": "2026-01-01T00:00:00Z",
            "avg_ns": mean_ns,
            "stddev_ns": 0,
            "avg_ts": mean_ts,
            "stddev_ts": var**0.5,
            "samples_ns": samples_ns,
            "samples_ts": samples_ts,
        }
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
