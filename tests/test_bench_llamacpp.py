"""The llama.cpp target: llama-bench's JSONL read into records (a stand-in that prints its real format,
and the real llama-bench when one is on PATH), a run interrupted with SIGINT, a missing binary."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from strata_bench.cli import main

FAKE = Path(__file__).parent / "bench_support" / "fake_llama_bench.py"


def _sigint_default() -> None:
    """In the child before exec: SIGINT back to its default. A runner that starts the tests in the background
    of a non-interactive shell has SIGINT ignored, the child would inherit that, and Python installs no
    KeyboardInterrupt handler where SIGINT is ignored at start."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def bench(cmd: str) -> int:
    return main(cmd.split())


@pytest.fixture
def fake_bin(tmp_path, monkeypatch) -> Path:
    """A folder on PATH holding an executable `llama-bench` that is the stand-in."""
    d = tmp_path / "bin"
    d.mkdir()
    exe = d / "llama-bench"
    exe.write_text(f"#!{sys.executable}\n" + FAKE.read_text())
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
    return d


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rows_from_llama_bench_jsonl(fake_bin, tiny, tmp_path, capsys) -> None:
    out = tmp_path / "r.jsonl"
    rc = bench(
        f"run --target llama.cpp --model {tiny} -p 64,128 -n 16 -d 0,256 -r 5 --threads 2 "
        f"--output {out} --format md"
    )
    assert rc == 0
    rows = _rows(out)
    # llama-bench's order: for each depth, the prompt tests and then the generation tests
    assert [r["test"] for r in rows] == [
        "pp64",
        "pp128",
        "tg16",
        "pp64 @ d256",
        "pp128 @ d256",
        "tg16 @ d256",
    ]
    for r in rows:
        assert r["target"] == "llama.cpp" and r["unit"] == "t/s"
        assert len(r["samples"]) == 5 and r["repetitions"] == 5
        assert r["mean"] == pytest.approx(sum(r["samples"]) / 5)
        assert r["peer"]["avg_ts"] == pytest.approx(r["mean"])  # our summary agrees with llama-bench's own
        assert r["peer"]["n_threads"] == 2 and r["peer"]["n_gpu_layers"] == 0  # the flags were passed through
        # prompts of at most 512 tokens: llama.cpp's default micro-batch is its best, one run only
        assert r["knobs"] == {"threads": 2, "device": "cpu", "kv": "f16", "n_ubatch": 512, "n_batch": 2048}
        assert r["work"] == {"n_prompt": r["n_prompt"], "n_gen": r["n_gen"], "n_depth": r["n_depth"],
                             "prompt_set": "llama-bench", "max_context": r["n_prompt"] + r["n_gen"] + r["n_depth"]}  # fmt: skip
        assert r["model"] == tiny.name and r["quant"]
    # the stand-in's speeds: 900 t/s for prompts and 40 for generation, divided by 1 + depth/4096
    by = {r["test"]: r["mean"] for r in rows}
    assert by["pp64"] == pytest.approx(900, rel=0.02)
    assert by["tg16 @ d256"] == pytest.approx(40 / (1 + 256 / 4096), rel=0.02)
    md = capsys.readouterr().out
    assert "| llama.cpp" in md and "pp128 @ d256" in md


def test_one_llama_bench_run_per_shared_knob_set(fake_bin, tiny, tmp_path) -> None:
    out = tmp_path / "r.jsonl"
    # --expert-cache means nothing to llama.cpp: two strata configs, one llama-bench run; --threads 1,2: two runs
    rc = bench(
        f"run --target llama.cpp --model {tiny} -p 32 -n 0 -r 5 --expert-cache 4,8 --threads 1,2 "
        f"--output {out} --format csv"
    )
    assert rc == 0
    assert sorted(r["knobs"]["threads"] for r in _rows(out)) == [1, 2]


