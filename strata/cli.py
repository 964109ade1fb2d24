"""The ``strata`` command: generate, model, serve, chat, profile.

Each subcommand lives in its own module, which provides ``add_parser(subparsers)`` and sets
``func`` on its parser; nothing heavy is imported until a subcommand runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand modules, in the order `strata --help` lists them
_COMMANDS = [
    "strata._cli_generate",  # strata generate
    "strata.model.cli",  # strata model make|info
    "strata.server.cli",  # strata serve
    "strata_tui.cli",  # strata chat
    "strata._cli_profile",  # strata profile save
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata", description="Run MoE language models bigger than the GPU.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for mod_name in _COMMANDS:
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name == mod_name:
                continue  # subcommand not built yet
            raise
        mod.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if not getattr(args, "func", None):
        p.print_help()
        return 2
    try:
        rc = args.func(args)
    except KeyboardInterrupt:
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
