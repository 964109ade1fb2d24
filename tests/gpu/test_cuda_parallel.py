"""Several sequences on the CUDA backend (tests/test_parallel.py is the CPU side).

The CUDA backend steps one sequence at a time: --parallel 1 runs strata_decode_batch as the plain decode
step (the same bits), and --parallel N > 1 is refused at open with a message that names --parallel and
says what to use instead, rather than serializing the sequences without saying so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from strata import Engine, EngineConfig, InvalidArgumentError

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def _need_gpu() -> None:
    from strata import _engine

    if not _engine.cuda_available():
        pytest.skip("no CUDA device")


@pytest.fixture(scope="module")
def model() -> Path:
    from strata.model import ensure_model

    return Path(ensure_model("tiny", quant="q8_0", seed=0))


def test_one_sequence_batch_is_the_decode_step(model: Path) -> None:
    prompt = [5, 17, 33, 200, 9, 77]
    cfg = EngineConfig(device="cuda", max_context=128)
    with Engine(model, cfg) as eng:
        eng.prefill(prompt)
        ref = [eng.logits()]
        for _ in range(8):
            eng.decode(int(np.argmax(ref[-1])))
            ref.append(eng.logits())
    with Engine(model, EngineConfig(device="cuda", max_context=128, parallel=1)) as eng:
        eng.seq_prefill(0, prompt)
        got = [eng.seq_logits(0)]
        for _ in range(8):
            eng.decode_batch([0], [int(np.argmax(got[-1]))])
            got.append(eng.seq_logits(0))
    for k, (a, b) in enumerate(zip(ref, got, strict=True)):
        assert np.array_equal(a, b), f"step {k}: logits differ by up to {np.abs(a - b).max()}"


@pytest.mark.parametrize("n_seq", [4, 8])
def test_several_sequences_are_refused_at_open(model: Path, n_seq: int) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"--parallel {n_seq}: the CUDA backend .* --device cpu"):
        Engine(model, EngineConfig(device="cuda", max_context=128, parallel=n_seq))
