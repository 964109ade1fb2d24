"""Sampling: greedy, temperature, top-k, top-p, min-p and seeds (strata_sampler), and how generate
stops (EOS, stop tokens, max tokens, a callback, a cancelled prompt)."""

from __future__ import annotations

import ctypes
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from _gguf_helper import TinyConfig, write_qwen3moe

from strata import EngineConfig
from strata import _cdefs as C
from strata._engine import Engine

pytestmark = pytest.mark.asan


class Sampler:
    def __init__(
        self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, seed: int = 0
    ):
        s = C.StrataSampling(temperature, top_k, top_p, min_p, seed)
        h = ctypes.c_void_p()
        self.status = C.strata_sampler_init(ctypes.byref(s), ctypes.byref(h))
        self.h = h.value

    def __call__(self, logits: np.ndarray) -> int:
        x = np.ascontiguousarray(logits, dtype=np.float32)
        return int(C.strata_sampler_sample(self.h, x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), x.size))

    def close(self) -> None:
        C.strata_sampler_free(self.h)


def draws(n: int, logits: np.ndarray, **kw: float) -> Counter[int]:
    s = Sampler(**kw)  # type: ignore[arg-type]
    try:
        return Counter(s(logits) for _ in range(n))
    finally:
        s.close()


LOGITS = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float64)).astype(np.float32)


def test_greedy_picks_argmax_and_lowest_id_on_ties() -> None:
    s = Sampler()
    assert s(np.array([0.1, 3.0, -1.0, 3.0], dtype=np.float32)) == 1
    assert s(np.array([5.0], dtype=np.float32)) == 0
    s.close()


def test_temperature_follows_softmax() -> None:
    n = 20000
    c = draws(n, LOGITS, temperature=1.0, seed=7)
    freq = np.array([c[i] / n for i in range(4)])
    # 4.5 standard deviations of a binomial proportion: fails only on a real bias
    sd = np.sqrt(np.array([0.5, 0.3, 0.15, 0.05]) * (1 - np.array([0.5, 0.3, 0.15, 0.05])) / n)
    assert np.all(np.abs(freq - [0.5, 0.3, 0.15, 0.05]) < 4.5 * sd), freq


def test_high_temperature_flattens() -> None:
    c = draws(20000, LOGITS, temperature=100.0, seed=3)
    assert min(c[i] for i in range(4)) > 4000  # nearly uniform: each near 5000


def test_top_k_keeps_only_k() -> None:
    c = draws(3000, LOGITS, temperature=1.0, top_k=2, seed=1)
    assert set(c) == {0, 1}


def test_top_k_on_a_large_vocabulary() -> None:
    logits = np.random.default_rng(4).standard_normal(5000).astype(np.float32)
    best = set(np.argsort(-logits, kind="stable")[:10].tolist())
    c = draws(4000, logits, temperature=2.0, top_k=10, seed=9)
    assert set(c) <= best and len(c) >= 8  # flat at T=2: nearly all ten appear


def test_nan_and_inf_logits_do_not_break_sampling() -> None:
    logits = np.array([np.nan, 1.0, -np.inf, 2.0, np.nan], dtype=np.float32)
    assert set(draws(500, logits, temperature=1.0, seed=2)) <= {1, 3}
    assert set(draws(50, np.full(4, -np.inf, np.float32), temperature=1.0, seed=2)) <= {0, 1, 2, 3}


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    assert set(draws(3000, LOGITS, temperature=1.0, top_p=0.7, seed=1)) == {0, 1}  # 0.5 + 0.3 >= 0.7
    assert set(draws(3000, LOGITS, temperature=1.0, top_p=0.5, seed=1)) == {0}
    assert set(draws(5000, LOGITS, temperature=1.0, top_p=0.9, seed=1)) == {0, 1, 2}


def test_min_p_drops_unlikely_tokens() -> None:
    assert set(draws(3000, LOGITS, temperature=1.0, min_p=0.5, seed=1)) == {0, 1}  # 0.3 >= 0.25
    assert set(draws(3000, LOGITS, temperature=1.0, min_p=0.2, seed=1)) == {0, 1, 2}  # 0.15 >= 0.1


def test_seed_reproduces_and_differs() -> None:
    logits = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    a = [Sampler(temperature=1.0, seed=42) for _ in range(2)]
    seq1 = [a[0](logits) for _ in range(50)]
    seq2 = [a[1](logits) for _ in range(50)]
    b = Sampler(temperature=1.0, seed=43)
    seq3 = [b(logits) for _ in range(50)]
    assert seq1 == seq2
    assert seq1 != seq3
    for s in (*a, b):
        s.close()


