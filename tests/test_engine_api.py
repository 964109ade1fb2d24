"""The Python engine's contract around failures: each bad call raises the exception of its status with
a message, changes nothing, and leaves the engine usable."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from strata import (
    ContextError,
    EngineConfig,
    EngineStateError,
    InvalidArgumentError,
    StrataError,
)
from strata._engine import Engine

pytestmark = pytest.mark.asan

PROMPT = [1, 20, 30, 40, 50, 60]


def test_errors_leave_the_engine_usable(tiny: Path) -> None:
    with Engine(tiny, EngineConfig(threads=2, max_context=32)) as eng:
        with pytest.raises(EngineStateError, match="no logits"):
            eng.logits()
        eng.prefill(PROMPT)
        want = eng.logits()
        with pytest.raises(InvalidArgumentError, match="vocabulary"):
            eng.prefill([5, eng.info.n_vocab])
        with pytest.raises(InvalidArgumentError, match="vocabulary"):
            eng.decode(-1)
        with pytest.raises(ContextError, match="32"):
            eng.prefill(list(range(1, 40)))
        with pytest.raises(InvalidArgumentError, match="keep 99"):
            eng.kv_truncate(99)
        assert eng.n_past == len(PROMPT)
        assert np.array_equal(eng.logits(), want)  # nothing changed
        eng.decode(7)
        assert eng.n_past == len(PROMPT) + 1
        eng.kv_truncate(len(PROMPT))
        with pytest.raises(EngineStateError):
            eng.logits()  # the logits belonged to the dropped token
        with pytest.raises(InvalidArgumentError, match="sampling"):
            eng.generate([], max_tokens=3, top_p=0.0)
        eng.decode(7)
        assert eng.generate([], max_tokens=3).tokens  # continues from the context


def test_info_and_plan_describe_the_model(tiny: Path) -> None:
    with Engine(tiny, EngineConfig(threads=1, max_context=64)) as eng:
        i = eng.info
        assert i.arch == "qwen3moe" and i.n_layer == 4 and i.n_embd == 128 and i.n_expert == 32
        assert i.n_expert_used == 4 and i.head_dim == 32 and i.n_head_kv == 2 and i.n_vocab == 2048
        assert i.file_bytes == tiny.stat().st_size and 0 < i.resident_bytes < i.file_bytes
        assert i.expert_bytes * i.n_expert * i.n_layer + i.resident_bytes <= i.file_bytes
        assert eng.plan.max_context == 64 and eng.plan.n_threads == 1
        assert eng.layout(16).n_tokens == 16 and eng.layout(16).buffer_bytes > 0


def test_close_is_idempotent_and_final(tiny: Path) -> None:
    eng = Engine(tiny, EngineConfig(threads=1))
    eng.close()
    eng.close()
    with pytest.raises(StrataError, match="closed"):
        eng.decode(1)
    assert eng.last_error == ""


def test_bad_settings_are_refused_at_open(tiny: Path) -> None:
    with pytest.raises(ValueError, match="--threads: -3 is out of range"):  # said by the config, as a flag
        Engine(tiny, EngineConfig(threads=-3))
    with pytest.raises(ValueError, match="--simd"):
        Engine(tiny, EngineConfig(simd="neon"))


def test_a_prompt_cancelled_part_way_reports_the_tokens_it_read(tiny: Path) -> None:
    from strata import EngineConfig

    prompt = np.random.default_rng(3).integers(3, 2000, 300).tolist()
    with Engine(tiny, EngineConfig(threads=1, prefill="64", max_context=512)) as eng:
        seen: list[int] = []
        r = eng.generate(prompt, max_tokens=8, on_prompt=lambda done, total: seen.append(done) or done >= 128)
        assert r.finish_reason == "cancelled" and r.tokens == []
        assert r.prompt_tokens == 128 == seen[-1]  # two chunks of 64 were read, then the cancel
        assert eng.n_past == 0  # and forgotten
        r = eng.generate(prompt, max_tokens=4, stop_at_eos=False)
        assert r.finish_reason == "length" and r.prompt_tokens == 300
