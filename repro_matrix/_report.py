"""The bug report: what a maintainer needs to act, written from a run directory, scrubbed.

Sections: a title that names the failure and where it happens; setup (strata version and commit,
build flags, GPU and driver, CPU, RAM, OS, Python, the model and the matrix); what happens (the
engine's own message, exit codes, a log excerpt); the table; the boundaries ``bisect`` found; what was
expected; the shortest command that reproduces it; what was not run. Home folders, user and host
names, keys and IP addresses are replaced by placeholders, and the caller gets the list of what was
removed to show the user.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ._env import env_markdown
from ._matrix import Cell, Matrix
from ._runner import RunDir
from ._scrub import Removed, Scrubber
from ._table import _ranges, build_table, markdown_table, summarize, verdicts
from ._verdict import Verdict

__all__ = ["build_report", "expected_text", "write_report"]

# what should have happened, for each kind of failure (the report says those that happened)
_EXPECTED: dict[str, str] = {
    "engine start failed": (
        "The engine starts with these flags, or, when a budget cannot hold what the flags ask for, the server "
        "refuses at once with a message that names the budget, the bytes missing and the flag to change. "
        "A configuration the plan accepts never fails to open."
    ),
    "lend failed": (
        "Every request is served. A request whose chunk is at most the auto chunk gets a loan that holds "
        "its own chunk's layout, whatever that chunk's ring; when no loan can hold it, its chunk is halved "
        "for that request and the trace says so. No request ends in an error because a loan was sized for a "
        "different chunk."
    ),
    "engine exited": (
        "The engine process never exits while it serves a request: a request it cannot serve ends in an "
        "error reply that says why, and the engine goes on serving the next one."
    ),
    "request failed": (
        "Every request the matrix sends (token ids of the model's ordinary vocabulary, a prompt and reply "
        "that fit the context) is served with HTTP 200."
    ),
    "nondeterministic": (
        "Fresh engine starts with the same flags give the same reply to the same prompt, token for token "
        "(at temperature 0, and at any temperature with a fixed seed)."
    ),
    "reply differs": (
        "At temperature 0 every reply equals the reference cell's token for token, whatever the expert-cache "
        "size, chunk, lend policy or thread count: these knobs move bytes, not numbers. A difference at a "
        "near-tie (the reference's top-2 margin below the matrix's threshold) is still a difference, but "
        "one that a change in the order of float additions can explain."
    ),
}
_EXPECTED_ORDER = (
    "engine start failed",
    "lend failed",
    "engine exited",
    "request failed",
    "nondeterministic",
    "reply differs",
)
_NOTHING_FAILED = (
    "Every cell passes: every request served, and every reply equal to the reference cell's "
    "token for token. Nothing differs from what is expected."
)


def expected_text(labels: Sequence[str]) -> str:
    """The "Expected" section for the failures seen (in the order of _EXPECTED_ORDER)."""
    seen = [lb for lb in _EXPECTED_ORDER if lb in labels]
    if not seen:
        return _NOTHING_FAILED
    return "\n\n".join(f"**{lb}**: {_EXPECTED[lb]}" if len(seen) > 1 else _EXPECTED[lb] for lb in seen)


def _failing(df: pd.DataFrame) -> pd.DataFrame:
    """The failing cells, the matrix's first; the reference's own failure counts too."""
    bad = df[df["failing"]]
    return pd.concat([bad[bad["cell"] != "reference"], bad[bad["cell"] == "reference"]])


def _group_name(cell: Cell, knobs: Sequence[str]) -> str:
    return ", ".join(f"`{k}={cell.knob(k)}`" for k in knobs)


def _prompt_chunk(rec: dict[str, Any], k: int) -> tuple[int | None, int | None]:
    """(length, chunk) of prompt k: the chunk the plan gives it when recorded, else the declared one."""
    p: dict[str, Any] = next((p for p in rec.get("prompts", []) if p["index"] == k), {})
    n = p.get("length")
    pred = ((rec.get("layouts") or {}).get("predicted") or {}).get(str(n))
    if pred:
        return n, int(pred["chunk"])
    auto = (rec.get("plan") or {}).get("auto_chunk")
    chunk = p.get("chunk") or n
    return n, (min(chunk, auto) if chunk and auto else chunk)


def _below_auto(records: dict[str, dict[str, Any]], ids: Sequence[str]) -> bool:
    """Whether every failed request of these cells had a chunk below its cell's auto chunk."""
    seen = False
    for cid in ids:
        rec = records[cid]
        auto = (rec.get("plan") or {}).get("auto_chunk")
        for st in rec.get("starts", []):
            for r in st.get("requests", []):
                if r.get("status") == "ok" or r.get("error_code") not in ("lend_failed", "engine_exited"):
                    continue
                _, chunk = _prompt_chunk(rec, r["prompt"])
                if not auto or not chunk or chunk >= auto:
                    return False
                seen = True
    return seen


