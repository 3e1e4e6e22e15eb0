"""One engine revision: every field that can change what an engine computes, or the wire
between prefill and decode, reaches production only through a canary — proven on exactly
the build it ran, under a transfer key derived from the resolved engine configuration, with
no way around it by recreating the deployment."""

from __future__ import annotations

import json
from typing import Annotated

import pytest
import yaml
from pydantic import BaseModel

from dsv4_engine.engine_config import REVISION_ENV
from dsv4_engine.features import Role
from dsv4_engine.probe.settings import Determinism
from dsv4_operator.api import KIND
from dsv4_operator.api.rollout import EngineRevision
from dsv4_operator.api.rolls import Rolls, Unclassified, classes, project
from dsv4_operator.api.samples import load_sample, merge_patch
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render.meta import ANNOTATION_CONFIG_HASH
from dsv4_operator.rollout.controller import canary_settings
from dsv4_operator.rollout.decide import ManualAction
from dsv4_operator.rollout.digest import registry_digest
from dsv4_operator.rollout.slices import REVISION_PATHS, canary_spec, spec_revision
from tests.unit.operator.harness import FAIL, FP4, HICACHE, HICACHE_IN_PLACE, NS, PASS, World

# One change of each revision-class field (a spec patch), for the field's path.
REVISION_CHANGES = {
    ("engine",): {"engine": "reference"},
    ("model",): {"model": {"toolCallParser": "deepseekv32"}},
    ("image",): {"image": {"name": "ghcr.io/dsv4/engine:0.2.0"}},
    ("features",): {"features": {"kvCanary": "raise"}},
    ("disaggregation",): {"disaggregation": {"transferBackend": "nixl"}},
    ("prefill", "nodesPerReplica"): {"prefill": {"nodesPerReplica": 2, "tp": 8}},
    ("prefill", "gpusPerNode"): {"prefill": {"gpusPerNode": 8, "tp": 8}},
    ("prefill", "tp"): {"prefill": {"tp": 2}},
    ("prefill", "dp"): {"prefill": {"dp": 2}},
    ("prefill", "ep"): {"prefill": {"ep": 4}},
    ("prefill", "enableDpAttention"): {"decode": {"enableDpAttention": True, "dp": 2}},
    ("prefill", "extraArgs"): {"prefill": {"extraArgs": ["--mem-fraction-static", "0.8"]}},
    ("prefill", "env"): {"prefill": {"env": [{"name": "NCCL_DEBUG", "value": "INFO"}]}},
    ("prefill", "maxTotalTokens"): {"prefill": {"maxTotalTokens": 65536}},
    ("router", "policy"): {"router": {"policy": "round_robin"}},
    ("router", "image"): {"router": {"image": "ghcr.io/dsv4/router:1"}},
}
# Changes that roll production directly (or change nothing in a pod).
DIRECT_CHANGES = [
    {"prefill": {"replicas": 2}},
    {"decode": {"resources": {"memory": "600Gi"}}},
    {"router": {"replicas": 2}},
    {"placement": {"gpuProducts": ["NVIDIA-GB200"]}},
    {"progressDeadlineSeconds": 900},
    {"canary": {"concurrency": 8}},
    {"rollout": {"order": ["prefill"]}},
]


def spec(patch: dict | None = None) -> DSV4DeploymentSpec:
    return DSV4DeploymentSpec.model_validate(merge_patch(load_sample()["spec"], patch or {}))


def test_every_spec_field_has_a_rollout_class():
    found = classes(DSV4DeploymentSpec)
    assert set(found.values()) == set(Rolls)

    class Later(BaseModel):
        kept: Annotated[int, Rolls.CAPACITY] = 1
        forgotten: int = 0  # a field someone added without saying how it rolls

    with pytest.raises(Unclassified, match="forgotten"):
        classes(Later)