@pytest.mark.parametrize(
    "kw", [{"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"min_p": -0.1}, {"top_k": -2}]
)
def test_bad_settings_are_rejected(kw: dict[str, float]) -> None:
    s = Sampler(**kw)  # type: ignore[arg-type]
    assert s.status == 1 and not s.h


# ---- generate -----------------------------------------------------------------------------------

PROMPT = [1, 40, 41, 42, 43, 100, 7]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_qwen3moe(tmp_path_factory.mktemp("smp") / "m.gguf", TinyConfig())


@pytest.fixture(scope="module")
def greedy(model: Path) -> list[int]:
    with Engine(model, EngineConfig(threads=1)) as eng:
        return eng.generate(PROMPT, max_tokens=24, stop_at_eos=False).tokens


def test_stop_token_ends_before_it(model: Path, greedy: list[int]) -> None:
    stop = greedy[5]
    with Engine(model, EngineConfig(threads=1)) as eng:
        res = eng.generate(PROMPT, max_tokens=24, stop_tokens=[stop], stop_at_eos=False)
    assert res.tokens == greedy[: greedy.index(stop)]
    assert res.finish_reason == "stop"


def test_eos_from_metadata_stops(tmp_path: Path, greedy: list[int]) -> None:
    eos = greedy[4]
    path = write_qwen3moe(tmp_path / "eos.gguf", TinyConfig(eos_id=eos))
    with Engine(path, EngineConfig(threads=1)) as eng:
        assert eng.info.eos_id == eos
        res = eng.generate(PROMPT, max_tokens=24)
        assert res.tokens == greedy[: greedy.index(eos)] and res.finish_reason == "stop"
        eng.kv_reset()
        res = eng.generate(PROMPT, max_tokens=24, stop_at_eos=False)
        assert res.tokens == greedy and res.finish_reason == "length"


def test_max_tokens_and_callback_stop(model: Path, greedy: list[int]) -> None:
    with Engine(model, EngineConfig(threads=1)) as eng:
        res = eng.generate(PROMPT, max_tokens=3, stop_at_eos=False, top_logits=5)
        assert res.tokens == greedy[:3] and res.finish_reason == "length"
        assert len(res.top) == 3 and all(len(t) == 5 for t in res.top)
        assert [t[0][0] for t in res.top] == res.tokens  # greedy: the best logit is the token taken
        assert all(t[i][1] >= t[i + 1][1] for t in res.top for i in range(4))
        eng.kv_reset()
        seen: list[int] = []
        res = eng.generate(
            PROMPT, max_tokens=24, stop_at_eos=False, on_token=lambda t, _l: seen.append(t) or len(seen) == 4
        )
        assert res.tokens == greedy[:4] == seen and res.finish_reason == "stop"


def test_prompt_cancel_rolls_back(model: Path) -> None:
    with Engine(model, EngineConfig(threads=1, prefill="2")) as eng:
        calls: list[tuple[int, int]] = []
        res = eng.generate(PROMPT, max_tokens=5, on_prompt=lambda d, t: calls.append((d, t)) or d >= 4)
        assert res.finish_reason == "cancelled" and res.tokens == []
        # after each chunk of 2, and between the layers of a chunk with the tokens done so far
        assert list(dict.fromkeys(calls)) == [(0, 7), (2, 7), (4, 7)] and calls[-1] == (4, 7)
        assert eng.n_past == 0


def test_a_cancel_is_seen_inside_a_chunk(model: Path) -> None:
    # the whole prompt in one chunk: the first question comes after its first layer, and a yes stops it there
    with Engine(model, EngineConfig(threads=1, prefill="8")) as eng:
        calls: list[tuple[int, int]] = []
        res = eng.generate(PROMPT, max_tokens=5, on_prompt=lambda d, t: calls.append((d, t)) or True)
        assert res.finish_reason == "cancelled" and res.tokens == []
        assert calls == [(0, 7)]
        assert eng.n_past == 0
        assert eng.generate(PROMPT, max_tokens=2).finish_reason in ("stop", "length")  # and it still works


def test_sampled_generate_is_reproducible(model: Path) -> None:
    with Engine(model, EngineConfig(threads=2)) as eng:
        a = eng.generate(
            PROMPT, max_tokens=16, temperature=0.9, top_p=0.95, seed=11, stop_at_eos=False
        ).tokens
        eng.kv_reset()
        b = eng.generate(
            PROMPT, max_tokens=16, temperature=0.9, top_p=0.95, seed=11, stop_at_eos=False
        ).tokens
    assert a == b and len(a) == 16


def test_a_full_context_ends_generation(model: Path, greedy: list[int]) -> None:
    with Engine(model, EngineConfig(threads=1, max_context=16)) as eng:
        assert eng.plan.max_context == 16
        res = eng.generate(PROMPT, max_tokens=50, stop_at_eos=False)
        # 7 prompt tokens + 9 decoded fill 16 positions; the 10th generated token needs no position
        assert res.tokens == greedy[:10] and res.finish_reason == "length"
        assert eng.n_past == 16
        eng.kv_reset()
        out = (ctypes.c_int32 * 50)()
        n_out = ctypes.c_int32()
        gp = C.strata_default_generate_params()
        gp.max_tokens, gp.stop_at_eos = 50, 0
        prompt = (ctypes.c_int32 * len(PROMPT))(*PROMPT)
        st = C.strata_generate(
            eng.handle,
            prompt,
            len(PROMPT),
            ctypes.byref(gp),
            C.TOKEN_FN(),
            None,
            out,
            50,
            ctypes.byref(n_out),
        )
        assert st == 0 and n_out.value == 10 and list(out[:10]) == greedy[:10]