def _title(
    df: pd.DataFrame, knobs: Sequence[str], records: dict[str, dict[str, Any]], bisected: dict[str, str]
) -> str:
    bad = _failing(df)
    if bad.empty:
        return "No failures: every cell of the matrix passes"
    labels = [
        lb
        for lb in (
            "lend failed",
            "engine exited",
            "engine start failed",
            "request failed",
            "nondeterministic",
            "reply differs",
        )
        if bad["labels"].str.contains(lb, regex=False).any()
    ]
    what = {
        "lend failed": "requests fail (`lend failed`)",
        "engine exited": "the engine exits",
        "engine start failed": "the engine does not start",
        "request failed": "requests fail",
        "nondeterministic": "replies change between engine starts",
        "reply differs": "replies differ from the reference",
    }
    head = " and ".join(what[lb] for lb in labels[:2])
    others = [k for k in knobs if k != "expert_cache"]
    where = []
    for key, g in bad.groupby(others, sort=False) if others else [((), bad)]:
        key = key if isinstance(key, tuple) else (key,)
        name = ", ".join(f"{k}={v}" for k, v in zip(others, key, strict=True))
        all_sizes = df[(df["cell"] != "reference")]
        for k, v in zip(others, key, strict=True):
            all_sizes = all_sizes[all_sizes[k] == v]
        sizes = ""
        if name in bisected:
            sizes = f" at expert-cache sizes {bisected[name]}"
        elif "expert_cache" in g:
            sizes = (
                f" at expert-cache sizes {_ranges(list(g['expert_cache']), list(all_sizes['expert_cache']))}"
            )
        where.append(f"{name}{sizes}")
    short = ""
    if ("lend failed" in labels or "engine exited" in labels) and _below_auto(records, list(bad["cell_id"])):
        short = " for prompts whose chunk is below the auto chunk"
    return f"{head[0].upper()}{head[1:]}{short}: {'; '.join(where)}"


