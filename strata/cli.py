"""The ``strata`` command: generate, model, serve, profile, and the commands other packages add.

Each subcommand lives in its own module, which provides ``add_parser(subparsers)`` and sets
``func`` on its parser. The core's own commands are imported here; a package built on top of the
core (the terminal chat, ``strata chat``) adds its command through the ``strata.commands`` entry-point
group of its distribution, so the core never names the layers above it.

A failure is printed as one paragraph that says what to do (``strata._failure``); ``--debug`` (before
or after the command's name) or ``STRATA_DEBUG=1`` prints the traceback as well.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points
from typing import Any

from . import _cli_generate, _cli_profile
from ._failure import add_debug_flag, run_command
from .model import cli as _model_cli
from .server import cli as _server_cli

__all__ = ["build_parser", "main"]

COMMAND_GROUP = "strata.commands"

# the core's subcommands, in the order `strata --help` lists them (added commands come after them)
_CORE_COMMANDS: list[Any] = [_cli_generate, _model_cli, _server_cli, _cli_profile]


def _added_commands() -> list[Any]:
    """The modules that installed packages register under the ``strata.commands`` entry points."""
    return [ep.load() for ep in sorted(entry_points(group=COMMAND_GROUP), key=lambda ep: ep.name)]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata", description="Run MoE language models bigger than the GPU.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for mod in [*_CORE_COMMANDS, *_added_commands()]:
        mod.add_parser(sub)
    add_debug_flag(p)
    return p


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
