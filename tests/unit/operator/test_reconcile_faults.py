"""The reconcile under faults: a crash before any write of a rollout, lost status, stray
controls, a namesake deployment, a promotion that cannot finish — against the in-memory API
double (`harness`), every write a crash point.  The same code runs against the real control
plane in tests/e2e; this is where every interleaving can be tried.

Exactly-once, as a user sees it: one canary slice created per rollout, one probe Job per
attempt, one promotion, the verdict recorded, and never — at any write, in any order of
crashes — a stable workload running flags that no canary passed.
"""

from __future__ import annotations

import copy

import pytest

from dsv4_operator.api import KIND
from dsv4_operator.api.rollout import EngineRevision
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.kube.client import ApiError
from dsv4_operator.reconcile.triggers import owning_deployment
from dsv4_operator.render.meta import LABEL_SLOT, LABEL_TRANSFER
from dsv4_operator.rollout import manual
from dsv4_operator.rollout.decide import ManualAction
from dsv4_operator.rollout.record import ANNOTATION_RUNS
from dsv4_operator.rollout.slices import spec_revision
from tests.unit.operator.harness import FAIL, FP4, HICACHE, HICACHE_IN_PLACE, NS, PASS, World
from tests.unit.operator.memory_api import MemoryApi

pytestmark = pytest.mark.slow


def ready_world() -> World:
    world = World()
    world.create("flash")
    world.until("Ready", lambda: (world.obj().get("status") or {}).get("phase") == "Ready")
    return world


def flags_of(world: World, name: str = "flash") -> EngineRevision:
    """The flags the spec asks for now."""
    return spec_revision(DSV4DeploymentSpec.model_validate(world.obj(name)["spec"]))


def stable_runs(
    api: MemoryApi, writes: list, instance: str = "flash", role: str | None = None
) -> set[str]:
    """Every flag revision any stable StatefulSet of ``instance`` (of ``role``: only that
    role's) was ever written with."""
    seen = set()
    for write in writes:
        body = write.body
        if write.verb != "apply" or write.key[0] != "StatefulSet" or body is None:
            continue
        labels = body["metadata"]["labels"]
        if labels.get("app.kubernetes.io/instance") != instance:
            continue
        if role is not None and labels.get("app.kubernetes.io/component") != role:
            continue
        runs = body["metadata"].get("annotations", {}).get(ANNOTATION_RUNS)
        if runs:
            seen.add(EngineRevision.model_validate_json(runs).revision)
    return seen


def runs_of(world: World, name: str) -> str:
    """The revision StatefulSet ``name`` records running."""
    found = world.api.get("StatefulSet", NS, name)
    assert found is not None
    return EngineRevision.model_validate_json(
        found["metadata"]["annotations"][ANNOTATION_RUNS]
    ).revision


def created(world: World, kind: str, prefix: str) -> list[str]:
    return [
        w.key[2]
        for w in world.api.log
        if w.created and w.key[0] == kind and w.key[2].startswith(prefix)
    ]


def promotions(world: World) -> int:
    """Status writes that moved the stable flags: each is one promotion."""
    count, stable = 0, None
    for write in world.api.log:
        if write.verb != "status":
            continue
        revision = ((write.body or {}).get("status", {}).get("rollout") or {}).get("stableRevision")
        if stable is not None and revision is not None and revision != stable:
            count += 1
        stable = revision or stable
    return count


def mixed_slots(world: World) -> dict[str, set[str]]:
    """Slots whose engines speak more than one transfer format: a router of that slot
    could pair a prefill with a decode of another format.  Must always be empty."""
    formats: dict[str, set[str]] = {}
    for (kind, _, _), obj in world.api.objects.items():
        labels = obj.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})
        if kind == "StatefulSet" and labels.get("app.kubernetes.io/instance") == "flash":
            formats.setdefault(labels[LABEL_SLOT], set()).add(labels[LABEL_TRANSFER])
    return {slot: found for slot, found in formats.items() if len(found) > 1}


def no_mixed_slots(world: World) -> None:
    assert not mixed_slots(world), mixed_slots(world)


def rollout_writes(change: dict, verdict: dict) -> int:
    """How many writes a whole rollout makes without faults (the crash points to try)."""
    world = ready_world()
    world.verdict = lambda job: verdict
    before = len(world.api.log)
    world.patch_spec("flash", change)
    final = "Idle" if verdict is PASS else "RolledBack"
    world.until("done", lambda: world.phase() == final and world.rollout().get("verdict"))
    world.until("canary gone", lambda: not world.children("flash--canary"))
    return len(world.api.log) - before


# A change of the transfer format (promoted in pairs), one that keeps it (in pairs too, by
# default: a surge) and the same promoted role by role in place, as a spec may ask.
CHANGES = {"paired": FP4, "surge": HICACHE, "role-by-role": HICACHE_IN_PLACE}
PASS_WRITES = {kind: rollout_writes(change, PASS) for kind, change in CHANGES.items()}
FAIL_WRITES = rollout_writes(FP4, FAIL)


def test_the_sweep_covers_whole_rollouts():
    # Status, canary slice (12 objects), probe report + identity + Job, promotions, Events.
    assert min(PASS_WRITES.values()) > 40 and FAIL_WRITES > 30


