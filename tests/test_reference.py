"""The engine's logits against the independent NumPy reference (tests/reference.py), at every SIMD level.

For each weight type the tiny model is made, a prompt of 1, 7, 64 or 300 tokens is read, then 16
tokens are decoded (the reference's greedy choice is fed to the engine, so a near-tie in the sampled
token cannot make the two diverge), once at each SIMD level this CPU runs. At every step:
max |engine - reference| <= tol * max |reference|. The reference rounds its cached keys and values
to float16, the engine's KV cache format.

Tolerance of float weights (F32, F16, BF16): the engine computes in f32, the reference in float64,
and two errors add up.

- f32 arithmetic (``ARITH``). Each output is a sum of at most ``MAX_TERMS`` products (the longest
  are the attention sums over every cached position); whatever the order of the sum and with or
  without fused multiply-adds, its error is at most (n - 1) * 2^-24 of the sum of |terms| (Higham,
  Accuracy and Stability of Numerical Algorithms, 3.1). Measured: about 2e-7 of max |logit|.
- Cached values rounded the other way (``KV_FLIPS * kv_step_cost``). Both sides round each cached
  key and value to the nearest float16, from values that differ by the f32 error (about 1e-7 of a
  row's largest value in the first layer, up to 1e-5 in the last). A value that close to a midpoint
  between two float16s is stored one float16 step (2^-11 to 2^-10 of it) from the reference's: a
  discontinuity, not an accumulated error. About one cached value in a hundred goes the other way at
  every SIMD level, different values at each level, since it follows each kernel's summation order
  (the same build gives the same bits on every CPU). What one such step can cost is a property of
  the model, computed by the reference alone (``kv_step_cost``): each value that a one-token prompt
  caches, one float16 step up and one down. There a value has attention weight 1, the most it can
  have; a later position shares the weight, and a key acts through the softmax (slope at most 1/4):
  on the tiny model the keys and values of a two-token prompt cost at most 0.9 times as much (keys
  0.4). One step costs up to about 2e-4 of max |logit|, more than a bound of f32 size: the AVX2 F16
  path once failed a bound of 1e-4 because one first-layer value of the first token (1.2583) lies
  8e-8 of itself from a midpoint and its AVX2 sum falls on the other side; with that one value
  rounded the other way the reference matches AVX2 to 2e-7 and misses scalar and AVX-512 by the
  same 1.1e-4. Most values cost far less; the bound allows ``KV_FLIPS`` costly ones in one run (with
  noise of the f32 error's size on every cached value, 300 simulated runs of the one-token prompt:
  median worst step 7e-5, largest 1.5e-4). An engine error bigger than that fails, at any level.

Quantized weights: the engine may quantize activations (8-bit blocks for integer dot products),
which moves every product by up to 2^-8 of the block's largest value; their tolerance is declared.
Near-tie rule for them: activation quantization moves router logits by about 1e-2. When the
reference's last chosen and first unchosen expert are closer than ``NEAR_TIE`` in some layer, the
engine may legitimately pick the other expert and the logits of that step differ by more; such
steps are counted, not failed, and at most ``MAX_NEAR_TIES`` of the 17 steps may use the rule.
Float weights get no such rule.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from reference import Reference

import strata._engine as engine_mod
from strata import EngineConfig
from strata.model import ensure_model, make_model
from strata.model._routing import PROMPT_TEXT
from strata.model.cli import _gguf_tokenizer

PROMPT_LENGTHS = [1, 7, 64, 300]
DECODE_STEPS = 16
FLOAT_TYPES = ("f32", "f16", "bf16")
# max |engine - reference| / max |reference| of weight types that quantize activations
QUANT_TOLERANCE = {
    "q8_0": 4e-2,  # the engine may quantize activations to 8-bit blocks for integer dot products
}
MAX_TERMS = max(PROMPT_LENGTHS) + DECODE_STEPS  # the longest sum: attention over every cached position
ARITH = (MAX_TERMS - 1) * 2.0**-24  # f32 error of one sum, any order, relative to the sum of |terms|
KV_FLIPS = 2  # costly cached values (see the docstring) rounded the other way in one run
NEAR_TIE = 0.05  # router logits
MAX_NEAR_TIES = 4


def _prompt(path: Path, n: int) -> list[int]:
    ids = _gguf_tokenizer(path).encode(PROMPT_TEXT * 4).ids
    return ids[:n]


def _levels() -> list[str]:
    """The SIMD levels this CPU runs."""
    return engine_mod.simd_levels()


def kv_step_cost(path: Path) -> float:
    """The most that one cached value stored one float16 step from the nearest costs the logits.

    Every value of every layer's V cache after a one-token prompt (attention weight 1), one float16
    step up and one down, each on its own, by the reference alone: max |logits' - logits| over
    max |logits|. (The keys of a one-token prompt do not change its logits: one position gets
    weight 1 whatever its score.)
    """
    ids = _prompt(path, 1)
    ref = Reference(path)
    base = ref.forward(ids)[-1]
    scale = float(np.abs(base).max())
    worst = 0.0
    for layer in range(ref.n_layer):
        for i in range(ref.n_head_kv * ref.head_dim):
            for step in (1, -1):
                ref.reset()
                ref.kv_steps = {(layer, "v", 0, i): step}
                worst = max(worst, float(np.abs(ref.forward(ids)[-1] - base).max()) / scale)
    return worst


@pytest.fixture(scope="module", params=[*FLOAT_TYPES, *QUANT_TOLERANCE, "f32-tied"])
def model(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, float]:
    """(weight type, file, tolerance)"""
    if request.param == "f32-tied":  # no output.weight: the head is the token embedding
        quant = "f32"
        path = make_model(
            "tiny", "f32", 0, tmp_path_factory.mktemp("tied") / "tied.gguf", tie_embeddings=True
        )
    else:
        quant = request.param
        path = ensure_model("tiny", quant, 0)
    tol = QUANT_TOLERANCE[quant] if quant in QUANT_TOLERANCE else ARITH + KV_FLIPS * kv_step_cost(path)
    return quant, path, tol


def _engine_logits(path: Path, level: str, ids: list[int], fed: list[int]) -> list[np.ndarray]:
    """The engine's logits after the prompt and after each fed token, at one SIMD level."""
    out = []
    with engine_mod.Engine(path, EngineConfig(simd=level)) as eng:
        eng.prefill(ids)
        out.append(eng.logits().copy())
        for tok in fed:
            eng.decode(tok)
            out.append(eng.logits().copy())
        assert eng.n_past == len(ids) + len(fed)
    return out


