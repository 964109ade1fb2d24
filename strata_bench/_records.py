"""Benchmark records: self-describing rows, appended to JSONL the moment they are measured.

A record is one measured test (``pp512``, ``tg128``, ``pp512 @ d4096``, or a server suite) of one
target under one configuration. It carries everything needed to read it a year later without the
command line that made it: the commit and whether the tree was dirty, the machine (GPU and driver,
CPU), the model and its quantization, every knob, the UTC time, the raw samples and their summary.

``RecordWriter.append`` writes one line, flushes and fsyncs it, so that a run stopped with Ctrl-C
(or killed) keeps every row it finished. ``read_records`` reads such a file back, skipping a torn
last line. ``flatten`` turns records into flat rows (``knobs.expert_cache``, ``metrics.hit_rate``)
for CSV, pandas and comparisons.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import os
import platform
import socket
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from strata import _environment

__all__ = [
    "SCHEMA",
    "RecordWriter",
    "base_record",
    "environment",
    "failed",
    "failed_record",
    "flatten",
    "git_state",
    "read_records",
    "summarize",
    "llama_test_name",
    "to_csv",
    "to_markdown",
    "utc_now",
    "work_of",
]

SCHEMA = 1


def utc_now() -> str:
    """The current UTC time as ISO 8601 with a trailing ``Z`` (seconds precision)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def llama_test_name(n_prompt: int, n_gen: int, n_depth: int = 0) -> str:
    """llama-bench's name for a test: ``pp512``, ``tg128``, ``pp512 @ d4096``."""
    if n_prompt > 0 and n_gen > 0:
        name = f"pp{n_prompt}+tg{n_gen}"
    elif n_prompt > 0:
        name = f"pp{n_prompt}"
    else:
        name = f"tg{n_gen}"
    return f"{name} @ d{n_depth}" if n_depth > 0 else name


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """mean, median, sample standard deviation (Bessel), min and max of the samples."""
    xs = [float(x) for x in samples]
    if not xs:
        nan = float("nan")
        return {"mean": nan, "median": nan, "stddev": nan, "min": nan, "max": nan}
    return {
        "mean": statistics.fmean(xs),
        "median": statistics.median(xs),
        "stddev": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        "min": min(xs),
        "max": max(xs),
    }


# ---- the machine and the tree -------------------------------------------------------------------


def git_state(path: str | os.PathLike[str] | None = None) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git tree that holds ``path`` (this package by default); (None, None) outside one.

    ``STRATA_BENCH_COMMIT`` (``COMMIT`` or ``COMMIT+dirty``) overrides it: for a copy of a tree whose git
    metadata is not its own (a tree sent to another machine without its history), the sender says which
    commit it is.
    """
    given = os.environ.get("STRATA_BENCH_COMMIT", "").strip()
    if given:
        commit, _, flag = given.partition("+")
        return commit, flag == "dirty"
    return _environment.git_state(Path(path) if path else Path(__file__).resolve().parent)


@functools.lru_cache(maxsize=1)
def environment() -> dict[str, Any]:
    """The fields that describe where a record was measured (computed once per process)."""
    from ._nvml import gpu_info

    commit, dirty = git_state()
    gpu = gpu_info()
    from strata import __version__ as version

    return {
        "commit": commit,
        "dirty": dirty,
        "version": version,
        "cpu": _environment.cpu_info()["model"],
        "n_cpu": os.cpu_count(),
        "gpu": gpu["name"] if gpu else None,
        "gpu_driver": gpu["driver"] if gpu else None,
        "gpu_memory_total": gpu["memory_total"] if gpu else None,
        "host": socket.gethostname(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def base_record(**fields: Any) -> dict[str, Any]:
    """A record with the schema version, the UTC time and the environment, updated by ``fields``."""
    rec: dict[str, Any] = {"schema": SCHEMA, "time_utc": utc_now()}
    rec.update(environment())
    try:
        # other work on the machine while this row was measured (a busy host widens the spread)
        rec["load_avg_1m"] = round(os.getloadavg()[0], 2)
    except OSError:
        rec["load_avg_1m"] = None
    rec.update(fields)
    return rec


def failed_record(error: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A record of a test that could not be measured: ``status`` is ``"failed"``, ``error`` says where
    (``phase``: opening the engine, a test, llama-bench, a server suite) and in whose words (``type``,
    ``status``, ``message``, ``flags``), and every knob is there as in a measured row. It has no samples
    and no summary, so tables show the cell as failed and ``compare`` gates fail on it."""
    nan = float("nan")
    return base_record(
        **fields,
        status="failed",
        error=error,
        samples=[],
        samples_ns=[],
        mean=nan,
        median=nan,
        stddev=nan,
        min=nan,
        max=nan,
    )