@pytest.mark.parametrize(
    ("kind", "crash_at"),
    [(kind, n) for kind, writes in PASS_WRITES.items() for n in range(1, writes + 1)],
)
def test_a_crash_before_any_write_of_a_passing_rollout_still_promotes_exactly_once(kind, crash_at):
    world = ready_world()
    tested = flags_of(world)
    world.patch_spec("flash", CHANGES[kind])
    new = flags_of(world)
    start = len(world.api.log)
    world.checks.append(no_mixed_slots)
    world.crash_before_write(crash_at)
    world.until(
        "promoted",
        lambda: world.phase() == "Idle" and world.rollout().get("stableRevision") == new.revision,
        passes=60,
    )
    world.until("canary gone", lambda: not world.children("flash--canary"))
    assert world.crashes == 1
    rollout = world.rollout()
    assert rollout["verdict"] == "PASS" and rollout["report"]  # the verdict is not lost
    writes = world.api.log[start:]
    assert len(set(created(world, "StatefulSet", "flash--canary-decode"))) == 1
    assert (
        len(
            [
                w
                for w in writes
                if w.created and w.key == ("StatefulSet", NS, "flash--canary-decode")
            ]
        )
        == 1
    )
    jobs = [w.key[2] for w in writes if w.created and w.key[0] == "Job"]
    assert len(jobs) == rollout["probeAttempt"] == 1, jobs
    assert promotions(world) == 1
    # Stable workloads only ever ran the old flags or the ones the canary passed.
    assert stable_runs(world.api, writes) <= {tested.revision, new.revision}


@pytest.mark.parametrize("crash_at", range(1, FAIL_WRITES + 1))
def test_a_crash_before_any_write_of_a_failing_rollout_never_promotes_it(crash_at):
    world = ready_world()
    world.verdict = lambda job: FAIL
    stable = flags_of(world)
    world.patch_spec("flash", FP4)
    rejected = flags_of(world)
    start = len(world.api.log)
    world.crash_before_write(crash_at)
    world.until("rolled back", lambda: world.phase() == "RolledBack", passes=60)
    world.until("canary gone", lambda: not world.children("flash--canary"))
    assert world.crashes == 1
    rollout = world.rollout()
    assert rollout["verdict"] == "FAIL" and rollout["rejectedRevision"] == rejected.revision
    assert rollout["stableRevision"] == stable.revision
    writes = world.api.log[start:]
    assert rejected.revision not in stable_runs(world.api, writes)
    jobs = [w.key[2] for w in writes if w.created and w.key[0] == "Job"]
    assert len(jobs) == rollout["probeAttempt"] == 1, jobs
    # Sticky: more passes (and more crashes) never start it again.
    for _ in range(5):
        world.step("flash")
    assert world.phase() == "RolledBack" and not world.children("flash--canary")


def test_a_control_acts_once_and_is_never_acted_on_again():
    world = ready_world()
    world.verdict = lambda job: FAIL
    world.patch_spec("flash", FP4)
    world.until("rolled back", lambda: world.phase() == "RolledBack")
    rejected = world.rollout()["rejectedRevision"]
    world.verdict = lambda job: PASS
    world.control(ManualAction.RETRY, rejected, "t1")
    world.until("retried", lambda: world.phase() == "Idle" and world.rollout()["verdict"] == "PASS")
    assert world.rollout()["handledAction"] == "t1"
    # The operator wrote the resource's status only: the control stays as the person wrote it.
    annotations = world.obj()["metadata"]["annotations"]
    assert annotations[manual.ANNOTATION] == manual.encode(ManualAction.RETRY, "t1", rejected)
    assert not [w for w in world.api.log if w.key == (KIND, NS, "flash") and w.verb != "status"]
    # Read on every later pass, through another rollout and its rollback, it never acts
    # again, nor is it judged again (the flags it names are stable now: it would be refused).
    world.verdict = lambda job: FAIL
    world.patch_spec("flash", {"features": {"indexDtype": "fp8", "kvCanary": "off"}})
    world.until("rolled back again", lambda: world.phase() == "RolledBack")
    assert world.rollout()["handledAction"] == "t1"
    assert len(world.events("RetryRequested")) == 1
    assert not world.events("RolloutActionIgnored")


def test_an_oversized_control_is_refused_once_and_never_copied_into_the_status():
    """A 200 KB annotation (the review's) is no control: refused by its size, and what the
    status keeps of it is a short digest, never the annotation."""
    world = ready_world()
    world.patch_spec("flash", FP4)
    world.until("probing", lambda: world.phase() == "Probing", passes=3)
    world.annotate("flash", manual.ANNOTATION, "promote/" + "x" * 200_000)
    world.step("flash")
    handled = world.rollout()["handledAction"]
    assert handled.startswith("sha256:") and len(handled) <= manual.MAX_CONTROL
    (ignored,) = world.events("RolloutActionIgnored")
    assert "200008 characters; a control is at most 128" in ignored["message"]
    assert world.phase() == "Probing"  # refused: it neither promoted nor aborted


