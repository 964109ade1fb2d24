"""``strata-bench``: measure strata and its peers side by side.

    strata-bench run --model FILE -p 512,4096 -n 128 -d 0,4096 -r 5 --expert-cache 64,128 \\
                     --target strata --target llama.cpp --output runs.jsonl
    strata-bench run --target openai:http://127.0.0.1:8080 --suite short,long,agentic
    strata-bench serve-bench --url http://127.0.0.1:8080 --suite short --max-concurrency 1,4,16
    strata-bench compare old.jsonl new.jsonl --fail-if tg128:-5%
    strata-bench plot runs.jsonl --out plots/
    strata-bench show runs.jsonl --format md

Every engine flag of ``strata`` is accepted, and a comma list sweeps it (``--threads 1,2``). Records
are appended to the output file as each test finishes, so an interrupted run keeps its rows.
"""

from __future__ import annotations

import argparse
import functools
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata._failure import add_debug_flag, run_command

__all__ = ["build_parser", "exit_process", "main"]


def _add_output_args(p: argparse.ArgumentParser, default_output: bool = True) -> None:
    p.add_argument(
        "--output",
        "-O",
        metavar="FILE.jsonl",
        help="append records here" + (" (default: results/bench-<UTC time>.jsonl)" if default_output else ""),
    )
    p.add_argument(
        "--format",
        "-f",
        default="table",
        choices=["table", "md", "csv", "jsonl"],
        help="what to print when done (default: table)",
    )


def _add_server_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server benchmark")
    g.add_argument("--suite", default="short", help="comma list of short, long, agentic (default: short)")
    g.add_argument(
        "--requests",
        type=int,
        help="requests per suite step (short: 8, long: 1 per length, agentic: 1 conversation)",
    )
    g.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request (default 64)")
    g.add_argument("--turns", type=int, default=6, help="turns of an agentic conversation (default 6)")
    g.add_argument("--api-key", help="bearer token for the server")
    g.add_argument("--server-model", help="model name to request (default: the first of /v1/models)")
    g.add_argument("--server-context", type=int, help="the server's context in tokens, when it does not say")
    g.add_argument("--timeout", type=float, default=900.0, help="seconds one request may take (default 900)")
    g.add_argument(
        "--max-concurrency",
        type=_concurrency_list,
        default=[1],
        metavar="N,...",
        help="requests in flight at most; a comma list runs every suite at each (inf: no limit; default 1)",
    )
    g.add_argument(
        "--request-rate",
        type=_rate_list,
        default=[None],
        metavar="R,...",
        help="requests per second, arriving as a seeded Poisson process; a comma list runs each "
        "(default inf: all at once, as fast as the concurrency lets them)",
    )


def _concurrency_list(text: str) -> list[int | None]:
    out: list[int | None] = []
    for t in (x.strip() for x in text.split(",")):
        if t.lower() in ("inf", "unlimited", "none"):
            out.append(None)
        elif t.isdigit() and int(t) >= 1:
            out.append(int(t))
        else:
            raise argparse.ArgumentTypeError(
                f"--max-concurrency: {t!r} is not a count of at least 1 or 'inf'"
            )
    return out


def _rate_list(text: str) -> list[float | None]:
    out: list[float | None] = []
    for t in (x.strip() for x in text.split(",")):
        try:
            v = float(t)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--request-rate: {t!r} is not a number of requests per second"
            ) from None
        if v != v or v <= 0:
            raise argparse.ArgumentTypeError(f"--request-rate: {t!r} must be above 0 (inf: all at once)")
        out.append(None if v == float("inf") else v)
    return out


def _n_cpu_moe_list(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",")]
    for t in items:
        if t != "auto" and not t.isdigit():
            raise argparse.ArgumentTypeError(f"--llama-n-cpu-moe: {t!r} is not a layer count or 'auto'")
    return items


