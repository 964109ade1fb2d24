"""``strata-bench``: measure strata and its peers side by side.

    strata-bench run --model FILE -p 512,4096 -n 128 -d 0,4096 -r 5 --expert-cache 64,128 \\
                     --target strata --target llama.cpp --output runs.jsonl
    strata-bench run --target openai:http://127.0.0.1:8080 --suite short,long,agentic
    strata-bench serve-bench --url http://127.0.0.1:8080 --suite short
    strata-bench compare old.jsonl new.jsonl --fail-if tg128:-5%
    strata-bench plot runs.jsonl --out plots/
    strata-bench show runs.jsonl --format md

Every engine flag of ``strata`` is accepted, and a comma list sweeps it (``--threads 1,2``). Records
are appended to the output file as each test finishes, so an interrupted run keeps its rows.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["build_parser", "main"]


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
        default="target,model,quant,test,knobs",
        help="fields that identify a row; 'knobs' stands for every knob (default: %(default)s)",
    )
    c.add_argument(
        "--fail-if",
        action="append",
        default=[],
        metavar="[FIELD@]TEST:±X%",
        help="gate, e.g. tg128:-5%% (t/s fell more than 5%%) or metrics.ttft_ms.p90@short:+10%%",
    )
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


def _run_server(args: argparse.Namespace, url: str, on_record: Callable[[dict[str, Any]], None]) -> int:
    from ._server_bench import run_suites

    suites = [s.strip() for s in args.suite.split(",") if s.strip()]
    with _progress() as prog:
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
            advance=lambda k: prog.advance(task, k),
            set_total=lambda n: prog.update(task, total=n),
        )


def cmd_run(args: argparse.Namespace) -> int:
    from ._records import RecordWriter

    targets = _parse_targets(args.target)
    if args.repetitions < 1:
        raise ValueError("-r/--repetitions must be at least 1")
    out = Path(args.output) if args.output else _default_output()
    writer = RecordWriter(out)
    args._writer = writer
    _err(f"records -> {out}")

    engine_targets = [t for t in targets if not t.startswith("openai:")]
    if engine_targets:
        from ._engine_bench import plan_tests, run_strata
        from ._grid import configs_from_grid
        from ._llamacpp import find_llama_bench, peer_knobs, run_llama_bench
        from ._model import model_fields, weight_bytes

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
        with _progress() as prog:
            for target in engine_targets:
                if target == "strata":
                    task = prog.add_task(
                        "strata", total=len(configs) * len(tests) * (args.warmup + args.repetitions)
                    )
                    run_strata(
                        str(model_path),
                        model,
                        configs,
                        tests,
                        args.repetitions,
                        writer.append,
                        warmup=args.warmup,
                        seed=args.seed,
                        advance=functools.partial(prog.advance, task),
                    )
                else:
                    # one llama-bench run per distinct (threads, device, kv): the knobs it shares with strata
                    seen: list[dict[str, Any]] = []
                    peer_cfgs = []
                    for cfg in configs:
                        if peer_knobs(cfg) not in seen:
                            seen.append(peer_knobs(cfg))
                            peer_cfgs.append(cfg)
                    task = prog.add_task("llama.cpp", total=len(peer_cfgs) * len(tests))
                    assert exe is not None  # found before any work started
                    for cfg in peer_cfgs:
                        run_llama_bench(
                            exe,
                            model_path,
                            model,
                            args.n_prompt,
                            args.n_gen,
                            args.n_depth,
                            args.repetitions,
                            cfg,
                            writer.append,
                            on_test=functools.partial(prog.advance, task, 1),
                            weights=weights,
                        )
    for target in targets:
        if target.startswith("openai:"):
            _run_server(args, target.removeprefix("openai:"), writer.append)
    _print_records(writer.rows, args.format)
    return 0


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
    from ._compare import compare, parse_gate
    from ._records import read_records

    gates = [parse_gate(g) for g in args.fail_if]
    key = [k.strip() for k in args.key.split(",") if k.strip()]
    res = compare(read_records(args.old), read_records(args.new), key=key, gates=gates)
    if args.format == "md":
        print(res.markdown())
    else:
        from rich.console import Console
        from rich.table import Table as RichTable

        rt = RichTable(title=f"{args.old} -> {args.new}", title_justify="left")
        for h in res.headers:
            rt.add_column(h, justify="right" if h in ("old", "new", "new/old", "change") else "left")
        for row in res.rows:
            rt.add_row(*row, style="red" if row[-1].startswith("FAIL") else None)
        Console().print(rt)
    print(f"{res.matched} rows matched, {res.only_old} only in OLD, {res.only_new} only in NEW")
    if res.ignored_fields:
        print(f"not part of the key (only one side has them): {', '.join(res.ignored_fields)}")
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


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if not getattr(args, "func", None):
        p.print_help()
        return 2
    from strata._exceptions import StrataError

    from ._llamacpp import LlamaBenchError
    from ._server_bench import ServerBenchError

    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `strata-bench show runs.jsonl | head`: the reader has all it wanted
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        writer = getattr(args, "_writer", None)
        if writer is not None and writer.path is not None:
            _err(f"interrupted: {len(writer.rows)} finished rows kept in {writer.path}")
        else:
            _err("interrupted")
        return 130
    except (ValueError, FileNotFoundError, LlamaBenchError, ServerBenchError, StrataError) as e:
        _err(str(e))
        writer = getattr(args, "_writer", None)
        if writer is not None and writer.rows:
            _err(f"{len(writer.rows)} finished rows kept in {writer.path}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
