"""One environment collector (strata._environment) and one NVML wrapper (strata._nvml) behind
repro_matrix's env.json, strata_bench's records and the server's /health."""

from __future__ import annotations

import subprocess
from pathlib import Path

from repro_matrix import _env, _runner
from strata import _environment, _nvml
from strata.server import app
from strata_bench import _records


def test_git_state_of_a_tree_and_outside_one(tmp_path: Path) -> None:
    assert _environment.git_state(tmp_path) == (None, None)
    repo = tmp_path / "r"
    repo.mkdir()

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)

    git("init", "-q")
    (repo / "f").write_text("a")
    git("add", "f")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    commit, dirty = _environment.git_state(repo)
    assert commit is not None and len(commit) == 40 and dirty is False
    (repo / "f").write_text("b")
    assert _environment.git_state(repo) == (commit, True)
    (repo / "untracked").write_text("x")  # untracked files do not make a tree dirty
    (repo / "f").write_text("a")
    assert _environment.git_state(repo) == (commit, False)


def test_the_matrix_and_the_bench_record_the_same_environment(monkeypatch) -> None:
    monkeypatch.delenv("STRATA_BENCH_COMMIT", raising=False)
    _records.environment.cache_clear()
    # the commit through the one git_state (the shared tree's state itself may change between two calls)
    seen: list[Path] = []
    monkeypatch.setattr(_environment, "git_state", lambda where: seen.append(Path(where)) or ("c0ffee", True))
    monkeypatch.setattr(_env, "git_state", _environment.git_state)
    env, rec = _env.collect_env(), _records.environment()
    assert (
        env["strata"]["commit"] == rec["commit"] == "c0ffee"
        and env["strata"]["dirty"] is rec["dirty"] is True
    )
    assert len(seen) == 2
    assert env["cpu"]["model"] == rec["cpu"] == _environment.cpu_info()["model"]
    gpus = _environment.gpus()
    assert env["gpu"] == gpus
    if "error" in gpus:
        assert rec["gpu"] is None and _runner.gpu_count() == 0
    else:
        assert rec["gpu"] == gpus["devices"][0]["name"] and _runner.gpu_count() == len(gpus["devices"])
    _records.environment.cache_clear()


def test_one_nvml_wrapper() -> None:
    assert app.gpu_info is _nvml.gpu_info
    assert _runner.gpu_count() == _nvml.device_count()