def _ubatch_list(text: str) -> list[int]:
    try:
        out = [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--llama-ubatch {text!r}: a comma list of token counts") from None
    if not out or any(v < 1 for v in out):
        raise argparse.ArgumentTypeError(f"--llama-ubatch {text!r}: micro-batches are at least 1 token")
    return out


def build_parser() -> argparse.ArgumentParser:
    from ._grid import add_grid_engine_args, int_list

    p = argparse.ArgumentParser(
        prog="strata-bench",
        description="Benchmark strata and its peers side by side.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    r = sub.add_parser(
        "run",
        help="run benchmarks (engine through the binding, llama.cpp, or a server)",
        description="Run llama-bench-style tests on strata and its peers; a server with --target openai:URL.",
    )
    m = r.add_argument_group("model")
    m.add_argument("--model", "-m", help="GGUF file (default: the preset's synthetic model)")
    m.add_argument(
        "--preset", default="tiny", help="synthetic model preset when --model is not given (default: tiny)"
    )
    m.add_argument("--quant", help="quantization of the preset model")
    t = r.add_argument_group("tests")
    t.add_argument(
        "--target",
        action="append",
        metavar="strata|llama.cpp|openai:URL",
        help="what to measure; repeat to compare (default: strata)",
    )
    t.add_argument("-p", "--n-prompt", type=int_list, default=[512], help="prompt lengths (default 512)")
    t.add_argument("-n", "--n-gen", type=int_list, default=[128], help="tokens to generate (default 128)")
    t.add_argument("-d", "--n-depth", type=int_list, default=[0], help="context already filled (default 0)")
    t.add_argument(
        "-r",
        "--repetitions",
        type=int,
        default=5,
        help="timed repetitions per test (default 5, at least 5 advised)",
    )
    t.add_argument("--warmup", type=int, default=1, help="untimed runs before each test (default 1)")
    t.add_argument(
        "--seed", type=int, default=0, help="seed of the random tokens and of sampling (default 0)"
    )
    t.add_argument("--llama-bench", metavar="PATH", help="llama.cpp's llama-bench (default: the one on PATH)")
    t.add_argument(
        "--llama-args",
        default="",
        metavar="'FLAGS'",
        help="more llama-bench flags for every llama.cpp run, e.g. '-ub 4096 -b 4096' (recorded in each row)",
    )
    t.add_argument(
        "--llama-n-cpu-moe",
        type=_n_cpu_moe_list,
        metavar="N,...",
        help="GPU runs: llama.cpp's --n-cpu-moe (experts of the first N layers on the host, -ngl 99), one "
        "value per --vram-budget value in the same order, or 'auto' for the value whose estimated device "
        "memory fits that budget (the default); with no --vram-budget, every value runs and 0 pairs "
        "with strata's all-resident rows",
    )
    t.add_argument(
        "--llama-ubatch",
        type=_ubatch_list,
        default=[512, 4096],
        metavar="U,...",
        help="llama.cpp micro-batches for prompts: the first runs every test, each other one runs the prompts "
        "longer than the first again with -ub U -b U (halved while it does not fit the budget or the device), "
        "and strata is paired with the faster (default 512,4096)",
    )
    _add_output_args(r)
    _add_server_args(r)
    add_grid_engine_args(r)
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("serve-bench", help="benchmark an OpenAI-compatible server (TTFT, TPOT, ITL, latency)")
    s.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8080")
    s.add_argument("--seed", type=int, default=0)
    _add_output_args(s)
    _add_server_args(s)
    s.set_defaults(func=cmd_serve_bench)

    c = sub.add_parser(
        "compare",
        help="compare two record files; gates fail the command",
        description="Match rows of OLD and NEW by key fields, print new/old ratios, apply gates.",
    )
    c.add_argument("old")
    c.add_argument("new")
    c.add_argument(
        "--key",
        default="target,model,quant,test,knobs,work",
        help="fields that identify a row; 'knobs' stands for every engine knob and 'work' for every setting "
        "of the work (tokens, context, prompt set, concurrency, ...) (default: %(default)s)",
    )
    c.add_argument(
        "--fail-if",
        action="append",
        default=[],
        metavar="[FIELD@]TEST:±X%",
        help="gate, e.g. tg128:-5%% (the median t/s fell significantly and by more than 5%%) or "
        "metrics.ttft_ms.p90@short:+10%%",
    )
    c.add_argument(
        "--assume",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="rows that lack a key field were measured with VALUE (records older than the field), "
        "e.g. work.max_tokens=64",
    )
    c.add_argument(
        "--ignore", action="append", default=[], metavar="FIELD", help="take a field out of the key"
    )
    c.add_argument("--confidence", type=float, default=0.95, help="of the bootstrap interval (default 0.95)")
    c.add_argument("--bootstrap", type=int, default=10_000, help="bootstrap resamples (default 10000)")
    c.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default 0)")
    c.add_argument("--format", "-f", default="table", choices=["table", "md"])
    c.set_defaults(func=cmd_compare)

    pl = sub.add_parser("plot", help="PNG charts: tokens/s vs prompt length, hit rate vs cache size")
    pl.add_argument("files", nargs="+", metavar="FILE.jsonl")
    pl.add_argument("--out", default="plots", help="folder for the PNG files (default: plots)")
    pl.set_defaults(func=cmd_plot)

    sh = sub.add_parser("show", help="print the tables of record files")
    sh.add_argument("files", nargs="+", metavar="FILE.jsonl")
    sh.add_argument("--format", "-f", default="table", choices=["table", "md", "csv", "jsonl"])
    sh.set_defaults(func=cmd_show)
    add_debug_flag(p)
    return p


