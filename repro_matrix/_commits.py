"""Bisect over commits: the first commit between GOOD and BAD at which a cell fails.

``repro_matrix bisect --commits GOOD..BAD CELL`` is ``git bisect run`` that knows strata's verdicts and
its nondeterminism:

- a cell bisected for ``reply differs`` is compared with the matrix's reference cell run on the same
  commit (the question is whether that commit's engine keeps the cell's replies equal to its own
  all-resident ones);
- each candidate commit is checked out in a git worktree of its own and built there once (the build is
  kept, keyed by the commit and the build command, so a second bisect over the same commits builds
  nothing);
- the cell runs on that commit's ``strata`` (its Python package and the library its build made), with
  fresh engine starts; a commit is *bad* when a start shows one of the verdicts being bisected
  (those the cell failed with), *good* when none does, and *skipped* when it cannot run the cell at all
  (its build fails, or its engine does not start while "engine start failed" is not what is bisected);
- a cell that fails only k of n starts needs several starts per commit before a commit may be called
  good. With a failure rate p per start, s starts all pass on a bad commit with probability (1-p)^s, so
  s = ceil(ln(miss) / ln(1-p)) keeps a bad commit from being called good with probability below
  ``miss`` (1 % by default). p is estimated from the cell's record (when CELL is a run directory) and
  from starts run on BAD first; a commit is bad at its first failing start, so only good commits pay for
  every start.

``starts_needed`` and ``rate_lower_bound`` are that arithmetic; ``bisect_commits`` the search.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ._matrix import Cell, Matrix, MatrixError
from ._verdict import judge

__all__ = [
    "DEFAULT_BUILD",
    "Builds",
    "CommitOutcome",
    "CommitsResult",
    "bisect_commits",
    "rate_lower_bound",
    "source_rate",
    "starts_needed",
]

#: How a commit of strata is built in its worktree: the engine into strata/lib, where that commit's loader
#: looks first (its Python package is the worktree's own).
DEFAULT_BUILD = (
    'cmake -S native -B build/native -DCMAKE_BUILD_TYPE=Release -DSTRATA_OUTPUT_DIR="$PWD/strata/lib" '
    ">/dev/null && cmake --build build/native -j"
)

_BUILT_MARK = ".repro_matrix-built"
_BUILD_LOG = ".repro_matrix-build.log"

# Loaded by every Python started for a candidate commit (its folder leads PYTHONPATH): the worktree's
# packages win over an editable install of the same project, whose import hook would otherwise run first.
_SITECUSTOMIZE = '''\
"""repro_matrix bisect: import strata from the worktree in REPRO_MATRIX_TREE, not from an editable install."""
import os as _os
import sys as _sys

_tree = _os.path.realpath(_os.environ.get("REPRO_MATRIX_TREE", "")) if _os.environ.get("REPRO_MATRIX_TREE") else ""


def _elsewhere(finder):
    find = getattr(finder, "find_spec", None)
    if not _tree or find is None:
        return False
    try:
        spec = find("strata", None)
    except Exception:
        return False
    origin = getattr(spec, "origin", None) if spec is not None else None
    return bool(origin) and not _os.path.realpath(origin).startswith(_tree + _os.sep)


_sys.meta_path[:] = [f for f in _sys.meta_path if not _elsewhere(f)]
'''


# ---- how many starts ---------------------------------------------------------------------------------


def starts_needed(rate: float, miss: float = 0.01) -> int:
    """Starts per commit so that a bad commit whose starts fail with probability ``rate`` passes all of
    them with probability below ``miss``: the least s with (1 - rate)^s < miss."""
    if not 0 < miss < 1:
        raise ValueError("miss must be between 0 and 1")
    if rate <= 0:
        raise ValueError("a failure rate of 0 never shows: nothing to bisect")
    if rate >= 1:
        return 1
    s = math.ceil(math.log(miss) / math.log1p(-rate))
    while (1 - rate) ** s >= miss:  # the boundary case, exactly on miss
        s += 1
    return max(1, s)


def rate_lower_bound(k: int, n: int, confidence: float = 0.9) -> float:
    """The one-sided lower confidence bound of a failure rate seen k times in n starts (Clopper-Pearson):
    the smallest rate that makes k or more failures in n starts at least (1 - confidence) likely."""
    if k <= 0:
        return 0.0

    def tail(p: float) -> float:  # P(X >= k), X ~ Binomial(n, p)
        return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if tail(mid) < 1 - confidence:
            lo = mid
        else:
            hi = mid
    return hi


# ---- worktrees and their builds ----------------------------------------------------------------------


def _git(repo: Path, *args: str, check: bool = True) -> str:
    p = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise MatrixError(f"git {' '.join(args)} in {repo}: {(p.stderr or p.stdout).strip()}")
    return p.stdout.strip()


class BuildError(Exception):
    """A commit that does not build (the commit is skipped)."""


class Builds:
    """One worktree per commit under ``cache``, built once with ``build`` (a shell command run in it)."""

    def __init__(self, repo: Path, cache: Path, build: str, log: Callable[[str], None] = print):
        self.repo = repo
        self.cache = cache
        self.build = build
        self.log = log
        self.key = hashlib.sha1(build.encode()).hexdigest()[:8]
        self.shim = cache / "shim"
        self.shim.mkdir(parents=True, exist_ok=True)
        (self.shim / "sitecustomize.py").write_text(_SITECUSTOMIZE)

    def tree(self, sha: str) -> Path:
        """The built worktree of ``sha`` (made and built the first time it is asked for)."""
        path = self.cache / f"{sha[:12]}-{self.key}"
        mark = path / _BUILT_MARK
        if mark.is_file():
            return path
        if not path.exists():
            _git(self.repo, "worktree", "add", "--detach", "--force", str(path), sha)
        self.log(f"building {sha[:12]} in {path}")
        with open(path / _BUILD_LOG, "w") as logf:
            p = subprocess.run(
                self.build,
                shell=True,
                cwd=path,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env={k: v for k, v in os.environ.items() if k != "STRATA_LIB"},
            )
        if p.returncode != 0:
            tail = "\n".join((path / _BUILD_LOG).read_text(errors="replace").splitlines()[-15:])
            raise BuildError(f"the build of {sha[:12]} failed (exit status {p.returncode}):\n{tail}")
        mark.write_text(
            json.dumps(
                {
                    "commit": sha,
                    "build": self.build,
                    "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                }
            )
        )
        return path

    def env(self, tree: Path) -> dict[str, str]:
        """The environment that makes `strata` (the server and its engine worker, started in the worktree)
        that worktree's."""
        env = {k: v for k, v in os.environ.items() if k not in ("STRATA_LIB", "REPRO_MATRIX_STRATA")}
        env["REPRO_MATRIX_TREE"] = str(tree.resolve())
        env["PYTHONPATH"] = os.pathsep.join(
            [str(self.shim), str(tree.resolve()), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        return env


# ---- the search --------------------------------------------------------------------------------------


@dataclass
class CommitOutcome:
    commit: str
    subject: str
    verdict: str  # bad | good | skip
    starts: int = 0  # starts run
    failing: int = 0  # starts that showed a bisected verdict
    labels: list[str] = field(default_factory=list)  # every verdict seen at this commit
    why: str = ""  # a skip's reason

    def describe(self) -> str:
        what = {
            "bad": f"bad ({self.failing} of {self.starts} starts failing: {', '.join(self.labels)})",
            "good": f"good ({self.starts} of {self.starts} starts pass)",
            "skip": f"skipped ({self.why.splitlines()[0] if self.why else 'cannot run the cell'})",
        }[self.verdict]
        return f"{self.commit[:12]}  {what}  {self.subject}"


@dataclass
class CommitsResult:
    good: str
    bad: str
    cell_id: str
    labels: list[str]  # the verdicts bisected
    rate: tuple[int, int]  # failing starts, starts: what the number of starts per commit comes from
    starts_per_commit: int
    miss: float
    why_starts: str
    first_bad: str | None = None
    candidates: list[str] = field(default_factory=list)  # when skips leave more than one
    tested: list[CommitOutcome] = field(default_factory=list)
    error: str | None = None
    subjects: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        subjects = self.subjects
        lines = [self.why_starts, ""] if self.why_starts else []
        lines += [t.describe() for t in self.tested]
        lines.append("")
        if self.error:
            lines.append(f"no answer: {self.error}")
        elif self.first_bad:
            lines.append(f"first bad commit: {self.first_bad} {subjects.get(self.first_bad, '')}".rstrip())
        elif self.candidates:
            lines.append("the first bad commit is one of (the others could not run the cell):")
            lines += [f"  {c} {subjects.get(c, '')}".rstrip() for c in self.candidates]
        return "\n".join(lines)


def _one_start_records(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """A record split into one record per start (to count the starts that fail)."""
    return [{**rec, "starts": [st]} for st in rec.get("starts", [])]


def source_rate(
    record: dict[str, Any],
    reference: dict[str, Any] | None,
    matrix: Matrix,
    labels: Sequence[str] | None = None,
) -> tuple[list[str], int, int]:
    """From a cell's record: the verdicts to bisect (``labels``, or the failing ones it shows), and how many
    of its starts showed one of them, of how many."""
    v = judge(record, reference, near_tie=matrix.near_tie, fail_on=matrix.fail_on)
    want = list(labels) if labels else [lb for lb in v.labels if lb in matrix.fail_on]
    k = n = 0
    for sub in _one_start_records(record):
        n += 1
        sv = judge(sub, reference, near_tie=matrix.near_tie, fail_on=matrix.fail_on)
        k += bool(set(sv.labels) & set(want))
    return want, k, n


def explain_starts(k: int, n: int, miss: float, cap: int) -> tuple[int, str]:
    """Starts per commit from k failing starts of n, and the sentence that says why."""
    rate = k / n
    s = starts_needed(rate, miss)
    text = (
        f"the cell failed {k} of {n} starts on BAD ({rate:.0%}): a bad commit passes one start with "
        f"probability {1 - rate:.0%}"
    )
    if rate >= 1:
        text += ", so one start per commit tells a bad commit from a good one"
    else:
        text += (
            f", so {s} starts per commit call a bad commit good with probability {(1 - rate) ** s:.2%} "
            f"(below {miss:.0%}); a commit is bad at its first failing start"
        )
    lo = rate_lower_bound(k, n)
    if lo < rate and lo > 0:
        s_lo = starts_needed(lo, miss)
        if s_lo > s:
            text += (
                f". From {n} starts the rate is uncertain: it may be as low as {lo:.0%} (90% bound), which "
                f"would need {s_lo} starts per commit (--starts {s_lo}, or --calibrate more starts on BAD)"
            )
    if s > cap:
        text += (
            f". Capped at --max-starts {cap}: a bad commit is missed with probability {(1 - rate) ** cap:.1%}"
        )
        s = cap
    return s, text + "."


def bisect_commits(
    repo: Path,
    good: str,
    bad: str,
    matrix: Matrix,
    cell: Cell,
    *,
    builds: Builds,
    labels: Sequence[str] | None = None,
    source: dict[str, Any] | None = None,
    source_reference: dict[str, Any] | None = None,
    calibrate: int = 3,
    miss: float = 0.01,
    max_starts: int = 60,
    starts: int | None = None,
    out: Path | None = None,
    log: Callable[[str], None] = print,
) -> CommitsResult:
    """Find the first commit in GOOD..BAD at which ``cell`` fails (see the module's docstring)."""
    from ._cell import run_cell

    good_sha = _git(repo, "rev-parse", "--verify", f"{good}^{{commit}}")
    bad_sha = _git(repo, "rev-parse", "--verify", f"{bad}^{{commit}}")
    listed = _git(repo, "rev-list", "--reverse", "--ancestry-path", f"{good_sha}..{bad_sha}").split()
    if not listed:
        raise MatrixError(f"no commits between {good} and {bad}: GOOD must be an ancestor of BAD")
    subjects = {good_sha: _git(repo, "log", "-1", "--format=%s", good_sha)}
    for line in _git(repo, "log", "--format=%H %s", f"{good_sha}..{bad_sha}").splitlines():
        sha, _, subject = line.partition(" ")
        subjects[sha] = subject
    trial_starts = 2 if labels and set(labels) == {"nondeterministic"} else 1
    one = Matrix.from_dict({**matrix.to_dict(), "starts": trial_starts})
    ref_cell = matrix.reference_cell()
    trials_file = out / "trials.jsonl" if out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)

    refs: dict[str, dict[str, Any] | None] = {}

    def keep(rec: dict[str, Any], sha: str) -> None:
        rec["commit"] = sha
        if trials_file:
            with open(trials_file, "a") as f:
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")

    def trial(sha: str) -> tuple[list[str], bool]:
        """One trial on ``sha``: the verdicts it shows, and whether the commit could run the cell at all."""
        tree = builds.tree(sha)
        env = builds.env(tree)
        want = set(wanted())  # empty while BAD is first run: everything is looked for then
        if ref_cell is not None and (not want or "reply differs" in want) and sha not in refs:
            r = run_cell(
                Matrix.from_dict({**matrix.to_dict(), "starts": 1}),
                ref_cell,
                env=env,
                layouts=False,
                cwd=tree,
            )
            keep(r, sha)
            refs[sha] = (
                r if any(rq.get("status") == "ok" for st in r["starts"] for rq in st["requests"]) else None
            )
        rec = run_cell(one, cell, env=env, layouts=False, cwd=tree)
        keep(rec, sha)
        v = judge(rec, refs.get(sha), near_tie=matrix.near_tie, fail_on=matrix.fail_on)
        ran = "engine start failed" not in v.labels or "engine start failed" in want
        return [lb for lb in v.labels if lb in matrix.fail_on], ran

    def test(sha: str, n_starts: int, *, stop_at_bad: bool = True) -> CommitOutcome:
        o = CommitOutcome(commit=sha, subject=subjects.get(sha, ""), verdict="good")
        try:
            for _ in range(n_starts):
                seen, ran = trial(sha)
                if not ran:
                    return CommitOutcome(
                        commit=sha,
                        subject=o.subject,
                        verdict="skip",
                        why="its engine does not start with the cell's flags",
                    )
                o.starts += trial_starts
                o.labels = sorted(set(o.labels) | set(seen))
                if set(seen) & set(wanted()):
                    o.failing += trial_starts
                    o.verdict = "bad"
                    if stop_at_bad:
                        break
        except BuildError as e:
            return CommitOutcome(commit=sha, subject=o.subject, verdict="skip", why=str(e))
        return o

    label_box: list[str] = list(labels or [])

    def wanted() -> list[str]:
        return label_box

    # what is bisected and how often it shows: the cell's own record first, then starts on BAD
    k = n = 0
    if source is not None:
        found, k, n = source_rate(source, source_reference, matrix, label_box or None)
        label_box[:] = label_box or found
    log(f"running the cell {calibrate} times on BAD ({bad_sha[:12]}) to see how often it fails")
    cal = CommitOutcome(commit=bad_sha, subject=subjects[bad_sha], verdict="good")
    try:
        for _ in range(calibrate):
            seen, ran = trial(bad_sha)
            if not ran:
                raise MatrixError(f"BAD ({bad_sha[:12]}) cannot run the cell: its engine does not start")
            if not label_box:
                label_box += [lb for lb in seen if lb != "engine start failed" or len(seen) == 1]
            cal.starts += trial_starts
            if set(seen) & set(label_box):
                cal.failing += trial_starts
                cal.verdict = "bad"
            cal.labels = sorted(set(cal.labels) | set(seen))
    except BuildError as e:
        raise MatrixError(f"BAD ({bad_sha[:12]}) does not build: {e}") from None
    k += cal.failing
    n += cal.starts
    res = CommitsResult(
        good=good_sha,
        bad=bad_sha,
        cell_id=cell.cell_id,
        labels=list(label_box),
        rate=(k, n),
        starts_per_commit=0,
        miss=miss,
        why_starts="",
        subjects=subjects,
    )
    res.tested.append(cal)
    if not label_box or k == 0:
        res.error = (
            f"the cell does not fail on BAD ({bad_sha[:12]}): {cal.starts} of {cal.starts} starts pass"
            + (" here, although its record fails" if source is not None else "")
            + "; check the build command and the cell, or run more starts with --calibrate"
        )
        return _save(res, out)
    s, why = explain_starts(k, n, miss, max_starts)
    if starts is not None:
        s, why = starts, why + f" Given --starts {starts}: {starts} starts per commit."
    res.starts_per_commit, res.why_starts = s, why
    log(why)
    g = test(good_sha, s)
    res.tested.insert(0, g)
    if g.verdict == "bad":
        res.error = f"GOOD ({good_sha[:12]}) fails too ({', '.join(g.labels)}): pick an older GOOD"
        return _save(res, out)
    if g.verdict == "skip":
        res.error = f"GOOD ({good_sha[:12]}) cannot run the cell: {g.why}"
        return _save(res, out)
    # binary search: listed[hi] is bad; listed[lo] good (lo = -1: GOOD itself)
    lo, hi = -1, len(listed) - 1
    skipped: set[int] = set()
    while hi - lo > 1:
        inner = [i for i in range(lo + 1, hi) if i not in skipped]
        if not inner:
            break
        mid = (lo + hi) // 2
        mid = min(inner, key=lambda i: (abs(i - mid), i))
        log(f"testing {listed[mid][:12]} ({hi - lo - 1} commits left between good and bad)")
        o = test(listed[mid], s)
        res.tested.append(o)
        if o.verdict == "bad":
            hi = mid
        elif o.verdict == "good":
            lo = mid
        else:
            skipped.add(mid)
    between = [listed[i] for i in range(lo + 1, hi + 1)]
    if len(between) == 1:
        res.first_bad = between[0]
    else:
        res.candidates = between
    order = [good_sha, *listed]
    res.tested.sort(key=lambda t: (order.index(t.commit), t.starts))
    return _save(res, out)


def _save(res: CommitsResult, out: Path | None) -> CommitsResult:
    if out:
        (out / "bisect-commits.json").write_text(json.dumps(res.to_dict(), indent=1))
        (out / "bisect-commits.txt").write_text(res.text() + "\n")
    return res


def repo_root(start: Path) -> Path:
    top = _git(start, "rev-parse", "--show-toplevel")
    return Path(top)


def default_cache(repo: Path) -> Path:
    from platformdirs import user_cache_path

    common = Path(_git(repo, "rev-parse", "--git-common-dir"))
    if not common.is_absolute():
        common = (repo / common).resolve()
    return user_cache_path("repro_matrix") / "builds" / hashlib.sha1(str(common).encode()).hexdigest()[:12]
