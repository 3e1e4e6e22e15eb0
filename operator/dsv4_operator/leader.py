"""Leader election on a coordination.k8s.io Lease, so two operator replicas never both act.

The decision is a pure function of the Lease and the clock (`lease_verdict`); the loop
around it only reads and writes the Lease.  Writes carry the resourceVersion read, so two
candidates racing for an expired Lease cannot both win: the loser gets 409.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from dsv4_operator.reconcile.kube import ApiError, Kube

log = logging.getLogger("dsv4_operator.leader")


@dataclass(frozen=True)
class LeaseConfig:
    name: str
    namespace: str
    identity: str
    duration_s: int = 15

    @property
    def renew_every_s(self) -> float:
        return self.duration_s / 3


def _format(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(s: str) -> dt.datetime:
    return dt.datetime.strptime(s.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")


def lease_verdict(spec: dict[str, Any], identity: str, now: dt.datetime) -> str:
    """`renew` (ours), `take` (free or expired) or `wait` (someone else holds it)."""
    holder = spec.get("holderIdentity")
    if holder == identity:
        return "renew"
    renewed = spec.get("renewTime")
    if not holder or renewed is None:
        return "take"
    expiry = _parse(renewed) + dt.timedelta(seconds=spec.get("leaseDurationSeconds", 15))
    return "take" if now >= expiry else "wait"


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


def try_hold(kube: Kube, config: LeaseConfig) -> bool:
    """One attempt to take or renew the Lease; True while this process is the leader."""
    now = dt.datetime.now(dt.UTC)
    lease = kube.get("Lease", config.namespace, config.name)
    try:
        if lease is None:
            kube.create(lease_body(config, now, None))
            return True
        verdict = lease_verdict(lease.get("spec") or {}, config.identity, now)
        if verdict == "wait":
            return False
        acquired = lease["spec"].get("acquireTime") if verdict == "renew" else None
        body = lease_body(config, now, acquired)
        body["metadata"]["resourceVersion"] = lease["metadata"]["resourceVersion"]
        kube.replace(body)
        return True
    except ApiError as err:
        if err.status == 409:
            return False
        raise


async def acquire(kube: Kube, config: LeaseConfig) -> None:
    while True:
        try:
            if await asyncio.to_thread(try_hold, kube, config):
                log.info("became leader", extra={"lease": config.name, "identity": config.identity})
                return
        except ApiError as err:
            log.warning("lease attempt failed: %s", err)
        await asyncio.sleep(config.renew_every_s)


async def keep(kube: Kube, config: LeaseConfig, lost: asyncio.Event) -> None:
    """Renew until a renewal is refused or the Lease could not be renewed before expiry."""
    last_ok = asyncio.get_running_loop().time()
    while True:
        await asyncio.sleep(config.renew_every_s)
        try:
            held = await asyncio.to_thread(try_hold, kube, config)
        except ApiError as err:
            log.warning("lease renewal failed: %s", err)
            held = asyncio.get_running_loop().time() - last_ok < config.duration_s
        else:
            last_ok = asyncio.get_running_loop().time() if held else last_ok
        if not held:
            log.error("lost leadership", extra={"lease": config.name})
            lost.set()
            return


def release(kube: Kube, config: LeaseConfig) -> None:
    """Hand the Lease over at shutdown so a standby need not wait for it to expire."""
    lease = kube.get("Lease", config.namespace, config.name)
    if lease is None or (lease.get("spec") or {}).get("holderIdentity") != config.identity:
        return
    lease["spec"]["holderIdentity"] = None
    try:
        kube.replace(lease)
    except ApiError as err:
        log.warning("lease release failed: %s", err)
