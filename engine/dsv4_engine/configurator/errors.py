"""The one error the configurator raises for bad input.

A ``ValueError`` so library callers can catch it generically; the CLI turns it into one
line and exit code 2.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """Input the configurator cannot size: the message names the field and what was expected."""