def test_each_revision_field_changes_the_revision_and_nothing_else_does():
    revision_fields = {p for p, r in classes(DSV4DeploymentSpec).items() if r is Rolls.REVISION}
    covered = {path for path in REVISION_CHANGES}
    # Both roles' fields have the same class: one role's change stands for both.
    expected = {p for p in revision_fields if p[0] != "decode"}
    assert covered == expected, "give every revision field a sample change here"
    base = spec_revision(spec())
    for path, patch in REVISION_CHANGES.items():
        assert spec_revision(spec(patch)).revision != base.revision, path
    for patch in DIRECT_CHANGES:
        assert spec_revision(spec(patch)).revision == base.revision, patch


WIRE = {
    "index-K dtype": {"features": {"indexDtype": "fp4"}},
    "engine build": {"image": {"name": "ghcr.io/dsv4/engine:0.2.0"}},
    "transfer backend": {"disaggregation": {"transferBackend": "nixl"}},
    "weights": {"model": {"hostPath": "/data/models/deepseek-v4-flash-2"}},
    "preset": {"model": {"preset": "v4-pro"}},
    "speculative decoding": {
        "decode": {"extraArgs": ["--speculative-algorithm", "EAGLE", "--speculative-num-steps=3"]}
    },
    "attention backend (KV layout)": {"prefill": {"extraArgs": ["--dsv4-attn-backend=flashmla"]}},
    "KV layout env": {"decode": {"env": [{"name": "SGLANG_DSV4_KV_LAYOUT", "value": "v41"}]}},
    "engine": {"engine": "reference"},
}
SAME_WIRE = {
    "HiCache": {"features": {"hicache": {"enabled": True, "ratio": 2.0}}},
    "kv-canary": {"features": {"kvCanary": "raise"}},
    "tool-call parser": {"model": {"toolCallParser": "deepseekv32"}},
    "served name": {"model": {"servedModelName": "flash-2"}},
    "other extra args": {"prefill": {"extraArgs": ["--mem-fraction-static", "0.8"]}},
    "device pool cap": {"prefill": {"maxTotalTokens": 65536}},
    "other env": {"decode": {"env": [{"name": "NCCL_DEBUG", "value": "INFO"}]}},
    "IB devices": {"disaggregation": {"ibDevices": ["mlx5_0"]}},
    "replicas": {"decode": {"replicas": 3}},
}


@pytest.mark.parametrize("what", WIRE)
def test_the_transfer_key_moves_with_each_field_of_the_wire_format(what):
    assert spec_revision(spec(WIRE[what])).transfer_key != spec_revision(spec()).transfer_key


@pytest.mark.parametrize("what", SAME_WIRE)
def test_the_transfer_key_stays_for_changes_that_keep_the_wire_format(what):
    changed = spec_revision(spec(SAME_WIRE[what]))
    assert changed.transfer_key == spec_revision(spec()).transfer_key
    if what != "replicas":
        assert changed.revision != spec_revision(spec()).revision  # still a canary


def test_wire_flags_are_read_however_they_are_written():
    """`--flag value` and `--flag=value` set the same thing; so does an argparse prefix of a
    listed flag.  (A speculative flag's prefix is taken as written: at worst another key,
    which promotes in pairs — the safe direction.)"""
    keys = {
        spec_revision(spec({"decode": {"extraArgs": args}})).transfer_key
        for args in (
            ["--speculative-algorithm", "EAGLE", "--dsv4-attn-backend", "x"],
            ["--speculative-algorithm=EAGLE", "--dsv4-attn=x"],
        )
    }
    assert len(keys) == 1


def test_registry_digests_are_read_from_image_ids():
    digest = "sha256:" + "a" * 64
    assert registry_digest(f"docker-pullable://ghcr.io/dsv4/engine@{digest}") == (
        f"ghcr.io/dsv4/engine@{digest}"
    )
    assert registry_digest(f"ghcr.io/dsv4/engine@{digest}") == f"ghcr.io/dsv4/engine@{digest}"
    assert registry_digest(digest) is None  # a local image ID: no registry serves it
    assert registry_digest("") is None


