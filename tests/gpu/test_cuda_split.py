"""The layer split on CUDA: two plans in one process on one card (``--gpus 0,0``), and on two cards
(``--gpus 0,1``, skipped with one): each device holds its own layers, its own expert cache and its own loan,
and the replies at temperature 0 are bit-identical to the one-device run on the same backend."""

from __future__ import annotations

import numpy as np
import pytest

from strata import Engine, EngineConfig
from strata._exceptions import InvalidArgumentError
from strata._memplan import predict

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def _need_gpu():
    from strata import _engine

    if not _engine.cuda_available():
        pytest.skip("no CUDA device")


def _model(preset: str = "tiny", quant: str = "q8_0"):
    from strata.model import ensure_model

    return ensure_model(preset, quant=quant, seed=0)


def _cards() -> int:
    from strata import _nvml

    return _nvml.device_count()


def _prompt(n: int, vocab: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(10, vocab - 10, size=n)]


def _run(path, cfg: EngineConfig, prompt: list[int], n_gen: int):
    with Engine(path, cfg) as eng:
        eng.prefill(prompt)
        first = eng.logits()
        eng.kv_reset()
        res = eng.generate(prompt, max_tokens=n_gen, top_logits=2, stop_at_eos=False)
        devices = eng.devices()
        return res.tokens, first.tobytes(), [[v for _, v in s] for s in res.top], devices, eng.stats()


def _check_split(path, gpus: str) -> None:
    with Engine(path, EngineConfig(device="cpu")) as eng:
        vocab, n_experts = eng.info.n_vocab, eng.info.n_layer * eng.info.n_expert
    prompt = _prompt(301, vocab, seed=3)
    ref = _run(path, EngineConfig(device="cuda"), prompt, 24)
    for extra in (
        {},
        {"prefill": "16"},
        # small caches on each device: misses, loans that displace experts, refills
        {"expert_cache": str(n_experts * 3 // 8), "miss": "copy"},
        {"expert_cache": str(n_experts * 3 // 8), "miss": "host"},
        {"tensor_split": "3,1"},
    ):
        cfg = EngineConfig(device="cuda", split="layer", gpus=gpus, **extra)  # type: ignore[arg-type]
        tok, first, top, devices, stats = _run(path, cfg, prompt, 24)
        what = " ".join(cfg.to_cli_args())
        assert tok == ref[0], f"tokens differ with {what}"
        assert first == ref[1], f"prompt logits differ with {what}"
        assert top == ref[2], f"decode logits differ with {what}"
        assert [d.device for d in devices] == [int(g) for g in gpus.split(",")]
        assert devices[0].layer_begin == 0 and devices[-1].layer_end == 4
        assert all(d.device_bytes > 0 and d.plan.n_slots > 0 and d.lookups > 0 for d in devices), devices
        assert stats.slots_lent_now == 0 and stats.lookups == sum(d.lookups for d in devices)


def test_split_over_two_plans_on_one_card_is_bit_identical():
    _check_split(_model(), "0,0")


def test_split_over_two_cards_is_bit_identical():
    if _cards() < 2:
        pytest.skip("one CUDA device: the two-card split needs a machine with two GPUs")
    _check_split(_model(), "0,1")


def test_split_budgets_and_loans_on_one_card():
    path = _model()
    budgets = [40 << 20, 64 << 20]
    cfg = EngineConfig(device="cuda", split="layer", gpus="0,0", vram_budgets=budgets)
    with Engine(path, cfg) as eng:
        devices = eng.devices()
        assert [d.plan.budget_bytes for d in devices] == budgets
        for d in devices:
            assert d.device_bytes <= d.plan.budget_bytes, d
        pred = predict(eng, 700)
        eng.prefill(_prompt(700, eng.info.n_vocab, seed=4))
        assert eng.stats().last_chunk == pred.chunk_used
        assert [d.last_loan_slots for d in eng.devices()] == [p.loan_slots for p in pred.devices]


def test_split_on_a_card_that_does_not_exist_is_a_clear_error():
    with pytest.raises(InvalidArgumentError, match=r"CUDA device 7 does not exist"):
        Engine(_model(), EngineConfig(device="cuda", split="layer", gpus="0,7"))
