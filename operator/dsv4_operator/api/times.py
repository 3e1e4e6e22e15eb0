"""The one timestamp format of status fields and Events (RFC 3339, UTC, seconds)."""

from __future__ import annotations

import datetime as dt

RFC3339 = "%Y-%m-%dT%H:%M:%SZ"


def stamp(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime(RFC3339)


def parse_stamp(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, RFC3339).replace(tzinfo=dt.UTC)


def now_rfc3339() -> str:
    return stamp(dt.datetime.now(dt.UTC))
