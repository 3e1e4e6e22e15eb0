"""Shared plumbing of the project's two command lines, `dsv4ctl` and `dsv4-engine`.

Subcommands are discovered, not listed: every module of a commands package that defines
``register(subparsers)`` adds its parser and sets ``func``; ``func(args)`` returns the exit
code.  A ``CommandError`` ends the command with one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence
from types import ModuleType


class CommandError(Exception):
    """A user-facing failure: the message names what is wrong; ``exit_code`` is returned."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def build_parser(
    prog: str, description: str, package: ModuleType, argv: Sequence[str] | None = None
) -> argparse.ArgumentParser:
    """With ``argv`` naming a subcommand module first, only that module is imported, so a
    light command (``dsv4ctl plan``) does not pay for the imports of heavy ones."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    infos = sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name)
    requested = [m for m in infos if argv and m.name == argv[0]]
    for info in requested or infos:
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(subparsers)
    return parser


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except CommandError as err:
        print(f"{parser.prog} {args.command}: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"{parser.prog} {args.command}: interrupted", file=sys.stderr)
        return 130