# ---- output -------------------------------------------------------------------------------------


def _header(records: Sequence[dict[str, Any]]) -> str:
    if not records:
        return ""
    r = records[0]
    commit = (r.get("commit") or "unknown")[:10] + (" (dirty)" if r.get("dirty") else "")
    gpu = f"{r['gpu']} (driver {r.get('gpu_driver')})" if r.get("gpu") else "no GPU"
    models = sorted({f"{x.get('model')} ({x.get('quant') or '?'})" for x in records})
    peers = sorted(
        {
            f"llama.cpp {x['peer'].get('build_commit')} ({x['peer'].get('backends')})"
            for x in records
            if x.get("peer")
        }
    )
    loads = [x["load_avg_1m"] for x in records if x.get("load_avg_1m") is not None]
    load = f" · load {min(loads):.1f}-{max(loads):.1f}" if loads else ""
    line = f"strata {commit} · {r.get('cpu')} ×{r.get('n_cpu')}{load} · {gpu} · {', '.join(models)}"
    return line + (" · " + ", ".join(peers) if peers else "")


def _print_records(records: Sequence[dict[str, Any]], fmt: str) -> None:
    import json

    from ._records import _json_safe, _looks_numeric, to_csv
    from ._tables import tables

    if fmt == "jsonl":
        for rec in records:
            print(json.dumps(_json_safe(rec)))
        return
    if fmt == "csv":
        sys.stdout.write(to_csv(records))
        return
    if fmt == "md" or not sys.stdout.isatty():
        print(_header(records) + "\n")
        for t in tables(records):
            print(f"**{t.title}**\n\n{t.markdown()}")
        return
    from rich.console import Console
    from rich.table import Table as RichTable

    console = Console()
    console.print(_header(records), style="dim", highlight=False)
    for t in tables(records):
        rt = RichTable(title=t.title, title_justify="left", show_lines=False)
        for i, h in enumerate(t.headers):
            numeric = all(_looks_numeric(row[i]) or row[i] in ("", "-") for row in t.rows)
            rt.add_column(h, justify="right" if numeric else "left")
        for row in t.rows:
            rt.add_row(*row, style="bold" if row and row[0].startswith("strata /") else None)
        console.print(rt)


def _progress() -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )


def _default_output() -> Path:
    from datetime import datetime, timezone

    return Path("results") / f"bench-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.jsonl"


def _err(msg: str) -> None:
    print(f"strata-bench: {msg}", file=sys.stderr)