def test_a_leftover_promote_does_not_promote_the_next_rollout():
    world = ready_world()
    world.verdict = lambda job: FAIL
    world.patch_spec("flash", FP4)
    world.until("probing", lambda: world.phase() == "Probing", passes=3)
    first = world.rollout()["canaryRevision"]
    # A promote for the first rollout arrives only after it was rolled back.
    world.until("rolled back", lambda: world.phase() == "RolledBack")
    world.control(ManualAction.PROMOTE, first, "t-late")
    world.patch_spec("flash", {"features": {"indexDtype": "fp8", "kvCanary": "off"}})
    world.until("second canary", lambda: world.phase() in ("CanaryStarting", "Probing"))
    world.until("rolled back again", lambda: world.phase() == "RolledBack")
    second = world.rollout()
    assert second["canaryRevision"] != first
    assert second["verdict"] == "FAIL", "the leftover promote never acted on the new rollout"
    # Refused once, on the pass that first read it, and never judged again since, though
    # it stays on the resource (the operator does not write it).
    (ignored,) = world.events("RolloutActionIgnored")
    assert ignored.get("count", 1) == 1
    assert second["handledAction"] == "t-late"
    assert manual.ANNOTATION in world.obj()["metadata"]["annotations"]


def test_status_wiped_mid_rollout_never_lets_untested_flags_into_production():
    world = ready_world()
    stable = flags_of(world)
    world.verdict = lambda job: FAIL
    world.patch_spec("flash", FP4)
    world.until("probing", lambda: world.phase() == "Probing", passes=3)
    start = len(world.api.log)
    world.wipe_status("flash", part=None)  # a restore from a backup without status
    world.step("flash")
    rebuilt = world.rollout()
    assert rebuilt["stableRevision"] == stable.revision
    assert rebuilt["phase"] in ("CanaryStarting", "Probing")
    assert world.events("RolloutStateRebuilt")
    world.until("rolled back", lambda: world.phase() == "RolledBack")
    assert flags_of(world).revision not in stable_runs(world.api, world.api.log[start:])
    assert world.rollout()["probeAttempt"] == 2, "a new attempt, never the old report re-read"


def test_status_wiped_after_a_rejection_keeps_the_rejection():
    world = ready_world()
    world.verdict = lambda job: FAIL
    world.patch_spec("flash", FP4)
    world.until("rolled back", lambda: world.phase() == "RolledBack")
    rejected = world.rollout()["rejectedRevision"]
    world.wipe_status("flash")
    for _ in range(5):
        world.step("flash")
    assert world.phase() == "RolledBack" and world.rollout()["rejectedRevision"] == rejected
    assert not world.children("flash--canary")


def test_status_wiped_after_promotion_rebuilds_the_promoted_flags():
    world = ready_world()
    world.patch_spec("flash", FP4)
    world.until("promoted", lambda: world.phase() == "Idle" and world.rollout().get("verdict"))
    promoted = world.rollout()["stableRevision"]
    world.wipe_status("flash")
    world.step("flash")
    assert world.rollout()["stableRevision"] == promoted
    assert world.phase() == "Idle"


def test_status_wiped_mid_promotion_resumes_it_only_with_a_pass_report():
    world = ready_world()
    world.held = lambda obj: obj["metadata"]["name"] == "flash-decode"  # decode keeps rolling
    world.patch_spec("flash", HICACHE_IN_PLACE)
    world.until("decode promoting", lambda: world.rollout().get("promotedRoles") == ["decode"])
    world.wipe_status("flash")
    world.step("flash")
    resumed = world.rollout()
    assert resumed["phase"] == "Promoting" and resumed["promotedRoles"] == ["decode"]
    # The same, with the PASS report gone: nothing proves the flags, so they roll back.
    for name in [k[2] for k in world.api.objects if k[0] == "ConfigMap" and "-canary-" in k[2]]:
        world.api.objects.pop(("ConfigMap", NS, name))
    world.wipe_status("flash")
    world.step("flash")
    assert world.phase() == "RolledBack"
    assert world.rollout()["rejectedRevision"] == flags_of(world).revision


def filed(world: World, verdict: str) -> list[str]:
    """Canary reports whose probe filed ``verdict`` (whether or not a pass has read it)."""
    return [
        name
        for (kind, _, name), cm in world.api.objects.items()
        if kind == "ConfigMap"
        and "-canary-" in name
        and f'"verdict": "{verdict}"' in (cm.get("data") or {}).get("outcome.json", "")
    ]


def test_status_wiped_after_a_fail_report_keeps_the_fail():
    """The probe files FAIL; status.rollout is lost before any pass reads it.  The rebuilt
    rollout reads the report: FAIL stays FAIL, no new attempt runs, nothing is promoted."""
    world = ready_world()
    world.verdict = lambda job: FAIL
    world.patch_spec("flash", FP4)
    world.until("FAIL filed", lambda: filed(world, "FAIL"))
    assert world.phase() == "Probing", "the FAIL is filed and not read yet"
    failed = world.rollout()["canaryRevision"]
    world.verdict = lambda job: PASS  # a second attempt would PASS: it must never run
    start = len(world.api.log)
    world.wipe_status("flash")
    world.step("flash")
    rollout = world.rollout()
    assert rollout["phase"] == "RolledBack" and rollout["verdict"] == "FAIL", rollout
    assert rollout["rejectedRevision"] == failed and rollout["report"] == filed(world, "FAIL")[0]
    world.until("canary gone", lambda: not world.children("flash--canary"))
    for _ in range(5):
        world.step("flash")
    assert world.phase() == "RolledBack" and world.rollout()["probeAttempt"] == 1
    assert not created(world, "Job", "flash-canary-")[1:], "one probe Job: attempt 1's"
    assert failed not in stable_runs(world.api, world.api.log[start:])


