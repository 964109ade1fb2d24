"""``strata chat``: the terminal chat.

With ``--server URL`` it talks to any OpenAI-compatible server. Otherwise it starts ``strata serve`` on
the given model (or on the default model, made on first use) on a free loopback port, and stops it on
exit.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
from pathlib import Path

from strata._config import add_engine_args, config_or_usage_error
from strata._model_path import model_path_problem

__all__ = ["add_parser", "run"]

_DEFAULT_NEWLINE = ("ctrl+j", "shift+enter", "alt+enter")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "chat",
        help="terminal chat (starts a server on a model, or connects to one)",
        description="Chat in the terminal. With no --model and no --server, the default model is made and served.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", type=Path, help="GGUF model file to serve for this chat")
    src.add_argument(
        "--server", help="URL of a running OpenAI-compatible server (e.g. http://127.0.0.1:8080)"
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("STRATA_API_KEY"),
        help="API key for the server (env STRATA_API_KEY)",
    )
    p.add_argument("--model-name", help="model id to ask the server for (default: the first it lists)")
    p.add_argument(
        "--newline-key",
        default=os.environ.get("STRATA_NEWLINE_KEY"),
        help="key that inserts a new line in the message (default: ctrl+j; shift+enter and alt+enter where the terminal sends them)",
    )
    p.add_argument(
        "--db",
        type=Path,
        help="conversation database (default: chat.sqlite3 in the user data folder; STRATA_DATA_DIR overrides)",
    )
    add_engine_args(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from .app import StrataChat
    from .server_process import ServerProcess

    newline = (args.newline_key,) if args.newline_key else _DEFAULT_NEWLINE
    proc = None
    if args.server:
        app = StrataChat(
            server_url=args.server,
            api_key=args.api_key,
            db_path=args.db,
            model_name=args.model_name,
            newline_keys=newline,
        )
    else:
        cfg = config_or_usage_error(args, "strata chat")
        if cfg is None:  # a flag out of range, said before any screen opens
            return 2
        problem = model_path_problem(args.model.expanduser()) if args.model is not None else None
        if problem:
            print(f"strata chat: {problem}", file=sys.stderr)
            return 2
        # the chat's own server takes a key that only the chat knows (unless one was given), so that
        # another user of the machine cannot use it or learn anything from it
        api_key = args.api_key or secrets.token_urlsafe(32)
        proc = ServerProcess(args.model, cfg.to_cli_args(), api_key=api_key)
        app = StrataChat(
            server_process=proc,
            api_key=api_key,
            db_path=args.db,
            model_name=args.model_name,
            newline_keys=newline,
        )
    if proc is not None:
        # the server runs in its own session (so that it can be stopped with everything it started);
        # make sure a closed terminal or a kill of the chat stops it too
        def _stop(signum: int, _frame: object) -> None:
            proc.stop(grace=2.0)
            raise SystemExit(128 + signum)

        for sig in (signal.SIGHUP, signal.SIGTERM):
            signal.signal(sig, _stop)
    try:
        app.run()
    finally:
        if proc is not None:
            proc.stop()
    return int(app.return_code or 0)