# -- through the operator (the in-memory API harness) ------------------------------------
def ready_world() -> World:
    world = World()
    world.create("flash")
    world.until("Ready", lambda: (world.obj().get("status") or {}).get("phase") == "Ready")
    return world


def stable_templates(world: World) -> dict[str, dict]:
    return {
        name: obj["spec"]["template"]
        for (kind, _, name), obj in world.api.objects.items()
        if kind == "StatefulSet"
        and obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "flash"
    }


ENGINE_CHANGES = {
    "tool-call parser": ({"model": {"toolCallParser": "deepseekv32"}}, "compatible"),
    "transfer backend": ({"disaggregation": {"transferBackend": "nixl"}}, "incompatible"),
    "extraArgs": ({"prefill": {"extraArgs": ["--mem-fraction-static", "0.8"]}}, "compatible"),
    "env": ({"decode": {"env": [{"name": "DSV4_LOG", "value": "debug"}]}}, "compatible"),
    "image": ({"image": {"name": "ghcr.io/dsv4/engine:0.2.0"}}, "incompatible"),
    "speculative decoding": (
        {"decode": {"extraArgs": ["--speculative-algorithm", "EAGLE"]}},
        "incompatible",
    ),
}


@pytest.mark.parametrize("what", ENGINE_CHANGES)
def test_an_engine_change_goes_through_a_canary_and_is_promoted_only_on_pass(what):
    patch, transfer = ENGINE_CHANGES[what]
    world = ready_world()
    before = stable_templates(world)
    world.verdict = lambda job: FAIL
    world.patch_spec("flash", patch)
    world.step("flash")
    assert world.phase() == "CanaryStarting" and world.rollout()["transfer"] == transfer
    world.until("rolled back", lambda: world.phase() == "RolledBack")
    assert stable_templates(world) == before, "a FAIL leaves production as it was"
    # Another change of the same field passes: promoted, production runs it.
    world.verdict = lambda job: PASS
    world.patch_spec("flash", {"canary": {"concurrency": 8}})  # not a revision: still rejected
    world.step("flash")
    assert world.phase() == "RolledBack"
    world.control(ManualAction.RETRY, world.rollout()["rejectedRevision"], "t1")
    world.until(
        "promoted", lambda: world.phase() == "Idle" and world.rollout()["verdict"] == "PASS"
    )
    assert world.rollout()["stableRevision"] == spec_revision(spec(patch)).revision
    assert stable_templates(world) != before


def test_a_replicas_change_rolls_directly():
    world = ready_world()
    world.patch_spec("flash", {"decode": {"replicas": 2}})
    world.step("flash")
    assert world.phase() == "Idle" and not world.children("flash--canary")
    (decode,) = [
        o for (k, _, n), o in world.api.objects.items() if (k, n) == ("StatefulSet", "flash-decode")
    ]
    assert decode["spec"]["replicas"] == 2


def test_an_engine_change_during_probing_ends_the_attempt_and_probes_the_new_revision():
    world = ready_world()
    world.api.run_probe_jobs = lambda *a, **k: 0
    world.patch_spec("flash", HICACHE)
    world.until("probing", lambda: world.phase() == "Probing")
    first = world.rollout()
    world.patch_spec("flash", {"model": {"toolCallParser": "deepseekv32"}})
    world.step("flash")
    superseded = world.rollout()
    assert superseded["canaryRevision"] != first["canaryRevision"]
    assert superseded["phase"] == "CanaryStarting"
    (event,) = world.events("CanarySuperseded")
    assert "model.toolCallParser" in event["message"]
    jobs = [n for (k, _, n) in world.api.objects if k == "Job"]
    assert not jobs, "the probe of the old revision is stopped, never judged"
    world.until("probing again", lambda: world.phase() == "Probing")
    assert world.rollout()["probeAttempt"] == first["probeAttempt"] + 1