# ---- commands -----------------------------------------------------------------------------------


def _parse_targets(raw: list[str] | None) -> list[str]:
    targets = raw or ["strata"]
    for t in targets:
        if t not in ("strata", "llama.cpp") and not t.startswith("openai:"):
            raise ValueError(
                f"--target {t!r}: use strata, llama.cpp or openai:URL (e.g. openai:http://127.0.0.1:8080)"
            )
    return targets


def _run_server(
    args: argparse.Namespace, url: str, on_record: Callable[[dict[str, Any]], None], prog: Any = None
) -> int:
    from ._server_bench import Load, run_suites

    suites = [s.strip() for s in args.suite.split(",") if s.strip()]
    loads = [Load(c, r) for c in args.max_concurrency for r in args.request_rate]
    if prog is None:
        with _progress() as own:
            return _run_server(args, url, on_record, own)
    task = prog.add_task(f"server {url}", total=None)
    return run_suites(
        url,
        suites,
        on_record,
        requests=args.requests,
        max_tokens=args.max_tokens,
        seed=args.seed,
        api_key=args.api_key,
        model=args.server_model,
        max_context=args.server_context,
        turns=args.turns,
        timeout=args.timeout,
        loads=loads,
        advance=lambda k: prog.advance(task, k),
        set_total=lambda n: prog.update(task, total=n),
    )


@dataclass
class _PeerRun:
    """One llama.cpp setting: the strata configuration it mirrors and llama.cpp's own settings.

    ``candidates`` are (micro-batch, --n-cpu-moe) pairs tried in order until one runs (a large micro-batch
    that does not fit is halved); a micro-batch of None is llama-bench's default (``-ub 512 -b 2048``)."""

    cfg: Any  # EngineConfig
    knobs: dict[str, Any]  # of the first candidate
    after: int  # run it right after this strata configuration (index), so pairs finish together
    candidates: list[tuple[int | None, int | None]]
    prompts_only: bool = False  # a large micro-batch: the prompt tests longer than the default one only
    paired: bool = True

    @property
    def n_cpu_moe(self) -> int | None:
        return self.candidates[0][1]


