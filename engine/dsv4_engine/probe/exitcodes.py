"""Exit codes of `dsv4ctl probe` and `dsv4ctl validate`.

argparse exits with 2 on a usage error, which `dsv4ctl probe` uses for INCONCLUSIVE; a
script gating a rollout on the exit code must not read a typo as "not enough evidence".
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn

from dsv4_engine.cliutil import usage_error

USAGE_OR_CONNECTION_ERROR = 3
# A verdict was reached but could not be filed (`--report-configmap`): the run is over, and
# a probe Job must not run it again — a rerun could only replace that verdict with another.
VERDICT_NOT_FILED = 4


def usage_error_exit_3(parser: argparse.ArgumentParser) -> Callable[[str], NoReturn]:
    """A replacement for `parser.error` that exits with 3 instead of argparse's 2."""

    def error(message: str) -> NoReturn:
        usage_error(parser.prog, message, USAGE_OR_CONNECTION_ERROR)

    return error