def work_of(record: dict[str, Any]) -> dict[str, Any]:
    """What a record's test did, besides the engine's knobs: ``record["work"]``.

    ``work`` holds every setting of the harness that changes the work (tokens generated, the effective
    context, the prompt set and its seed, concurrency and request rate for a server, ...). A record
    written before ``work`` existed gets what it did record at its top level (the test's token counts,
    the seed; a server row's ``n_gen``, its max tokens) and nothing else: a setting it never recorded
    stays missing, so ``compare`` cannot pair it with a row that has one by accident.
    """
    w = record.get("work")
    if isinstance(w, dict):
        return w
    legacy: dict[str, Any] = {}
    if record.get("kind") == "server":
        if record.get("n_gen") is not None:
            legacy["max_tokens"] = record["n_gen"]
    else:
        legacy.update({k: record[k] for k in ("n_prompt", "n_gen", "n_depth") if record.get(k) is not None})
    if record.get("seed") is not None:
        legacy["seed"] = record["seed"]
    return legacy


def failed(record: dict[str, Any]) -> bool:
    """Whether a record is of a test that failed (records written before ``status`` existed are measured)."""
    return record.get("status") == "failed"


# ---- writing and reading ------------------------------------------------------------------------


@dataclass
class RecordWriter:
    """Appends records to a JSONL file (or only keeps them in memory when ``path`` is None)."""

    path: Path | None
    rows: list[dict[str, Any]]

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path else None
        self.rows = []

    def append(self, record: dict[str, Any]) -> None:
        self.rows.append(record)
        if self.path is None:
            return
        line = json.dumps(_json_safe(record), sort_keys=False) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One write of one whole line, flushed and synced before the next test starts: an interrupted
        # run leaves only finished rows behind.
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def _json_safe(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if hasattr(x, "item") and callable(x.item):  # numpy scalars
        return _json_safe(x.item())
    return x


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Records of a JSONL file. A torn last line (a run killed mid-write) is skipped; a bad line elsewhere is an error."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such records file (write one with `strata-bench run --output {p}`)")
    lines = p.read_text(encoding="utf-8").splitlines()
    out: list[dict[str, Any]] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):
                break
            raise ValueError(
                f"{p}:{i}: not a JSON record ({e.msg}); is this a strata-bench JSONL file?"
            ) from None
        if not isinstance(rec, dict):
            raise ValueError(f"{p}:{i}: a record must be a JSON object")
        out.append(rec)
    return out


def flatten(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts become dotted keys (``knobs.expert_cache``); lists stay as they are."""
    flat: dict[str, Any] = {}
    for k, v in record.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(flatten(v, key + "."))
        else:
            flat[key] = v
    return flat


# ---- tables -------------------------------------------------------------------------------------


def to_markdown(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], align: Sequence[str] | None = None
) -> str:
    """A GitHub Markdown table; ``align`` holds ``l`` or ``r`` per column (numbers right by default)."""
    body = [["" if c is None else str(c) for c in r] for r in rows]
    if align is None:
        align = [
            "r" if body and all(_looks_numeric(r[i]) or r[i] in ("", "-") for r in body) else "l"
            for i in range(len(headers))
        ]
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(headers)]
    widths = [max(w, 3) for w in widths]

    def line(cells: Sequence[str]) -> str:
        return (
            "| "
            + " | ".join(
                c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(cells, widths, align, strict=False)
            )
            + " |"
        )

    rule = (
        "| "
        + " | ".join(
            ("-" * (w - 1) + ":") if a == "r" else "-" * w for w, a in zip(widths, align, strict=False)
        )
        + " |"
    )
    return "\n".join([line(list(headers)), rule] + [line(r) for r in body]) + "\n"


def _looks_numeric(s: str) -> bool:
    t = s.replace("±", " ").replace("%", " ").replace("x", " ").split()
    if not t:
        return True
    try:
        float(t[0].replace(",", ""))
    except ValueError:
        return False
    return True


def to_csv(records: Sequence[dict[str, Any]]) -> str:
    """Flat CSV of the records: one column per dotted field, raw samples joined by spaces."""
    flat = [flatten(r) for r in records]
    cols: list[str] = []
    for f in flat:
        for k in f:
            if k not in cols:
                cols.append(k)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for f in flat:
        w.writerow({k: " ".join(map(str, v)) if isinstance(v, list) else v for k, v in f.items()})
    return buf.getvalue()