def _peer_runs(
    args: argparse.Namespace, configs: list[Any], weights: dict[str, Any] | None, n_ctx: int
) -> list[_PeerRun]:
    """The llama-bench runs for a grid: one per distinct set of shared knobs; on the GPU, one per budget
    with the ``--n-cpu-moe`` that matches it (given, or estimated from the model). Each is followed by a
    run of the longer prompts at a large micro-batch (``--llama-ubatch``), with its own ``--n-cpu-moe``."""
    from ._llamacpp import (
        LLAMA_DEFAULT_UBATCH,
        device_budget,
        fit_n_cpu_moe,
        n_cpu_moe_for_budget,
        on_gpu,
        peer_knobs,
        split_args,
    )

    raw: list[str] | None = args.llama_n_cpu_moe
    extra_flags = shlex.split(args.llama_args)
    gpu_cfgs = [c for c in configs if on_gpu(c.device)]
    if raw is not None and not gpu_cfgs:
        raise ValueError(
            "--llama-n-cpu-moe: llama.cpp keeps experts on the host only in a GPU run; add --device cuda"
        )
    for c in configs:
        split_args(c)  # a split llama.cpp cannot run is an error before any work
    budgets: list[int | None] = []
    for c in gpu_cfgs:
        if device_budget(c) not in budgets:
            budgets.append(device_budget(c))
    chosen: dict[int | None, str] = {b: "auto" for b in budgets}
    extra: list[str] = []
    if raw is not None:
        if len(raw) == len(budgets):
            chosen = dict(zip(budgets, raw, strict=True))
        elif budgets == [None]:
            chosen = {None: "0"}
            extra = [v for v in raw if v != "0"]
        else:
            raise ValueError(
                f"--llama-n-cpu-moe has {len(raw)} values and --vram-budget {len(budgets)}: give one per "
                "budget, in the same order ('auto' estimates the value that fits the budget; 0 = all on the GPU)"
            )

    def resolve(v: str, budget: int | None, ubatch: int = LLAMA_DEFAULT_UBATCH) -> int | None:
        """The --n-cpu-moe for a budget at a micro-batch; None when that micro-batch fits with none."""
        if v != "auto":
            return int(v)
        if budget is None:
            return 0
        if weights is None:
            raise ValueError(
                "--llama-n-cpu-moe auto: the model's tensor sizes could not be read; give the values"
            )
        if ubatch == LLAMA_DEFAULT_UBATCH:
            return n_cpu_moe_for_budget(weights, budget, n_ctx)
        return fit_n_cpu_moe(weights, budget, n_ctx, ubatch)

    ubatches: list[int] = args.llama_ubatch
    base_ub = ubatches[0]
    longest = max(args.n_prompt, default=0)
    # the user's own -ub/-b in --llama-args win over every variant: then there is one run
    own_batch = any(f in extra_flags for f in ("-ub", "--ubatch-size", "-b", "--batch-size"))
    runs: list[_PeerRun] = []
    seen: list[Any] = []
    for i, cfg in enumerate(configs):
        gpu = on_gpu(cfg.device)
        budget = device_budget(cfg) if gpu else None
        spec = chosen[device_budget(cfg)] if gpu else "0"
        ub0 = None if base_ub == LLAMA_DEFAULT_UBATCH else base_ub
        n0 = resolve(spec, budget, base_ub) if gpu else None
        if gpu and n0 is None:
            n0 = len(weights["expert_bytes"]) if weights else 0
        knobs = peer_knobs(cfg, n0, n_ubatch=ub0, extra=extra_flags)
        if knobs in seen:
            continue
        seen.append(knobs)
        runs.append(_PeerRun(cfg, knobs, i, [(ub0, n0)]))
        for u in [] if own_batch else ubatches[1:]:
            top = min(u, longest)
            cands: list[tuple[int | None, int | None]] = []
            while top > base_ub:
                n = resolve(spec, budget, top) if gpu else None
                if not gpu or n is not None:
                    cands.append((top, n))
                top //= 2
            if not cands:
                if longest > base_ub:
                    _err(
                        f"llama.cpp: no micro-batch above {base_ub} up to {u} fits "
                        f"--vram-budget {cfg.vram_budget} by the estimate; its prompts run at -ub {base_ub} only"
                    )
                continue
            k = peer_knobs(cfg, cands[0][1], n_ubatch=cands[0][0], extra=extra_flags)
            if k not in seen:
                seen.append(k)
                runs.append(_PeerRun(cfg, k, i, cands, prompts_only=True))
        if gpu and device_budget(cfg) is None:
            for v in extra:
                k = peer_knobs(cfg, int(v), paired=False, n_ubatch=ub0, extra=extra_flags)
                if k not in seen:
                    seen.append(k)
                    runs.append(_PeerRun(cfg, k, i, [(ub0, int(v))], paired=False))
            extra = []  # after the first all-resident configuration only
    return runs


def _row_line(rec: dict[str, Any]) -> str:
    """One line per finished row on stderr, so a long run shows its figures as they come."""
    from ._records import failed
    from ._tables import fmt_bytes, vram_used

    k = rec.get("knobs") or {}
    if rec.get("target") == "strata":
        from strata._config import EngineConfig

        try:
            flags = " ".join(EngineConfig.from_dict(dict(k)).to_cli_args())
        except (TypeError, ValueError):
            flags = ""
    else:
        flags = " ".join(f"{n}={v}" for n, v in k.items() if n in ("threads", "n_gpu_layers", "n_cpu_moe"))
        if k.get("n_ubatch") not in (None, 512):
            flags += f" n_ubatch={k['n_ubatch']}"
        if "vram_budget" in k:
            from ._tables import knob_str

            flags += f" (against --vram-budget {knob_str(k['vram_budget'], 'vram_budget')})"
    head = f"{rec.get('target')} {flags}".strip() + f" {rec.get('test')}:"
    if failed(rec):
        msg = (rec.get("error") or {}).get("message", "")
        return (
            f"{head} FAILED ({(rec.get('error') or {}).get('phase')}): {msg.splitlines()[0] if msg else ''}"
        )
    line = f"{head} {rec.get('mean', 0):.2f} ± {rec.get('stddev') or 0:.2f} {rec.get('unit', '')}"
    vram = vram_used(rec)
    if vram is not None:
        util = (rec.get("nvml") or {}).get("utilization_mean")
        line += f" · VRAM {fmt_bytes(vram)}" + (f" · GPU {util:.0f}%" if util is not None else "")
    return line