def _what_happens(
    records: dict[str, dict[str, Any]], df: pd.DataFrame, vs: dict[str, Verdict], knobs: Sequence[str]
) -> str:
    bad = _failing(df)
    out = [summarize(df)]
    if bad.empty:
        return "\n".join(out)
    # the first failing cell of each kind, with the engine's own words
    shown: set[str] = set()
    for _, row in bad.iterrows():
        v = vs[row["cell_id"]]
        if v.label in shown:
            continue
        shown.add(v.label)
        rec = records[row["cell_id"]]
        cell = Cell.from_dict(rec["cell"])
        end = "" if v.detail.endswith(("…", ".")) else "."
        out.append(f"**{v.label}** — first seen at {_group_name(cell, knobs)}: {v.detail}{end}\n")
        plan = rec.get("plan") or {}
        if plan:
            out.append(
                f"The plan: {plan.get('n_slots')} expert-cache slots of {plan.get('slot_bytes')} bytes, "
                f"auto chunk {plan.get('auto_chunk')} tokens with a ring of {plan.get('auto_ring_slots')} "
                f"slots, loan {plan.get('auto_loan_slots')} slots (at most {plan.get('max_lend_slots')}, "
                f"floor {plan.get('lend_floor')}), small-chunk threshold {plan.get('small_chunk')}.\n"
            )
        failed_start = next((st for st in rec.get("starts", []) if st.get("start_error")), None)
        if failed_start is not None and "engine start failed" in v.labels:
            code = failed_start.get("start_exit_code")
            when = (
                f" after {failed_start['start_s']:.1f} s" if failed_start.get("start_s") is not None else ""
            )
            out.append(
                f"Start {failed_start.get('start', 0)}: "
                + (
                    f"the server exited with exit code {code}{when}"
                    if code is not None
                    else "the engine did not come up"
                )
                + ". In its own words:\n"
            )
            words = failed_start.get("start_message") or failed_start["start_error"]
            out.append("```\n" + str(words).strip() + "\n```\n")
            if failed_start.get("log_tail"):
                tail = "\n".join(failed_start["log_tail"].splitlines()[-15:])
                out.append("Server log (last lines of that start):\n\n```\n" + tail + "\n```\n")
        failing_req = None
        for st in rec.get("starts", []):
            for r in st.get("requests", []):
                if r.get("status") != "ok":
                    failing_req = (st, r)
                    break
            if failing_req:
                break
        if failing_req:
            st, r = failing_req
            lay = (rec.get("layouts") or {}).get("layouts") or {}
            n, chunk = _prompt_chunk(rec, r["prompt"])
            need = lay.get(str(chunk)) if chunk else None
            out.append(
                f"Prompt {r['prompt']} ({n} tokens"
                + (f", chunk {chunk}" if chunk else "")
                + ")"
                + (
                    f", whose layout needs {need['slots_needed']} slots (ring {need['ring_slots']})"
                    if need
                    else ""
                )
                + f", got HTTP {r.get('http_status', '?')} `{r.get('error_code')}`:\n"
            )
            out.append("```\n" + (r.get("error_message") or "").strip() + "\n```\n")
            loan = plan.get("auto_loan_slots")
            if (
                need
                and loan is not None
                and need["slots_needed"] > loan
                and r.get("error_code") == "lend_failed"
            ):
                out.append(
                    f"The loan was sized for the auto chunk ({plan.get('auto_chunk')} tokens, ring "
                    f"{plan.get('auto_ring_slots')}): {loan} slots. This request's chunk gets the deeper "
                    f"ring ({need['ring_slots']} slots) and its layout needs {need['slots_needed']} slots, "
                    f"{need['slots_needed'] - loan} more than the loan, although the cache could lend "
                    f"{plan.get('max_lend_slots')}.\n"
                )
            if st.get("log_tail"):
                tail = "\n".join(st["log_tail"].splitlines()[-15:])
                out.append("Server log (last lines of that start):\n\n```\n" + tail + "\n```\n")
        if v.difference is not None:
            d = v.difference
            out.append(f"First difference: {d.describe()}.\n")
    return "\n".join(out)


def _shortest_command(records: dict[str, dict[str, Any]], df: pd.DataFrame, matrix: Matrix) -> str:
    bad = _failing(df)
    if bad.empty:
        return "Nothing to reproduce.\n"
    row = bad.iloc[0]
    rec = records[row["cell_id"]]
    cell = Cell.from_dict(rec["cell"])
    args = cell.config.to_cli_args()
    model_spec = rec.get("model_spec", matrix.model)
    is_preset = not str(model_spec).endswith(".gguf")
    model_arg = "MODEL.gguf" if is_preset else str(model_spec)
    lines = []
    if is_preset:
        lines.append(f"strata model make --preset {model_spec} --out MODEL.gguf")
    lines.append(shlex.join(["strata", "serve", "--model", model_arg, *args]))
    # the failing prompt: its length is all that matters (any ordinary tokens)
    failing = None
    for st in rec.get("starts", []):
        failing = next((r for r in st.get("requests", []) if r.get("status") != "ok"), None)
        if failing:
            break
    prompts = {p["index"]: p for p in rec.get("prompts", [])}
    n = prompts.get(failing["prompt"], {}).get("length") if failing else None
    text = "```sh\n" + "\n".join(lines) + "\n```\n"
    if n:
        body = (
            f'{{"prompt": [<{n} token ids>], "max_tokens": {cell.request["max_tokens"]}, '
            f'"temperature": {cell.request["temperature"]}}}'
        )
        text += (
            f"\nthen send a prompt of {n} tokens (any ordinary token ids) to it:\n\n"
            f"```sh\ncurl -s http://127.0.0.1:8080/v1/completions -H 'content-type: application/json' "
            f"-d '{body}'\n```\n"
        )
    one = ["repro_matrix", "run", "-", "--model", str(model_spec)]
    # the engine flags in their shortest form (sizes with units), as --set knob=value
    for flag, v in zip(args[::2], args[1::2], strict=True):
        one += ["--set", f"{flag[2:].replace('-', '_')}={v}"]
    for k, v in cell.request.items():
        from ._matrix import REQUEST_KNOBS

        if v != REQUEST_KNOBS[k]:
            one += ["--set", f"{k}={v}"]
    if n:
        one += ["--set", f"lengths={n}"]
    one += ["--set", f"starts={matrix.starts}"]
    text += "\nor, as a one-cell matrix that records everything:\n\n```sh\n" + shlex.join(one) + "\n```\n"
    return text