def promoting_decode(change: dict = HICACHE_IN_PLACE) -> tuple[World, str]:
    """A role-by-role promotion with decode promoted and still rolling."""
    world = ready_world()
    world.held = lambda obj: obj["metadata"]["name"] == "flash-decode"
    world.patch_spec("flash", change)
    world.until("decode promoting", lambda: world.rollout().get("promotedRoles") == ["decode"])
    return world, world.rollout()["canaryRevision"]


def abort_writes() -> int:
    """How many writes the pass that acts on an abort makes (the crash points to try)."""
    world, passed = promoting_decode()
    before = len(world.api.log)
    world.control(ManualAction.ABORT, passed, "t-abort")
    world.step("flash")
    assert world.phase() == "RolledBack"
    return len(world.api.log) - before


@pytest.mark.parametrize("crash_at", [None, *range(1, abort_writes() + 1)])
def test_status_wiped_during_an_abort_never_resumes_the_promotion(crash_at):
    """A person aborts a promotion whose PASS report still exists; the operator dies before
    any one write of the abort pass, and status.rollout is lost.  The promotion is never
    resumed: the passed flags never reach another role, and decode returns to stable."""
    world, passed = promoting_decode()
    start = len(world.api.log)
    world.control(ManualAction.ABORT, passed, "t-abort")
    world.crash_before_write(crash_at)
    world.step("flash")
    world.wipe_status("flash")
    world.held = lambda obj: False
    world.until("rolled back", lambda: world.phase() == "RolledBack")
    world.until("decode back", lambda: runs_of(world, "flash-decode") != passed)
    rollout = world.rollout()
    assert rollout["rejectedRevision"] == passed and rollout["verdict"] == "ABORTED", rollout
    assert passed not in stable_runs(world.api, world.api.log[start:], role="prefill")
    for _ in range(3):
        world.step("flash")
    assert world.phase() == "RolledBack" and runs_of(world, "flash-prefill") != passed


def test_status_wiped_after_a_promotion_timed_out_keeps_the_timeout():
    world, passed = promoting_decode(
        {**HICACHE, "rollout": {"promotion": "InPlace", "promotionTimeoutSeconds": 120}}
    )
    world.until("timed out", lambda: world.phase() == "RolledBack", seconds=30)
    assert world.rollout()["verdict"] == "PROMOTION_TIMEOUT"
    world.wipe_status("flash")
    world.step("flash")
    rollout = world.rollout()
    assert rollout["phase"] == "RolledBack" and rollout["rejectedRevision"] == passed, rollout
    assert rollout["verdict"] == "PROMOTION_TIMEOUT", "from the ledger, not the PASS report"


def test_status_wiped_mid_promotion_rechecks_the_pass_report():
    """The PASS that resumes a promotion is the probe's, re-checked as on the first read:
    one in a report made again by someone else (deleted, then created with the same
    content: another object, which the attempt's Job does not belong to) rolls the
    promotion back."""
    world = ready_world()
    world.held = lambda obj: obj["metadata"]["name"] == "flash-decode"
    world.patch_spec("flash", HICACHE_IN_PLACE)
    world.until("decode promoting", lambda: world.rollout().get("promotedRoles") == ["decode"])
    report = world.rollout()["report"]

    def rewritten(cm: dict) -> None:  # a person "fixes" the report by hand
        cm["metadata"]["uid"] = "uid-of-a-report-made-again"

    world.api.user_patch("ConfigMap", NS, report, rewritten)
    world.wipe_status("flash")
    world.step("flash")
    rollout = world.rollout()
    assert rollout["phase"] == "RolledBack" and rollout["verdict"] == "INCONCLUSIVE", rollout
    assert "its probe Job did not complete with exit code 0" in rollout["verdictReason"], rollout


def as_written_before_the_engine_revision(rollout: dict) -> dict:
    """``rollout`` as an operator before the engine revision wrote it: flag sets
    `{features, image}` and their own revision hashes."""
    old = dict(rollout)
    for key, revision_key in (("stable", "stableRevision"), ("canary", "canaryRevision")):
        if key in rollout:
            spec = rollout[key]["spec"]
            old[key] = {"features": spec["features"], "image": spec["image"]["name"]}
            old[revision_key] = f"0ld{key}"
            if rollout.get("rejectedRevision") == rollout[revision_key]:
                old["rejectedRevision"] = f"0ld{key}"
    return old