def _failure_summary(records: Sequence[dict[str, Any]]) -> list[str]:
    """One line per failed configuration (its tests merged) for the end of a run."""
    from ._records import failed

    groups: dict[tuple[str, str, str], list[str]] = {}
    for r in records:
        if not failed(r):
            continue
        e = r.get("error") or {}
        key = (str(r.get("target")), str(e.get("flags") or ""), str(e.get("message") or ""))
        groups.setdefault(key, []).append(str(r.get("test")))
    out = []
    for (target, flags, msg), tests in groups.items():
        lines = msg.strip().splitlines() or ["(no message)"]
        tail = lines[1:][-12:]  # of a tool's stderr, its last lines say why
        text = "\n    ".join([lines[0], *tail])
        out.append(f"{target} {flags}".rstrip() + f" [{', '.join(tests)}]: {text}")
    return out


def cmd_run(args: argparse.Namespace) -> int:
    from ._records import RecordWriter, failed

    targets = _parse_targets(args.target)
    if args.repetitions < 1:
        raise ValueError("-r/--repetitions must be at least 1")
    out = Path(args.output) if args.output else _default_output()
    writer = RecordWriter(out)
    args._writer = writer
    _err(f"records -> {out}")

    with _progress() as prog:

        def record(rec: dict[str, Any]) -> None:
            writer.append(rec)
            prog.console.print(_row_line(rec), highlight=False, markup=False, soft_wrap=True)

        engine_targets = [t for t in targets if not t.startswith("openai:")]
        if engine_targets:
            _run_engine_targets(args, engine_targets, targets, prog, record)
        for target in targets:
            if target.startswith("openai:"):
                _run_server_target(args, target, record, prog)
    _print_records(writer.rows, args.format)
    bad = _failure_summary(writer.rows)
    if bad:
        n_failed = sum(1 for r in writer.rows if failed(r))
        _err(
            f"{n_failed} of {len(writer.rows)} rows failed, in {len(bad)} configuration(s); "
            f"the others were measured (records in {out}):"
        )
        for line in bad:
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0