def engine_config_maps(world: World, role: str) -> set[str]:
    return {
        name
        for (kind, _, name) in world.api.objects
        if kind == "ConfigMap" and name.startswith(f"flash-{role}-engine-")
    }


def test_a_role_rolling_to_a_new_revision_keeps_its_old_engine_yaml_until_rolled():
    """An old pod restarted mid-rollout mounts the ConfigMap its template names: still
    there, unchanged (immutable), until the role has rolled."""
    world = ready_world()
    (old,) = engine_config_maps(world, "decode")
    world.held = lambda obj: obj["metadata"]["name"] == "flash-decode"  # decode keeps rolling
    world.patch_spec("flash", HICACHE_IN_PLACE)
    world.until("decode promoting", lambda: world.rollout().get("promotedRoles") == ["decode"])
    world.step("flash")
    both = engine_config_maps(world, "decode")
    assert old in both and len(both) == 2
    assert world.api.objects[("ConfigMap", NS, old)]["immutable"] is True
    world.held = lambda obj: False
    world.until("promoted", lambda: world.phase() == "Idle")
    world.step("flash")
    assert old not in engine_config_maps(world, "decode")


DIGEST = "ghcr.io/dsv4/engine@sha256:" + "b" * 64


def canary_pods(world: World, image_ids: dict[str, str]) -> None:
    """What the kubelet reports of the canary's engine pods: the build each pulled."""
    for role, image_id in image_ids.items():
        world.api.user_apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"flash--canary-{role}-0",
                    "namespace": NS,
                    "labels": {
                        "app.kubernetes.io/name": "dsv4",
                        "app.kubernetes.io/instance": "flash--canary",
                        "app.kubernetes.io/component": role,
                    },
                },
                "status": {
                    "phase": "Running",
                    "containerStatuses": [
                        {
                            "name": "engine",
                            "image": "ghcr.io/dsv4/engine:0.2.0",
                            "imageID": image_id,
                        }
                    ],
                },
            }
        )


def engine_images(world: World) -> set[str]:
    return {c["image"] for t in stable_templates(world).values() for c in t["spec"]["containers"]}


def test_the_pass_records_the_digest_the_canary_ran_and_production_runs_it():
    world = ready_world()
    world.patch_spec("flash", {"image": {"name": "ghcr.io/dsv4/engine:0.2.0"}})
    world.until("canary up", lambda: world.phase() in ("CanaryStarting", "Probing"), passes=2)
    canary_pods(world, {"prefill": DIGEST, "decode": f"docker-pullable://{DIGEST}"})
    world.until(
        "promoted", lambda: world.phase() == "Idle" and world.rollout()["verdict"] == "PASS"
    )
    assert world.rollout()["stable"]["imageDigest"] == DIGEST
    assert engine_images(world) == {DIGEST}, "the tag may move; production runs the build"
    assert world.events("ImagePinned")


def test_a_canary_that_ran_two_builds_proves_neither():
    world = ready_world()
    world.patch_spec("flash", {"image": {"name": "ghcr.io/dsv4/engine:0.2.0"}})
    world.until("canary up", lambda: world.phase() in ("CanaryStarting", "Probing"), passes=2)
    canary_pods(world, {"prefill": DIGEST, "decode": DIGEST.replace("b" * 64, "c" * 64)})
    world.until("rolled back", lambda: world.phase() == "RolledBack")
    assert world.rollout()["verdict"] == "INCONCLUSIVE"
    assert "2 builds" in world.rollout()["verdictReason"]
    assert engine_images(world) == {"ghcr.io/dsv4/engine:0.1.0"}


