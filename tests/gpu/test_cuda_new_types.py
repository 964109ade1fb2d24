"""The CPU's newest weight types on --device cuda: IQ2_XXS, IQ2_S, IQ1_S, IQ1_M and MXFP4.

While the CUDA kernels do not run a type, opening a file that holds it fails at open with a message
naming the tensor and the type (never at the first kernel, never with garbage); once they do, the first
logits agree with the CPU's.
"""

from __future__ import annotations

import numpy as np
import pytest

from strata import Engine, EngineConfig
from strata._exceptions import StrataError

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def _need_gpu():
    from strata import _engine

    if not _engine.cuda_available():
        pytest.skip("no CUDA device")


# mix -> the new type its expert matrices get
MIXES = {"iq2_xxs": "IQ2_XXS", "iq2_m": "IQ2_S", "iq1_s": "IQ1_S", "iq1_m": "IQ1_M", "mxfp4_moe": "MXFP4"}
PROMPT = [5, 17, 101, 33, 260, 7, 400, 12]


@pytest.mark.parametrize("mix", list(MIXES))
def test_new_type_on_cuda_is_refused_at_open_or_matches_cpu(mix: str) -> None:
    from strata.model import ensure_model

    path = ensure_model("small", quant=mix, seed=0)
    with Engine(path, EngineConfig(device="cpu")) as eng:
        eng.prefill(PROMPT)
        cpu = eng.logits()
    try:
        eng = Engine(path, EngineConfig(device="cuda"))
    except StrataError as e:
        # the first matrix of a type the kernels lack is named: the new type, or another the mix puts
        # beside it (Q2_K, Q4_K, IQ3_S ... as llama.cpp does) that the GPU does not run either
        from gguf import GGUFReader

        types = {t.tensor_type.name for t in GGUFReader(str(path)).tensors}
        assert MIXES[mix] in types, types
        msg = str(e)
        named = [
            t for t in types - {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q6_K"} if f" is {t}," in msg
        ]
        assert named and "--device cpu" in msg and ".weight" in msg, msg
        return
    with eng:
        eng.prefill(PROMPT)
        gpu = eng.logits()
    err = float(((gpu.astype(np.float64) - cpu) ** 2).sum() / (cpu.astype(np.float64) ** 2).sum())
    assert err < 1e-3, f"{mix}: GPU logits' normalized MSE against the CPU's is {err:.2e}"