def _run_engine_targets(
    args: argparse.Namespace,
    engine_targets: list[str],
    targets: list[str],
    prog: Any,
    record: Callable[[dict[str, Any]], None],
) -> None:
    from ._engine_bench import plan_tests, run_strata
    from ._grid import configs_from_grid
    from ._llamacpp import LlamaBenchError, find_llama_bench, peer_knobs, run_llama_bench
    from ._model import model_fields, weight_bytes
    from ._records import failed_record

    configs = configs_from_grid(args)
    tests = plan_tests(args.n_prompt, args.n_gen, args.n_depth)
    if not tests:
        raise ValueError("nothing to measure: every -p and -n value is 0")
    exe = find_llama_bench(args.llama_bench) if "llama.cpp" in targets else None  # fail before any work
    if args.model:
        model_path = Path(args.model)
    else:
        from strata.model import ensure_model

        kw: dict[str, Any] = {"preset": args.preset, "seed": 0}
        if args.quant:
            kw["quant"] = args.quant
        model_path = Path(ensure_model(**kw))
    model = model_fields(model_path)
    weights = weight_bytes(model_path)
    n_ctx = max(t.context for t in tests)
    peers = _peer_runs(args, configs, weights, n_ctx) if "llama.cpp" in engine_targets else []
    steps = args.warmup + args.repetitions
    task_s = (
        prog.add_task("strata", total=len(configs) * len(tests) * steps)
        if "strata" in engine_targets
        else None
    )
    base_ub = args.llama_ubatch[0]
    extra_flags = shlex.split(args.llama_args)

    def peer_tests(pr: _PeerRun) -> list[Any]:
        return [t for t in tests if t.n_prompt > base_ub] if pr.prompts_only else tests

    task_l = prog.add_task("llama.cpp", total=sum(len(peer_tests(p)) for p in peers)) if peers else None

    def run_peer(pr: _PeerRun) -> None:
        assert exe is not None  # found before any work started
        done: list[str] = []
        tried: list[dict[str, Any]] = []
        own = peer_tests(pr)
        n_prompt = sorted({t.n_prompt for t in own if t.n_prompt})
        n_gen = [] if pr.prompts_only else args.n_gen

        def keep(rec: dict[str, Any]) -> None:
            done.append(rec["test"])
            record(rec)

        for ci, (ub, n) in enumerate(pr.candidates):
            knobs = peer_knobs(pr.cfg, n, pr.paired, ub, extra_flags)
            try:
                run_llama_bench(
                    exe, model_path, model, n_prompt, n_gen, args.n_depth, args.repetitions, pr.cfg, keep,
                    on_test=functools.partial(prog.advance, task_l, 1), weights=weights, n_cpu_moe=n,
                    knobs=knobs, extra=extra_flags, n_ubatch=ub, peer_extra={"tried": tried} if tried else None,
                )  # fmt: skip
                return
            except LlamaBenchError as e:
                if not done and ci + 1 < len(pr.candidates):
                    # the largest micro-batch that fits: halve it and try again, and say so in the rows
                    nxt = pr.candidates[ci + 1]
                    tried.append({"n_ubatch": ub, "n_cpu_moe": n, "message": str(e)[-600:]})
                    prog.console.print(
                        f"llama.cpp -ub {ub} -ncmoe {n} did not run ({str(e).splitlines()[-1][:160]}); "
                        f"trying -ub {nxt[0]} -ncmoe {nxt[1]}",
                        highlight=False, markup=False, soft_wrap=True,
                    )  # fmt: skip
                    continue
                # the tests it did not finish get failed rows; the next configuration still runs
                error = {"phase": "llama-bench", "type": type(e).__name__, "status": None, "message": str(e),
                         "flags": " ".join(f"{k}={v}" for k, v in knobs.items())}  # fmt: skip
                for t in own:
                    if t.name not in done:
                        record(failed_record(
                            dict(error), target="llama.cpp", test=t.name, kind="pp" if t.n_prompt else "tg",
                            n_prompt=t.n_prompt, n_gen=t.n_gen, n_depth=t.n_depth, unit="t/s",
                            repetitions=args.repetitions, warmup=1, **model, knobs=knobs,
                            work={"n_prompt": t.n_prompt, "n_gen": t.n_gen, "n_depth": t.n_depth,
                                  "prompt_set": "llama-bench", "max_context": t.n_prompt + t.n_gen + t.n_depth},
                        ))  # fmt: skip
                        prog.advance(task_l, 1)
                return

    for i, cfg in enumerate(configs):
        for target in engine_targets:
            if target == "strata":
                assert task_s is not None
                run_strata(
                    str(model_path), model, [cfg], tests, args.repetitions, record,
                    warmup=args.warmup, seed=args.seed, advance=functools.partial(prog.advance, task_s),
                )  # fmt: skip
            else:
                for pr in peers:
                    if pr.after == i:
                        run_peer(pr)


def _run_server_target(
    args: argparse.Namespace, target: str, record: Callable[[dict[str, Any]], None], prog: Any
) -> None:
    from ._records import failed_record
    from ._server_bench import PROMPT_SET, ServerBenchError

    url = target.removeprefix("openai:")
    try:
        _run_server(args, url, record, prog)
    except ServerBenchError as e:
        # a peer that errors is a failed row; the targets after it still run
        record(failed_record(
            {"phase": "server", "type": type(e).__name__, "status": None, "message": str(e), "flags": url},
            target="openai", url=url, test=args.suite, kind="server", unit="tok/s", knobs={},
            work={"suite": args.suite, "max_tokens": args.max_tokens, "seed": args.seed, "prompt_set": PROMPT_SET},
        ))  # fmt: skip