def _merge_info(rd: RunDir) -> dict[str, Any]:
    """What ``merge`` recorded in run.json about the shards it combined ({} for a run that was not merged)."""
    try:
        runs = json.loads((rd.path / "run.json").read_text())
    except (OSError, ValueError):
        return {}
    runs = runs if isinstance(runs, list) else [runs]
    return next((r for r in runs if isinstance(r, dict) and "merged_from" in r), {})


def _not_run(rd: RunDir, matrix: Matrix, records: Sequence[dict[str, Any]], env: dict[str, Any]) -> str:
    lines = []
    declared = {c.cell_id for c in matrix.cells()}
    have = {r["cell_id"] for r in records}
    missing = declared - have
    merged = _merge_info(rd)
    for d in merged.get("missing_runs") or []:
        lines.append(
            f"- `{d}` held no run when the shards were merged (a shard that did not run, or whose "
            "results were not collected)."
        )
    if merged.get("missing_shards"):
        lines.append(f"- Shard {', '.join(merged['missing_shards'])} missing from the merge.")
    if missing:
        lines.append(
            f"- {len(missing)} of the matrix's {len(declared)} cells have no result here (another "
            "shard, or an interrupted sweep: `repro_matrix run --resume DIR` finishes it)."
        )
    for note in rd.notes:
        lines.append(f"- {note}.")
    for d in merged.get("reference_differs") or []:
        lines.append(
            f"- The reference cell replied otherwise in {d}: the shards' runners do not compute alike."
        )
    if matrix.starts == 1:
        lines.append(
            "- One engine start per cell: whether a failure happens on every start was not measured "
            "(`starts = 3` measures it)."
        )
    ctx_capped = [
        p for r in records for p in r.get("prompts", []) if p.get("chunk") and p["length"] < p["chunk"] - 64
    ]
    if ctx_capped:
        caps = sorted({(p["chunk"], p["length"]) for p in ctx_capped})
        lines.append(
            "- Prompt chunks above the context were capped: "
            + ", ".join(f"{c} → {n} tokens" for c, n in caps)
            + "."
        )
    devices = {Cell.from_dict(r["cell"]).knob("device") for r in records}
    if "cuda" not in devices:
        gpu = env.get("gpu") or {}
        lines.append(
            "- The CUDA backend was not run"
            + (" (no GPU on this machine)." if not gpu.get("devices") else ".")
        )
    bis = rd.path / "bisect.json"
    if bis.is_file():
        for res in json.loads(bis.read_text()):
            if res.get("not_run"):
                group = ", ".join(f"{k}={v}" for k, v in res.get("group", {}).items())
                lines.append(
                    f"- {group}: {res['not_run']} values of {res['knob']} between those run were not "
                    "run (assumed to behave like their neighbours)."
                )
    else:
        lines.append("- The boundaries were not bisected (`repro_matrix bisect DIR --knob expert_cache`).")
    if not any(r["cell"].get("reference") for r in records):
        lines.append("- No reference cell: replies were not compared.")
    return "\n".join(lines) + "\n" if lines else "Everything declared was run.\n"


def _axis_text(values: Sequence[Any]) -> str:
    if all(str(v).isdigit() for v in values):
        return _ranges(values)
    return ", ".join(str(v) for v in values)