def test_a_deployment_recreated_with_rejected_flags_does_not_adopt_them():
    world = ready_world()
    world.verdict = lambda job: FAIL
    world.patch_spec("flash", FP4)
    world.until("rolled back", lambda: world.phase() == "RolledBack")
    rejected = world.rollout()["rejectedRevision"]
    world.api.delete(KIND, NS, "flash")  # the owner goes, its children with it
    assert not stable_templates(world)
    world.create("flash", FP4)  # the same name, asking for the rejected flags
    for _ in range(3):
        world.step("flash")
    assert not stable_templates(world), "no engine runs a rejected revision"
    status = world.obj()["status"]
    (degraded,) = [c for c in status["conditions"] if c["type"] == "Degraded"]
    assert status["phase"] == "Degraded" and degraded["reason"] == "RevisionRejected"
    assert rejected in degraded["message"]
    # The retry control is the way back: the person decides.
    world.control(ManualAction.RETRY, rejected, "t1")
    world.until("Ready", lambda: (world.obj().get("status") or {}).get("phase") == "Ready")
    assert world.rollout()["stableRevision"] == rejected


def test_a_rejected_revision_stays_rejected_after_the_spec_moved_away_and_back():
    world = ready_world()
    world.verdict = lambda job: FAIL
    world.patch_spec("flash", FP4)
    world.until("rolled back", lambda: world.phase() == "RolledBack")
    rejected = world.rollout()["rejectedRevision"]
    # Another revision, its own canary (fails too); fp8 again, since HiCache with the fp4
    # indexer is a known issue (dsv4_operator.api.known_issues).
    world.patch_spec("flash", merge_patch(HICACHE, {"features": {"indexDtype": "fp8"}}))
    world.until("second canary", lambda: world.rollout().get("rejectedRevision") != rejected)
    world.until("rolled back", lambda: world.phase() == "RolledBack")
    world.patch_spec("flash", {"features": {"indexDtype": "fp4", "hicache": None}})
    world.step("flash")
    assert spec_revision(spec(FP4)).revision == rejected
    assert world.phase() == "RolledBack" and not world.children("flash--canary")
    assert f"flags {rejected} were rejected (earlier" in world.rollout()["message"]


def test_probes_need_host_tier_reads_only_where_the_revision_has_a_host_tier():
    """A canary's probe asks for host-tier reads where its revision runs HiCache, and never
    uses the reference engine's offload knob: on either engine the canary reads prefixes
    back from the host tier by eviction, its HiCache roles' device pool capped
    (`CanarySpec.pool_tokens`).  What the probe cannot ask sglang-router it is told: the
    served model, the reference model, whether the engine is deterministic."""
    plain = canary_settings(spec({"engine": "reference"}), "http://canary:8000")
    assert plain.offload_path is None and not plain.hicache
    hicache = spec({"engine": "reference", **HICACHE})
    settings = canary_settings(hicache, "http://canary:8000")
    assert settings.offload_path is None and settings.hicache
    assert settings.model == hicache.model.served_model_name
    assert settings.reference_model is hicache.model.reference_model
    assert settings.deterministic is Determinism.YES
    flipping = spec(
        {"engine": "reference", "features": {"faultInjection": {"benignNondeterminism": 0.1}}}
    )
    assert canary_settings(flipping, "http://c:8000").deterministic is Determinism.NO
    sglang = canary_settings(spec({}), "http://canary:8000")
    assert sglang.deterministic is Determinism.NO and sglang.reference_model is None


def test_a_canarys_hicache_roles_run_a_capped_device_pool_production_never_does():
    """The cap is the canary's (a rendering of the canary slice), never the revision's:
    promoting the revision runs production's own pool."""
    hicache = spec({"engine": "reference", **HICACHE})
    canary = canary_spec(hicache, spec_revision(hicache), hicache.canary)
    roles = hicache.features.hicache.roles
    for role in Role:
        cap = canary.role_spec(role).max_total_tokens
        assert cap == (32768 if role in roles else None), role
        assert hicache.role_spec(role).max_total_tokens is None
    sized = spec({"engine": "reference", **HICACHE, "canary": {"devicePoolTokens": 32768}})
    cap = canary_spec(sized, spec_revision(sized), sized.canary).role_spec(roles[0])
    assert cap.max_total_tokens == 32768


