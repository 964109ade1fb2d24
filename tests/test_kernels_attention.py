"""The tiled attention kernel (AVX-512, f16 KV cache; native/src/cpu/attn_avx512.c).

For each head dim it handles (32, 64, 128; a group of 2 and of 4 query heads per KV head) a small
f32 model reads a prompt that spans several 16-position tiles, then decodes. Asserted:
- the logits equal the NumPy reference (tests/reference.py, float64 with an f16 cache) within the
  f32 tolerance of tests/test_reference.py, at every step;
- they are bit-identical whether the prompt is read at once, in chunks of 7 (tiles split across
  chunks) or one token at a time, on 1 or 2 threads (a query's result depends on its position only).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from reference import Reference

from strata import EngineConfig
from strata._engine import Engine, cpu_features
from strata.model import make_model

pytestmark = [
    pytest.mark.asan,
    pytest.mark.skipif("avx512f" not in cpu_features().split(), reason="the tiled kernel needs AVX-512"),
]

PROMPT = [(7 * i + 3) % 1000 + 3 for i in range(45)]  # tiles 0, 16, 32
DECODE = 6
TOL = 1e-4  # max |engine - reference| / max |reference| for f32 weights (tests/test_reference.py)


@pytest.fixture(scope="module", params=[(32, 2), (64, 2), (128, 4)], ids=["hd32", "hd64", "hd128-g4"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    hd, group = request.param
    out = tmp_path_factory.mktemp("attn") / f"attn-{hd}.gguf"
    return make_model(
        "tiny", "f32", 0, out, check=False, n_layer=2, head_dim=hd, n_head=2 * group, n_head_kv=2
    )


def _run(path: Path, cfg: EngineConfig, feed: str) -> list[np.ndarray]:
    """Logits after the prompt and after each of DECODE greedy steps (the reference picks the tokens)."""
    out = []
    with Engine(path, cfg) as eng:
        if feed == "one":
            for t in PROMPT:
                eng.decode(t)
        else:
            eng.prefill(PROMPT)
        out.append(eng.logits())
        for i in range(DECODE):
            eng.decode(PROMPT[i])
            out.append(eng.logits())
    return out


def test_tiled_attention_matches_the_reference(model: Path) -> None:
    got = _run(model, EngineConfig(threads=2, simd="avx512"), "all")
    ref = Reference(model)
    want = [ref.forward(PROMPT)[-1]] + [ref.forward([PROMPT[i]])[-1] for i in range(DECODE)]
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        err = float(np.abs(g - w).max() / np.abs(w).max())
        assert err <= TOL, f"step {step}: max|engine - reference| / max|reference| = {err:.2e} > {TOL:.0e}"


def test_tiled_attention_is_chunking_and_thread_invariant(model: Path) -> None:
    base = _run(model, EngineConfig(threads=1, simd="avx512"), "all")
    for cfg, feed in [
        (EngineConfig(threads=2, simd="avx512"), "all"),
        (EngineConfig(threads=2, simd="avx512", prefill="7"), "all"),
        (EngineConfig(threads=2, simd="avx512"), "one"),
    ]:
        other = _run(model, cfg, feed)
        for step, (a, b) in enumerate(zip(base, other, strict=True)):
            assert np.array_equal(a, b), (
                f"{cfg.to_cli_args()} feed={feed}: logits differ at step {step}: max |d| = {np.abs(a - b).max()}"
            )