def test_a_status_an_older_operator_wrote_is_upgraded_not_rebuilt():
    world = ready_world()
    written = world.rollout()
    world.api.user_patch(
        KIND,
        NS,
        "flash",
        lambda obj: obj["status"].update(rollout=as_written_before_the_engine_revision(written)),
    )
    world.step("flash")
    rollout = world.rollout()
    assert rollout["stable"] == written["stable"], "the live spec with the recorded flags"
    assert rollout["stableRevision"] == written["stableRevision"]
    assert rollout["phase"] == "Idle" and not world.children("flash--canary")
    assert not world.events("RolloutStateRebuilt")


def test_an_older_operators_rejection_stays_rejected_after_the_upgrade():
    world = ready_world()
    world.verdict = lambda job: FAIL
    world.patch_spec("flash", FP4)
    world.until("rolled back", lambda: world.phase() == "RolledBack")
    world.until("canary gone", lambda: not world.children("flash--canary"))
    written = world.rollout()
    old = as_written_before_the_engine_revision(written)
    assert old["rejectedRevision"] == "0ldcanary"
    world.api.user_patch(KIND, NS, "flash", lambda obj: obj["status"].update(rollout=old))
    for _ in range(3):
        world.step("flash")
    rollout = world.rollout()
    assert rollout["phase"] == "RolledBack" and rollout["verdict"] == "FAIL"
    assert rollout["rejectedRevision"] == written["rejectedRevision"] == flags_of(world).revision
    assert rollout["stableRevision"] == written["stableRevision"]
    assert not world.children("flash--canary"), "the rejected flags are not tried again"


def test_an_unreadable_status_from_another_operator_version_is_read_or_rebuilt():
    world = ready_world()
    raw = world.obj()["status"]["rollout"]

    def future_field(obj: dict) -> None:
        obj["status"]["rollout"] = {**raw, "fieldFromAFutureVersion": {"x": 1}}

    world.api.user_patch(KIND, NS, "flash", future_field)
    world.step("flash")
    assert world.rollout()["stableRevision"] == raw["stableRevision"]
    assert not world.events("RolloutStateRebuilt"), "unknown fields are ignored, not fatal"


def test_a_deployment_and_its_namesake_canary_stay_intact_through_a_rollout_of_each():
    world = World()
    world.create("flash")
    world.create("flash-canary")
    both = ("flash", "flash-canary")
    world.until("both Ready", lambda: all(world.phase(n) == "Idle" for n in both), *both)
    namesake = copy.deepcopy(world.children("flash-canary"))
    world.patch_spec("flash", FP4)
    world.until(
        "flash promoted",
        lambda: world.phase("flash") == "Idle" and world.rollout("flash").get("verdict"),
        *both,
    )
    after = world.children("flash-canary")
    assert after.keys() == namesake.keys()
    assert all(after[k]["metadata"]["uid"] == namesake[k]["metadata"]["uid"] for k in after)
    world.patch_spec("flash-canary", FP4)
    world.until(
        "flash-canary promoted",
        lambda: (
            world.phase("flash-canary") == "Idle" and world.rollout("flash-canary").get("verdict")
        ),
        *both,
    )
    assert world.children("flash--canary--canary") == {}
    world.until(
        "both Ready", lambda: all(world.obj(n)["status"]["phase"] == "Ready" for n in both), *both
    )


def test_an_object_another_owner_holds_is_never_adopted_and_nothing_else_is_written():
    world = World()
    foreign = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "flash-decode", "namespace": NS, "labels": {"team": "other"}},
        "spec": {"replicas": 3},
    }
    world.api.user_apply(foreign)
    world.create("flash")
    for _ in range(3):
        world.step("flash")
    # Known from the cache of other owners' names: the operator never looked it up.
    assert world.api.gets["StatefulSet"] == 0
    held = world.api.get("StatefulSet", NS, "flash-decode")
    assert held["spec"] == {"replicas": 3} and "ownerReferences" not in held["metadata"]
    assert world.children("flash") == {}, "no child is written while one name is held"
    degraded = condition(world, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "NameConflict"
    assert "StatefulSet flash-decode (held by no owner)" in degraded["message"]
    assert world.events("NameConflict")
    # Once the name is free, the next pass writes every child.
    world.api.delete("StatefulSet", NS, "flash-decode")
    world.until("Ready", lambda: world.obj()["status"]["phase"] == "Ready")
    assert condition(world, "Degraded")["status"] == "False"


def test_a_router_never_runs_under_a_service_account_it_did_not_create():
    """The reported hijack: the namespace holds a ServiceAccount `ci-router` the operator
    did not make; a deployment `ci` with its own router image would have run that image as
    `ci-router` (the Deployment written first, the account's write failing after).  Nothing
    is written, so neither the router nor engines without their NetworkPolicy run."""
    world = World()
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "ci-router", "namespace": NS},
    }
    world.api.user_apply(account)
    world.create("ci", {"router": {"image": "ghcr.io/dsv4/router:any"}})  # an allowed one
    for _ in range(3):
        world.step("ci")
    assert world.children("ci") == {}
    assert not [w for w in world.api.log if w.verb == "apply" and w.key[0] != KIND]
    degraded = condition(world, "Degraded", "ci")
    assert degraded["reason"] == "NameConflict"
    assert "ServiceAccount ci-router (held by no owner)" in degraded["message"]
    # Freed (say, renamed by the team that made it), the name becomes the operator's: its
    # own account is written before the router that runs as it, and the engines' policy
    # before any engine.
    world.api.delete("ServiceAccount", NS, "ci-router")
    world.step("ci")
    kinds = [w.key[0] for w in world.api.log if w.verb == "apply" and w.key[0] != KIND]
    workloads = [i for i, kind in enumerate(kinds) if kind in ("Deployment", "StatefulSet")]
    assert min(workloads) > kinds.index("ServiceAccount")
    assert min(workloads) > kinds.index("NetworkPolicy")
    router = world.api.get("ServiceAccount", NS, "ci-router")
    assert router["metadata"]["ownerReferences"][0]["uid"] == world.obj("ci")["metadata"]["uid"]


