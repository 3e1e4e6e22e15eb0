"""Shared plumbing of the project's two command lines, `dsv4ctl` and `dsv4-engine`.

Subcommands are discovered, not listed: every module of a commands package that defines
``register(subparsers)`` adds its parser and sets ``func``; ``func(args)`` returns the exit
code.  Other installed distributions add subcommands the same way through an entry-point
group (``dsv4ctl.commands``: the development tooling's `dsv4ctl cluster`, absent from the
images).  A ``CommandError`` ends the command with one line on stderr, never a traceback, and
so does a usage error (`OneLineParser`).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import pkgutil
import shlex
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from types import ModuleType
from typing import NoReturn


def one_line(text: str) -> str:
    """An error message as one line: a parser's multi-line report (YAML's marks, a pydantic
    list) keeps its words, not its layout."""
    return " ".join(text.split())


def usage_error(prog: str, message: str, exit_code: int = 2) -> NoReturn:
    """A bad argument: one line naming it (argparse would print the whole usage first)."""
    print(f"{prog}: error: {one_line(message)} (see {prog} --help)", file=sys.stderr)
    sys.exit(exit_code)


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line usage errors; its subcommand parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        usage_error(self.prog, message)


class CommandError(Exception):
    """A user-facing failure: the message names what is wrong; ``exit_code`` is returned."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def build_parser(
    prog: str,
    description: str,
    package: ModuleType,
    argv: Sequence[str] | None = None,
    plugins: str | None = None,
) -> argparse.ArgumentParser:
    """The modules of ``package``, then those the entry points of group ``plugins`` name.
    With ``argv`` naming a subcommand first, only that module is imported, so a light
    command (``dsv4ctl plan``) does not pay for the imports of heavy ones."""
    parser = OneLineParser(prog=prog, description=description)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {
        m.name: f"{package.__name__}.{m.name}" for m in pkgutil.iter_modules(package.__path__)
    }
    if plugins is not None:
        for name, module in _plugin_commands(plugins):
            modules.setdefault(name, module)
    requested = [name for name in modules if argv and name == argv[0]]
    for name in requested or sorted(modules):
        module = importlib.import_module(modules[name])
        register = getattr(module, "register", None)
        if register is not None:
            register(subparsers)
    return parser


@functools.cache
def _plugin_commands(group: str) -> tuple[tuple[str, str], ...]:
    """(name, module) of each entry point of ``group``, looked up once a process: the look-up
    reads the metadata of every installed distribution (~13 ms here), and a process that
    runs commands in turn (the tests, a sweep) would pay it for each."""
    return tuple((point.name, point.value) for point in entry_points(group=group))


def _chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``args`` were parsed for."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            name = getattr(args, action.dest, None)
            if name in action.choices:
                return _chosen(action.choices[name], args)
    return parser


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    args, extra = parser.parse_known_args(argv)
    if extra:
        # Refused by the subcommand's own parser, with its own exit code (`dsv4ctl probe`
        # keeps 2 for INCONCLUSIVE), not by the top-level one.
        _chosen(parser, args).error(f"unrecognized arguments: {shlex.join(extra)}")
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except CommandError as err:
        print(f"{parser.prog} {args.command}: error: {one_line(str(err))}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"{parser.prog} {args.command}: interrupted", file=sys.stderr)
        return 130
