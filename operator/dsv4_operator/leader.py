"""Leader election on a coordination.k8s.io Lease, so two operator replicas never both act.

The decision is a pure function of the Lease, what this candidate saw of it and its own
clock (`lease_verdict`); the loop around it only reads and writes the Lease.  Writes carry
the resourceVersion read, so two candidates racing for an expired Lease cannot both win:
the loser gets 409.

Timing follows client-go's leader election.  A candidate measures expiry on its own
monotonic clock, from when it last saw the Lease's holder or renewTime change (never the
holder's renewTime against its own wall clock: the two machines' clocks may disagree by
more than the Lease lasts), and takes a Lease only after its full duration without a
change.  The holder stops acting once it has failed to renew for the (shorter) renew
deadline, counted from when it sent its last successful renewal.  Every write but the
Lease's own asks `Leadership.remaining` first (`Kube.fence`): none is sent once the deadline
has passed, and each is abandoned by the client at the deadline at the latest.  So no write
is sent or waited for after the renew deadline, which passes at least duration − deadline
(5 s by default) before any candidate may take over; what this cannot rule out is a request
the API server received before the deadline and finishes later (Kubernetes has no fencing
token), which the gap makes unlikely, not impossible.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from dsv4_operator.kube.client import ApiError, Kube

log = logging.getLogger("dsv4_operator.leader")


@dataclass(frozen=True)
class LeaseConfig:
    name: str
    namespace: str
    identity: str
    duration_s: int = 15  # others may take the Lease this long after its last renewal
    renew_deadline_s: float = 10.0  # the holder stops acting this long after its last renewal
    retry_period_s: float = 2.0  # how often the holder renews (and a candidate retries)

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.duration_s:
            raise ValueError(
                "lease timing needs retry period < renew deadline < lease duration, got "
                f"{self.retry_period_s} / {self.renew_deadline_s} / {self.duration_s}"
            )

    @classmethod
    def scaled(cls, name: str, namespace: str, identity: str, duration_s: int) -> LeaseConfig:
        """Deadline and retry period in client-go's proportions (15 / 10 / 2 s)."""
        return cls(name, namespace, identity, duration_s, duration_s * 2 / 3, duration_s * 2 / 15)

    @property
    def request_timeout_s(self) -> float:
        return self.retry_period_s


@dataclass(frozen=True)
class Sighting:
    """The Lease's holder and renewTime as this candidate last saw them change, and when,
    on its own monotonic clock: expiry is counted from here."""

    holder: str | None
    renew_time: str | None
    seen_at: float


@dataclass
class Leadership:
    """Whether this process may still write (it renewed within the renew deadline), and
    what it saw of the Lease while it did not hold it."""

    config: LeaseConfig
    renewed_at: float | None = None  # time.monotonic() of the last successful renewal
    clock: Any = field(default=time.monotonic)
    sighting: Sighting | None = None

    def remaining(self) -> float:
        """Seconds this process may still write: until the renew deadline (0: not leader)."""
        if self.renewed_at is None:
            return 0.0
        return max(0.0, self.config.renew_deadline_s - (self.clock() - self.renewed_at))

    def held(self) -> bool:
        return self.remaining() > 0