def condition(world: World, kind: str, name: str = "flash") -> dict:
    return next(c for c in world.obj(name)["status"]["conditions"] if c["type"] == kind)


def test_a_promotion_that_cannot_finish_is_rolled_back_at_its_deadline():
    world = ready_world()
    world.patch_spec(
        "flash", {**HICACHE, "rollout": {"promotion": "InPlace", "promotionTimeoutSeconds": 120}}
    )
    world.held = lambda obj: obj["metadata"]["name"] == "flash-decode"  # its pods never start
    world.until("decode promoting", lambda: world.rollout().get("promotedRoles") == ["decode"])
    world.until("rolled back", lambda: world.phase() == "RolledBack", seconds=30)
    rollout = world.rollout()
    assert rollout["verdict"] == "PROMOTION_TIMEOUT"
    assert "within 120s (decode not rolled)" in rollout["message"]
    decode = world.api.get("StatefulSet", NS, "flash-decode")
    runs = EngineRevision.model_validate_json(decode["metadata"]["annotations"][ANNOTATION_RUNS])
    assert runs.revision == rollout["stableRevision"], "decode is back on the stable flags"


def test_the_production_watch_keeps_running_after_a_rollback():
    world = ready_world()
    world.patch_spec("flash", {"rollout": {"stableProbeIntervalSeconds": 60}})
    world.verdict = lambda job: FAIL if "canary" in job["metadata"]["name"] else WATCH_CLEAN
    world.patch_spec("flash", FP4)
    world.until("rolled back", lambda: world.phase() == "RolledBack")
    watched = world.rollout().get("stableProbe")
    world.until(
        "a watch run after the rollback",
        lambda: (w := world.rollout().get("stableProbe")) and w != watched and w.get("verdict"),
        seconds=30,
    )
    assert world.rollout()["stableProbe"]["verdict"] == "NoCorruptionSeen"
    assert world.phase() == "RolledBack"


WATCH_CLEAN = {"verdict": "INCONCLUSIVE", "rate": 0.0, "bound": 0.058, "samples": 50, "message": ""}


def test_a_concurrent_abort_refuses_the_status_write_and_no_role_is_promoted():
    """A person aborts while a pass is deciding to promote the first role: the pass's status
    write is refused (resourceVersion precondition), so nothing it decided was acted on,
    and the pass runs again on what is there now — the abort."""
    world = ready_world()
    world.patch_spec("flash", HICACHE_IN_PLACE)
    world.until("promotion started", lambda: world.phase() == "Promoting")
    assert world.rollout()["promotedRoles"] == []
    passed = world.rollout()["canaryRevision"]

    def abort_meanwhile(api: MemoryApi, key: tuple) -> None:
        api.before_status_write = None  # once
        world.control(ManualAction.ABORT, passed, "t-abort")

    world.api.before_status_write = abort_meanwhile
    start = len(world.api.log)
    world.step("flash")  # decides "promote decode", is refused, decides again
    rollout = world.rollout()
    assert rollout["phase"] == "RolledBack" and rollout["verdict"] == "ABORTED"
    assert passed not in stable_runs(world.api, world.api.log[start:])


def test_a_pass_report_not_filed_by_the_probe_is_not_trusted():
    world = ready_world()
    world.verdict = lambda job: {**PASS, "samples": 100}  # fewer than 598
    world.patch_spec("flash", FP4)
    world.until("rolled back", lambda: world.phase() == "RolledBack")
    assert world.rollout()["verdict"] == "INCONCLUSIVE"
    assert "100 judged samples, 598 required" in world.rollout()["message"]


def test_eleven_failed_requests_beside_598_clean_samples_do_not_pass():
    """Failed requests count: a report that calls 11 of 609 a PASS (as one that left the
    failures out would) is re-checked on its counts, and its bound is no PASS."""
    world = ready_world()
    world.verdict = lambda job: {**PASS, "rate": 11 / 609, "samples": 609}
    world.patch_spec("flash", HICACHE)
    world.until("rolled back", lambda: world.phase() == "RolledBack")
    rollout = world.rollout()
    assert rollout["verdict"] == "INCONCLUSIVE", rollout
    assert "11/609 corrupt bounds the rate" in rollout["verdictReason"]


