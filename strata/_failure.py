"""How a command-line entry point ends on an error: one paragraph that says what to do, no traceback.

Every entry point (``strata`` and its subcommands, ``strata chat``, ``strata-bench``, ``repro_matrix``)
runs its body through ``run_reporting``. An expected failure (a ``StrataError``, an ``OSError`` on a file
the user named, a ``ValueError`` from input, and the types an entry point names as its own) is printed
as ``PROG: message``; anything else is a bug and says so, with how to see where it happened. ``--debug``
(``add_debug_flag`` puts it on every subcommand) or ``STRATA_DEBUG=1`` prints the traceback as well.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import traceback
from collections.abc import Callable
from typing import Any

from ._exceptions import StrataError

__all__ = [
    "DEBUG_HELP",
    "UserError",
    "add_debug_flag",
    "debug_from_env",
    "describe",
    "run_command",
    "run_reporting",
]

DEBUG_HELP = "print the traceback of a failure as well (also STRATA_DEBUG=1)"


class UserError(Exception):
    """A failure whose message is written for the user already (what went wrong and what to do)."""


def add_debug_flag(parser: argparse.ArgumentParser, *, top: bool = True) -> None:
    """``--debug`` on ``parser`` and on each of its subcommands (``args.debug``)."""
    # on a subcommand the flag must not reset what the top level parsed (SUPPRESS: no default there)
    parser.add_argument(
        "--debug", action="store_true", default=False if top else argparse.SUPPRESS, help=DEBUG_HELP
    )
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                add_debug_flag(sub, top=False)


def debug_from_env() -> bool:
    """True when ``STRATA_DEBUG`` is set to something other than empty, 0, no, off or false."""
    return os.environ.get("STRATA_DEBUG", "").strip().lower() not in ("", "0", "no", "off", "false")


def describe(exc: BaseException, expected: tuple[type[BaseException], ...] = ()) -> str:
    """One paragraph for ``exc``: what went wrong and, where it is known, what to do. ``expected``: more
    types whose message is written for the user (an entry point's own errors)."""
    if isinstance(exc, (UserError, StrataError, *expected)):
        return _one_paragraph(str(exc))
    if isinstance(exc, sqlite3.DatabaseError):
        return _one_paragraph(
            f"the database could not be read ({exc}): it is damaged or not a strata database; "
            "move it away or give another one"
        )
    if isinstance(exc, OSError):
        what = exc.strerror or str(exc)
        where = f": {exc.filename}" if exc.filename else ""
        return _one_paragraph(f"{what}{where}")
    if isinstance(exc, ValueError) and _is_input_error(exc):
        return _one_paragraph(str(exc))
    return _one_paragraph(
        f"unexpected error ({type(exc).__name__}: {exc}). This is a bug in strata: run the command again "
        "with --debug (or STRATA_DEBUG=1) to see where it happened, and report it with that output"
    )


def _is_input_error(exc: ValueError) -> bool:
    """A model file or vocabulary the reader refused (its message names the file and the fault)."""
    from ._gguf_meta import GGUFMetadataError
    from .tokenizer import TokenizerError

    return isinstance(exc, (GGUFMetadataError, TokenizerError))


def _one_paragraph(text: str) -> str:
    return " ".join(text.split()) or "failed (no details)"


def run_reporting(
    prog: str,
    body: Callable[[], int | None],
    *,
    debug: bool = False,
    expected: tuple[type[BaseException], ...] = (),
    code: int = 1,
) -> int:
    """Run ``body`` and return its exit code; a failure is printed as one paragraph (exit ``code``)."""
    debug = debug or debug_from_env()
    try:
        return int(body() or 0)
    except KeyboardInterrupt:
        return 130
    except SystemExit:
        raise
    except BrokenPipeError:
        # the reader went away (``strata generate ... | head``): nothing left to say
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - so that the exit's flush does not fail again
        except OSError:
            pass
        return 1
    except Exception as e:
        if debug:
            traceback.print_exc()
        print(f"{prog}: {describe(e, expected)}", file=sys.stderr)
        return code


def run_command(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    *,
    run: Callable[[argparse.Namespace], int | None] | None = None,
    expected: tuple[type[BaseException], ...] = (),
    code: int = 1,
) -> int:
    """An entry point's ``main``: parse ``argv``, print the help (exit 2) without a subcommand, else run
    it (``args.func(args)``, or ``run(args)``) through ``run_reporting`` as "PROG COMMAND"."""
    args: Any = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    body = run or args.func
    return run_reporting(
        f"{parser.prog} {args.command}", lambda: body(args), debug=args.debug, expected=expected, code=code
    )