def _format(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(s: str) -> dt.datetime:
    return dt.datetime.strptime(s.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")


def lease_verdict(
    spec: dict[str, Any], identity: str, last: Sighting | None, now: float
) -> tuple[str, Sighting]:
    """`renew` (ours), `take` (free, or unchanged for its duration as seen from here) or
    `wait` (someone else holds it), and the sighting to remember; ``now`` is this
    candidate's monotonic clock."""
    holder, renewed = spec.get("holderIdentity"), spec.get("renewTime")
    if last is None or (last.holder, last.renew_time) != (holder, renewed):
        last = Sighting(holder, renewed, now)
    if holder == identity:
        return "renew", last
    if not holder or renewed is None:
        return "take", last
    unchanged = now - last.seen_at
    return ("take" if unchanged >= spec.get("leaseDurationSeconds", 15) else "wait"), last


def lease_body(config: LeaseConfig, now: dt.datetime, acquired: str | None) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": config.name, "namespace": config.namespace},
        "spec": {
            "holderIdentity": config.identity,
            "leaseDurationSeconds": config.duration_s,
            "acquireTime": acquired or _format(now),
            "renewTime": _format(now),
        },
    }


def try_hold(kube: Kube, leadership: Leadership) -> bool:
    """One attempt to take or renew the Lease; True while this process is the leader."""
    config = leadership.config
    timeout = config.request_timeout_s
    now = dt.datetime.now(dt.UTC)  # only written into the Lease, for people to read
    lease = kube.get("Lease", config.namespace, config.name, timeout=timeout)
    sent: dict[str, Any] | None = None  # the renewal or takeover, once sent
    try:
        if lease is None:
            kube.create(lease_body(config, now, None), timeout=timeout)
            return True
        verdict, leadership.sighting = lease_verdict(
            lease.get("spec") or {}, config.identity, leadership.sighting, leadership.clock()
        )
        if verdict == "wait":
            return False
        acquired = lease["spec"].get("acquireTime") if verdict == "renew" else None
        body = lease_body(config, now, acquired)
        body["metadata"]["resourceVersion"] = lease["metadata"]["resourceVersion"]
        sent = body["spec"]
        kube.replace(body, timeout=timeout)
        return True
    except ApiError as err:
        if err.status == 409:
            return sent is not None and _landed(kube, config, sent)
        raise


def _landed(kube: Kube, config: LeaseConfig, sent: dict[str, Any]) -> bool:
    """After a 409: did our own write land all the same?  A renewal whose answer timed out
    is sent again by the HTTP client (PUT is idempotent), and the repeat finds the version
    the first one made: refused, though the Lease is ours with our renewal in it.  Only a
    Lease that shows someone else's write means another holder."""
    lease = kube.get("Lease", config.namespace, config.name, timeout=config.request_timeout_s)
    spec = (lease or {}).get("spec") or {}
    return (
        spec.get("holderIdentity") == config.identity and spec.get("renewTime") == sent["renewTime"]
    )


async def acquire(kube: Kube, leadership: Leadership) -> None:
    config = leadership.config
    while True:
        started = leadership.clock()
        try:
            if await asyncio.to_thread(try_hold, kube, leadership):
                leadership.renewed_at = started
                log.info("became leader", extra={"lease": config.name, "identity": config.identity})
                return
        except ApiError as err:
            log.warning("lease attempt failed: %s", err)
        await asyncio.sleep(config.retry_period_s)


async def keep(kube: Kube, leadership: Leadership, lost: asyncio.Event) -> None:
    """Renew every retry period; leadership ends when a renewal is refused or none has
    succeeded within the renew deadline (`Leadership.held` turns False at that instant,
    so writes stop even before this loop notices)."""
    config = leadership.config
    while True:
        await asyncio.sleep(config.retry_period_s)
        started = leadership.clock()
        try:
            if await asyncio.to_thread(try_hold, kube, leadership):
                # Credit the renewal to when it was sent: the API may have been slow.
                leadership.renewed_at = started
            else:
                log.error("lost leadership: another holder renewed the Lease")
                break
        except ApiError as err:
            log.warning("lease renewal failed: %s", err)
        if not leadership.held():
            log.error("lost leadership: no renewal within the renew deadline")
            break
    leadership.renewed_at = None
    lost.set()


def release(kube: Kube, config: LeaseConfig) -> None:
    """Hand the Lease over at shutdown so a standby need not wait for it to expire."""
    lease = kube.get("Lease", config.namespace, config.name, timeout=config.request_timeout_s)
    if lease is None or (lease.get("spec") or {}).get("holderIdentity") != config.identity:
        return
    lease["spec"]["holderIdentity"] = None
    try:
        kube.replace(lease, timeout=config.request_timeout_s)
    except ApiError as err:
        log.warning("lease release failed: %s", err)
