"""``strata serve``: the OpenAI-compatible server.

    strata serve --model FILE [engine flags] [--host 127.0.0.1 --port 8080 --api-key KEY]

The server binds its socket, starts the engine worker and, once the engine is open, prints one line
``strata: listening on http://HOST:PORT`` on stdout (``--port 0`` picks a free port; the line says
which). When the engine cannot start, it prints the engine's message and exits with status 1.

API keys come from ``--api-key`` (once per key) or from ``STRATA_API_KEY`` (keys separated by commas);
the environment keeps a key out of the process list, where any user of the machine can read a
command line. SIGINT or SIGTERM stops the server in order: running and waiting requests end with an
error that says so, the engine worker is told to exit, and the exit status is 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._config import add_engine_args, config_or_usage_error
from .requests import DEFAULT_MAX_BODY
from .supervisor import DEFAULT_ENGINE_TIMEOUT

__all__ = ["add_parser", "model_path_problem", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a GGUF model over an OpenAI-compatible HTTP API (/v1/chat/completions, "
        "/v1/completions, /v1/models, /v1/status, /health, /metrics).",
    )
    p.add_argument(
        "--model", type=Path, help="GGUF model file (default: the synthetic tiny model, made once)"
    )
    add_engine_args(p)
    g = p.add_argument_group("server")
    g.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    g.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    g.add_argument(
        "--api-key",
        action="append",
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on every endpoint but /health; give it once per "
        "client (each key is a client of its own). Default: $STRATA_API_KEY (comma-separated), "
        "which keeps the keys off the command line",
    )
    g.add_argument("--model-name", help="model id shown by /v1/models (default: the file name)")
    g.add_argument(
        "--max-body-mib",
        type=float,
        default=DEFAULT_MAX_BODY / (1 << 20),
        help=f"largest request body in MiB (default {DEFAULT_MAX_BODY >> 20}); a larger one gets 413",
    )
    g.add_argument(
        "--engine-timeout",
        type=float,
        default=DEFAULT_ENGINE_TIMEOUT,
        metavar="SECONDS",
        help=f"seconds without a heartbeat from the engine worker before it counts as unresponsive "
        f"(default {DEFAULT_ENGINE_TIMEOUT:g}; 0: never)",
    )
    g.add_argument(
        "--cache-prompt",
        action="store_true",
        help="reuse the KV cache for the part of a prompt that the same client's previous request "
        'shared (requests can also ask with "cache_prompt": true)',
    )
    g.add_argument("--quiet", action="store_true", help="do not echo the engine log on stderr")
    p.set_defaults(func=run)
    return p


def model_path_problem(model: Path) -> str | None:
    """What is wrong with ``model`` as a model file, in words (None when it is a regular file)."""
    hint = "give --model FILE.gguf, or leave --model out for the synthetic tiny model"
    if model.is_dir():
        found = sorted(p.name for p in model.glob("*.gguf"))[:5]
        inside = f" (it holds {', '.join(found)})" if found else " (it holds no .gguf file)"
        return f"--model {model} is a folder{inside}: {hint}"
    if not model.exists():
        return f"model file not found: {model} ({hint})"
    if not model.is_file():
        return f"--model {model} is not a regular file (a pipe or a device cannot be mapped): {hint}"
    return None


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say they are
    # TCP, and with Nagle on, a reused keep-alive connection waits ~40 ms for delayed ACKs per reply
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


def run(args: argparse.Namespace) -> int:
    config = config_or_usage_error(args, "strata serve")
    if config is None:
        return 2
    model = args.model
    if model is None:
        from ..model import ensure_model

        print("strata: no --model given; using the synthetic tiny model", file=sys.stderr, flush=True)
        model = Path(ensure_model("tiny"))
    model = Path(model).expanduser()
    problem = model_path_problem(model)
    if problem:
        print(f"strata serve: {problem}", file=sys.stderr)
        return 2
    if args.max_body_mib <= 0:
        print("strata serve: --max-body-mib must be positive", file=sys.stderr)
        return 2
    if args.engine_timeout < 0:
        print("strata serve: --engine-timeout must be 0 (never) or a number of seconds", file=sys.stderr)
        return 2
    keys = api_keys(args.api_key)
    from ..chat_template import ChatTemplate, ChatTemplateError
    from ..tokenizer import Tokenizer, TokenizerError

    try:
        tokenizer = Tokenizer.from_gguf(model)
        template = ChatTemplate(
            tokenizer.chat_template,
            bos_token=tokenizer.bos_token,
            eos_token=tokenizer.eos_token,
            control_tokens=tokenizer.control_texts,
        )
    except (TokenizerError, ChatTemplateError, ValueError, OSError) as e:
        print(f"strata serve: cannot read the tokenizer of {model}: {e}", file=sys.stderr)
        return 1

    try:
        sock = _bind(args.host, args.port)
    except OSError as e:
        print(
            f"strata serve: cannot listen on {args.host}:{args.port}: {e.strerror or e} "
            f"(use another --port, or --port 0 for a free one)",
            file=sys.stderr,
        )
        return 1
    return asyncio.run(_serve(args, config, model, tokenizer, template, sock, keys))


def api_keys(given: list[str] | None) -> tuple[str, ...]:
    """The keys from ``--api-key``, else from ``STRATA_API_KEY`` (comma-separated)."""
    raw = given if given else os.environ.get("STRATA_API_KEY", "").split(",")
    return tuple(dict.fromkeys(k.strip() for k in raw if k.strip()))


async def _serve(
    args: argparse.Namespace,
    config: Any,
    model: Path,
    tokenizer: Any,
    template: Any,
    sock: socket.socket,
    keys: tuple[str, ...],
) -> int:
    import uvicorn

    from .app import ServerState, create_app
    from .supervisor import EngineStartError, Supervisor

    class _Server(uvicorn.Server):
        # signals are handled below, so that a stop while the engine loads is clean too
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    sup = Supervisor(str(model), config, echo_log=not args.quiet, engine_timeout=args.engine_timeout)
    state = ServerState(
        supervisor=sup,
        tokenizer=tokenizer,
        template=template,
        model_name=args.model_name or model.name,
        api_keys=keys,
        max_body=int(args.max_body_mib * (1 << 20)),
        cache_prompt=args.cache_prompt,
    )
    app = create_app(state)
    uconf = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5
    )
    server = _Server(uconf)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    serve_task = asyncio.create_task(server.serve(sockets=[sock]))
    host, port = sock.getsockname()[:2]
    start_task = asyncio.create_task(sup.start())
    stop_task = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({start_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        if not start_task.done():  # stopped while the engine was loading
            start_task.cancel()
            sup.shutdown()
            server.should_exit = True
            await serve_task
            await sup.close()
            return 0
        try:
            start_task.result()
        except EngineStartError as e:
            print(f"strata serve: the engine could not start: {e}", file=sys.stderr, flush=True)
            server.should_exit = True
            await serve_task
            await sup.close()
            return 1
        print(
            f"strata: listening on {_url(args.host if args.host not in ('0.0.0.0', '::') else host, port)}",
            flush=True,
        )
        await asyncio.wait({serve_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        # requests in flight get their error event before the connections close
        sup.shutdown()
        server.should_exit = True
        await serve_task
    finally:
        stop_task.cancel()
        await sup.close()
    return 0