def test_missing_llama_bench_is_a_clear_error(tiny, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert bench(f"run --target llama.cpp --model {tiny} --output {tmp_path / 'r.jsonl'}") == 1
    err = capsys.readouterr().err
    assert "none is on PATH" in err and "--llama-bench PATH" in err
    cmd = f"run --target llama.cpp --llama-bench {tmp_path / 'nope'} --model {tiny} --output {tmp_path / 'r.jsonl'}"
    assert bench(cmd) == 1
    assert "not an executable" in capsys.readouterr().err


def test_failing_llama_bench_keeps_finished_rows(fake_bin, tiny, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("FAKE_LLAMA_BENCH_FAIL", "2")
    out = tmp_path / "r.jsonl"
    assert bench(f"run --target llama.cpp --model {tiny} -p 16,32,64 -n 8 -r 5 --output {out}") == 1
    err = capsys.readouterr().err
    assert "exited with status 1" in err and "failed to create context" in err
    # the finished rows are kept, the tests llama-bench did not finish are failed rows with its words
    rows = _rows(out)
    assert [(r["test"], r["status"]) for r in rows] == [
        ("pp16", "ok"),
        ("pp32", "ok"),
        ("pp64", "failed"),
        ("tg8", "failed"),
    ]
    assert all("failed to create context" in r["error"]["message"] for r in rows[2:])


def test_sigint_keeps_finished_rows(fake_bin, tiny, tmp_path) -> None:
    out = tmp_path / "r.jsonl"
    # rows 1.5 s apart: a test process starved for a few seconds on a loaded machine still interrupts mid-run
    env = {**os.environ, "FAKE_LLAMA_BENCH_DELAY": "1.5"}
    cmd = f"run --target llama.cpp --model {tiny} -p 16,32,64,128,256 -n 8,16,32 -r 5 --output {out}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "strata_bench.cli", *cmd.split()],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=_sigint_default,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if out.exists() and len(out.read_text().splitlines()) >= 2:
                break
            time.sleep(0.05)
        else:
            pytest.fail("no rows were written")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    rows = _rows(out)  # every line is a whole JSON record
    assert 2 <= len(rows) < 8
    assert [r["test"] for r in rows] == ["pp16", "pp32", "pp64", "pp128", "pp256", "tg8", "tg16"][: len(rows)]
    assert f"{len(rows)} finished rows kept in {out}" in err


@pytest.mark.skipif(shutil.which("llama-bench") is None, reason="no llama-bench on PATH")
def test_real_llama_bench(tiny, tmp_path) -> None:
    out = tmp_path / "r.jsonl"
    assert bench(f"run --target llama.cpp --model {tiny} -p 32 -n 8 -r 5 --threads 2 --output {out}") == 0
    rows = _rows(out)
    assert [r["test"] for r in rows] == ["pp32", "tg8"]
    for r in rows:
        assert len(r["samples"]) == 5 and all(x > 0 for x in r["samples"])
        assert r["peer"]["n_threads"] == 2 and r["peer"]["build_commit"]


def test_gpu_grid_pairs_budgets_with_n_cpu_moe(fake_bin, tiny, tmp_path, monkeypatch, capsys) -> None:
    """--device cuda: llama.cpp runs -ngl 99 and, for each --vram-budget, the --n-cpu-moe given for it,
    right after the strata configuration it stands against; a llama.cpp setting that fails to load is a
    failed row and the next one still runs. Without a GPU here strata's CUDA configurations fail to open,
    which is a failed row too."""
    monkeypatch.setenv("FAKE_LLAMA_BENCH_FAIL_NCMOE", "7")
    out = tmp_path / "r.jsonl"
    cmd = (
        f"run --device cuda --target strata --target llama.cpp --model {tiny} -p 32 -n 8 -r 5 "
        f"--threads 1 --vram-budget auto,64MiB,32MiB --llama-n-cpu-moe 0,7,3 --output {out} --format md"
    )
    rc = main([*cmd.split(), "--llama-args", "-ub 256 -b 256"])
    assert rc == 1  # one llama.cpp setting failed (and strata's, where there is no GPU)
    rows = _rows(out)
    budgets = [None, 64 << 20, 32 << 20]
    assert [(r["target"], r["knobs"]["vram_budget"]) for r in rows] == [
        (t, b) for b in budgets for t in ("strata", "strata", "llama.cpp", "llama.cpp")
    ]
    for r in rows:
        assert r["knobs"]["device"] == "cuda"
        if r["target"] == "strata" and r["status"] == "failed":
            assert r["error"]["phase"] == "open" and r["error"]["type"] == "DeviceError"
    llama = [r for r in rows if r["target"] == "llama.cpp"]
    for r, n in zip(llama, [0, 0, 7, 7, 3, 3], strict=True):
        assert r["knobs"]["n_gpu_layers"] == 99 and r["knobs"]["n_cpu_moe"] == n
        if n == 7:
            assert r["status"] == "failed" and "failed to load model" in r["error"]["message"]
            continue
        args = r["peer"]["args"]
        assert args[args.index("-ngl") + 1] == "99"
        assert ("-ncmoe" in args) == (n > 0) and (n == 0 or args[args.index("-ncmoe") + 1] == str(n))
        # host experts from llama.cpp's own buffers, not the mapping; --llama-args reach every run
        assert r["peer"]["load_mode"] == ("none" if n else "auto")
        assert r["peer"]["n_cpu_moe"] == n and r["peer"]["n_ubatch"] == 256  # llama-bench's own record
        # the stand-in's speed is divided by 1 + n: the rows are those of the setting asked for
        assert r["mean"] == pytest.approx((900.0 if r["n_prompt"] else 40.0) / (1 + n), rel=0.02)
    md = capsys.readouterr().out
    speed = md.split("**engine")[0]
    line = next(x for x in speed.splitlines() if "-ncmoe 3" in x)
    assert line.startswith("| llama.cpp") and "32MiB" in line
    assert "failed to load model" in md.split("**failed")[1]


def test_gpu_ratio_rows_pair_equal_budgets() -> None:
    """The speed table puts each llama.cpp GPU row under the strata row of the same budget, with the ratio."""
    from strata_bench._tables import speed_table

    def rec(target: str, budget: int | None, test: str, mean: float, **knobs) -> dict:
        k = {"threads": 8, "device": "cuda", "kv": "f16", "vram_budget": budget, **knobs}
        return {"target": target, "model": "m.gguf", "quant": "Q8_0", "test": test, "unit": "t/s",
                "mean": mean, "stddev": 1.0, "knobs": k, "status": "ok",
                "nvml": {"process_memory_max": (budget or 30 << 30) - (1 << 28)}}  # fmt: skip

    g = 1 << 30
    recs = [
        rec("strata", None, "pp512", 1400.0), rec("strata", None, "tg128", 57.0),
        rec("strata", 12 * g, "pp512", 110.0), rec("strata", 12 * g, "tg128", 9.0),
        rec("llama.cpp", 12 * g, "pp512", 1300.0, n_gpu_layers=99, n_cpu_moe=33),
        rec("llama.cpp", 12 * g, "tg128", 36.0, n_gpu_layers=99, n_cpu_moe=33),
        rec("llama.cpp", None, "pp512", 8000.0, n_gpu_layers=99, n_cpu_moe=0),
        rec("llama.cpp", None, "tg128", 340.0, n_gpu_layers=99, n_cpu_moe=0),
    ]  # fmt: skip
    t = speed_table(recs)
    assert t is not None
    assert t.headers == ["target", "quant", "vram_budget", "llama.cpp flags", "VRAM peak", "pp512", "tg128"]
    cells = [[c.strip() for c in row] for row in t.rows]
    assert [r[0] for r in cells] == ["strata", "llama.cpp", "strata / llama.cpp"] * 2
    assert cells[0][2] == "auto" and cells[1][3] == "-ngl 99" and cells[1][2] == "auto"
    assert cells[2][-2:] == [f"{1400 / 8000:.2f}x", f"{57 / 340:.2f}x"]
    assert cells[3][2] == "12GiB" and cells[4][3] == "-ngl 99 -ncmoe 33" and cells[4][2] == "12GiB"
    assert cells[5][-2:] == [f"{110 / 1300:.2f}x", f"{9 / 36:.2f}x"]
    assert cells[3][4] == "11.75 GiB"  # the peak of the process's own device memory


def test_n_cpu_moe_for_a_budget(tiny) -> None:
    """The smallest --n-cpu-moe whose estimated device memory fits the budget (see n_cpu_moe_for_budget)."""
    from strata_bench._llamacpp import _LLAMA_COMPUTE_RESERVE, n_cpu_moe_for_budget
    from strata_bench._model import weight_bytes

    w = weight_bytes(tiny)
    assert w is not None
    n_layer, ctx = len(w["expert_bytes"]), 160
    per_layer = [b * w["n_expert"] for b in w["expert_bytes"]]
    fixed = w["dense_bytes"] + w["kv_values_per_token"] * 2 * ctx + _LLAMA_COMPUTE_RESERVE
    assert n_cpu_moe_for_budget(w, None, ctx) == 0
    for k in range(n_layer + 1):
        fits = fixed + sum(per_layer[k:])
        assert n_cpu_moe_for_budget(w, fits, ctx) == k
        if k < n_layer:
            assert n_cpu_moe_for_budget(w, fits - 1, ctx) == k + 1
    assert n_cpu_moe_for_budget(w, 1 << 20, ctx) == n_layer  # not even the dense part fits: all on the host


def test_n_cpu_moe_needs_a_gpu_run_and_one_value_per_budget(fake_bin, tiny, tmp_path, capsys) -> None:
    out = tmp_path / "r.jsonl"
    assert bench(f"run --target llama.cpp --model {tiny} --llama-n-cpu-moe 4 --output {out}") == 1
    assert "add --device cuda" in capsys.readouterr().err
    cmd = (
        f"run --device cuda --target llama.cpp --model {tiny} --vram-budget 64MiB,32MiB "
        f"--llama-n-cpu-moe 1,2,3 --output {out}"
    )
    assert bench(cmd) == 1
    assert "give one per budget" in capsys.readouterr().err
    assert not out.exists()


def test_n_cpu_moe_values_without_budgets_all_run(fake_bin, tiny, tmp_path) -> None:
    """No --vram-budget list: every --llama-n-cpu-moe value runs; only 0 stands against strata's rows."""
    out = tmp_path / "r.jsonl"
    cmd = f"run --device cuda --target llama.cpp --model {tiny} -p 32 -n 0 -r 5 --llama-n-cpu-moe 0,2,4 --output {out}"
    assert bench(cmd) == 0
    rows = _rows(out)
    assert [r["knobs"]["n_cpu_moe"] for r in rows] == [0, 2, 4]
    assert ["vram_budget" in r["knobs"] for r in rows] == [True, False, False]
    assert [r["mean"] for r in rows] == pytest.approx([900.0, 300.0, 180.0], rel=0.02)


def test_long_prompts_also_run_at_a_large_micro_batch_and_the_faster_pairs(
    fake_bin, tiny, tmp_path, capsys
) -> None:
    """llama.cpp at its best: every test at -ub 512, the prompts longer than that again at -ub 4096 -b 4096
    (capped by the longest prompt); the ratio row is against the faster row of each test and names it."""
    out = tmp_path / "r.jsonl"
    cmd = f"run --target strata --target llama.cpp --model {tiny} -p 256,2048 -n 8 -r 5 --threads 1 --output {out} --format md"
    assert bench(cmd) == 0
    rows = _rows(out)
    llama = [
        (r["test"], r["knobs"]["n_ubatch"], r["knobs"]["n_batch"]) for r in rows if r["target"] == "llama.cpp"
    ]
    assert llama == [("pp256", 512, 2048), ("pp2048", 512, 2048), ("tg8", 512, 2048), ("pp2048", 2048, 2048)]
    big = next(r for r in rows if r["target"] == "llama.cpp" and r["knobs"]["n_ubatch"] == 2048)
    args = big["peer"]["args"]
    assert args[args.index("-ub") + 1] == "2048" and args[args.index("-b") + 1] == "2048"
    assert big["peer"]["n_ubatch"] == 2048 and args[args.index("-n") + 1] == "0"  # prompts only
    assert big["mean"] == pytest.approx(900 * 2, rel=0.02)  # the stand-in is sqrt(2048 / 512) times faster
    strata = {r["test"]: r["mean"] for r in rows if r["target"] == "strata"}
    base = {
        r["test"]: r["mean"] for r in rows if r["target"] == "llama.cpp" and r["knobs"]["n_ubatch"] == 512
    }
    md = capsys.readouterr().out
    speed = md.split("**engine")[0]
    lines = [line for line in speed.splitlines() if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in lines[2:]] == [
        "strata",
        "llama.cpp",
        "llama.cpp",
        "strata / llama.cpp",
    ]
    assert "-ub 2048 -b 2048" in lines[4] and lines[3].split("|")[3].strip() == "-"
    cells = [c.strip() for c in lines[5].strip("|").split("|")][-3:]
    # pp256 was run one way; pp2048 two ways, and the faster (-ub 2048) is the one strata is measured against
    assert cells == [
        f"{strata['pp256'] / base['pp256']:.2f}x",
        f"{strata['pp2048'] / big['mean']:.2f}x (-ub 2048)",
        f"{strata['tg8'] / base['tg8']:.2f}x",
    ]


def test_a_large_micro_batch_that_does_not_fit_is_halved(
    fake_bin, tiny, tmp_path, monkeypatch, capsys
) -> None:
    """On the GPU at a budget: each micro-batch gets its own --n-cpu-moe (given here); one that runs out of
    device memory is halved until one runs, and its rows say what was tried."""
    monkeypatch.setenv("FAKE_LLAMA_BENCH_MAX_UBATCH", "1024")
    out = tmp_path / "r.jsonl"
    cmd = (f"run --device cuda --target llama.cpp --model {tiny} -p 512,4096 -n 8 -r 5 --threads 1 "
           f"--vram-budget 64MiB --llama-n-cpu-moe 2 --output {out} --format md")  # fmt: skip
    assert bench(cmd) == 0
    cap = capsys.readouterr()
    rows = _rows(out)
    assert [(r["test"], r["knobs"]["n_ubatch"]) for r in rows] == [
        ("pp512", 512),
        ("pp4096", 512),
        ("tg8", 512),
        ("pp4096", 1024),
    ]
    assert all(
        r["status"] == "ok" and r["knobs"]["n_cpu_moe"] == 2 and r["knobs"]["vram_budget"] == 64 << 20
        for r in rows
    )
    tried = rows[-1]["peer"]["tried"]
    assert [(t["n_ubatch"], t["n_cpu_moe"]) for t in tried] == [(4096, 2), (2048, 2)]
    assert all("out of memory" in t["message"] for t in tried)
    assert "llama.cpp -ub 4096 -ncmoe 2 did not run" in cap.err and "trying -ub 2048" in cap.err
    assert "-ngl 99 -ncmoe 2 -ub 1024 -b 1024" in cap.out
    # nothing fits at all: the tests of that setting are failed rows with llama.cpp's words
    monkeypatch.setenv("FAKE_LLAMA_BENCH_MAX_UBATCH", "600")
    out2 = tmp_path / "r2.jsonl"
    assert bench(cmd.replace(str(out), str(out2))) == 1
    last = _rows(out2)[-1]
    assert (
        last["status"] == "failed"
        and last["test"] == "pp4096"
        and "out of memory" in last["error"]["message"]
    )


def test_micro_batch_estimate_and_its_n_cpu_moe(tiny) -> None:
    """A larger micro-batch needs larger compute buffers, so at one budget it keeps more experts on the host;
    a micro-batch whose buffers alone do not fit has no --n-cpu-moe at all."""
    from strata_bench._llamacpp import _LLAMA_COMPUTE_RESERVE, compute_bytes, fit_n_cpu_moe
    from strata_bench._model import weight_bytes

    w = weight_bytes(tiny)
    assert w is not None and w["n_embd"] and w["n_ff_exp"]
    assert compute_bytes(w, 512) == compute_bytes(w, 256) == _LLAMA_COMPUTE_RESERVE
    per_token = 4 * (8 * w["n_embd"] + 3 * w["n_expert_used"] * w["n_ff_exp"])
    assert compute_bytes(w, 4096) == _LLAMA_COMPUTE_RESERVE + 2 * 3584 * per_token
    ctx = 4096 + 8
    per_layer = [b * w["n_expert"] for b in w["expert_bytes"]]
    fixed = w["dense_bytes"] + w["kv_values_per_token"] * 2 * ctx
    budget = fixed + compute_bytes(w, 4096) + sum(per_layer[2:])  # ub 4096 fits with two layers' experts out
    assert fit_n_cpu_moe(w, budget, ctx, 4096) == 2 and fit_n_cpu_moe(w, budget - 1, ctx, 4096) == 3
    assert fit_n_cpu_moe(w, budget, ctx, 512) < 2  # the smaller buffers leave room for more experts
    assert fit_n_cpu_moe(w, fixed + compute_bytes(w, 4096) - 1, ctx, 4096) is None


def test_peer_over_its_budget_is_marked_and_not_chosen() -> None:
    """The ratio is against the faster llama.cpp row that kept to the budget; a row over it says so."""
    from strata_bench._tables import speed_table

    g = 1 << 30

    def rec(target: str, test: str, mean: float, used: int, **knobs) -> dict:
        k = {"threads": 8, "device": "cuda", "kv": "f16", "vram_budget": 12 * g, **knobs}
        return {"target": target, "model": "m.gguf", "quant": "Q4_K_M", "test": test, "unit": "t/s",
                "mean": mean, "stddev": 1.0, "knobs": k, "status": "ok", "nvml": {"process_memory_max": used}}  # fmt: skip

    recs = [
        rec("strata", "pp4096", 7765.0, int(12.54 * g)),
        rec(
            "llama.cpp",
            "pp4096",
            2421.0,
            12 * g - 1,
            n_gpu_layers=99,
            n_cpu_moe=19,
            n_ubatch=512,
            n_batch=2048,
        ),
        rec(
            "llama.cpp", "pp4096", 9000.0, 13 * g, n_gpu_layers=99, n_cpu_moe=19, n_ubatch=4096, n_batch=4096
        ),
        rec(
            "llama.cpp",
            "pp4096",
            7936.0,
            12 * g - 5,
            n_gpu_layers=99,
            n_cpu_moe=22,
            n_ubatch=4096,
            n_batch=4096,
        ),
    ]
    t = speed_table(recs)
    assert t is not None
    cells = [[c.strip() for c in row] for row in t.rows]
    vram = t.headers.index("VRAM peak")
    assert cells[0][vram] == "12.54 GiB (over)" and cells[2][vram] == "13.00 GiB (over)"
    assert cells[1][vram] == "12.00 GiB" and cells[3][vram] == "12.00 GiB"
    assert cells[-1][-1] == f"{7765 / 7936:.2f}x (-ub 4096 -ncmoe 22)"


def test_each_micro_batch_gets_the_n_cpu_moe_that_fits_the_budget(fake_bin, tiny, tmp_path) -> None:
    """--llama-n-cpu-moe auto at a budget: the -ub 512 run and the large micro-batch run each keep on the host
    the fewest layers' experts whose estimated device memory fits the budget at that micro-batch."""
    from strata_bench._llamacpp import compute_bytes, fit_n_cpu_moe
    from strata_bench._model import weight_bytes

    w = weight_bytes(tiny)
    assert w is not None
    ctx = 2048  # the longest test's context
    per_layer = [b * w["n_expert"] for b in w["expert_bytes"]]
    budget = (
        w["dense_bytes"] + w["kv_values_per_token"] * 2 * ctx + compute_bytes(w, 2048) + sum(per_layer[2:])
    )
    out = tmp_path / "r.jsonl"
    cmd = (f"run --device cuda --target llama.cpp --model {tiny} -p 512,2048 -n 8 -r 5 --threads 1 "
           f"--vram-budget {budget} --output {out}")  # fmt: skip
    assert bench(cmd) == 0
    got = {(r["test"], r["knobs"]["n_ubatch"]): r["knobs"]["n_cpu_moe"] for r in _rows(out)}
    small = fit_n_cpu_moe(w, budget, ctx, 512)
    assert got == {("pp512", 512): small, ("pp2048", 512): small, ("tg8", 512): small, ("pp2048", 2048): 2}
    assert small is not None and small < 2


def test_a_layer_split_runs_against_llama_cpp_split_mode_layer(fake_bin, tiny, tmp_path, capsys) -> None:
    """strata's --split layer rows (here on the CPU backend's emulated budgets) against llama-bench -sm layer
    with the same shares of the layers; the table pairs the rows of the same split. The two-card run itself
    needs a machine with two GPUs."""
    out = tmp_path / "r.jsonl"
    rc = bench(
        f"run --target strata --target llama.cpp --model {tiny} -p 32 -n 8 -r 5 --threads 1 "
        f"--split layer --gpus 0/1,0/1/2/3 --output {out} --format md"
    )
    assert rc == 0
    rows = _rows(out)
    strata = [r for r in rows if r["target"] == "strata"]
    llama = [r for r in rows if r["target"] == "llama.cpp"]
    assert {r["knobs"]["gpus"] for r in strata} == {"0,1", "0,1,2,3"} and len(strata) == 4
    assert all(r["status"] == "ok" and r["knobs"]["split"] == "layer" for r in strata)
    for r in llama:
        args = r["peer"]["args"]
        n = len(r["knobs"]["gpus"].split(","))
        assert args[args.index("-sm") + 1] == "layer" and r["peer"]["split_mode"] == "layer"
        assert args[args.index("-ts") + 1] == "/".join(["1"] * n)  # strata's even split, said to llama.cpp
        assert "-dev" not in args  # a CPU run names no card
    assert sorted(r["knobs"]["gpus"] for r in llama) == ["0,1", "0,1", "0,1,2,3", "0,1,2,3"]
    md = capsys.readouterr().out
    assert "-sm layer" in md.split("**engine")[0]  # the speed table names the peer's split


def test_a_gpu_split_names_its_cards_and_budgets(fake_bin, tiny, tmp_path) -> None:
    out = tmp_path / "r.jsonl"
    rc = bench(
        f"run --device cuda --target llama.cpp --model {tiny} -p 32 -n 8 -r 5 --threads 1 --split layer "
        f"--gpus 0/1 --tensor-split 0.6/0.4 --vram-budget 64MiB/32MiB --output {out}"
    )
    assert rc == 0
    for r in _rows(out):
        args = r["peer"]["args"]
        assert args[args.index("-dev") + 1] == "CUDA0/CUDA1" and args[args.index("-ts") + 1] == "0.6/0.4"
        assert r["knobs"]["vram_budgets"] == [64 << 20, 32 << 20] and r["knobs"]["tensor_split"] == "0.6,0.4"
        assert r["peer"]["tensor_split"] == "0.60/0.40"


def test_a_split_over_one_card_twice_has_no_llama_cpp_counterpart(fake_bin, tiny, tmp_path, capsys) -> None:
    rc = bench(
        f"run --device cuda --target llama.cpp --model {tiny} -p 32 -n 8 --split layer --gpus 0/0 "
        f"--output {tmp_path / 'r.jsonl'}"
    )
    assert rc != 0
    err = capsys.readouterr().err
    assert "distinct cards only" in err and "Traceback" not in err