def cmd_serve_bench(args: argparse.Namespace) -> int:
    from ._records import RecordWriter

    out = Path(args.output) if args.output else _default_output()
    writer = RecordWriter(out)
    args._writer = writer
    _err(f"records -> {out}")
    _run_server(args, args.url, writer.append)
    _print_records(writer.rows, args.format)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from ._compare import compare, parse_assume, parse_gate
    from ._records import read_records

    gates = [parse_gate(g) for g in args.fail_if]
    key = [k.strip() for k in args.key.split(",") if k.strip()]
    assume = dict(parse_assume(a) for a in args.assume)
    res = compare(
        read_records(args.old), read_records(args.new), key=key, gates=gates, assume=assume,
        ignore=args.ignore, confidence=args.confidence, n_boot=args.bootstrap, seed=args.seed,
    )  # fmt: skip
    if args.format == "md":
        print(res.markdown())
    else:
        from rich.console import Console
        from rich.table import Table as RichTable

        rt = RichTable(title=f"{args.old} -> {args.new} (median t/s)", title_justify="left")
        for h in res.headers:
            rt.add_column(h, justify="right" if h in ("old", "new", "change") else "left")
        for row in res.rows:
            rt.add_row(*row, style="red" if row[-1].startswith("FAIL") else None)
        Console().print(rt)
    print(f"{res.matched} rows matched, {res.only_old} only in OLD, {res.only_new} only in NEW")
    for note in res.notes:
        print(f"note: {note}")
    if res.failures:
        for f in res.failures:
            print(f"FAIL {f}")
        return 1
    if gates:
        print("all gates passed: " + ", ".join(str(g) for g in gates))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from ._plot import plot_records
    from ._records import read_records

    records = [r for f in args.files for r in read_records(f)]
    written = plot_records(records, args.out)
    if not written:
        _err("nothing to plot: the records hold no prompt tests and no decode hit rates")
        return 1
    for w in written:
        print(w)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from ._records import read_records

    _print_records([r for f in args.files for r in read_records(f)], args.format)
    return 0


def exit_process(rc: int) -> int:
    """The exit status of the command; after Ctrl-C, end the process here.

    An interrupted run has written and synced its rows and said so. Left to the interpreter's own
    shutdown, such a process was sometimes reported as killed by SIGINT rather than exiting with 130
    (about one run in thirty here), which a caller cannot tell from a crash; so it exits at once.
    """
    if rc == 130:
        import os

        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(130)
    return rc


def _run_keeping_rows(args: argparse.Namespace) -> int:
    """Run the command; a run that stops or fails says which finished rows it kept, before the failure
    itself is reported."""
    try:
        return int(args.func(args) or 0)
    except BaseException as e:
        writer = getattr(args, "_writer", None)
        kept = (
            f"{len(writer.rows)} finished rows kept in {writer.path}"
            if writer is not None and writer.path is not None and writer.rows
            else ""
        )
        if isinstance(e, KeyboardInterrupt):
            _err(f"interrupted: {kept}" if kept else "interrupted")
        elif kept and not isinstance(e, (SystemExit, BrokenPipeError)):
            _err(kept)
        raise


def main(argv: list[str] | None = None) -> int:
    from ._llamacpp import LlamaBenchError
    from ._server_bench import ServerBenchError

    # a failure is one paragraph (strata's rule; --debug or STRATA_DEBUG=1 shows the traceback)
    return run_command(
        build_parser(), argv, run=_run_keeping_rows, expected=(ValueError, LlamaBenchError, ServerBenchError)
    )


if __name__ == "__main__":
    sys.exit(exit_process(main()))
