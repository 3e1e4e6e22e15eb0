"""Entry point of `dsv4ctl`: subcommands are the modules of ``dsv4_operator.cli``, plus the
``dsv4ctl.commands`` entry points of other installed distributions (`dsv4ctl cluster`
comes with the development tooling, dsv4-dev)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from dsv4_engine.cliutil import build_parser, run
from dsv4_operator import cli

PLUGINS = "dsv4ctl.commands"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(
        "dsv4ctl",
        "Operate DeepSeek-V4 deployments on SGLang: pool planning, rendering, "
        "corruption probes and canary rollouts.",
        cli,
        sys.argv[1:] if argv is None else argv,
        plugins=PLUGINS,
    )
    return run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
