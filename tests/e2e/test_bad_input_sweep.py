"""The bad-input sweep: mutated DSV4Deployments (tests/e2e/bad_inputs.py) against the real
API server with the operator running.  Every input must end refused with a message naming
a field, or Ready, or Degraded with a reason — never stuck Progressing, never a traceback.

Hypothesis with a fixed seed (derandomize, no example database) generates the inputs.  Each
is sent to the API server as `kubectl apply` would (strict field validation) in a server-side
dry run; what the server accepts is reconciled by the real operator code against the
in-memory API double (every one), and a bounded set of them — the first accepted of each
mutation class, small enough to schedule — is applied for real, where the operator must
bring each to Ready or to Degraded with a reason within a bound (progressDeadlineSeconds is
set to 10 s on those, so a deployment that cannot progress says so in time).  The counts of
each outcome are printed.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from kubernetes import config

from dsv4_dev.cluster.local import LocalCluster
from dsv4_operator.api import KIND
from dsv4_operator.api.crd import CRD_PATH
from dsv4_operator.api.names import name_problem
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.kube.client import ApiError, Kube, path
from tests.e2e.bad_inputs import Case, cases, pods_wanted, spec_leaves
from tests.e2e.helpers import get_json, operator_and_runtime, wait_for
from tests.unit.operator.harness import World

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NS = "dsv4-sweep"
EXAMPLES = 400
REAL_MAX = 8  # deployments applied for real
REAL_PODS = 6  # ... each making at most this many pods
SETTLE_S = 90  # Ready, or Degraded with a reason, within this long
# A refusal names the field it is about: `spec.prefill.tp`, `spec.placement.gpuProducts[0]`,
# `metadata.name`.
NAMES_A_FIELD = re.compile(r"\b(metadata\.name|spec(\.[A-Za-z0-9]+|\[\d+\])+)")


@pytest.fixture(scope="module")
def world(cluster: LocalCluster, tmp_path_factory):
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_PATH))
    cluster.wait_established("crd/dsv4deployments.inference.dsv4.dev")
    cluster.kubectl("create", "namespace", NS, check=False)
    logs = tmp_path_factory.mktemp("sweep")
    operator, _ = operator_and_runtime(cluster, NS, logs)
    operator.start()  # starts while the dry runs go
    kube = Kube(config.new_client_from_config(config_file=cluster.kubeconfig))
    try:
        yield cluster, kube, operator
    finally:
        operator.stop()
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)


def dry_run(kube: Kube, obj: dict[str, Any]) -> ApiError | dict[str, Any]:
    """The API server's answer to `kubectl apply` of a new object, persisting nothing: its
    refusal, or the object as it would store it — defaults applied, a null where a default
    stands replaced by it — which is what the operator would read."""
    try:
        return kube.request(
            "POST", path(KIND, NS), obj, query=[("dryRun", "All"), ("fieldValidation", "Strict")]
        )
    except ApiError as err:
        return err


def in_memory_outcome(obj: dict[str, Any]) -> str:
    """The operator's real reconcile on the API double (its controllers settle everything
    they can): what the accepted input ends as, and that no pass raises."""
    world = World()
    world.api.user_apply({**obj, "apiVersion": "inference.dsv4.dev/v1alpha1", "kind": KIND,
                          "metadata": {**obj["metadata"], "namespace": "serving"}})  # fmt: skip
    name = obj["metadata"]["name"]
    for _ in range(10):
        world.step(name)
        status = world.api.get(KIND, "serving", name).get("status") or {}
        if status.get("phase") in ("Ready", "Degraded"):
            break
    return ending(status)


def ending(status: dict[str, Any]) -> str:
    """'Ready', 'Degraded/<reason>', or what is wrong with it."""
    degraded = next((c for c in status.get("conditions") or [] if c["type"] == "Degraded"), {})
    if status.get("phase") == "Ready":
        return "Ready"
    if status.get("phase") == "Degraded" and degraded.get("reason") and degraded.get("message"):
        return f"Degraded/{degraded['reason']}"
    return f"stuck {status.get('phase')}: {status.get('conditions')}"


def test_every_bad_input_is_refused_naming_a_field_or_ends_ready_or_degraded(world):
    cluster, kube, operator = world
    started = time.monotonic()
    refused: Counter[str] = Counter()
    accepted: list[Case] = []
    tried: set[str] = set()
    leaves = spec_leaves()

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(cases(leaves))
    def sweep(case: Case) -> None:
        text = json.dumps(case.obj, sort_keys=True)
        if text in tried:
            return
        tried.add(text)
        err = dry_run(kube, case.obj)
        if not isinstance(err, ApiError):
            meta = {
                k: v for k, v in err["metadata"].items() if k in ("name", "labels", "annotations")
            }
            stored = {**case.obj, "metadata": meta, "spec": err["spec"]}
            accepted.append(dataclasses.replace(case, obj=stored))
            return
        assert err.status in (400, 422), f"{case.classes}: {err}"
        assert NAMES_A_FIELD.search(err.message), f"refused without naming a field: {err.message}"
        refused[f"HTTP {err.status}"] += 1

    sweep()
    dry_run_s = time.monotonic() - started

    # What the API server accepts the operator's own models accept (the CEL rules and the
    # pydantic validators are the same rules), and its name fits.
    for case in accepted:
        spec = DSV4DeploymentSpec.model_validate(case.obj["spec"])
        assert name_problem(case.obj["metadata"]["name"], spec.multinode) is None, case.obj

    # Every accepted input through the operator's reconcile (no pass may raise).
    endings = Counter(in_memory_outcome(case.obj) for case in accepted)
    assert not [e for e in endings if e.startswith("stuck")], endings

    # A bounded set for real: the first accepted of each class that schedules small.
    real: dict[str, Case] = {}
    for case in accepted:
        cls = case.classes[-1]
        if cls not in real and len(real) < REAL_MAX and pods_wanted(case.obj["spec"]) <= REAL_PODS:
            real[cls] = case
    names = []
    for i, (cls, case) in enumerate(sorted(real.items())):
        obj = json.loads(json.dumps(case.obj))
        if cls != "long_name":
            obj["metadata"]["name"] = f"sweep-{i}"
        obj["spec"]["progressDeadlineSeconds"] = 10
        cluster.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(obj))
        names.append(obj["metadata"]["name"])

    def all_ended() -> dict[str, str] | None:
        found = {
            o["metadata"]["name"]: ending(o.get("status") or {})
            for o in get_json(cluster, "dsv4", "-n", NS)["items"]
        }
        done = all(not e.startswith("stuck") for e in found.values()) and len(found) == len(names)
        return found if done else None

    real_endings = wait_for("every real input Ready or Degraded with a reason", all_ended, SETTLE_S)
    cluster.kubectl("delete", "dsv4", "--all", "-n", NS, "--wait=false")
    log = operator.text()
    assert "Traceback" not in log, log[log.index("Traceback") - 2000 :][:6000]

    classes = Counter(c for case in accepted for c in case.classes)
    print(
        f"\n{len(tried)} distinct inputs in {dry_run_s:.1f}s of dry runs: "
        f"{sum(refused.values())} refused naming a field ({dict(refused)}), "
        f"{len(accepted)} accepted (mutation classes {dict(classes)})"
        f"\naccepted, reconciled on the API double: {dict(endings)}"
        f"\napplied for real ({len(names)}): {real_endings}"
        f"\nsweep took {time.monotonic() - started:.1f}s"
    )
    assert refused and accepted and real_endings
