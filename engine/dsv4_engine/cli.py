"""Entry point of `dsv4-engine`: subcommands are the modules of ``dsv4_engine.commands``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from dsv4_engine import commands
from dsv4_engine.cliutil import build_parser, run


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(
        "dsv4-engine",
        "DeepSeek-V4 engine launcher and CPU reference engine.",
        commands,
        sys.argv[1:] if argv is None else argv,
    )
    return run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
