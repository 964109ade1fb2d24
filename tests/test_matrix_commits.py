"""Bisect over commits: the arithmetic of starts per commit, and a planted bad commit in a scratch history.

The scratch repository holds strata's Python package (this tree's files) and a build command that links
this tree's libstrata.so into each worktree; one of its commits makes `strata serve` default to the legacy
lend policy, which fails the cell (`lend failed`). Bisect must name that commit, having built each
commit it ran in a worktree of its own, and build nothing a second time.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro_matrix._commits import Builds, explain_starts, rate_lower_bound, starts_needed

_ROOT = Path(__file__).resolve().parent.parent


# ---- how many starts per commit ------------------------------------------------------------------------


@given(rate=st.floats(0.01, 0.99), miss=st.sampled_from([0.05, 0.01, 0.001]))
def test_starts_needed_is_the_least_that_keeps_a_miss_below_the_bound(rate, miss):
    s = starts_needed(rate, miss)
    assert (1 - rate) ** s < miss
    assert s == 1 or (1 - rate) ** (s - 1) >= miss


def test_two_of_nine_needs_nineteen_starts_and_says_why():
    # 2 of 9: p = 2/9; (7/9)^18 = 1.08 % (not enough), (7/9)^19 = 0.84 %
    assert starts_needed(2 / 9, 0.01) == 19
    s, why = explain_starts(2, 9, 0.01, 60)
    assert s == 19
    assert "failed 2 of 9 starts" in why and "19 starts per commit" in why and "0.84%" in why
    assert "as low as" in why  # 9 starts leave the rate uncertain, and the sentence says what would cover it
    assert starts_needed(1.0) == 1 and "one start per commit" in explain_starts(3, 3, 0.01, 60)[1]
    s, why = explain_starts(1, 50, 0.01, 60)
    assert s == 60 and "Capped at --max-starts 60" in why
    with pytest.raises(ValueError):
        starts_needed(0.0)


def test_rate_lower_bound_is_clopper_pearson():
    assert rate_lower_bound(0, 5) == 0
    # k = n: the bound solves p^n = 1 - confidence
    assert math.isclose(rate_lower_bound(3, 3, 0.9), 0.1 ** (1 / 3), rel_tol=1e-6)
    # k = 1: 1 - (1 - p)^n = 0.1
    assert math.isclose(rate_lower_bound(1, 10, 0.9), 1 - 0.9 ** (1 / 10), rel_tol=1e-6)
    assert rate_lower_bound(2, 9) < 2 / 9


# ---- a planted bad commit ------------------------------------------------------------------------------


def _git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.org",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.org",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


def _scratch_history(tmp: Path) -> tuple[Path, list[str]]:
    """Six commits of strata's package (this repository's HEAD); the fourth (index 3) makes `strata serve`
    default to legacy loans."""
    repo = tmp / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    # the package as committed (a working tree may be half way through an edit)
    archive = subprocess.run(
        ["git", "-C", str(_ROOT), "archive", "HEAD", "strata"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(repo)], input=archive, check=True)
    (repo / ".gitignore").write_text("strata/lib/\n")
    shas = []
    for i in range(6):
        (repo / "NOTES").write_text(f"step {i}\n")
        if i == 3:
            cfg = repo / "strata" / "_config.py"
            text = cfg.read_text()
            # the flag's default, however the call is laid out
            planted = re.sub(r'("--lend-policy",\s*default=)"current"', r'\1"legacy"', text)
            assert planted != text
            cfg.write_text(planted)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"step {i}" + (": lend policy default" if i == 3 else ""))
        shas.append(_git(repo, "rev-parse", "HEAD"))
    return repo, shas


def test_bisect_names_the_planted_bad_commit_and_reuses_its_builds(tmp_path: Path):
    lib = _ROOT / "strata" / "lib" / "libstrata.so"
    assert lib.is_file(), "make native first"
    repo, shas = _scratch_history(tmp_path)
    cell = tmp_path / "cell.toml"
    # 1024 slots at a 512-token context: a 256-token chunk's deep ring needs more than the legacy loan
    cell.write_text(
        'model = "tiny"\nmax_tokens = 2\nreference = false\n[engine]\ndevice = "cpu"\n'
        'max_context = 512\nvram_budget = "64MiB"\nexpert_cache = 1024\n[prompts]\nchunks = [256]\n'
    )
    build = f"mkdir -p strata/lib && ln -sf {lib} strata/lib/libstrata.so && echo built >> {tmp_path / 'builds.log'}"
    cache, out = tmp_path / "cache", tmp_path / "bisect"

    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "repro_matrix",
            "bisect",
            str(cell),
            "--commits",
            f"{shas[0]}..{shas[-1]}",
            "--repo",
            str(repo),
            "--build",
            build,
            "--cache",
            str(cache),
            "--out",
            str(out),
            "--calibrate",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert f"first bad commit: {shas[3]} step 3: lend policy default" in p.stdout
    assert "failed 2 of 2 starts on BAD" in p.stdout and "one start per commit" in p.stdout
    res = json.loads((out / "bisect-commits.json").read_text())
    assert res["first_bad"] == shas[3] and res["labels"] == ["lend failed"] and res["starts_per_commit"] == 1
    verdicts = {t["commit"]: t["verdict"] for t in res["tested"]}
    assert verdicts[shas[0]] == "good" and verdicts[shas[3]] == "bad" and verdicts[shas[-1]] == "bad"
    assert all(v == ("bad" if shas.index(c) >= 3 else "good") for c, v in verdicts.items())
    # the cell really ran on each commit's own strata: legacy loans from step 3 on, the default before
    trials = [json.loads(x) for x in (out / "trials.jsonl").read_text().splitlines()]
    assert {t["commit"] for t in trials} == set(verdicts)
    for t in trials:
        codes = {r.get("error_code") for st in t["starts"] for r in st["requests"]}
        assert codes == ({"lend_failed"} if shas.index(t["commit"]) >= 3 else {None}), (t["commit"], codes)
    built = (tmp_path / "builds.log").read_text().count("built")
    assert built == len(verdicts)  # one worktree and one build per commit run
    # the builds are kept by commit (and build command): asked again, nothing is built
    builds = Builds(repo, cache, build, log=lambda _: None)
    trees = {sha: builds.tree(sha) for sha in verdicts}
    assert (tmp_path / "builds.log").read_text().count("built") == built
    assert all(_git(t, "rev-parse", "HEAD") == sha for sha, t in trees.items())
    assert len({t.parent for t in trees.values()}) == 1 and len(set(trees.values())) == len(trees)
    Builds(repo, cache, build + " # another build", log=lambda _: None).tree(shas[0])
    assert (tmp_path / "builds.log").read_text().count("built") == built + 1


def test_a_range_whose_bad_end_passes_gives_no_answer(tmp_path: Path):
    repo, shas = _scratch_history(tmp_path)
    cell = tmp_path / "cell.toml"
    cell.write_text(
        'model = "tiny"\nmax_tokens = 2\nreference = false\n[engine]\ndevice = "cpu"\n'
        'max_context = 512\nvram_budget = "64MiB"\nexpert_cache = 1024\n[prompts]\nchunks = [256]\n'
    )
    lib = _ROOT / "strata" / "lib" / "libstrata.so"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "repro_matrix",
            "bisect",
            str(cell),
            "--commits",
            f"{shas[0]}..{shas[2]}",
            "--repo",
            str(repo),
            "--build",
            f"mkdir -p strata/lib && ln -sf {lib} strata/lib/",
            "--cache",
            str(tmp_path / "cache"),
            "--out",
            str(tmp_path / "b"),
            "--calibrate",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 3, (p.stdout, p.stderr)
    assert "no answer: the cell does not fail on BAD" in p.stdout and "Traceback" not in p.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "repro_matrix", "bisect", str(cell), "--commits", "nope", "--repo", str(repo)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "write GOOD..BAD" in bad.stderr


def test_the_rate_comes_from_the_cells_own_starts():
    from repro_matrix import Matrix
    from repro_matrix._commits import source_rate

    m = Matrix.from_dict({"axes": {"expert_cache": [1024]}, "reference": False})
    c = m.cells()[0]
    ok = {"requests": [{"prompt": 0, "status": "ok", "tokens": [1, 2]}]}
    lend = {"requests": [{"prompt": 0, "status": "error", "error_code": "lend_failed", "error_message": "x"}]}
    rec = {"cell_id": c.cell_id, "cell": c.to_dict(), "starts": [ok, lend, ok, ok, lend, ok, ok, ok, ok]}
    assert source_rate(rec, None, m) == (["lend failed"], 2, 9)  # the 2 of 9 that needs 19 starts per commit
    assert source_rate(rec, None, m, ["engine exited"]) == (["engine exited"], 0, 9)
