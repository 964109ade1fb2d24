"""The ``repro_matrix`` command: run a matrix, merge shards, bisect a boundary or commits, report, plot.

    repro_matrix run MATRIX [--out DIR] [--jobs N] [--shard K/N] [--ray [ADDRESS]] [--resume DIR]
                            [--junit FILE] [--summary FILE]
    repro_matrix merge OUT DIR DIR... [--junit FILE] [--summary FILE]
    repro_matrix bisect DIR [--knob expert_cache] [--where KNOB=VALUE]
    repro_matrix bisect --commits GOOD..BAD CELL [--build CMD] [--calibrate N] [--miss P]
    repro_matrix report DIR [--output FILE]
    repro_matrix plot DIR [--output FILE]
    repro_matrix env

MATRIX is ``builtin`` (what ``make matrix`` runs), a TOML file, or ``-`` for a matrix declared by
flags alone (``--set knob=value``, ``--axis knob=v1,v2,A..B``, ``--model``). Exit statuses: 0 pass,
1 a cell failed, 2 usage, 3 incomplete, 130 interrupted (``repro_matrix._ci``)."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import Any

from strata._failure import add_debug_flag, run_command

from ._commits import BuildError
from ._matrix import MatrixError

__all__ = ["build_parser", "main"]


def _err(msg: str) -> int:
    print(f"repro_matrix: {msg}", file=sys.stderr)
    return 2


def _add_decl(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="a setting shared by every cell (also model=, starts=, max_tokens=, chunks=, lengths=)",
    )
    p.add_argument(
        "--axis",
        dest="axes",
        action="append",
        default=[],
        metavar="KNOB=V1,V2,A..B",
        help="sweep a knob over values and ranges",
    )
    p.add_argument("--model", help="preset name (tiny, small) or .gguf file")
    p.add_argument("--starts", type=int, help="engine starts per cell")
    p.add_argument("--max-tokens", type=int, help="tokens per reply (default 64)")


def _add_ci(p: argparse.ArgumentParser) -> None:
    p.add_argument("--junit", type=Path, metavar="FILE", help="write JUnit XML: one test case per cell")
    p.add_argument(
        "--summary", type=Path, metavar="FILE", help="append a Markdown summary (for $GITHUB_STEP_SUMMARY)"
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="repro_matrix",
        description="Sweep engine configurations, find the failing ones, write the report.",
        epilog="exit status: 0 pass, 1 a cell failed (or the matrix as a whole did), "
        "2 usage, 3 incomplete (cells without a result), 130 interrupted",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    r = sub.add_parser("run", help="run a matrix", description="Run every cell of a matrix.")
    r.add_argument("matrix", nargs="?", help="builtin, a TOML file, or - (flags only)")
    r.add_argument("--out", type=Path, help="run directory (default: matrix-out)")
    r.add_argument(
        "--jobs", type=int, default=1, help="cells at a time on this machine (within its cores/GPUs)"
    )
    r.add_argument("--shard", metavar="K/N", help="run the K-th of N shares of the cells")
    r.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="run cells as Ray tasks (a local cluster without ADDRESS; needs the ray extra)",
    )
    r.add_argument(
        "--resume", type=Path, metavar="DIR", help="finish the run in DIR, skipping finished cells"
    )
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--yes", action="store_true", help="run a matrix of more than 10,000 cells")
    _add_ci(r)
    _add_decl(r)
    r.set_defaults(func=cmd_run)

    b = sub.add_parser(
        "bisect",
        help="narrow a knob to the exact ranges where cells fail, or find the first bad commit (--commits)",
        description="Between neighbouring passing and failing values of a knob, run the values "
        "in between by bisection until every failing range has exact edges. With "
        "--commits GOOD..BAD CELL: build each candidate commit in a worktree of its "
        "own and name the first commit at which CELL fails, with enough engine "
        "starts per commit for a cell that fails only some of them.",
    )
    b.add_argument(
        "dir",
        help="run directory; with --commits, CELL: a run directory (its first failing "
        "cell, or DIR:CELL_ID), a TOML matrix of one cell, or - with --set",
    )
    b.add_argument("--commits", metavar="GOOD..BAD", help="bisect over the commits after GOOD up to BAD")
    b.add_argument("--cell", metavar="ID", help="with --commits: the cell (an id, or its first characters)")
    b.add_argument("--repo", type=Path, help="with --commits: the git repository (default: the one here)")
    b.add_argument(
        "--build",
        help="with --commits: the build command run in each worktree (default: cmake into strata/lib)",
    )
    b.add_argument("--cache", type=Path, help="with --commits: where the built worktrees are kept")
    b.add_argument(
        "--out", type=Path, help="with --commits: where trials and the answer go (default: matrix-bisect)"
    )
    b.add_argument(
        "--calibrate",
        type=int,
        default=3,
        metavar="N",
        help="with --commits: starts on BAD first, to measure how often the cell fails (default 3)",
    )
    b.add_argument(
        "--miss",
        type=float,
        default=0.01,
        help="with --commits: the chance to call a bad commit good that the starts per commit allow "
        "(default 0.01)",
    )
    b.add_argument(
        "--starts",
        dest="commit_starts",
        type=int,
        metavar="N",
        help="with --commits: starts per commit (default: computed from the failure rate)",
    )
    b.add_argument(
        "--max-starts", type=int, default=60, help="with --commits: at most this many starts per commit"
    )
    b.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="with --commits and CELL -: the cell's settings",
    )
    b.add_argument("--knob", default="expert_cache", help="the knob to bisect (whole-number values)")
    b.add_argument(
        "--where", action="append", default=[], metavar="KNOB=VALUE", help="only the groups with this setting"
    )
    b.add_argument("--fail-on", help="comma list of verdicts that count as failing (default: those seen)")
    b.add_argument("--jobs", type=int, default=1, help="boundaries searched at the same time")
    b.set_defaults(func=cmd_bisect)

    mg = sub.add_parser(
        "merge",
        help="combine the run directories of shards into one",
        description="Combine shard runs (--shard K/N) of one matrix into one run directory, print "
        "its table, and exit 1 on any failure the matrix does not expect (a CI gate).",
    )
    mg.add_argument("out", type=Path, help="the combined run directory")
    mg.add_argument(
        "dirs",
        type=Path,
        nargs="+",
        help="shard run directories (one that holds no run counts as a missing shard)",
    )
    _add_ci(mg)
    mg.set_defaults(func=cmd_merge)

    pl = sub.add_parser(
        "plot",
        help="draw the verdicts as a heat map (cache size x chunk)",
        description="Draw the run's verdicts as a heat map: expert-cache size across, the prompts' "
        "chunks up, one panel per value of the other swept knobs.",
    )
    pl.add_argument("dir", type=Path, help="run directory")
    pl.add_argument(
        "--output", "-o", type=Path, help="image to write, .png/.svg/.pdf (default: DIR/verdicts.png)"
    )
    pl.add_argument("--x", default="expert_cache", help="the knob across (default expert_cache)")
    pl.add_argument("--y", default="chunk", help="'chunk' (each prompt's chunk, the default) or a swept knob")
    pl.set_defaults(func=cmd_plot)

    rp = sub.add_parser("report", help="write the Markdown bug report of a run")
    rp.add_argument("dir", type=Path, help="run directory")
    rp.add_argument("--output", "-o", type=Path, help="file to write (default: DIR/report.md)")
    rp.add_argument("--print", dest="print_", action="store_true", help="also print the report")
    rp.set_defaults(func=cmd_report)

    e = sub.add_parser("env", help="print the environment section of a report")
    e.add_argument("--json", action="store_true", help="as JSON")
    e.add_argument("--no-scrub", action="store_true", help="print it as collected")
    e.set_defaults(func=cmd_env)
    add_debug_flag(p)
    return p


def _load(args: argparse.Namespace) -> Any:
    from ._matrix import load_matrix

    sets = list(args.sets)
    if args.model:
        sets.append(f"model={args.model}")
    if args.starts:
        sets.append(f"starts={args.starts}")
    if args.max_tokens:
        sets.append(f"max_tokens={args.max_tokens}")
    spec = args.matrix or ("-" if (args.sets or args.axes or args.model) else None)
    if spec is None:
        raise SystemExit(_err("give a matrix: builtin, a TOML file, or - with --set/--axis"))
    return load_matrix(spec, sets, args.axes)


def _print_table(out: Path, matrix: Any, records: list[dict[str, Any]]) -> tuple[int, int]:
    from ._table import build_table, markdown_table, save_table, summarize, verdicts

    df = build_table(records, matrix)
    save_table(df, out, verdicts(records, matrix))
    print(markdown_table(df))
    print(summarize(df))
    if df.empty:
        return 0, 0
    failing = int(df["failing"].sum())
    unexpected = int((df["failing"] & ~df["expected"]).sum())
    return failing, unexpected


def _expectation_gate(matrix: Any, failing: int, unexpected: int, whole: bool) -> str | None:
    """The problem when the matrix expects failures and none happened over the whole matrix: the harness
    no longer sees the failure it exists to find, a failure of its own for CI (like a strict xpass). A
    shard may hold none of the failing cells: there it is a note, and the merge of the shards decides."""
    if not matrix.expect_fail or failing != unexpected:
        return None
    what = "; ".join(", ".join(f"{k}={v}" for k, v in e.items()) for e in matrix.expect_fail)
    if not whole:
        print(
            f"note: the matrix expects failures ({what}) and none happened in this shard; the merge of the "
            "shards decides"
        )
        return None
    text = (
        f"the matrix expects failures ({what}) and none happened: the harness no longer sees the "
        "failure it exists to find (check the engine flags and the device the cells ran on, or drop "
        "expect_fail from the matrix)"
    )
    print(f"error: {text}")
    return text


def _finish(
    args: argparse.Namespace,
    out: Path,
    matrix: Any,
    records: list[dict[str, Any]],
    *,
    whole: bool,
    shard: str | None = None,
    missing: list[str] | None = None,
    problems: list[str] | None = None,
    incomplete: list[str] | None = None,
    what: str = "",
) -> int:
    """Print the table and the verdict line, write the CI files; the exit status (see ``_ci``)."""
    from ._ci import Gate, write_ci_files
    from ._table import verdicts

    failing, unexpected = _print_table(out, matrix, records)
    print(
        f"{len(records)} cells in {out}{what}; {failing} failing"
        + (f", {failing - unexpected} of them expected by the matrix" if failing - unexpected else "")
    )
    problems = list(problems or [])
    gate_problem = _expectation_gate(matrix, failing, unexpected, whole=whole)
    if gate_problem:
        problems.append(gate_problem)
    gate = Gate(
        matrix=matrix,
        records=records,
        verdicts=verdicts(records, matrix),
        missing=list(missing or []),
        problems=problems,
        incomplete=list(incomplete or []),
        shard=shard,
    )
    write_ci_files(gate, args.junit, args.summary)
    for label, path in (("JUnit", args.junit), ("summary", args.summary)):
        if path is not None:
            print(f"{label}: {path}", file=sys.stderr)
    return gate.exit_code


def cmd_run(args: argparse.Namespace) -> int:
    from ._matrix import MatrixError
    from ._runner import RunDir, RunOptions, run_matrix

    try:
        if args.resume:
            if args.matrix or args.sets or args.axes:
                return _err(
                    "--resume DIR runs the matrix saved in DIR; give no MATRIX or --set/--axis with it"
                )
            out = args.resume
            matrix = RunDir(out).matrix()
            if args.shard is None:  # a shard's resume finishes that shard, not the whole matrix
                args.shard = _shard_of_run(out)
        else:
            matrix = _load(args)
            out = args.out or Path("matrix-out")
        from ._matrix import MAX_CELLS_WITHOUT_YES

        size = matrix.size()
        print(f"{size:,} cells", file=sys.stderr)
        if size > MAX_CELLS_WITHOUT_YES and not args.yes:
            return _err(
                f"the matrix has {size:,} cells (more than {MAX_CELLS_WITHOUT_YES:,}); pass --yes to run "
                "them, or narrow its axes"
            )
        opts = RunOptions(
            out=out,
            jobs=args.jobs,
            shard=args.shard,
            ray=args.ray,
            resume=bool(args.resume),
            progress=not args.no_progress,
        )
        res = run_matrix(matrix, opts)
    except MatrixError as e:
        return _err(str(e))
    except KeyboardInterrupt:
        print(f"\ninterrupted; finished cells are kept: repro_matrix run --resume {out}", file=sys.stderr)
        return 130
    for n in res.notes:
        print(f"note: {n}", file=sys.stderr)
    if res.skipped:
        print(f"resumed: skipped {len(res.skipped)} finished cells, ran {len(res.ran)}", file=sys.stderr)
    shard = args.shard
    code = _finish(
        args, out, matrix, res.records, whole=not shard, shard=shard, what=f" ({len(res.ran)} run now)"
    )
    print(f"next: repro_matrix bisect {out}   |   repro_matrix report {out}")
    return code


def _shard_of_run(out: Path) -> str | None:
    from ._runner import RunDir, _shard_of

    return _shard_of(RunDir(out))


def _commit_cell(args: argparse.Namespace) -> tuple[Any, Any, dict[str, Any] | None, dict[str, Any] | None]:
    """CELL of ``bisect --commits``: (matrix, cell, its record or None, the reference's record or None)."""
    from ._matrix import Cell, MatrixError, load_matrix
    from ._runner import RunDir
    from ._table import verdicts

    spec, _, want = str(args.dir).partition(":") if not Path(args.dir).exists() else (str(args.dir), "", "")
    want = want or args.cell or ""
    rd = RunDir(spec)
    if rd.exists():
        matrix = rd.matrix()
        records = rd.records()
        for n in rd.notes:
            print(f"note: {n}", file=sys.stderr)
        ref = next((r for r in records if r["cell"].get("reference")), None)
        if want:
            hits = [r for r in records if r["cell_id"].startswith(want)]
            if len(hits) != 1:
                raise MatrixError(
                    f"{len(hits)} cells of {spec} have an id that starts with {want!r}; give more of it"
                )
            rec = hits[0]
        else:
            vs = verdicts(records, matrix)
            failing = [r for r in records if vs[r["cell_id"]].failing and not r["cell"].get("reference")]
            if not failing:
                raise MatrixError(f"no cell of {spec} fails; name the one to bisect with --cell ID")
            rec = failing[0]
        return matrix, Cell.from_dict(rec["cell"]), rec, ref
    matrix = load_matrix(spec, args.sets, [])
    cells = [c for c in matrix.cells() if not c.reference]
    if want:
        cells = [c for c in cells if c.cell_id.startswith(want)]
    if len(cells) != 1:
        raise MatrixError(
            f"{spec} declares {len(cells)} cells besides the reference; bisect one: --cell ID "
            f"({', '.join(c.cell_id for c in cells[:6])})"
        )
    return matrix, cells[0], None, None


def cmd_bisect_commits(args: argparse.Namespace) -> int:
    from ._ci import EXIT_INCOMPLETE
    from ._commits import DEFAULT_BUILD, Builds, bisect_commits, default_cache, repo_root
    from ._matrix import MatrixError

    good, sep, bad = args.commits.partition("..")
    if not sep or not good or not bad:
        return _err(f"--commits {args.commits!r}: write GOOD..BAD (two commits, tags or branches)")
    if (
        args.calibrate < 1
        or not 0 < args.miss < 1
        or (args.commit_starts is not None and args.commit_starts < 1)
    ):
        return _err("--calibrate and --starts need at least 1, --miss a probability between 0 and 1")
    try:
        repo = repo_root(args.repo or Path.cwd())
        matrix, cell, rec, ref = _commit_cell(args)
        fail_on = [x.strip() for x in args.fail_on.split(",")] if args.fail_on else None
        builds = Builds(
            repo,
            args.cache or default_cache(repo),
            args.build or DEFAULT_BUILD,
            log=lambda t: print(f"bisect: {t}", file=sys.stderr),
        )
        out = args.out or Path("matrix-bisect")
        res = bisect_commits(
            repo,
            good,
            bad,
            matrix,
            cell,
            builds=builds,
            labels=fail_on,
            source=rec,
            source_reference=ref,
            calibrate=args.calibrate,
            miss=args.miss,
            max_starts=args.max_starts,
            starts=args.commit_starts,
            out=out,
            log=lambda t: print(f"bisect: {t}", file=sys.stderr),
        )
    except MatrixError as e:
        return _err(str(e))
    print(res.text())
    print(f"(trials in {out}/trials.jsonl; the answer in {out}/bisect-commits.json)", file=sys.stderr)
    return 0 if res.first_bad else EXIT_INCOMPLETE


def cmd_bisect(args: argparse.Namespace) -> int:
    if args.commits:
        return cmd_bisect_commits(args)
    args.dir = Path(args.dir)
    from ._bisect import bisect_ranges, format_result, groups_of
    from ._cell import run_cell
    from ._matrix import Cell, MatrixError, _normalize
    from ._runner import RunDir
    from ._table import verdicts
    from ._verdict import judge

    rd = RunDir(args.dir)
    try:
        matrix = rd.matrix()
    except MatrixError as e:
        return _err(str(e))
    records = rd.records()
    for n in rd.notes:
        print(f"note: {n}", file=sys.stderr)
    knob = args.knob.replace("-", "_")
    others = [k for k in matrix.swept_knobs() if k != knob]
    where = {}
    for w in args.where:
        if "=" not in w:
            return _err(f"--where {w!r}: write KNOB=VALUE")
        k, v = w.split("=", 1)
        where[k.strip()] = _normalize(k.strip(), v.strip())

    def value_of(rec: dict[str, Any], k: str) -> Any:
        return Cell.from_dict(rec["cell"]).knob(k)

    vs = verdicts(records, matrix)
    reference = next((r for r in records if r["cell"].get("reference")), None)
    groups = groups_of(records, knob, others, value_of)
    lock = threading.Lock()
    results = []
    texts = []
    for key, recs in groups.items():
        group = dict(zip(others, key, strict=True))
        if any(str(group.get(k)) != str(v) for k, v in where.items()):
            continue
        seen = sorted({lb for r in recs for lb in vs[r["cell_id"]].labels if lb in matrix.fail_on})
        fail_on = [x.strip() for x in args.fail_on.split(",")] if args.fail_on else seen
        known = {
            int(str(value_of(r, knob))): any(lb in fail_on for lb in vs[r["cell_id"]].labels) for r in recs
        }
        labels = {int(str(value_of(r, knob))): vs[r["cell_id"]].label for r in recs}
        template = Cell.from_dict(recs[0]["cell"])
        by_id = {r["cell_id"]: r for r in records}

        def probe(
            v: int,
            template: Cell = template,
            fail_on: list[str] = fail_on,
            labels: dict[int, str] = labels,
            by_id: dict[str, Any] = by_id,
            key: tuple[Any, ...] = key,
        ) -> bool:
            settings = {**template.engine, **template.request, knob: _normalize(knob, v)}
            cell = Cell.make(settings, origin="bisect")
            with lock:
                rec = by_id.get(cell.cell_id)
            if rec is None:
                print(
                    f"bisect: running {knob}={v} ({', '.join(f'{k}={x}' for k, x in zip(others, key, strict=True))})",
                    file=sys.stderr,
                )
                rec = run_cell(matrix, cell)
                rec["backend"] = "local"
                rd.append(rec)
                with lock:
                    by_id[cell.cell_id] = rec
            verdict = judge(rec, reference, near_tie=matrix.near_tie, fail_on=matrix.fail_on)
            with lock:
                labels[v] = verdict.label
            return any(lb in fail_on for lb in verdict.labels)

        res = bisect_ranges(known, probe, knob=knob, group=group, jobs=max(1, args.jobs))
        results.append(res)
        texts.append(format_result(res, labels))
    if not results:
        return _err(
            f"no group of cells in {args.dir} has whole-number values of {knob}"
            + (f" with {where}" if where else "")
        )
    text = "\n".join(texts)
    print(text)
    (rd.path / "bisect.json").write_text(json.dumps([r.to_dict() for r in results], indent=1))
    (rd.path / "bisect.txt").write_text(text + "\n")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from ._matrix import MatrixError
    from ._runner import merge_runs

    try:
        res = merge_runs(args.out, args.dirs)
    except MatrixError as e:
        return _err(str(e))
    for n in res.notes:
        print(f"note: {n}", file=sys.stderr)
    incomplete = []
    for d in res.missing_runs:
        incomplete.append(f"{d} holds no run: a shard that did not run or whose results were not collected")
    if res.missing_shards:
        incomplete.append(
            f"shard {', '.join(res.missing_shards)} missing: no run directory given is that shard"
        )
    if res.missing_cells:
        incomplete.append(
            f"{len(res.missing_cells)} of the matrix's {len(res.matrix.cells())} cells have no result "
            "in these runs"
        )
    problems = [
        f"the reference cell replied otherwise in {d}: the shards' runners do not compute alike, so "
        "their cells cannot be compared with one reference"
        for d in res.reference_differs
    ]
    for text in problems:
        print(f"error: {text}", file=sys.stderr)
    code = _finish(
        args,
        args.out,
        res.matrix,
        res.records,
        whole=True,
        missing=res.missing_cells,
        problems=problems,
        incomplete=incomplete,
        what=f" from {len(args.dirs)} runs",
    )
    for text in incomplete:
        print(
            f"error: incomplete: {text}; the merged verdict covers only part of the matrix", file=sys.stderr
        )
    return code


def cmd_plot(args: argparse.Namespace) -> int:
    from ._matrix import ENGINE_KNOBS, REQUEST_KNOBS, MatrixError
    from ._plot import plot_verdicts
    from ._runner import RunDir

    rd = RunDir(args.dir)
    try:
        matrix = rd.matrix()
    except MatrixError as e:
        return _err(str(e))
    records = rd.records()
    for n in rd.notes:
        print(f"note: {n}", file=sys.stderr)
    for axis, knob in (("--x", args.x), ("--y", args.y)):
        if knob != "chunk" and knob not in ENGINE_KNOBS and knob not in REQUEST_KNOBS:
            return _err(
                f"{axis} {knob!r}: give a knob of the matrix ({', '.join(matrix.swept_knobs()) or 'none swept'})"
                + (" or chunk" if axis == "--y" else "")
            )
    try:
        path = plot_verdicts(matrix, records, args.output or rd.path / "verdicts.png", x=args.x, y=args.y)
    except ValueError as e:
        return _err(f"{args.dir}: {e}")
    print(f"heat map written to {path}", file=sys.stderr)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from ._matrix import MatrixError
    from ._report import write_report

    try:
        path, text, removed = write_report(args.dir, args.output)
    except MatrixError as e:
        return _err(str(e))
    if args.print_:
        print(text)
    print(f"report written to {path}", file=sys.stderr)
    _show_removed(removed)
    return 0


def _show_removed(removed: list[Any]) -> None:
    if not removed:
        print("scrubbed: nothing identifying was found", file=sys.stderr)
        return
    print("scrubbed (replaced in the report; check before sharing):", file=sys.stderr)
    for r in removed:
        print(f"  {r.kind:5s} {r.original!r} -> {r.placeholder} ({r.count}x)", file=sys.stderr)


def cmd_env(args: argparse.Namespace) -> int:
    from ._env import collect_env, env_markdown
    from ._scrub import Scrubber

    env = collect_env()
    text = json.dumps(env, indent=1) if args.json else env_markdown(env)
    if args.no_scrub:
        print(text)
        return 0
    clean, removed = Scrubber.for_this_machine().scrub(text)
    print(clean)
    _show_removed(removed)
    return 0


def main(argv: list[str] | None = None) -> int:
    # a failure is one paragraph (strata's rule; --debug or STRATA_DEBUG=1 shows the traceback), with exit
    # status 2 so that 1 keeps meaning "a cell failed"
    return run_command(build_parser(), argv, expected=(MatrixError, BuildError), code=2)


if __name__ == "__main__":
    sys.exit(main())
