"""Periodic work spread over its period, each deployment at its own offset.

Deployments created together would otherwise resync together and run their production
watch together, every period, for ever: a burst of passes and probe Jobs instead of a
trickle.  Each deployment gets a fixed offset, a fraction of the period derived from its
UID (the same in every operator process and after every restart, unlike a random one), and
its periodic work lands on that offset.
"""

from __future__ import annotations

import hashlib


def phase(uid: str) -> float:
    """A fraction in [0, 1) fixed by ``uid``, spread evenly over deployments."""
    digest = hashlib.sha256(uid.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def next_slot(after: float, period: float, fraction: float) -> float:
    """The first time at or after ``after`` that is ``fraction`` of the way into a period
    (times in seconds on any clock both share)."""
    offset = fraction * period
    return after + (offset - after) % period


def first_due(start: float, period: float, fraction: float) -> float:
    """When the first run after ``start`` is due: between half a period and one and a
    half after it, at the deployment's offset (the middle, one period, for 0.5)."""
    return start + period * (0.5 + fraction)
