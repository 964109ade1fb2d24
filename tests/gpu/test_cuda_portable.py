"""The portable CUDA path gives the bits of the card's own path (native/src/cuda/arch.cuh).

Two switches run, on a newer card, the code a card without its features takes:
- STRATA_CUDA_PORTABLE=1: plain copies instead of cp.async, four mma m8n8k16 per integer m16n8k32,
  one flash-attention stage, no programmatic launches (the machine code of the card, its fallbacks);
- CUDA_FORCE_PTX_JIT=1 (the driver's): the library's compute_75 PTX compiled by the driver, i.e. the
  code an sm_75 card runs, with every sm_80 and sm_90 feature compiled out.
Each run is a process of its own (the driver reads CUDA_FORCE_PTX_JIT when it starts). A prompt's logits
and a greedy reply's tokens and logits must equal the default run's bit for bit. Under the PTX both
runs take STRATA_CUDA_FLASH=0: sm_75's flash attention adds its f16 products with two m16n8k8 instead of
one m16n8k16, and how a tensor core rounds those sums is the hardware's (arch.cuh, cu_mma_f16), so there
the test asks for logits close to the default's instead. The kernel tests (products against their host
mirrors bit for bit, attention, flash attention) run again under each switch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
PORTABLE = {"STRATA_CUDA_PORTABLE": "1"}
# the driver keeps what it compiled in its cache (1 GiB here: every kernel of the library), so that only
# the first process under the switch waits for the compilation
PTX = {"CUDA_FORCE_PTX_JIT": "1", "CUDA_CACHE_MAXSIZE": str(1 << 30)}


@pytest.fixture(scope="module", autouse=True)
def _need_gpu():
    from strata import _engine

    if not _engine.cuda_available():
        pytest.skip("no CUDA device")


def _env(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment without the CUDA switches, plus extra and the repository on the path."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("STRATA_CUDA_") and k != "CUDA_FORCE_PTX_JIT"
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def _run(model: Path, extra: dict[str, str], tmp_path: Path, tag: str, kv: str = "f16") -> dict:
    out = tmp_path / f"{tag}.npz"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.gpu._portable_run", str(model), str(out), kv],
        cwd=ROOT,
        env=_env(extra),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"the run with {extra} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    with np.load(out) as z:
        res["prompt_logits"] = z["prompt_logits"]
        res["decode_logits"] = z["decode_logits"]
    return res


def _same(got: dict, ref: dict, what: str) -> None:
    assert got["prompt_logits"].tobytes() == ref["prompt_logits"].tobytes(), (
        f"{what}: prompt logits differ from the default run's (max |diff| "
        f"{np.abs(got['prompt_logits'] - ref['prompt_logits']).max():.3e})"
    )
    assert got["tokens"] == ref["tokens"], f"{what}: reply {got['tokens']} != {ref['tokens']}"
    assert got["decode_logits"].tobytes() == ref["decode_logits"].tobytes(), (
        f"{what}: decode logits differ from the default run's"
    )


def _model(preset: str, quant: str) -> Path:
    from strata.model import ensure_model

    return Path(ensure_model(preset, quant=quant, seed=0))


# tiny/q8_0: Q8_0 prompt products, flash attention at head dim 32; small/q4_k_m: Q4_K and Q6_K, head dim 64
MODELS = [("tiny", "q8_0"), ("small", "q4_k_m")]


@pytest.mark.parametrize(
    "preset,quant,kv",
    [(p, q, "f16") for p, q in MODELS] + [("tiny", "q8_0", "int8"), ("small", "q4_k_m", "int8")],
)
def test_portable_switch_gives_the_default_bits(preset, quant, kv, tmp_path):
    """int8 KV too: its flash attention stages the raw rows (4-byte copies at tiny's kv_dim, 16-byte at
    small's) and converts them, in one stage and with plain copies under the switch."""
    model = _model(preset, quant)
    ref = _run(model, {}, tmp_path, "default", kv)
    got = _run(model, PORTABLE, tmp_path, "portable", kv)
    assert "runs code built for" in ref["code_path"], "the engine's trace does not name its code path"
    path = got["code_path"]
    for words in ("portable path", "plain copies", "m8n8k16", "programmatic launches off"):
        assert words in path, f"STRATA_CUDA_PORTABLE=1: {words!r} not in the code path {path!r}"
    _same(got, ref, f"STRATA_CUDA_PORTABLE=1, {kv} KV")


@pytest.mark.parametrize("preset,quant", MODELS)
def test_ptx_gives_the_default_bits(preset, quant, tmp_path):
    model = _model(preset, quant)
    flash_off = {"STRATA_CUDA_FLASH": "0"}
    ref = _run(model, flash_off, tmp_path, "default")
    got = _run(model, {**PTX, **flash_off}, tmp_path, "ptx")
    assert "runs code built for sm_75" in got["code_path"], (
        f"CUDA_FORCE_PTX_JIT=1 did not run the compute_75 PTX: {got['code_path']!r} (is the library built with "
        "the default architectures?)"
    )
    assert "programmatic launches off" in got["code_path"], got["code_path"]
    _same(got, ref, "CUDA_FORCE_PTX_JIT=1")


def test_ptx_flash_attention_is_close_to_the_default(tmp_path):
    """sm_75's flash attention (two m16n8k8 per m16n8k16) in the engine. The bound is the one
    test_cuda_flash.py holds between flash attention and the decode kernel on this model, a different
    float expression altogether; the two MMA forms differ only in the tensor core's rounding of sums."""
    model = _model("small", "q8_0")
    ref = _run(model, {}, tmp_path, "default")
    got = _run(model, PTX, tmp_path, "ptx")
    assert "runs code built for sm_75" in got["code_path"], got["code_path"]
    a, b = got["prompt_logits"], ref["prompt_logits"]
    nmse = float(np.mean((a - b) ** 2) / np.mean(b**2))
    assert nmse < 1e-3, f"prompt logits nMSE {nmse:.3e} between the compute_75 PTX and the default code"


@pytest.mark.parametrize("switch", [PORTABLE, PTX], ids=["portable", "ptx"])
def test_kernel_tests_pass_on_the_portable_code(switch):
    """The kernel tests under each switch: the products equal their host mirrors (which do not depend on
    the card) bit for bit, so the fallbacks give the default code's bits kernel by kernel."""
    files = ["tests/gpu/test_cuda_kernels.py", "tests/gpu/test_cuda_mmq.py", "tests/gpu/test_cuda_flash.py"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "-m",
            "gpu",
            *files,
        ],
        cwd=ROOT,
        env=_env(switch),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, (
        f"kernel tests with {switch} failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
    )
    assert " passed" in proc.stdout, f"the kernel tests with {switch} ran nothing:\n{proc.stdout[-2000:]}"