def test_a_probe_that_cannot_file_its_verdict_is_not_run_again():
    """A probe that could not file its verdict exits 4 and fails its Job: the attempt is
    INCONCLUSIVE, recorded by the operator, and no second run gets to answer instead."""
    world = ready_world()
    runs: list[str] = []

    def unfiled_then_pass(job: dict) -> dict | None:
        runs.append(job["metadata"]["name"])
        return None if len(runs) == 1 else PASS

    world.verdict = unfiled_then_pass
    world.patch_spec("flash", HICACHE)
    world.until("rolled back", lambda: world.phase() == "RolledBack")
    rollout = world.rollout()
    assert rollout["verdict"] == "INCONCLUSIVE" and len(runs) == 1, (rollout, runs)
    assert "ended without filing its report" in rollout["verdictReason"]
    for _ in range(5):
        world.step("flash")
    assert len(runs) == 1 and world.phase() == "RolledBack"


def filed_while_running(world: World) -> bool:
    """A canary report holds a verdict while its probe Job is still active."""
    return any(
        (job.get("status") or {}).get("filed")
        for (kind, _, _), job in world.api.objects.items()
        if kind == "Job"
    )


def test_a_pass_filed_before_its_job_completes_waits_for_the_job_and_promotes():
    """A probe pod files its report, then exits: the report's watch event wakes a pass
    while the Job is still active.  That pass waits; the Job's completion promotes."""
    world = ready_world()
    world.probe_exit = "later"
    world.patch_spec("flash", HICACHE)
    world.until("PASS filed, Job active", lambda: filed_while_running(world))
    world.step("flash", seconds=1)  # the pass the report's watch event wakes
    assert world.phase() == "Probing", world.rollout()
    world.until("promoted", lambda: world.phase() == "Idle")
    rollout = world.rollout()
    assert rollout["verdict"] == "PASS" and "rejectedRevision" not in rollout
    assert rollout["stableRevision"] == rollout["canaryRevision"]


def test_a_pass_whose_job_never_completes_is_inconclusive_once_the_grace_is_over():
    world = ready_world()
    world.probe_exit = "never"
    world.patch_spec("flash", HICACHE)
    world.until("PASS filed, Job active", lambda: filed_while_running(world))
    world.until("rolled back", lambda: world.phase() == "RolledBack", seconds=10)
    rollout = world.rollout()
    assert rollout["verdict"] == "INCONCLUSIVE"
    assert "its probe Job was still running 60 s after the PASS was seen" in rollout["message"]


def test_events_of_the_canary_slice_and_probe_jobs_reconcile_their_real_owner():
    world = ready_world()
    world.verdict = lambda job: FAIL
    world.patch_spec("flash", FP4)
    world.until("probing", lambda: world.phase() == "Probing")
    sts = world.api.get("StatefulSet", NS, "flash--canary-decode")
    job = next(obj for (kind, _, _), obj in world.api.objects.items() if kind == "Job")
    assert owning_deployment(sts["metadata"]) == owning_deployment(job["metadata"]) == "flash"


