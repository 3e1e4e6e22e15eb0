"""Readiness the local runtime earns, and the termination it waits out: no engine or router
pod is Ready before its process answers, none is gone before its process has stopped, and
no probe pod is KWOK's.

KWOK marks a pod Running and Ready the moment it is scheduled, while the process the local
runtime starts for it takes seconds to answer.  Left alone, the StatefulSets, Deployments
and the operator would count a replica that serves nothing as Ready — and a paired
promotion would retire the old slot's router before the new one answers, which on a real
cluster the router's readiness probe prevents.

So while a runtime plays kubelet, a MutatingAdmissionPolicy gives every new DSV4 engine,
router and probe pod a scheduling gate; the runtime starts the pod's process at once and
lifts the gate when the process answers (or at once for a pod it will not run), and only
then is the pod scheduled and marked Ready.  A probe Job's pod keeps its gate for good: KWOK
completes every Job pod it runs, so the runtime reports the probe's exit itself (`probes`).
When the runtime stops it removes the policy and lifts every gate it still holds on a pod
that has not ended: without a runtime KWOK plays every pod, as before.

KWOK deletes a pod the instant it is marked for deletion, while kubelet removes it only
once its containers have stopped.  Left alone, a Deployment deleted with foreground
propagation would be gone while its router still answers, and a paired promotion would
retire the old slot's engines under that router's in-flight and just-routed requests.  So
the same policy gives every engine and router pod a finalizer (`HOLD`) standing for its
container: the runtime removes it once the pod's process has drained and stopped (`let_go`),
at once for a pod it runs no process for, and from every pod when it stops.  A runtime that
starts again finds the pods it let go without it, as a kubelet restarted finds its pods
running: it holds each again before it runs its process (`hold`).

The API server applies a new policy some time after it is created; a pod made meanwhile is
KWOK's (Ready at once, a probe pod completed without running).  So the runtime says it
plays kubelet only once a server-side dry run of a DSV4 pod comes back gated
(`wait_effective`), and whoever starts it waits for that line (`READY`).
"""

from __future__ import annotations

import time
from typing import Any

from dsv4_operator.render.meta import APP, LABEL_COMPONENT, LABEL_NAME, PROBE_COMPONENT

GATE = "inference.dsv4.dev/local-runtime"
HOLD = "inference.dsv4.dev/local-runtime-container"
POLICY = "dsv4-local-runtime-gate"
_GROUP, _VERSION = "admissionregistration.k8s.io", "v1"
_COMPONENTS = ("prefill", "decode", "router", PROBE_COMPONENT)
EFFECTIVE_TIMEOUT_S = 60.0


def policy_objects() -> list[tuple[str, dict[str, Any]]]:
    """(plural, object) of the policy and its binding (cluster-wide: every namespace the
    runtime plays)."""
    labels = "object.metadata.labels"
    matches = (
        f"has(object.metadata.labels) && '{LABEL_NAME}' in {labels} && "
        f"{labels}['{LABEL_NAME}'] == '{APP}' && '{LABEL_COMPONENT}' in {labels} && "
        f"{labels}['{LABEL_COMPONENT}'] in {list(_COMPONENTS)}"
    )
    spec = f'spec: Object.spec{{schedulingGates: [Object.spec.schedulingGates{{name: "{GATE}"}}]}}'
    held = f'metadata: Object.metadata{{finalizers: ["{HOLD}"]}}'
    # Probe pods end by themselves (`probes`): only a serving container is waited out.
    gate = (
        f"{labels}['{LABEL_COMPONENT}'] == '{PROBE_COMPONENT}' ? "
        f"Object{{{spec}}} : Object{{{held}, {spec}}}"
    )
    policy = {
        "apiVersion": f"{_GROUP}/{_VERSION}",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ]
            },
            "matchConditions": [{"name": "dsv4-engine-router-or-probe", "expression": matches}],
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "mutations": [
                {"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": gate}}
            ],
        },
    }
    binding = {
        "apiVersion": f"{_GROUP}/{_VERSION}",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY},
        "spec": {"policyName": POLICY},
    }
    return [("mutatingadmissionpolicies", policy), ("mutatingadmissionpolicybindings", binding)]


