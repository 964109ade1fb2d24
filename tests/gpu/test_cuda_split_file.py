"""A split model on the GPU: the same logits, bit for bit, as the unsplit file, with the expert store
copied into pinned memory (the default), registered from the parts' mappings, or streamed through the ring.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from strata import Engine, EngineConfig
from strata.model import ensure_model
from strata.model._split import split_model

pytestmark = pytest.mark.gpu

PROMPT = [int(t) for t in np.random.default_rng(5).integers(10, 2000, size=150)]


@pytest.fixture(scope="module", autouse=True)
def _need_gpu() -> None:
    from strata import _engine

    if not _engine.cuda_available():
        pytest.skip("no CUDA device")


def _steps(path: Path, cfg: EngineConfig, n: int = 16) -> tuple[list[int], list[np.ndarray], int]:
    toks, logits = [], []
    with Engine(path, cfg) as eng:
        eng.prefill(PROMPT)
        for _ in range(n):
            lg = eng.logits().copy()
            logits.append(lg)
            toks.append(int(lg.argmax()))
            eng.decode(toks[-1])
        return toks, logits, eng.stats().misses


@pytest.mark.parametrize("store", ["pinned", "register", "ring"])
@pytest.mark.parametrize("cache", ["auto", "three-quarters"])
def test_cuda_split_model_matches_the_unsplit_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str, cache: str
) -> None:
    unsplit = Path(ensure_model("small", "q8_0", 0))
    parts = split_model(unsplit, tmp_path / "small.gguf", max_size=24 << 20)
    assert len(parts) >= 5
    if cache != "auto":  # the smallest cache test_cuda_engine's sweep opens on this model
        with Engine(unsplit, EngineConfig(device="cpu")) as eng:
            cache = str(eng.info.n_layer * eng.info.n_expert * 3 // 4)
    if store != "pinned":
        monkeypatch.setenv("STRATA_CUDA_STORE", store)
    cfg = EngineConfig(device="cuda", expert_cache=cache)
    want_toks, want, _ = _steps(unsplit, cfg)
    got_toks, got, misses = _steps(parts[0], cfg)
    assert got_toks == want_toks
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"logits differ at step {i}"
    if cache != "auto":
        assert misses > 0  # the experts really came from the parts