@pytest.mark.parametrize(("mode", "read"), [("off", False), ("log", True), ("raise", True)])
def test_a_probe_reads_kv_canary_violations_where_the_engines_run_kv_canary(mode, read):
    """The production watch probes what production runs; a canary always runs log."""
    probed = spec({"features": {"kvCanary": mode}})
    assert canary_settings(probed, "http://flash:8000").kv_canary is read
    canary = canary_spec(probed, spec_revision(probed), probed.canary)
    assert canary_settings(canary, "http://canary:8000").kv_canary is True


def test_a_hicache_pass_without_host_tier_reads_is_not_promoted():
    """A probe filed PASS for a HiCache revision, but none of its 598 samples read a prefix
    back from the host tier: the operator's re-check refuses it (the probe's own rule),
    and the revision is rolled back, not promoted.  A revision without HiCache needs no
    such reads: the same report promotes it."""
    world = ready_world()
    world.verdict = lambda job: {**PASS, "exercised": 0}
    stable = world.rollout()["stableRevision"]
    world.patch_spec("flash", HICACHE)
    world.until("rolled back", lambda: world.phase() == "RolledBack")
    rollout = world.rollout()
    assert rollout["verdict"] == "INCONCLUSIVE" and rollout["stableRevision"] == stable
    assert rollout["verdictReason"].endswith(
        "was not trusted: HiCache is on but only 0 judged answers are proven "
        "to have read a prefix back from the host tier; at least 24 required"
    )
    world.patch_spec("flash", {"features": {"hicache": None, "kvCanary": "raise"}})
    world.until("promoted", lambda: world.phase() == "Idle" and world.rollout().get("verdict"))
    assert world.rollout()["verdict"] == "PASS"


def test_a_canarys_probe_job_compares_with_the_stable_router_the_watch_probes_a_slice_alone():
    """On an engine that is not deterministic (SGLang) the canary's consistency samples are
    judged against the stable's own divergence: its probe Job is given the stable router,
    the Service users call, as the baseline.  A production watch run has no baseline."""
    world = ready_world()
    world.patch_spec("flash", HICACHE)
    world.until("probing", lambda: world.api.names("Job"), passes=10)
    (job,) = (world.api.objects[("Job", NS, name)] for name in world.api.names("Job"))
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    stable_router = "http://flash-router.serving.svc:8000"
    assert args[args.index("--baseline-url") + 1] == stable_router
    assert args[args.index("probe") + 1] != stable_router  # the canary itself is probed
    assert canary_settings(spec({}), stable_router).baseline_url is None


def test_a_stable_router_without_an_endpoint_leaves_the_canary_probed_without_a_baseline():
    """Where the stable router cannot be reached (the local runtime has not published it),
    the canary is still probed; its consistency samples say why they do not apply."""
    world = ready_world()

    def unpublished_router(namespace: str, service: str, port: int) -> str:
        if service == "flash-router":
            raise ValueError(f"{service}.{namespace}:{port} has no local endpoint yet")
        return f"http://{service}.{namespace}.svc:{port}"

    world.reconciler.rollout.probe_url = unpublished_router
    world.patch_spec("flash", HICACHE)
    world.until("probing", lambda: world.api.names("Job"), passes=10)
    (job,) = (world.api.objects[("Job", NS, name)] for name in world.api.names("Job"))
    assert "--baseline-url" not in job["spec"]["template"]["spec"]["containers"][0]["args"]


def test_a_flag_added_later_keeps_every_revision_recorded_before_it():
    """benignNondeterminism was added after revisions were recorded: at its default the
    revision is the hash of exactly what an older operator hashed, so an upgrade starts no
    canary; set, it is a revision of its own (and a rollout)."""
    before = spec({"engine": "reference"})
    recorded = spec_revision(before).spec["features"]["faultInjection"]
    assert recorded == {"ungatedIndexK": False, "ungatedShare": 1}
    noisy = spec(
        {"engine": "reference", "features": {"faultInjection": {"benignNondeterminism": 0.03}}}
    )
    assert spec_revision(noisy).revision != spec_revision(before).revision
    assert spec_revision(noisy).features.fault_injection.benign_nondeterminism == 0.03


