"""The engine's logits against the independent NumPy reference (tests/reference.py).

For each weight type the tiny model is made, a prompt of 1, 7, 64 or 300 tokens is read, then 16
tokens are decoded (the reference's greedy choice is fed to both, so a near-tie in the sampled token
cannot make the two diverge). At every step: max |engine - reference| <= tol * max |reference|, tol
declared per type. The reference rounds its cached keys and values to float16, the engine's KV cache
format.

Near-tie rule for quantized weights: the engine may quantize activations (8-bit blocks for integer
dot products), which moves router logits by about 1e-2. When the reference's last chosen and first
unchosen expert are closer than ``NEAR_TIE`` in some layer, the engine may legitimately pick the
other expert and the logits of that step differ by more; such steps are counted, not failed, and at
most ``MAX_NEAR_TIES`` of the 17 steps may use the rule. Float weights get no such rule.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from reference import Reference

from strata.model import ensure_model, make_model
from strata.model._routing import PROMPT_TEXT
from strata.model.cli import _gguf_tokenizer

# max |engine - reference| / max |reference|, per weight type of the file
TOLERANCE = {
    "f32": 1e-4,
    "f16": 1e-4,
    "bf16": 1e-4,
    "q8_0": 4e-2,  # the engine may quantize activations to 8-bit blocks for integer dot products
}
NEAR_TIE = 0.05  # router logits
MAX_NEAR_TIES = 4
PROMPT_LENGTHS = [1, 7, 64, 300]
DECODE_STEPS = 16

engine_mod = pytest.importorskip("strata._engine", reason="the engine binding is not built")


def _prompt(path: Path, n: int) -> list[int]:
    ids = _gguf_tokenizer(path).encode(PROMPT_TEXT * 4).ids
    return ids[:n]


@pytest.fixture(scope="module", params=[*TOLERANCE, "f32-tied"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    if request.param == "f32-tied":  # no output.weight: the head is the token embedding
        path = make_model(
            "tiny", "f32", 0, tmp_path_factory.mktemp("tied") / "tied.gguf", tie_embeddings=True
        )
        return "f32", path
    return request.param, ensure_model("tiny", request.param, 0)


@pytest.mark.asan
@pytest.mark.parametrize("n_prompt", PROMPT_LENGTHS)
def test_engine_logits_match_the_reference(model: tuple[str, Path], n_prompt: int) -> None:
    quant, path = model
    tol = TOLERANCE[quant]
    ids = _prompt(path, n_prompt)
    ref = Reference(path)
    errors = []
    near_ties = []
    with engine_mod.Engine(path) as eng:
        want = ref.forward(ids)[-1]
        eng.prefill(ids)
        for step in range(DECODE_STEPS + 1):
            got = eng.logits()
            assert got.shape == want.shape
            err = float(np.abs(got - want).max() / np.abs(want).max())
            errors.append(err)
            quantized = quant not in ("f32", "f16", "bf16")
            if err > tol and quantized and ref.margins[-1] < NEAR_TIE:
                near_ties.append((step, err, ref.margins[-1]))
                assert len(near_ties) <= MAX_NEAR_TIES, f"too many steps over tolerance: {near_ties}"
            else:
                assert err <= tol, (
                    f"{quant}, prompt {n_prompt}, step {step}: max|engine - reference| / max|reference| = "
                    f"{err:.2e} > {tol:.0e} (worst token {int(np.abs(got - want).argmax())}, "
                    f"closest router near-tie {ref.margins[-1]:.3f})"
                )
            if step == DECODE_STEPS:
                break
            nxt = int(np.argmax(want))
            eng.decode(nxt)
            want = ref.forward([nxt])[-1]
        assert eng.n_past == n_prompt + DECODE_STEPS
    print(
        f"{quant} prompt {n_prompt}: worst {max(errors):.2e}, mean {np.mean(errors):.2e}, "
        f"near-tie steps {[(s, f'{e:.2e}', f'{m:.3f}') for s, e, m in near_ties]}"
    )
