"""The families on the GPU: qwen3moe runs there; every family whose blocks the CUDA kernels do not have
yet (shared experts, biases, full-projection q/k norms, the llama rotary layout, granite's multipliers,
rope scaling, multi-head latent attention) is refused at open with a message naming the missing block, never run without it.
"""

from __future__ import annotations

import pytest

from strata import Engine, EngineConfig, UnsupportedModelError
from strata.model import ensure_model

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def _need_gpu():
    from strata import _engine

    if not _engine.cuda_available():
        pytest.skip("no CUDA device")


@pytest.mark.parametrize(
    ("preset", "missing"),
    [
        ("tiny-qwen2moe", "attention without q/k norms"),
        ("tiny-mixtral", "attention without q/k norms"),
        ("tiny-olmoe", "q/k norms over the whole projection"),
        ("tiny-granitemoe", "attention without q/k norms"),
        ("tiny-glm4moe", "dense leading layers"),
        ("tiny-deepseek2", "multi-head latent attention (MLA)"),
    ],
)
def test_cuda_refuses_a_family_it_lacks_blocks_for(preset: str, missing: str) -> None:
    path = ensure_model(preset, "q8_0", 0)
    with pytest.raises(UnsupportedModelError) as exc:
        Engine(path, EngineConfig(device="cuda"))
    msg = str(exc.value)
    assert "--device cuda" in msg and missing in msg and "use --device cpu" in msg, msg
    # the CPU runs the same file
    with Engine(path, EngineConfig(device="cpu")) as eng:
        eng.prefill([10, 11, 12])
        assert eng.logits().shape[0] > 0


def test_cuda_still_runs_qwen3moe() -> None:
    with Engine(ensure_model("tiny", "q8_0", 0), EngineConfig(device="cuda")) as eng:
        eng.prefill([10, 11, 12])
        assert eng.logits().shape[0] > 0