def test_a_revision_read_back_from_the_api_server_is_the_same_revision():
    """The API server writes a whole float (ungatedShare 1.0, ratio 2.0) back as an integer:
    the revision read from status must still name what the spec asks for, or every pass
    would start the same canary again (seen on the real control plane)."""
    asked = spec({"engine": "reference", **HICACHE})
    written = {
        "spec": project(asked.model_dump(mode="json", by_alias=True), REVISION_PATHS),
        "transferKey": "k",
    }
    text = json.dumps(written)
    assert '"ratio": 2.0' in text
    stored = json.loads(text.replace(".0,", ",").replace(".0}", "}"))
    assert EngineRevision.model_validate(stored).revision == spec_revision(asked).revision


@pytest.mark.parametrize("asked", ["off", "raise"])
def test_a_canary_runs_kv_canary_in_log_mode_and_its_probe_reads_it_whatever_the_flags_say(asked):
    """Off, the canary's engines would find nothing; raise would stop them at the first
    violation before the probe reads it.  So the canary's engine.yaml says log, and its
    probe Job is told to read the violations; production's flags are what was asked."""
    world = ready_world()
    world.api.run_probe_jobs = lambda *a, **k: 0
    world.patch_spec("flash", {"features": {**HICACHE["features"], "kvCanary": asked}})
    world.until("probing", lambda: world.phase() == "Probing")
    engine_yaml = {
        name: yaml.safe_load(text)
        for (kind, _, name), obj in world.api.objects.items()
        if kind == "ConfigMap" and "-engine-" in name
        for text in obj["data"].values()
    }
    canary = {n: c["features"]["kvCanary"] for n, c in engine_yaml.items() if "--canary" in n}
    assert canary and set(canary.values()) == {"log"}
    assert spec_revision(spec({"features": {"kvCanary": asked}})).features.kv_canary == asked
    (job,) = [o for (k, _, _), o in world.api.objects.items() if k == "Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert "--kv-canary" in container["args"] + container.get("command", [])


def revision_env(world: World, instance: str) -> dict[str, tuple[str, str]]:
    """Each engine StatefulSet of ``instance``: the revision its engine container is told it
    runs (what its live-answer counters are labelled with) and its template's config hash."""
    out = {}
    for (kind, _, name), obj in world.api.objects.items():
        if kind != "StatefulSet":
            continue
        if obj["metadata"]["labels"]["app.kubernetes.io/instance"] != instance:
            continue
        template = obj["spec"]["template"]
        (engine,) = [c for c in template["spec"]["containers"] if c["name"] == "engine"]
        (told,) = [e["value"] for e in engine["env"] if e["name"] == REVISION_ENV]
        out[name] = (told, template["metadata"]["annotations"][ANNOTATION_CONFIG_HASH])
    return out


def test_every_engine_is_told_its_configs_revision_and_a_change_rolls_no_other_role():
    world = ready_world()
    before = revision_env(world, "flash")
    assert before and all(told == config for told, config in before.values())
    # HiCache on the decode role only: the prefill template (its env too) stays as it was.
    decode_hicache = {"hicache": {"enabled": True, "ratio": 2.0, "roles": ["decode"]}}
    world.patch_spec("flash", {**HICACHE_IN_PLACE, "features": decode_hicache})
    world.until("canary up", lambda: world.children("flash--canary"), passes=2)
    canary = revision_env(world, "flash--canary")
    assert canary and all(told == config for told, config in canary.values())
    world.until(
        "promoted", lambda: world.phase() == "Idle" and world.rollout()["verdict"] == "PASS"
    )
    after = revision_env(world, "flash")
    assert all(told == config for told, config in after.values())
    changed = {name for name in after if after[name] != before.get(name)}
    assert changed == {"flash-decode"}, "only the role whose engine configuration changed"
