"""The layer split (``--split layer``) on the CPU backend, whose devices are emulated budgets of the one host:
each device's plan is made within its own budget and holds only its layers, each device lends from its own
cache for the chunk all of them run, every request is served, and the replies at temperature 0 are
bit-identical to the one-device run whatever the split, the budgets and the chunk."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from strata import EngineConfig
from strata._config import add_engine_args, config_from_args
from strata._engine import Engine
from strata._exceptions import InvalidArgumentError, LendError, StrataError
from strata._memplan import predict
from strata.model import ensure_model

LENT = re.compile(r"^device (\d+): lent (\d+) slots for (\d+) tokens$")
PROMPT = [1, 17, 33, 200, 5, 9, 77, 150, 3, 64, 12, 250, 31, 8, 99, 100, 4, 45, 46, 47]


def prompt(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(3, 2000, n).tolist()


def greedy(
    path: Path, cfg: EngineConfig, tokens: list[int], n: int = 10
) -> tuple[list[int], list[np.ndarray]]:
    with Engine(path, cfg) as eng:
        eng.prefill(tokens)
        logits = [eng.logits()]
        out: list[int] = []
        for _ in range(n):
            out.append(int(np.argmax(logits[-1])))
            eng.decode(out[-1])
            logits.append(eng.logits())
        return out, logits


def assert_same(
    a: tuple[list[int], list[np.ndarray]], b: tuple[list[int], list[np.ndarray]], what: str
) -> None:
    assert a[0] == b[0], what
    for i, (x, y) in enumerate(zip(a[1], b[1], strict=True)):
        assert np.array_equal(x, y), f"{what}: logits differ at step {i}: max |d| = {np.abs(x - y).max()}"


# ---- replies ------------------------------------------------------------------------------------------


@pytest.mark.asan
def test_split_replies_are_bit_identical_to_one_device(tiny: Path) -> None:
    base = greedy(tiny, EngineConfig(threads=2), PROMPT)
    splits = {
        "gpus 0,1": EngineConfig(threads=2, split="layer", gpus="0,1"),
        "tensor-split 0.75,0.25": EngineConfig(threads=2, split="layer", tensor_split="0.75,0.25"),
        "four devices, chunk 7": EngineConfig(threads=2, split="layer", gpus="0,1,2,3", prefill="7"),
        # small caches on both devices: misses run on the host, the loan displaces experts
        "small caches": EngineConfig(threads=2, split="layer", gpus="1,0", expert_cache="48", miss="copy"),
        "one device": EngineConfig(threads=2, split="layer", gpus="0"),
    }
    for what, cfg in splits.items():
        assert_same(base, greedy(tiny, cfg, PROMPT), what)


def test_split_with_own_budgets_agrees_on_a_long_prompt(tiny: Path) -> None:
    long = prompt(700, seed=3)
    base = greedy(tiny, EngineConfig(threads=2), long, n=4)
    cfg = EngineConfig(threads=2, split="layer", gpus="0,1", vram_budgets=[24 << 20, 40 << 20])
    assert_same(base, greedy(tiny, cfg, long, n=4), "budgets 24MiB,40MiB")


# ---- plans --------------------------------------------------------------------------------------------


def test_each_device_is_planned_within_its_own_budget(tiny: Path) -> None:
    with Engine(tiny, EngineConfig(threads=1)) as one:
        whole = one.plan
        E = one.info.n_expert
    budgets = [20 << 20, 48 << 20]
    cfg = EngineConfig(threads=1, split="layer", tensor_split="3,1", vram_budgets=budgets)
    with Engine(tiny, cfg) as eng:
        devs = eng.devices()
        assert [(d.device, d.layer_begin, d.layer_end) for d in devs] == [(0, 0, 3), (1, 3, 4)]
        for d, budget in zip(devs, budgets, strict=True):
            p, layers = d.plan, d.layer_end - d.layer_begin
            assert p.budget_bytes == budget
            assert p.n_experts_total == layers * E
            assert p.kv_bytes == whole.kv_bytes * layers // 4  # its layers' KV cache only
            assert (
                p.resident_bytes + p.kv_bytes + p.scratch_bytes + p.reserve_bytes + p.n_slots * p.slot_bytes
                <= p.budget_bytes
            )
            assert p.max_lend_slots <= min(p.n_slots - p.lend_floor, p.n_slots // 2)
        # the device with the larger budget has the larger cache; the resident weights are split, not copied
        assert devs[1].plan.n_slots > devs[0].plan.n_slots
        assert sum(d.plan.resident_bytes for d in devs) == whole.resident_bytes
        # the engine's plan is the devices' together, with the chunk all of them run
        p = eng.plan
        assert p.budget_bytes == sum(budgets) and p.n_slots == sum(d.plan.n_slots for d in devs)
        assert p.auto_chunk == min(d.plan.auto_chunk for d in devs)
        # each cache holds only its own layers' experts; the residency table names them all
        res = eng.residency()
        assert (res[:3] >= 0).sum() <= devs[0].plan.n_slots and (res[3:] >= 0).sum() <= devs[1].plan.n_slots


# ---- loans and the invariant ----------------------------------------------------------------------------


def test_each_device_lends_from_its_own_cache_and_every_request_is_served(tiny: Path) -> None:
    lines: list[str] = []
    # unequal budgets: the devices' auto chunks differ and the smaller one decides
    cfg = EngineConfig(
        threads=1, split="layer", gpus="0,1", vram_budgets=[18 << 20, 64 << 20], max_context=4096
    )
    with Engine(tiny, cfg, trace=lines.append) as eng:
        devs = eng.devices()
        chunks = [d.plan.auto_chunk for d in devs]
        assert chunks[0] < chunks[1], chunks
        for n in (1, 200, 300, 1000, chunks[0] + 1, 3000):
            eng.kv_reset()
            lines.clear()
            pred = predict(eng, n)
            eng.prefill(prompt(n, seed=n))
            assert eng.n_past == n
            s = eng.stats()
            assert s.last_chunk == pred.chunk_used <= chunks[0]
            assert s.slots_lent_now == 0 and s.last_loan_slots == pred.loan_slots
            lent = [LENT.match(ln) for ln in lines if LENT.match(ln)]
            assert [(int(m[1]), int(m[2]), int(m[3])) for m in lent] == [
                (d.device, d.loan_slots, pred.chunk_used) for d in pred.devices
            ]
            for dp, dev in zip(pred.devices, eng.devices(), strict=True):
                assert dp.chunk_used == pred.chunk_used and dp.loan_slots == dev.last_loan_slots
                assert 0 < dp.loan_slots <= dp.max_lend_slots
                assert dev.slots_lent_now == 0
            assert sum(d.loan_slots for d in pred.devices) == pred.loan_slots
            assert pred.verdict in ("ok", "halved")


def test_legacy_fails_on_a_device_exactly_where_its_prediction_says(tiny: Path) -> None:
    # 4500 slots on each device: the legacy window of the tiny preset (see tests/test_memplan.py), on each
    cfg = EngineConfig(threads=1, split="layer", gpus="0,1", expert_cache="4500", lend_policy="legacy")
    with Engine(tiny, cfg) as eng:
        for n, fails in ((2000, True), (300, False)):
            pred = predict(eng, n)
            assert (pred.verdict == "lend failed") == fails, pred
            assert all((d.verdict == "lend failed") == fails for d in pred.devices)
            before = eng.residency()
            if fails:
                with pytest.raises(LendError, match="lending the prompt path its slots failed"):
                    eng.prefill(prompt(n))
                assert eng.n_past == 0 and (eng.residency() == before).all()
                assert all(d.slots_lent_now == 0 for d in eng.devices())
            else:
                eng.prefill(prompt(n))
                assert eng.n_past == n


def test_a_split_profile_covers_every_layer(tiny: Path, tmp_path: Path) -> None:
    path = tmp_path / "profile.txt"
    cfg = EngineConfig(threads=1, split="layer", gpus="0,1", expert_cache="40", adapt_every=4)
    with Engine(tiny, cfg) as eng:
        eng.prefill(PROMPT)
        for t in range(12):
            eng.decode(t + 3)
        eng.save_profile(path)
    rows = [ln.split() for ln in path.read_text().splitlines() if not ln.startswith("#")]
    assert len(rows) == 4 * 32 and {int(r[0]) for r in rows} == {0, 1, 2, 3}
    # one device loads the whole profile; a split's devices each load their own layers' lines
    with Engine(tiny, EngineConfig(threads=1, expert_cache="64", expert_profile=str(path))) as one:
        assert (one.residency() >= 0).sum() == 64
    with Engine(
        tiny, EngineConfig(threads=1, split="layer", gpus="0,1", expert_cache="20", expert_profile=str(path))
    ) as two:
        res = two.residency()
        assert (res[:2] >= 0).sum() == 20 and (res[2:] >= 0).sum() == 20


# ---- a model with dense leading layers -------------------------------------------------------------------


@pytest.mark.asan
def test_split_of_a_model_with_a_dense_leading_layer(tmp_path: Path) -> None:
    """glm4moe's layer 0 is dense (no experts): each device's cache counts the MoE layers it holds, the
    replies are bit-identical to one device, and the residency and a saved profile name model layers."""
    glm = Path(ensure_model("tiny-glm4moe", "q8_0", 0))
    base = greedy(glm, EngineConfig(threads=2), PROMPT)
    splits = {
        "gpus 0,1": EngineConfig(threads=2, split="layer", gpus="0,1"),
        "tensor-split 3,1": EngineConfig(threads=2, split="layer", tensor_split="3,1"),
        "small caches, chunk 7": EngineConfig(
            threads=2, split="layer", gpus="0,1", expert_cache="24", miss="copy", prefill="7"
        ),
    }
    for what, cfg in splits.items():
        assert_same(base, greedy(glm, cfg, PROMPT), what)
    prof = tmp_path / "glm.profile"
    with Engine(glm, EngineConfig(threads=1, split="layer", gpus="0,1", expert_cache="24")) as eng:
        eng.prefill(PROMPT)
        eng.save_profile(prof)
        res = eng.residency()
        per_dev = [d.plan.n_experts_total for d in eng.devices()]
    assert per_dev == [32, 64]  # device 0 holds layers 0-1, of which only layer 1 has experts
    assert (res[0] == -1).all() and (res[1] >= 0).sum() == 24 and (res[2:] >= 0).sum() == 24
    rows = [ln.split() for ln in prof.read_text().splitlines() if not ln.startswith("#")]
    assert len(rows) == 3 * 32 and {int(r[0]) for r in rows} == {1, 2, 3}
    with Engine(
        glm, EngineConfig(threads=1, split="layer", gpus="0,1", expert_cache="24", expert_profile=str(prof))
    ) as again:
        res2 = again.residency()
    assert (res2[0] == -1).all() and (res2[1] >= 0).sum() == 24 and (res2[2:] >= 0).sum() == 24


def test_a_device_of_only_dense_layers_is_refused() -> None:
    glm = Path(ensure_model("tiny-glm4moe", "q8_0", 0))
    with pytest.raises(
        InvalidArgumentError, match=r"device 0 would hold only layers 0-0, which are dense leading"
    ):
        Engine(glm, EngineConfig(threads=1, split="layer", gpus="0,1,2,3"))


# ---- several sequences ------------------------------------------------------------------------------------


def test_split_with_several_sequences_is_refused(tiny: Path) -> None:
    with pytest.raises(
        InvalidArgumentError, match=r"--split layer with --parallel above 1 is not supported yet"
    ):
        Engine(tiny, EngineConfig(threads=1, split="layer", gpus="0,1", parallel=2))
    # one sequence, and a one-device split, still open
    with Engine(tiny, EngineConfig(threads=1, split="layer", gpus="0,1", parallel=1)) as eng:
        assert len(eng.devices()) == 2
    with Engine(tiny, EngineConfig(threads=1, split="layer", gpus="0", parallel=2)) as eng:
        assert eng.n_seq == 2


# ---- invalid splits -------------------------------------------------------------------------------------


def test_invalid_splits_are_clear_errors(tiny: Path) -> None:
    cases = {
        "has only 4 layers": EngineConfig(split="layer", gpus="0,1,2,3,4"),
        "device 2 does not exist": EngineConfig(split="layer", gpus="0,2"),
        "gives it no layer": EngineConfig(split="layer", tensor_split="1,0"),
    }
    for message, cfg in cases.items():
        with pytest.raises(InvalidArgumentError, match=message):
            Engine(tiny, cfg)
    with pytest.raises(StrataError, match="cannot hold|budget"):
        Engine(tiny, EngineConfig(split="layer", gpus="0,1", vram_budgets=[64 << 20, 1 << 20]))


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (dict(split="layer", gpus="0,1", vram_budgets=[1 << 30] * 3), r"--gpus 2, --vram-budget 3"),
        (dict(split="layer", gpus="0,1", tensor_split="1,1,1"), r"--gpus 2, --tensor-split 3"),
        (dict(gpus="0,1"), r"add --split layer"),
        (dict(vram_budgets=[1 << 30, 1 << 30]), r"add --split layer"),
        (dict(split="layer", gpus="0,x"), r"--gpus: '0,x' is not a comma-separated list"),
        (dict(split="layer", tensor_split="0,0"), r"at least one of them above 0"),
        (dict(split="layer", gpus=",".join("0" * 9)), r"at most 8"),
        (dict(split="rows"), r"--split: 'rows' is not one of none, layer"),
        (dict(split="layer", gpus="0,1", vram_budget=1 << 30, vram_budgets=[1 << 30] * 2), r"give it once"),
    ],
)
def test_invalid_split_flags(cfg: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**cfg).validate()  # type: ignore[arg-type]


def test_split_flags_round_trip() -> None:
    import argparse

    p = argparse.ArgumentParser()
    add_engine_args(p)
    ns = p.parse_args(
        ["--split", "layer", "--gpus", "0,1", "--vram-budget", "12GiB,8GiB", "--tensor-split", "0.6,0.4"]
    )
    cfg = config_from_args(ns)
    assert (cfg.split, cfg.gpus, cfg.tensor_split) == ("layer", "0,1", "0.6,0.4")
    assert cfg.vram_budget is None and cfg.vram_budgets == [12 << 30, 8 << 30]
    args = cfg.to_cli_args()
    assert args == [
        "--split",
        "layer",
        "--gpus",
        "0,1",
        "--tensor-split",
        "0.6,0.4",
        "--vram-budget",
        "12GiB,8GiB",
    ]
    assert config_from_args(p.parse_args(args)) == cfg
    assert EngineConfig.from_dict(
        {"split": "layer", "vram_budget": "12GiB,12GiB", "gpus": [0, 0]}
    ) == EngineConfig(split="layer", gpus="0,0", vram_budgets=[12 << 30, 12 << 30])
    single = config_from_args(p.parse_args(["--vram-budget", "12GiB"]))
    assert single.vram_budget == 12 << 30 and single.vram_budgets is None


# ---- the server -----------------------------------------------------------------------------------------


def test_the_server_takes_the_split_and_replies_as_one_device_does(tiny: Path) -> None:
    import httpx
    from _strata_server import Served, run_serve

    texts = []
    for args in ((), ("--split", "layer", "--gpus", "0,1", "--vram-budget", "40MiB,40MiB")):
        srv = Served(tiny, "--threads", "1", *args)
        try:
            body = {"model": "tiny", "prompt": "the cache and the loan", "max_tokens": 12, "temperature": 0}
            r = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            texts.append(r.json()["choices"][0]["text"])
            if args:
                st = srv.status()
                cfg = st["config"]
                assert (cfg["split"], cfg["gpus"], cfg["vram_budgets"]) == ("layer", "0,1", [40 << 20] * 2)
                devs = st["devices"]
                assert [(d["device"], d["layer_begin"], d["layer_end"]) for d in devs] == [
                    (0, 0, 2),
                    (1, 2, 4),
                ]
                assert [d["plan"]["budget_bytes"] for d in devs] == [40 << 20, 40 << 20]
            else:
                assert len(srv.status()["devices"]) == 1
        finally:
            srv.stop()
    assert texts[0] == texts[1] and texts[0]
    r = run_serve("--model", str(tiny), "--split", "layer", "--gpus", "0,1,2,3,4")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "the model has only 4 layers" in r.stderr, r.stderr