def build_report(out: str | Path) -> str:
    """The report's Markdown, before scrubbing."""
    rd = RunDir(out)
    matrix = rd.matrix()
    records_l = rd.records()
    records = {r["cell_id"]: r for r in records_l}
    env = rd.env()
    df = build_table(records_l, matrix)
    vs = verdicts(records_l, matrix)
    knobs = list(df.attrs.get("knobs", []))
    model_file = next((r.get("model") for r in records_l), None)
    bisected: dict[str, str] = {}
    if (rd.path / "bisect.json").is_file():
        for res in json.loads((rd.path / "bisect.json").read_text()):
            if res["knob"] == "expert_cache" and res["ranges"]:
                name = ", ".join(f"{k}={v}" for k, v in res["group"].items())
                bisected[name] = ", ".join(
                    f"{r['first']}..{r['last']}" if r["first"] != r["last"] else str(r["first"])
                    for r in res["ranges"]
                )
    parts = [f"# {_title(df, knobs, records, bisected) if not df.empty else 'No results'}\n"]
    n_fail = int(df["failing"].sum()) if not df.empty else 0
    parts.append(
        f"`repro_matrix` ran {len(records_l)} cells of the matrix `{matrix.name}`: {n_fail} failing.\n"
    )
    parts.append("## Setup\n")
    parts.append(env_markdown(env) if env else "- environment not recorded\n")
    prompt_parts = []
    if matrix.chunks:
        prompt_parts.append("prompts whose chunk rounds to " + ", ".join(map(str, matrix.chunks)) + " tokens")
    if matrix.lengths:
        prompt_parts.append("prompts of " + ", ".join(map(str, matrix.lengths)) + " tokens")
    prompt_desc = " and ".join(prompt_parts)
    shared = " ".join(Cell.make(dict(matrix.engine)).config.to_cli_args())
    req = Cell.make(dict(matrix.engine)).request
    parts.append(f"- **Model**: `{matrix.model}`" + (f" ({Path(model_file).name})" if model_file else ""))
    parts.append(
        f"- **Matrix**: `{matrix.name}`; shared flags `{shared or '(defaults)'}`; swept "
        + (", ".join(f"`{k}` = {_axis_text(v)}" for k, v in matrix.axes.items()) or "nothing")
        + f"; {matrix.starts} start(s) per cell; {prompt_desc} "
        f"(each with its own nonce), {req['max_tokens']} tokens at temperature {req['temperature']}, "
        "thinking off.\n"
    )
    parts.append("## What happens\n")
    parts.append(_what_happens(records, df, vs, knobs))
    parts.append("## The matrix\n")
    parts.append(markdown_table(df))
    bis = rd.path / "bisect.json"
    if bis.is_file():
        parts.append("## Boundaries\n")
        parts.append(
            "```\n" + (rd.path / "bisect.txt").read_text().strip() + "\n```\n"
            if (rd.path / "bisect.txt").is_file()
            else ""
        )
    parts.append("## Expected\n")
    contrast = ""
    if (
        not df.empty
        and "lend_policy" in df
        and n_fail
        and {"lend failed", "engine exited"}
        & {lb for cid in _failing(df)["cell_id"] for lb in vs[cid].labels}
    ):
        cur = df[(df["lend_policy"] == "current") & (df["cell"] != "reference")]
        if len(cur) and not cur["failing"].any():
            contrast = (
                f"\n\nThis is what the `current` lend policy does: all {len(cur)} of its cells pass"
                + (
                    ", and their replies equal the reference's token for token."
                    if any(r["cell"].get("reference") for r in records_l)
                    else "."
                )
            )
    seen_labels = sorted({lb for cid in _failing(df)["cell_id"] for lb in vs[cid].labels}) if n_fail else []
    parts.append(expected_text(seen_labels) + contrast + "\n")
    parts.append("## How to reproduce\n")
    parts.append(_shortest_command(records, df, matrix))
    parts.append("## What was not run\n")
    parts.append(_not_run(rd, matrix, records_l, env))
    return "\n".join(parts)


def write_report(
    out: str | Path, dest: str | Path | None = None, scrubber: Scrubber | None = None
) -> tuple[Path, str, list[Removed]]:
    """Write the scrubbed report (default ``DIR/report.md``); its path, text and what was removed."""
    text = build_report(out)
    clean, removed = (scrubber or Scrubber.for_this_machine()).scrub(text)
    path = Path(dest) if dest else Path(out) / "report.md"
    path.write_text(clean)
    return path, clean, removed