def install(custom: Any) -> None:
    """Create or replace the policy and its binding (``custom``: a CustomObjectsApi)."""
    from kubernetes.client.exceptions import ApiException

    for plural, body in policy_objects():
        name = body["metadata"]["name"]
        try:
            current = custom.get_cluster_custom_object(_GROUP, _VERSION, plural, name)
        except ApiException as err:
            if err.status != 404:
                raise
            custom.create_cluster_custom_object(_GROUP, _VERSION, plural, body)
            continue
        body = {**body, "metadata": {**body["metadata"], **_version_of(current)}}
        custom.replace_cluster_custom_object(_GROUP, _VERSION, plural, name, body)


def wait_effective(core: Any, namespace: str, timeout_s: float = EFFECTIVE_TIMEOUT_S) -> None:
    """Until the API server gates a new DSV4 pod (a server-side dry run of one in
    ``namespace``, nothing made); RuntimeError after ``timeout_s``."""
    from kubernetes import client

    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(
            generate_name="dsv4-gate-check-", labels={LABEL_NAME: APP, LABEL_COMPONENT: "router"}
        ),
        spec=client.V1PodSpec(containers=[client.V1Container(name="check", image="none")]),
    )
    deadline = time.monotonic() + timeout_s
    while not gated(core.create_namespaced_pod(namespace, pod, dry_run="All")):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the API server did not apply MutatingAdmissionPolicy {POLICY} within "
                f"{timeout_s:.0f}s: new DSV4 pods would not wait for the local runtime"
            )
        time.sleep(0.2)


def uninstall(custom: Any) -> None:
    from kubernetes.client.exceptions import ApiException

    for plural, body in reversed(policy_objects()):
        try:
            custom.delete_cluster_custom_object(_GROUP, _VERSION, plural, body["metadata"]["name"])
        except ApiException as err:
            if err.status != 404:
                raise


def gated(pod: Any) -> bool:
    """The pod waits for this runtime (still unscheduled, its process not answering yet)."""
    return any(g.name == GATE for g in pod.spec.scheduling_gates or [])


def lift(core: Any, pod: Any) -> None:
    """Remove the gate (a JSON patch that first tests it is where it was: a pod whose gates
    changed meanwhile is left to the next pass)."""
    from kubernetes.client.exceptions import ApiException

    index = next(i for i, g in enumerate(pod.spec.scheduling_gates) if g.name == GATE)
    ops = [
        {"op": "test", "path": f"/spec/schedulingGates/{index}/name", "value": GATE},
        {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
    ]
    try:
        core.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace, ops)
    except ApiException as err:
        if err.status not in (404, 409, 422):
            raise


def held(pod: Any) -> bool:
    """The pod stays until this runtime lets it go (its process stopped)."""
    return HOLD in (pod.metadata.finalizers or [])


def hold(core: Any, pod: Any) -> None:
    """Give ``pod`` `HOLD` if it lacks it (by uid: not a pod of the same name made since):
    what the policy gives a pod at its creation, for one this runtime adopts."""
    from kubernetes.client.exceptions import ApiException

    if held(pod):
        return
    add = (
        {"op": "add", "path": "/metadata/finalizers/-", "value": HOLD}
        if pod.metadata.finalizers
        else {"op": "add", "path": "/metadata/finalizers", "value": [HOLD]}
    )
    ops = [{"op": "test", "path": "/metadata/uid", "value": pod.metadata.uid}, add]
    try:
        core.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace, ops)
    except ApiException as err:
        if err.status not in (404, 409, 422):
            raise


def let_go(core: Any, namespace: str, name: str, uid: str) -> None:
    """Remove `HOLD` from the pod (by ``uid``: a pod of the same name made since is not
    touched), as kubelet removes a pod whose containers have stopped."""
    from kubernetes.client.exceptions import ApiException

    try:
        pod = core.read_namespaced_pod(name, namespace)
    except ApiException as err:
        if err.status == 404:
            return
        raise
    if pod.metadata.uid != uid or not held(pod):
        return
    index = pod.metadata.finalizers.index(HOLD)
    ops = [
        {"op": "test", "path": f"/metadata/finalizers/{index}", "value": HOLD},
        {"op": "remove", "path": f"/metadata/finalizers/{index}"},
    ]
    try:
        core.patch_namespaced_pod(name, namespace, ops)
    except ApiException as err:
        if err.status not in (404, 409, 422):
            raise


def _version_of(current: dict[str, Any]) -> dict[str, str]:
    return {"resourceVersion": current["metadata"]["resourceVersion"]}
