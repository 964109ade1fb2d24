"""The memory plan against real device memory: the settings that tests/test_memplan_props.py draws on
the CPU (budgets, cache sizes, contexts, KV types, prefill modes, lend policies, prompt lengths), run on
the GPU. On the device the auto chunk's buffers are laid out at open and kept, so a smaller chunk never
needs more than they hold: every request is served under either lend policy, and the device memory the
engine really holds (its CUDA allocations, counted by the backend) stays within the planned budget.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings

from strata import EngineConfig
from strata._memplan import request_chunk
from tests.test_memplan_props import _prompt, engine_settings, open_engine

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tiny() -> Path:
    from strata import _engine
    from strata.model import ensure_model

    if not _engine.cuda_available():
        pytest.skip("no CUDA device")
    return Path(ensure_model("tiny"))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(engine_settings())
def test_every_request_is_served_within_the_device_budget(
    tiny: Path, setting: tuple[dict[str, object], list[int]]
) -> None:
    cfg, lengths = setting
    eng = open_engine(tiny, EngineConfig(device="cuda", **cfg))  # type: ignore[arg-type]
    if eng is None:
        return
    with eng:
        p = eng.plan
        assert p.device == 1  # planned for the CUDA device
        for i, n in enumerate(lengths):
            eng.kv_reset()
            eng.prefill(_prompt(n, i))  # served, whatever the lend policy
            st = eng.stats()
            assert eng.n_past == n
            assert st.last_chunk == request_chunk(p.auto_chunk, n)
            assert st.slots_lent_now == 0
            # what the engine really allocated on the device fits the budget it planned for
            assert 0 < st.device_peak_bytes <= p.budget_bytes, (st.device_peak_bytes, p.budget_bytes)
            assert st.device_bytes <= st.device_peak_bytes
        eng.decode(7)
        assert eng.n_past == lengths[-1] + 1
        assert eng.stats().device_peak_bytes <= p.budget_bytes
        event(f"served ({p.lend_policy and 'legacy' or 'current'})")