def test_workloads_without_a_record_are_not_guessed_at():
    """Status lost and the workloads made by an operator that recorded nothing: the flags
    they run cannot be told apart from untested ones, so nothing is touched."""
    world = ready_world()
    for (kind, _, _), obj in world.api.objects.items():
        if kind == "StatefulSet":
            obj["metadata"]["annotations"].pop("inference.dsv4.dev/stable-flags")
    world.wipe_status("flash")
    world.patch_spec("flash", FP4)
    start = len(world.api.log)
    world.step("flash")
    degraded = next(c for c in world.obj()["status"]["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "RolloutStateLost"
    assert "carries no readable flags record" in degraded["message"]
    assert not [w for w in world.api.log[start:] if w.verb not in ("status", "create")]


@pytest.mark.parametrize(
    ("status", "reason"), [(403, "WriteForbidden"), (422, "WriteInvalid"), (500, "WriteFailed")]
)
def test_a_refused_write_is_a_condition_and_an_event_naming_the_object(status, reason):
    world = World()
    message = "statefulsets.apps is forbidden: not allowed"
    world.api.refuse[("apply", "StatefulSet")] = ApiError(status, message)
    world.create("flash")
    world.step("flash")
    degraded = next(c for c in world.obj()["status"]["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", reason)
    named = f"apply StatefulSet flash-prefill: HTTP {status}: {message}"
    assert degraded["message"] == named
    assert [e["message"] for e in world.events(reason)] == [named]
    # What the pass says it wrote is what it wrote: the refused StatefulSet is in no
    # Applied (or Initialized) Event, and no write after it was attempted.
    said = " ".join(e["message"] for e in world.events("Applied") + world.events("Initialized"))
    assert "StatefulSet flash-prefill" not in said
    assert "ConfigMap flash-prefill-engine" in said  # written before it
    # Once the server accepts again, the next pass converges and the condition clears.
    world.api.refuse.clear()
    world.until("Ready", lambda: world.obj()["status"]["phase"] == "Ready")
    degraded = next(c for c in world.obj()["status"]["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "False"


def replicas(world: World, name: str) -> int | None:
    found = world.api.get("StatefulSet", NS, name)
    return None if found is None else found["spec"]["replicas"]


def test_a_paired_promotion_never_drops_capacity_and_moves_production_to_the_other_slot():
    """fp8 → fp4 index-K with 2 prefill and 3 decode replicas, checked after every pass:
    each slot's engines speak one format, and the slots whose router serves hold at least
    the spec's replicas between them."""
    world = World()
    world.create("flash", {"prefill": {"replicas": 2}, "decode": {"replicas": 3}})
    world.until("Ready", lambda: (world.obj().get("status") or {}).get("phase") == "Ready")

    suffixes = {"blue": "", "green": "-green"}
    extra: list[dict[str, int]] = []

    def capacity(w: World) -> None:
        no_mixed_slots(w)
        serving = [
            s for s, x in suffixes.items() if w.api.get("Deployment", NS, f"flash-router{x}")
        ]
        over = {}
        for role, want in (("prefill", 2), ("decode", 3)):
            have = sum(replicas(w, f"flash-{role}{suffixes[s]}") or 0 for s in serving)
            assert have >= want, (role, have, serving)
            running = sum(replicas(w, f"flash-{role}{x}") or 0 for x in suffixes.values())
            over[role] = running - want
        extra.append(over)

    world.checks.append(capacity)
    world.patch_spec("flash", FP4)
    world.until("promoted", lambda: world.phase() == "Idle" and world.rollout().get("verdict"))
    assert world.rollout()["slot"] == "green"
    assert (
        replicas(world, "flash-prefill-green") == 2 and replicas(world, "flash-decode-green") == 3
    )
    assert replicas(world, "flash-decode") is None  # the old slot is gone
    steps = [e["message"] for e in world.events("PairPromoted")]
    assert steps == ["pair 1/3 moved to slot green", "pair 2/3 moved to slot green"]
    # Never more than one extra prefill and one extra decode replica at a time.
    assert max(e["prefill"] for e in extra) == max(e["decode"] for e in extra) == 1
    assert len(world.events("Promoted")) == 1


def test_a_paired_promotion_that_cannot_finish_returns_to_the_old_format_cleanly():
    world = ready_world()
    world.checks.append(no_mixed_slots)
    world.patch_spec("flash", {**FP4, "rollout": {"promotionTimeoutSeconds": 120}})
    world.held = lambda obj: obj["metadata"]["name"].endswith("-green")  # never Ready
    world.until("rolled back", lambda: world.phase() == "RolledBack", seconds=30)
    assert world.rollout()["verdict"] == "PROMOTION_TIMEOUT"
    world.until(
        "the green slot gone",
        lambda: (
            not any(
                name.endswith("-green")
                for (kind, _, name) in world.api.objects
                if kind == "StatefulSet"
            )
        ),
    )
    assert world.rollout()["slot"] == "blue" and world.rollout().get("retiring") is None
    assert replicas(world, "flash-decode") == 1 and replicas(world, "flash-prefill") == 1


@pytest.mark.parametrize("report_kept", [True, False])
def test_status_wiped_mid_paired_promotion_resumes_only_with_a_pass_report(report_kept):
    world = World()
    world.create("flash", {"prefill": {"replicas": 2}, "decode": {"replicas": 2}})
    world.until("Ready", lambda: (world.obj().get("status") or {}).get("phase") == "Ready")
    world.checks.append(no_mixed_slots)
    world.patch_spec("flash", FP4)
    world.until("the first pair moved", lambda: world.rollout().get("pairStep") == 2)
    if not report_kept:
        for name in [k[2] for k in world.api.objects if k[0] == "ConfigMap" and "-canary-" in k[2]]:
            world.api.objects.pop(("ConfigMap", NS, name))
    world.wipe_status("flash")
    world.step("flash")
    rebuilt = world.rollout()
    assert world.events("RolloutStateRebuilt")
    if report_kept:
        assert rebuilt["phase"] == "Promoting" and rebuilt["pairStep"] == 2
        world.until("promoted", lambda: world.phase() == "Idle")
        assert world.rollout()["slot"] == "green"
    else:
        assert rebuilt["phase"] == "RolledBack" and rebuilt["retiring"] == "green"
        world.until("the green slot gone", lambda: replicas(world, "flash-decode-green") is None)
        assert replicas(world, "flash-decode") == 2 and world.rollout()["slot"] == "blue"


def test_a_kv_canary_violation_in_production_makes_the_watch_degrade_the_deployment():
    """Production runs kv-canary (the sample: log), so each watch run is told to read its
    violations; one counted during a run FAILs it, which sets Degraded (StableCorruption)
    naming the violation."""
    world = ready_world()
    found = "kv-canary violations during the run: 2 x launch_tag=HEAD_K_FULL fail_reason=verify_chain_hash on http://10.0.0.7:30000"
    world.verdict = lambda job: {
        "verdict": "FAIL",
        "rate": 0.0,
        "bound": 0.058,
        "samples": 50,
        "message": found,
    }
    world.patch_spec("flash", {"rollout": {"stableProbeIntervalSeconds": 60}})
    world.until(
        "a watch run", lambda: (world.rollout().get("stableProbe") or {}).get("verdict"), seconds=30
    )
    assert world.rollout()["stableProbe"]["verdict"] == "Corrupt"
    (degraded,) = [c for c in world.obj()["status"]["conditions"] if c["type"] == "Degraded"]
    assert degraded["status"] == "True" and degraded["reason"] == "StableCorruption"
    assert found in degraded["message"]
