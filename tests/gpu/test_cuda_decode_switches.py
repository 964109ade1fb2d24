"""The decode step's latency-tuned kernels, programmatic launches and fused launches give the bits of the
plain kernels: STRATA_CUDA_FAST, _PDL, _FUSE (and the graph) each switched off, and all of them on, against
all of them off (trace.c says each gives the same replies).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from strata import Engine, EngineConfig

pytestmark = pytest.mark.gpu

OFF = {"STRATA_CUDA_FAST": "0", "STRATA_CUDA_PDL": "0", "STRATA_CUDA_FUSE": "0"}
SWITCHES = [
    "STRATA_CUDA_FAST",
    "STRATA_CUDA_PDL",
    "STRATA_CUDA_FUSE",
    "STRATA_CUDA_GRAPH",
    "STRATA_CUDA_ATT_SPLIT",
]


@pytest.fixture(scope="module", autouse=True)
def _need_gpu():
    from strata import _engine

    if not _engine.cuda_available():
        pytest.skip("no CUDA device")


def _decode(path, env: dict[str, str], monkeypatch, prompt: list[int], n: int) -> tuple[list[int], str]:
    for k in SWITCHES:
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    h = hashlib.sha1()
    with Engine(path, EngineConfig(device="cuda")) as eng:

        def on_token(_tok, logits):
            h.update(np.asarray(logits).tobytes())

        res = eng.generate(prompt, max_tokens=n, stop_at_eos=False, on_token=on_token)
    return res.tokens, h.hexdigest()


@pytest.mark.parametrize(
    "preset,quant",
    # small/q4_k_m: the K-quant decode kernels (Q4_K and Q6_K, 2-byte and 4-byte aligned rows)
    [("tiny", "q8_0"), ("tiny", "f16"), ("small", "q4_k_m")],
)
def test_decode_switches_give_the_same_bits(preset, quant, monkeypatch):
    from strata.model import ensure_model

    path = ensure_model(preset, quant=quant, seed=0)
    prompt = [int(t) for t in np.random.default_rng(3).integers(10, 2000, size=60)]
    ref = _decode(path, OFF, monkeypatch, prompt, 24)
    # everything on (the default), and each part alone off
    cases = [{}, {"STRATA_CUDA_PDL": "0"}, {"STRATA_CUDA_FUSE": "0"}, {"STRATA_CUDA_FAST": "0"}]
    cases.append({"STRATA_CUDA_GRAPH": "0"})
    for env in cases:
        got = _decode(path, env, monkeypatch, prompt, 24)
        assert got[0] == ref[0], f"tokens differ with {env}"
        assert got[1] == ref[1], f"decode logits differ with {env}"
