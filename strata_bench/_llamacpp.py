"""The llama.cpp target: run its ``llama-bench`` with the same tests and read its ``-o jsonl`` rows.

Each line llama-bench prints is one finished test; it is turned into a strata-bench record (the
same test name, the raw samples, the summary) and appended at once, so llama.cpp rows survive an
interrupted run like strata's do. llama-bench's own description of itself (build commit, backends,
batch sizes, threads) is kept under ``peer`` in each record, and the settings that change its work
(micro-batch and batch as it reports them, ``--n-cpu-moe``, the extra flags) are in its ``knobs``.

llama.cpp at its best: prompts run at its default micro-batch (``-ub 512``) and again at a large one
(``-ub 4096 -b 4096``, or the largest that fits the device memory), and the table pairs each strata
row with the faster of the two. With a budget, the ``--n-cpu-moe`` is the one whose estimated device
memory fits it at that micro-batch (a larger micro-batch needs larger compute buffers).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from strata._config import EngineConfig

from ._model import bytes_moved
from ._nvml import GpuSampler
from ._records import base_record, llama_test_name, summarize

__all__ = [
    "LlamaBenchError",
    "device_budget",
    "find_llama_bench",
    "fit_n_cpu_moe",
    "llama_bench_args",
    "n_cpu_moe_for_budget",
    "on_gpu",
    "peer_knobs",
    "record_from_row",
    "run_llama_bench",
]

# llama-bench fields copied into each record's "peer" (its description of the run)
_PEER_FIELDS = (
    "build_commit",
    "build_number",
    "cpu_info",
    "gpu_info",
    "backends",
    "model_filename",
    "model_type",
    "model_size",
    "model_n_params",
    "n_batch",
    "n_ubatch",
    "n_threads",
    "type_k",
    "type_v",
    "n_gpu_layers",
    "n_cpu_moe",
    "split_mode",
    "tensor_split",
    "devices",
    "flash_attn",
    "use_mmap",
    "load_mode",
    "test_time",
    "avg_ts",
    "stddev_ts",
)


class LlamaBenchError(RuntimeError):
    """llama-bench is missing, failed, or printed something that is not its JSONL."""


def find_llama_bench(path: str | None = None) -> Path:
    """The llama-bench executable: ``path`` if given, else ``llama-bench`` on PATH."""
    if path:
        p = Path(path)
        if p.is_dir():
            p = p / "llama-bench"
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise LlamaBenchError(f"--llama-bench {path}: not an executable file")
        return p
    found = shutil.which("llama-bench")
    if not found:
        raise LlamaBenchError(
            "the llama.cpp target needs llama.cpp's llama-bench: none is on PATH. Build llama.cpp "
            "(cmake --build build --target llama-bench) and put build/bin on PATH, or pass --llama-bench PATH"
        )
    return Path(found)


def _threads(cfg: EngineConfig) -> int:
    return cfg.threads or os.cpu_count() or 1


def on_gpu(device: str | None, gpu_present: bool | None = None) -> bool:
    """Whether a strata device setting means the GPU (``auto`` does when there is one)."""
    if device == "cuda":
        return True
    if device == "auto":
        if gpu_present is None:
            from ._nvml import gpu_info

            gpu_present = gpu_info() is not None
        return bool(gpu_present)
    return False


# What llama.cpp holds on the device besides the weights and the KV cache: compute buffers (logits of a
# 512-token micro-batch over a large vocabulary alone take ~300 MB) and scratch. An estimate; the rows
# record the memory NVML saw, which is what the comparison should be read against.
_LLAMA_COMPUTE_RESERVE = 1 << 30
LLAMA_DEFAULT_UBATCH = 512  # llama-bench's own -ub (and -b 2048)


def compute_bytes(weights: dict[str, Any], n_ubatch: int = LLAMA_DEFAULT_UBATCH) -> int:
    """Estimated compute buffers of llama.cpp at micro-batch ``n_ubatch``: the reserve that holds at 512,
    plus, for each token beyond 512, twice its f32 activations (the residual stream and its norms, about
    8 x n_embd values, and the gate, up and product of each used expert, 3 x K x F values)."""
    extra = max(0, n_ubatch - LLAMA_DEFAULT_UBATCH)
    n_embd, n_ff = weights.get("n_embd") or 0, weights.get("n_ff_exp") or 0
    per_token = 4 * (8 * n_embd + 3 * weights["n_expert_used"] * n_ff)
    return _LLAMA_COMPUTE_RESERVE + 2 * extra * per_token


def fit_n_cpu_moe(
    weights: dict[str, Any], budget: int, n_ctx: int, n_ubatch: int = LLAMA_DEFAULT_UBATCH
) -> int | None:
    """The smallest ``--n-cpu-moe N`` whose estimated device memory fits ``budget``; None when not even N =
    every layer fits (the dense weights, the KV cache and the compute buffers alone are too large)."""
    layer_experts = [b * weights["n_expert"] for b in weights["expert_bytes"]]
    kv = weights["kv_values_per_token"] * 2 * n_ctx  # f16 K and V
    # dense_bytes leaves out an input embedding table that is not also the output: llama.cpp keeps it on the host
    fixed = weights["dense_bytes"] + kv + compute_bytes(weights, n_ubatch)
    for n in range(len(layer_experts) + 1):
        if fixed + sum(layer_experts[n:]) <= budget:
            return n
    return None


def n_cpu_moe_for_budget(
    weights: dict[str, Any], budget: int | None, n_ctx: int, n_ubatch: int = LLAMA_DEFAULT_UBATCH
) -> int:
    """llama.cpp's ``--n-cpu-moe N`` that fits ``-ngl 99`` into ``budget`` bytes of device memory.

    With ``-ngl 99 --n-cpu-moe N`` llama.cpp keeps every weight on the device except the token
    embeddings and the experts of layers 0..N-1, plus its KV cache and compute buffers. The smallest N
    whose estimate fits the budget gives llama.cpp about the device memory strata was given. No budget
    (every expert resident in strata) is N = 0; a budget that nothing fits is every layer.
    """
    if budget is None:
        return 0
    n = fit_n_cpu_moe(weights, budget, n_ctx, n_ubatch)
    return len(weights["expert_bytes"]) if n is None else n


def device_budget(cfg: EngineConfig) -> int | None:
    """The device memory a configuration plans for: ``--vram-budget``, or a layer split's budgets together
    (llama.cpp's ``--n-cpu-moe`` is chosen for its devices together)."""
    return sum(cfg.vram_budgets) if cfg.vram_budgets else cfg.vram_budget


def split_args(cfg: EngineConfig) -> list[str]:
    """llama-bench's flags for strata's layer split: ``-sm layer`` over the same cards (``-dev CUDA0/CUDA1``)
    with the same shares of the layers (``-ts``; strata's default is an even split, llama.cpp's one by free
    memory, so the shares are always given). Nothing without a split. llama.cpp splits over distinct cards
    only, so a split that names one card twice (two plans on one card) has no counterpart."""
    if cfg.split != "layer":
        return []
    devices = cfg.split_devices()
    if len(set(devices)) != len(devices):
        raise ValueError(
            f"--gpus {cfg.gpus}: llama.cpp's -sm layer splits over distinct cards only; compare a split over "
            "distinct cards (e.g. --gpus 0/1), or leave out the llama.cpp target"
        )
    shares = cfg.split_shares() or [1.0] * len(devices)
    args = ["-sm", "layer", "-ts", "/".join(f"{s:g}" for s in shares)]
    if on_gpu(cfg.device):
        args += ["-dev", "/".join(f"CUDA{d}" for d in devices)]
    return args


def peer_knobs(
    cfg: EngineConfig,
    n_cpu_moe: int | None = None,
    paired: bool = True,
    n_ubatch: int | None = None,
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    """What a llama.cpp row ran with: the strata knobs that have a llama.cpp counterpart (what a strata row
    and a llama.cpp row must share to be paired) and llama.cpp's own settings.

    On the GPU llama.cpp runs every layer there (``-ngl 99``) and keeps the experts of its first
    ``n_cpu_moe`` layers on the host; such a row stands for the strata rows of the same
    ``vram_budget`` (kept in its knobs when ``paired``), and the table shows their ratio. ``n_ubatch``
    and ``n_batch`` are the micro-batch and batch asked for (llama-bench's defaults: 512 and 2048), and
    ``llama_args`` the extra flags, when there are any.
    """
    k: dict[str, Any] = {"threads": _threads(cfg), "device": cfg.device, "kv": cfg.kv}
    if cfg.split == "layer":  # the split it stands for, as the strata rows name it
        k["split"] = "layer"
        if cfg.gpus is not None:
            k["gpus"] = cfg.gpus
        if cfg.tensor_split is not None:
            k["tensor_split"] = cfg.tensor_split
    if on_gpu(cfg.device):
        k["n_gpu_layers"] = 99
        k["n_cpu_moe"] = int(n_cpu_moe or 0)
        if paired:
            k["vram_budget"] = cfg.vram_budget
            if cfg.vram_budgets:
                k["vram_budgets"] = list(cfg.vram_budgets)
    k["n_ubatch"] = n_ubatch or LLAMA_DEFAULT_UBATCH
    k["n_batch"] = n_ubatch or 2048
    if extra:
        k["llama_args"] = " ".join(extra)
    return k


def llama_bench_args(
    model: str | os.PathLike[str],
    n_prompt: Sequence[int],
    n_gen: Sequence[int],
    n_depth: Sequence[int],
    repetitions: int,
    cfg: EngineConfig,
    n_cpu_moe: int | None = None,
    extra: Sequence[str] = (),
    n_ubatch: int | None = None,
) -> list[str]:
    """llama-bench's flags for the same tests strata runs under ``cfg``; ``n_cpu_moe`` only on the GPU;
    ``n_ubatch`` as ``-ub N -b N`` (None: llama-bench's defaults); ``extra`` flags (``--llama-args``) last,
    so that they win."""
    gpu = on_gpu(cfg.device)
    args = [
        "-m",
        str(model),
        "-p",
        ",".join(map(str, n_prompt)) if n_prompt else "0",
        "-n",
        ",".join(map(str, n_gen)) if n_gen else "0",
        "-r",
        str(repetitions),
        "-t",
        str(_threads(cfg)),
        # every layer on the GPU when strata runs on CUDA; none on a CPU run
        "-ngl",
        "99" if gpu else "0",
        "-o",
        "jsonl",
    ]
    if gpu and n_cpu_moe:
        # Experts on the host cross PCIe for every prompt batch; from a memory-mapped file they move at
        # ~7 GB/s, from llama.cpp's own (pinned) buffers at ~43 GB/s on the H200 host (shared/GPU.md), so
        # llama.cpp is given the load mode it is fastest with.
        args += ["-ncmoe", str(n_cpu_moe), "-lm", "none"]
    if n_ubatch is not None:
        args += ["-ub", str(n_ubatch), "-b", str(n_ubatch)]
    args += split_args(cfg)
    args += list(extra)
    if any(d > 0 for d in n_depth):
        args += ["-d", ",".join(map(str, n_depth))]
    if cfg.kv == "int8":
        args += ["-ctk", "q8_0", "-ctv", "q8_0"]
    return args


def record_from_row(
    row: dict[str, Any],
    cfg: EngineConfig,
    model: dict[str, Any],
    args: list[str],
    weights: dict[str, Any] | None = None,
    knobs: dict[str, Any] | None = None,
    nvml: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A strata-bench record from one llama-bench JSONL row."""
    try:
        n_prompt, n_gen = int(row["n_prompt"]), int(row["n_gen"])
        samples = [float(x) for x in row["samples_ts"]]
    except (KeyError, TypeError, ValueError) as e:
        raise LlamaBenchError(
            f"llama-bench printed a row without {e} (is it llama-bench's -o jsonl?): {row}"
        ) from None
    n_depth = int(row.get("n_depth", 0) or 0)
    summary = summarize(samples)
    knobs = dict(knobs if knobs is not None else peer_knobs(cfg))
    # what llama-bench says it ran with (the extra flags may have set them)
    for name in ("n_ubatch", "n_batch"):
        if row.get(name) is not None:
            knobs[name] = int(row[name])
    work = {
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "n_depth": n_depth,
        "prompt_set": "llama-bench",
        "max_context": n_prompt + n_gen + n_depth,  # llama-bench's context for each test
    }
    metrics = None
    if weights is not None and summary["mean"] > 0:
        # the same roofline figure as strata's rows; llama.cpp reads a prompt in micro-batches of n_ubatch
        chunk = min(int(row.get("n_ubatch") or 512), n_prompt) if n_prompt else 0
        moved = bytes_moved(weights, n_prompt, n_gen, n_depth, chunk, "f16" if cfg.kv == "f16" else "int8")
        seconds = (n_prompt or n_gen) / summary["mean"]
        metrics = {"bytes_moved": moved, "gbps": moved / seconds / 1e9, "chunk": chunk if n_prompt else None}
    return base_record(
        target="llama.cpp",
        test=llama_test_name(n_prompt, n_gen, n_depth),
        kind="pp" if n_gen == 0 else ("tg" if n_prompt == 0 else "pg"),
        n_prompt=n_prompt,
        n_gen=n_gen,
        n_depth=n_depth,
        unit="t/s",
        repetitions=len(samples),
        warmup=1,
        **model,
        knobs=knobs,
        work=work,
        status="ok",
        samples=samples,
        samples_ns=[int(x) for x in row.get("samples_ns", [])],
        **summary,
        metrics=metrics,
        peer={k: row[k] for k in _PEER_FIELDS if k in row} | {"args": args},
        nvml=nvml,
    )


def run_llama_bench(
    exe: str | os.PathLike[str],
    model_path: str | os.PathLike[str],
    model: dict[str, Any],
    n_prompt: Sequence[int],
    n_gen: Sequence[int],
    n_depth: Sequence[int],
    repetitions: int,
    cfg: EngineConfig,
    on_record: Callable[[dict[str, Any]], None],
    on_test: Callable[[], None] | None = None,
    weights: dict[str, Any] | None = None,
    n_cpu_moe: int | None = None,
    knobs: dict[str, Any] | None = None,
    extra: Sequence[str] = (),
    n_ubatch: int | None = None,
    peer_extra: dict[str, Any] | None = None,
) -> int:
    """Run llama-bench once for ``cfg``; each JSONL row becomes a record passed to ``on_record``. Returns the row count.

    ``peer_extra`` is added to each record's ``peer`` (e.g. what was tried before these settings fitted).

    GPU memory and utilization are sampled while it runs; each row gets the samples taken since the
    previous row (the first one's window includes loading the model).
    """
    args = llama_bench_args(
        model_path, n_prompt, n_gen, n_depth, repetitions, cfg, n_cpu_moe, extra, n_ubatch
    )
    n = 0
    with (
        tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as err,
        GpuSampler(pids=[]) as gpu,
    ):
        with subprocess.Popen(
            [str(exe), *args],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        ) as proc:
            gpu.pids.append(proc.pid)
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    line = line.strip()
                    if not line.startswith("{"):
                        continue  # llama-bench prints only JSONL here, but builds differ in stray lines
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        raise LlamaBenchError(
                            f"llama-bench printed a line that is not JSON: {line[:200]}"
                        ) from None
                    rec = record_from_row(row, cfg, model, [str(exe), *args], weights, knobs, nvml=gpu.take())
                    if peer_extra:
                        rec["peer"].update(peer_extra)
                    on_record(rec)
                    n += 1
                    if on_test:
                        on_test()
                rc = proc.wait()
            except BaseException:
                # Ctrl-C or an error while it runs: stop llama-bench too, or it would keep the CPU busy.
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                raise
        if rc != 0:
            err.seek(0)
            tail = err.read()[-2000:].strip()
            raise LlamaBenchError(f"llama-bench exited with status {rc} ({exe} {' '.join(args)}):\n{tail}")
    return n