@pytest.mark.asan
@pytest.mark.parametrize("n_prompt", PROMPT_LENGTHS)
def test_engine_logits_match_the_reference(model: tuple[str, Path, float], n_prompt: int) -> None:
    quant, path, tol = model
    ids = _prompt(path, n_prompt)
    ref = Reference(path)
    wants = [ref.forward(ids)[-1]]
    fed = []
    for _ in range(DECODE_STEPS):
        fed.append(int(np.argmax(wants[-1])))
        wants.append(ref.forward([fed[-1]])[-1])
    margins = ref.margins  # per step: the closest router near-tie of the step's token
    quantized = quant not in FLOAT_TYPES
    summary = []
    for level in _levels():
        gots = _engine_logits(path, level, ids, fed)
        errors = []
        near_ties = []
        for step, (got, want) in enumerate(zip(gots, wants, strict=True)):
            assert got.shape == want.shape
            err = float(np.abs(got - want).max() / np.abs(want).max())
            errors.append(err)
            if err > tol and quantized and margins[step] < NEAR_TIE:
                near_ties.append((step, err, margins[step]))
                assert len(near_ties) <= MAX_NEAR_TIES, f"{level}: too many steps over tolerance: {near_ties}"
            else:
                assert err <= tol, (
                    f"{quant} at {level}, prompt {n_prompt}, step {step}: max|engine - reference| / "
                    f"max|reference| = {err:.2e} > {tol:.2e} (worst token {int(np.abs(got - want).argmax())}, "
                    f"closest router near-tie {margins[step]:.3f})"
                )
        summary.append(
            f"{level}: worst {max(errors):.2e}, mean {np.mean(errors):.2e}, "
            f"near-tie steps {[(s, f'{e:.2e}', f'{m:.3f}') for s, e, m in near_ties]}"
        )
    print(f"{quant} prompt {n_prompt}, tolerance {tol:.2e}: " + "; ".join(summary))
