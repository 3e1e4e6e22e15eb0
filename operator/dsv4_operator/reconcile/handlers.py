"""kopf wiring: which watch events start a reconcile pass.  No logic lives here.

Only `on.event` handlers: kopf then stores no progress annotations and adds no finalizer,
so the operator's only writes are its own (through `Kube`), deletion needs no running
operator, and children are removed by the garbage collector through owner references.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import kopf

from dsv4_operator.api import GROUP, KIND, PLURAL, VERSION
from dsv4_operator.api.names import CANARY_SUFFIX
from dsv4_operator.reconcile.reconciler import Reconciler
from dsv4_operator.render.lws import LWS_GROUP, LWS_PLURAL
from dsv4_operator.render.meta import (
    APP,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    MANAGED_BY,
)
from dsv4_operator.rollout.probe_job import COMPONENT as PROBE_COMPONENT

log = logging.getLogger("dsv4_operator.handlers")
WATCHED_CHILDREN = (
    ("apps", "v1", "statefulsets"),
    ("apps", "v1", "deployments"),
    # Served only where LWS is installed: kopf starts this watch once the CRD appears.
    (LWS_GROUP, "v1", LWS_PLURAL),
)


def register(
    registry: kopf.OperatorRegistry, reconciler: Reconciler, watch_probe_jobs: bool = False
) -> None:
    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_via_client(**kwargs)

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def deployment_changed(
        event: dict[str, Any], name: str, namespace: str, **_: Any
    ) -> None:
        if event.get("type") != "DELETED":
            await reconciler.reconcile(namespace, name)

    async def child_changed(
        event: dict[str, Any], meta: dict[str, Any], namespace: str, **_: Any
    ) -> None:
        # A child's status moved (pods became ready, a rollout progressed): refresh its
        # owner — the DSV4Deployment its owner reference names, which for a canary child or
        # a probe Job is not what its instance label says.
        owner = owning_deployment(meta)
        if owner is not None:
            await reconciler.reconcile(namespace, owner)

    for group, version, plural in WATCHED_CHILDREN:
        kopf.on.event(
            group,
            version,
            plural,
            labels={LABEL_MANAGED_BY: MANAGED_BY, LABEL_INSTANCE: kopf.PRESENT},
            registry=registry,
            id=f"child-{plural}",
        )(child_changed)

    # A pod was scheduled or not, a container started or keeps failing: why a replica is
    # not coming up may have changed, and the status says why (reconcile.blockers).
    kopf.on.event(
        "",
        "v1",
        "pods",
        labels={LABEL_NAME: APP, LABEL_INSTANCE: kopf.PRESENT},
        registry=registry,
        id="pods",
    )(child_changed)

    if watch_probe_jobs:
        # A probe Job ended: its verdict is in the report now, act on it without waiting
        # for the resync.
        kopf.on.event(
            "batch",
            "v1",
            "jobs",
            labels={LABEL_COMPONENT: PROBE_COMPONENT, LABEL_INSTANCE: kopf.PRESENT},
            registry=registry,
            id="probe-jobs",
        )(child_changed)


def owning_deployment(meta: dict[str, Any]) -> str | None:
    """The DSV4Deployment a child belongs to.  A probe Job names it through its report's
    labels instead (its owner is the report ConfigMap), a pod through its slice's instance
    label (its owner is a StatefulSet or ReplicaSet): `<name>` or `<name>--canary`."""
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(f"{GROUP}/"):
            return str(ref["name"])
    labels = meta.get("labels") or {}
    if labels.get(LABEL_COMPONENT) == PROBE_COMPONENT:
        return labels.get(LABEL_INSTANCE)
    if labels.get(LABEL_NAME) == APP and labels.get(LABEL_INSTANCE):
        return str(labels[LABEL_INSTANCE]).removesuffix(CANARY_SUFFIX)
    return None


async def resync_forever(
    reconciler: Reconciler, namespaces: Sequence[str], interval: float
) -> None:
    """Reconcile every DSV4Deployment every `interval` seconds, events or not.

    The safety net for a pass that failed after its retries and for state the watches do
    not show; in steady state each pass only reads.
    """
    while True:
        await asyncio.sleep(interval)
        try:
            items = await asyncio.to_thread(_list_all, reconciler, namespaces)
            for namespace, name in items:
                await reconciler.reconcile(namespace, name)
        except Exception:  # the loop must outlive API outages and bad responses
            log.exception("resync pass failed")


def _list_all(reconciler: Reconciler, namespaces: Sequence[str]) -> list[tuple[str, str]]:
    scopes: Sequence[str | None] = namespaces or [None]
    return [
        (o["metadata"]["namespace"], o["metadata"]["name"])
        for ns in scopes
        for o in reconciler.kube.list(KIND, ns)
    ]
