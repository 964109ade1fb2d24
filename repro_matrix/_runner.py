"""Running a matrix: a local pool, a shard of it, or Ray tasks; results appended as cells finish.

A run directory holds::

    matrix.json    the matrix as run (``--resume DIR`` needs nothing else)
    env.json       the environment of the first run (``_env.collect_env``); env-resumes.jsonl adds one
                   line per ``--resume``
    cells.jsonl    one record per finished cell, appended (and flushed) the moment it finishes
    run.json       how it was run: shard, jobs, backend, cells planned, UTC times

``--resume DIR`` reads ``cells.jsonl`` and runs only the cells that have no record yet (a line cut
short by a kill is ignored and rewritten; a complete last record without its newline is kept; a shard's
resume finishes that shard). ``--shard K/N`` runs every N-th cell starting at the K-th, so N runners
cover the matrix exactly once, and the reference cell in every shard (each compares with its own). ``--jobs N`` runs N cells at a time on this machine, at most
one per core (one per GPU on a CUDA matrix; each cell's server sees only its own GPU). ``--ray`` sends
each cell to a Ray cluster as a task (``num_gpus=1`` on a CUDA matrix).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from strata import _nvml

from ._cell import model_path, run_cell, stop_all_servers
from ._matrix import Cell, Matrix, MatrixError, parse_shard, shard_cells
from ._verdict import judge

__all__ = [
    "MergeResult",
    "RunDir",
    "RunOptions",
    "cards_needed",
    "gpu_count",
    "merge_runs",
    "plan_jobs",
    "run_matrix",
    "run_pool",
]


class RunDir:
    """A run directory: the matrix, the environment, and the cell records."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self.notes: list[str] = []  # problems found while reading (damaged lines), for the user

    @property
    def cells_file(self) -> Path:
        return self.path / "cells.jsonl"

    def exists(self) -> bool:
        return (self.path / "matrix.json").is_file()

    def matrix(self) -> Matrix:
        if not self.exists():
            raise MatrixError(f"{self.path} holds no run (no matrix.json); run one with --out {self.path}")
        f = self.path / "matrix.json"
        try:
            d = json.loads(f.read_bytes().decode("utf-8"))
        except (ValueError, OSError) as e:
            raise MatrixError(
                f"{f} cannot be read as the run's matrix ({e}); the run directory is damaged: "
                "run the matrix again into a new --out"
            ) from None
        if not isinstance(d, dict):
            raise MatrixError(
                f"{f} holds {type(d).__name__}, not a matrix; the run directory is damaged: run "
                "the matrix again into a new --out"
            )
        return Matrix.from_dict(d)

    def env(self) -> dict[str, Any]:
        """The first run's environment ({} when it was not recorded or cannot be read)."""
        f = self.path / "env.json"
        try:
            d = json.loads(f.read_bytes().decode("utf-8")) if f.is_file() else {}
        except (ValueError, OSError):
            self.notes.append(f"{f} cannot be read: the report's setup section is left out")
            return {}
        return d if isinstance(d, dict) else {}

    def records(self) -> list[dict[str, Any]]:
        """Every complete record, the last one per cell winning (a line cut short by a kill is skipped; a
        line that is JSON but no cell record is skipped with a note in ``notes``)."""
        out: dict[str, dict[str, Any]] = {}
        if not self.cells_file.is_file():
            return []
        data = self.cells_file.read_bytes()
        lines = data.split(b"\n")
        for n, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw.decode("utf-8"))
            except ValueError:
                if n < len(lines):  # a last line cut short by a kill is expected; another is damage
                    self._note(
                        f"{self.cells_file} line {n} is not JSON: skipped (--resume runs its cell again)"
                    )
                continue
            if not _is_record(rec):
                shown = raw[:60].decode("utf-8", "replace")
                self._note(
                    f"{self.cells_file} line {n} is not a cell record ({shown}): skipped (--resume runs its "
                    "cell again)"
                )
                continue
            out[rec["cell_id"]] = rec
        return list(out.values())

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def finished_ids(self) -> set[str]:
        return {r["cell_id"] for r in self.records()}

    def repair(self) -> None:
        """Make appends start on a line of their own: a last line that a kill cut short is dropped (its
        cell runs again), a complete last record that only lacks its newline is kept (its cell is done)."""
        if not self.cells_file.is_file():
            return
        data = self.cells_file.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            try:
                last = json.loads(data[cut:])
                complete = isinstance(last, dict) and "cell_id" in last
            except ValueError:
                complete = False
            self.cells_file.write_bytes(data + b"\n" if complete else data[:cut])

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock, open(self.cells_file, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def start(self, matrix: Matrix, env: dict[str, Any], run: dict[str, Any], *, resume: bool) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        if not resume and (self.cells_file.exists() or self.exists()):
            # an earlier run in the same place is kept, not overwritten
            stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
            keep = self.path / f"earlier-{stamp}"
            n = 1
            while keep.exists():
                n += 1
                keep = self.path / f"earlier-{stamp}-{n}"
            keep.mkdir()
            for name in (
                "matrix.json",
                "env.json",
                "env-resumes.jsonl",
                "cells.jsonl",
                "run.json",
                "table.csv",
                "table.jsonl",
                "table.md",
                "verdicts.jsonl",
                "bisect.json",
                "report.md",
            ):
                if (self.path / name).exists():
                    shutil.move(str(self.path / name), str(keep / name))
        (self.path / "matrix.json").write_text(json.dumps(matrix.to_dict(), indent=1))
        if resume and (self.path / "env.json").is_file():
            # the first run's environment stays what the report describes; each resume's is added
            with open(self.path / "env-resumes.jsonl", "a") as f:
                f.write(json.dumps(env, separators=(",", ":")) + "\n")
        else:
            (self.path / "env.json").write_text(json.dumps(env, indent=1))
        runs = []
        if resume and (self.path / "run.json").is_file():
            prev = json.loads((self.path / "run.json").read_text())
            runs = prev if isinstance(prev, list) else [prev]
        (self.path / "run.json").write_text(json.dumps([*runs, run], indent=1))
        self.repair()


def _is_record(rec: Any) -> bool:
    """A cell record as ``_cell.run_cell`` writes it (enough of it for the table and the verdicts)."""
    if not isinstance(rec, dict) or not isinstance(rec.get("cell_id"), str):
        return False
    cell = rec.get("cell")
    return (
        isinstance(cell, dict)
        and isinstance(cell.get("engine"), dict)
        and isinstance(cell.get("request"), dict)
        and isinstance(rec.get("starts", []), list)
    )


def gpu_count() -> int:
    return _nvml.device_count()


def _is_gpu_matrix(matrix: Matrix, cells: Sequence[Cell]) -> bool:
    return any(c.knob("device") in ("cuda", "auto") for c in cells) and gpu_count() > 0


def cards_needed(cell: Cell) -> int:
    """GPUs a cell takes while it runs: one, or for a layer split on CUDA the cards its ``gpus`` names,
    numbered from 0 among the cards the cell is given (``0,1``: two; ``0,0``: two plans on one card)."""
    if cell.knob("device") not in ("cuda", "auto") or cell.knob("split") != "layer":
        return 1
    return max(cell.config.split_devices()) + 1


def plan_jobs(jobs: int, matrix: Matrix, cells: Sequence[Cell]) -> tuple[int, list[str]]:
    """Cells at a time on this machine, within its cores (and GPUs on a CUDA matrix); notes on any cut.
    A CUDA cell that needs more cards than the machine has is an error before anything runs."""
    notes = []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = max(1, jobs)
    if n > cores:
        notes.append(f"--jobs {jobs} cut to {cores}: this machine has {cores} cores")
        n = cores
    if _is_gpu_matrix(matrix, cells):
        g = gpu_count()
        for c in cells:
            if cards_needed(c) > g:
                raise MatrixError(
                    f"cell {c.label(matrix.swept_knobs())} splits its layers over {cards_needed(c)} cards "
                    f"(gpus={c.knob('gpus')}) and this machine has {g}; run it on a machine with "
                    f"{cards_needed(c)} GPUs, or leave the cell out"
                )
        if n > g:
            notes.append(f"--jobs {n} cut to {g}: one cell per GPU")
            n = g
    return n, notes


def run_pool(
    cells: Sequence[Cell],
    jobs: int,
    cards: Sequence[int],
    run_one: Callable[[Cell, list[int] | None], dict[str, Any]],
    on_done: Callable[[dict[str, Any]], None],
) -> None:
    """Run cells ``jobs`` at a time. With ``cards`` (a CUDA matrix: the machine's GPUs) every running cell
    holds cards of its own: one, or ``cards_needed`` for a cell that splits its layers over several; the
    first queued cell that fits the free cards starts next, so a two-card cell waiting for a pair does not
    keep one-card cells from the cards that are free. ``run_one(cell, its cards or None)``."""
    free = list(cards)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        running: dict[Future[dict[str, Any]], list[int] | None] = {}
        queue = list(cells)
        while queue or running:
            while queue and len(running) < jobs:
                if not cards:
                    running[pool.submit(run_one, queue.pop(0), None)] = None
                    continue
                i = next((i for i, c in enumerate(queue) if cards_needed(c) <= len(free)), None)
                if i is None:
                    break  # the cells left wait for cards to come back
                cell = queue.pop(i)
                mine, free = free[: cards_needed(cell)], free[cards_needed(cell) :]
                running[pool.submit(run_one, cell, mine)] = mine
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in done:
                back = running.pop(fut)
                if back is not None:
                    free = sorted([*free, *back])
                on_done(fut.result())


@dataclass
class RunOptions:
    out: Path
    jobs: int = 1
    shard: str | None = None
    ray: str | None = None  # None: local pool; "" or "auto": ray.init() locally or the running cluster
    resume: bool = False
    progress: bool = True
    cell_env: dict[str, str] = field(default_factory=dict)


@dataclass
class RunResult:
    records: list[dict[str, Any]]
    ran: list[str]
    skipped: list[str]
    planned: list[str]
    notes: list[str]


class _Progress:
    """Cells done, failing so far, time left (rich, on stderr); silent when off."""

    def __init__(self, total: int, enabled: bool, title: str):
        self.total, self.done, self.failing = total, 0, 0
        self._bar = None
        if enabled and total:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("cells, [red]{task.fields[failing]} failing[/red], elapsed"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("left"),
                console=Console(stderr=True),
                transient=False,
            )
            self._task = self._bar.add_task(title, total=total, failing=0)
            self._bar.start()

    def advance(self, failing: bool, line: str | None = None) -> None:
        self.done += 1
        self.failing += int(failing)
        if self._bar is not None:
            self._bar.update(self._task, advance=1, failing=self.failing)
            if line:
                self._bar.console.print(line)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _ray_run(
    matrix: Matrix, cells: Sequence[Cell], address: str, on_done: Callable[[dict[str, Any]], None]
) -> None:
    try:
        import ray
    except ImportError:
        raise MatrixError("--ray needs Ray: pip install 'strata[ray]' (or pip install ray)") from None
    if not ray.is_initialized():
        if address in ("", "auto", "local"):
            ray.init(
                address=None if address in ("", "local") else "auto",
                include_dashboard=False,
                log_to_driver=False,
                ignore_reinit_error=True,
            )
        else:
            ray.init(address=address, log_to_driver=False, ignore_reinit_error=True)
    # a CUDA cell takes one of the cluster's GPUs (Ray sets CUDA_VISIBLE_DEVICES for it); the driver's
    # own machine may have none
    wants_gpu = any(c.knob("device") in ("cuda", "auto") for c in cells)
    cluster_gpus = float(ray.cluster_resources().get("GPU", 0))
    if any(c.knob("device") == "cuda" for c in cells) and cluster_gpus == 0:
        raise MatrixError(
            "the matrix runs cells on the CUDA backend and the Ray cluster has no GPU "
            f"({ray.cluster_resources()}); start its nodes with GPUs, or run the cells with --set device=cpu"
        )
    gpu = wants_gpu and cluster_gpus > 0
    # a cell that splits its layers over k cards asks Ray for k GPUs (Ray makes those visible to it)
    remotes: dict[int, Any] = {}
    pending = []
    for c in cells:
        k = cards_needed(c) if gpu else 0
        if k not in remotes:
            remotes[k] = ray.remote(num_gpus=k, num_cpus=1, max_retries=0)(_ray_cell)
        pending.append(remotes[k].remote(matrix.to_dict(), c.to_dict()))
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            on_done(ray.get(ref))


def _ray_cell(matrix_d: dict[str, Any], cell_d: dict[str, Any]) -> dict[str, Any]:
    # runs in a Ray worker: Ray sets CUDA_VISIBLE_DEVICES to the task's GPU, the server inherits it
    rec = run_cell(Matrix.from_dict(matrix_d), Cell.from_dict(cell_d))
    rec["backend"] = "ray"
    return rec


def run_matrix(
    matrix: Matrix,
    opts: RunOptions,
    *,
    env_info: dict[str, Any] | None = None,
    extra_cells: Sequence[Cell] = (),
) -> RunResult:
    """Run a matrix (or the rest of it) into ``opts.out``; the records of every finished cell."""
    from ._env import collect_env

    rd = RunDir(opts.out)
    if opts.resume:
        if not rd.exists():
            raise MatrixError(f"--resume {opts.out}: no run there (no matrix.json)")
        matrix = rd.matrix()
    all_cells = [*matrix.cells(), *extra_cells]
    planned = shard_cells(all_cells, opts.shard)
    finished = rd.finished_ids() if opts.resume else set()
    todo = [c for c in planned if c.cell_id not in finished]
    skipped = [c.cell_id for c in planned if c.cell_id in finished]
    gpu = _is_gpu_matrix(matrix, todo)
    jobs, notes = plan_jobs(opts.jobs, matrix, todo) if opts.ray is None else (opts.jobs, [])
    run_info = {
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "shard": opts.shard,
        "jobs": jobs,
        "backend": "ray" if opts.ray is not None else "local",
        "ray_address": opts.ray,
        "resume": opts.resume,
        "planned": [c.cell_id for c in planned],
        "skipped": skipped,
        "total_cells": len(all_cells),
    }
    if todo:
        try:  # a bad model path fails here, once, not in every cell; a preset is made before the pool starts
            model_path(matrix.model)
        except (FileNotFoundError, ValueError) as e:
            raise MatrixError(f"model {matrix.model!r}: {e}") from None
    rd.start(matrix, env_info if env_info is not None else collect_env(), run_info, resume=opts.resume)
    reference = next((r for r in rd.records() if r["cell"].get("reference")), None)
    ran: list[str] = []
    prog = _Progress(len(todo), opts.progress, matrix.name)
    lock = threading.Lock()

    def on_done(rec: dict[str, Any]) -> None:
        nonlocal reference
        rd.append(rec)
        with lock:
            ran.append(rec["cell_id"])
            if rec["cell"].get("reference"):
                reference = rec
            v = judge(rec, reference, near_tie=matrix.near_tie, fail_on=matrix.fail_on)
        prog.advance(
            v.failing,
            f"{Cell.from_dict(rec['cell']).label(matrix.swept_knobs())}: {v.detail}" if v.failing else None,
        )

    # the reference first: the others are compared with it as they finish
    todo.sort(key=lambda c: not c.reference)
    try:
        if opts.ray is not None:
            _ray_run(matrix, todo, opts.ray, on_done)
        elif jobs == 1:
            for c in todo:
                # one at a time: a split cell gets the first cards it names (CUDA_VISIBLE_DEVICES left to it)
                on_done(_local_cell(matrix, c, None, opts.cell_env))
        else:
            cards = list(range(gpu_count())) if gpu else []
            run_pool(todo, jobs, cards, lambda c, mine: _local_cell(matrix, c, mine, opts.cell_env), on_done)
    except BaseException:
        stop_all_servers()
        raise
    finally:
        prog.close()
    records = rd.records()
    return RunResult(
        records=records,
        ran=ran,
        skipped=skipped,
        planned=[c.cell_id for c in planned],
        notes=[*notes, *rd.notes],
    )


def _local_cell(
    matrix: Matrix, cell: Cell, cards: list[int] | None, cell_env: dict[str, str]
) -> dict[str, Any]:
    env = {**os.environ, **cell_env}
    if cards is not None:  # the cell's cards, which it numbers 0, 1, ... (its --gpus)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in cards)
    t = time.monotonic()
    rec = run_cell(matrix, cell, env=env)
    rec["backend"] = "local"
    rec["queue_s"] = time.monotonic() - t - rec.get("wall_s", 0)
    return rec


@dataclass
class MergeResult:
    """What ``merge_runs`` found: the matrix, every record, and what keeps the merge from being whole."""

    matrix: Matrix
    records: list[dict[str, Any]]
    missing_cells: list[str]  # ids of the matrix's cells with no record in any run
    missing_runs: list[
        str
    ]  # directories given that hold no run (a shard that never ran or was not collected)
    missing_shards: list[str]  # "K/N" of the shards no directory holds, when the runs were shards of N
    reference_differs: list[str]  # shards whose reference replied otherwise than the first shard's
    notes: list[str]

    @property
    def complete(self) -> bool:
        return not (self.missing_cells or self.missing_runs or self.missing_shards)


def _shard_of(rd: RunDir) -> str | None:
    try:
        runs = json.loads((rd.path / "run.json").read_text())
    except (OSError, ValueError):
        return None
    runs = runs if isinstance(runs, list) else [runs]
    last = runs[-1] if runs and isinstance(runs[-1], dict) else {}
    return last.get("shard")


def merge_runs(out: str | Path, dirs: Sequence[str | Path]) -> MergeResult:
    """Combine runs of one matrix (its shards) into ``out``.

    A directory that holds no run counts as a missing shard (the merge goes on with the others and says
    so); so do the shards K/N that none of the runs is, and every cell without a record. The reference
    cell, which every shard runs, must reply alike in all of them: the merged verdicts compare every cell
    with the first shard's reference.
    """
    from ._verdict import compare_replies

    runs = [RunDir(d) for d in dirs]
    present = [r for r in runs if r.exists()]
    missing_runs = [str(r.path) for r in runs if not r.exists()]
    if not present:
        raise MatrixError(
            "none of " + ", ".join(map(str, dirs)) + " holds a run (no matrix.json): nothing to "
            "merge; the shards did not run, or their directories were not collected"
        )
    matrices = [r.matrix() for r in present]
    first = matrices[0]
    for r, m in zip(present[1:], matrices[1:], strict=True):
        if m.to_dict() != first.to_dict():
            raise MatrixError(
                f"{r.path} ran another matrix than {present[0].path}; only shards of one matrix merge"
            )
    shards = [_shard_of(r) for r in present]
    missing_shards: list[str] = []
    ns = {parse_shard(s)[1] for s in shards if s}
    if len(ns) == 1:
        n = ns.pop()
        have = {parse_shard(s)[0] for s in shards if s}
        missing_shards = [f"{k}/{n}" for k in range(1, n + 1) if k not in have]
    dest = RunDir(out)
    env = present[0].env()
    info = {
        "merged_from": [str(d) for d in dirs],
        "shards": shards,
        "missing_runs": missing_runs,
        "missing_shards": missing_shards,
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    dest.start(first, env, info, resume=False)
    seen: dict[str, dict[str, Any]] = {}
    differs: list[str] = []
    first_ref: tuple[str, dict[str, Any]] | None = None
    for r, shard in zip(present, shards, strict=True):
        for rec in r.records():
            if rec["cell"].get("reference"):
                name = f"{r.path}" + (f" (shard {shard})" if shard else "")
                if first_ref is None:
                    first_ref = (name, rec)
                else:
                    d = compare_replies(rec, first_ref[1], near_tie=first.near_tie)
                    if d is not None:
                        differs.append(f"{name}: {d.describe(first_ref[0])}")
            if rec["cell_id"] not in seen:
                seen[rec["cell_id"]] = rec
                dest.append(rec)
    missing = [c.cell_id for c in first.cells() if c.cell_id not in seen]
    info["missing_cells"] = missing
    info["reference_differs"] = differs
    (dest.path / "run.json").write_text(json.dumps([info], indent=1))
    notes = [n for r in present for n in r.notes]
    return MergeResult(
        matrix=first,
        records=dest.records(),
        missing_cells=missing,
        missing_runs=missing_runs,
        missing_shards=missing_shards,
        reference_differs=differs,
        notes=notes,
    )
