"""`dsv4ctl render` prints exactly what the operator creates: the same objects the
reconciler applies to a fresh deployment, to its canary, and for its first probe attempt
(checked against the operator's own writes in the API double), without a cluster."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from dsv4_operator.api import KIND
from dsv4_operator.api.samples import SHIPPED_DIR, load_sample, merge_patch
from dsv4_operator.cli.main import main
from dsv4_operator.cli.render import UID
from dsv4_operator.render.meta import ANNOTATION_APPLIED_HASH
from tests.unit.operator.harness import FP4, NS, World

SERVER_FIELDS = ("uid", "resourceVersion", "generation", "creationTimestamp")


def rendered(capsys, *argv):
    assert main(["render", *argv]) == 0
    out = capsys.readouterr().out
    return [d for d in yaml.safe_load_all(out) if d]


def sample_file(tmp_path, patch=None):
    doc = merge_patch(load_sample(), {"metadata": {"name": "flash", "namespace": NS}})
    path = tmp_path / "flash.yaml"
    path.write_text(yaml.safe_dump(merge_patch(doc, patch or {})))
    return path


def comparable(obj):
    """An object without what only the API server (or a placeholder) fills in."""
    obj = copy.deepcopy(obj)
    for field in SERVER_FIELDS:
        obj["metadata"].pop(field, None)
    for ref in obj["metadata"].get("ownerReferences") or []:
        ref["uid"] = UID
    # A hash of the object as sent, owner's uid included.
    (obj["metadata"].get("annotations") or {}).pop(ANNOTATION_APPLIED_HASH, None)
    return json.loads(json.dumps(obj))


def applied(world, since=0):
    """The children the operator sent (applied, or created as a probe's report is), last
    body per object, in the order first sent."""
    sent = {}
    for write in world.api.log[since:]:
        if write.verb in ("apply", "create") and write.key[0] not in (KIND, "Event"):
            sent[(write.key[0], write.key[2])] = comparable(write.body)
    return sent


def keyed(objects):
    return {(o["kind"], o["metadata"]["name"]): comparable(o) for o in objects}


def test_render_prints_the_children_the_operator_applies(tmp_path, capsys):
    world = World()
    world.create("flash")
    world.step("flash")
    printed = keyed(rendered(capsys, str(sample_file(tmp_path))))
    assert printed == applied(world)
    assert list(printed) == list(applied(world))  # the same order: ConfigMap first


def test_render_canary_prints_the_slice_a_flag_change_starts(tmp_path, capsys):
    world = World()
    world.create("flash")
    world.until("Ready", lambda: (world.obj().get("status") or {}).get("phase") == "Ready")
    since = len(world.api.log)
    world.patch_spec("flash", FP4)
    world.step("flash")
    assert world.phase() == "CanaryStarting"
    canary = {k: o for k, o in applied(world, since).items() if k[1].startswith("flash--canary")}
    assert canary, "the operator made no canary"
    printed = keyed(rendered(capsys, str(sample_file(tmp_path)), "--canary", "indexDtype=fp4"))
    # The canary, and the stable children as the operator last applied them.
    assert printed == applied(world)


def test_render_probe_job_prints_the_first_attempt(tmp_path, capsys):
    world = World()
    world.create("flash")
    world.until("Ready", lambda: (world.obj().get("status") or {}).get("phase") == "Ready")
    since = len(world.api.log)
    world.patch_spec("flash", FP4)
    world.until("probing", lambda: world.phase() == "Probing")
    # The report, the probe's identity and its Job: everything but the canary slice.
    attempt = {k: o for k, o in applied(world, since).items() if "--canary" not in k[1]}
    assert {kind for kind, _ in attempt} == {
        "ConfigMap", "ServiceAccount", "RoleBinding", "Job"
    }  # fmt: skip
    file = str(sample_file(tmp_path))
    argv = [file, "--canary", "indexDtype=fp4", "--probe-job", "--probe-image", "operator:test"]
    printed = keyed(rendered(capsys, *argv))
    assert {k: printed[k] for k in attempt} == attempt


def test_every_shipped_sample_renders(capsys):
    for path in sorted(SHIPPED_DIR.glob("*.yaml")):
        if yaml.safe_load(path.read_text()).get("kind") != KIND:
            continue
        spec = yaml.safe_load(path.read_text())["spec"]
        multinode = any(spec[r].get("nodesPerReplica", 1) > 1 for r in ("prefill", "decode"))
        kinds = {o["kind"] for o in rendered(capsys, str(path))}
        engines = "LeaderWorkerSet" if multinode else "StatefulSet"
        assert {engines, "Deployment", "Service", "ConfigMap"} <= kinds, path


@pytest.mark.parametrize(
    ("change", "argv"),
    [
        ({"model": {"toolCallParser": "deepseekv32"}}, ["model.toolCallParser=deepseekv32"]),
        (
            {"disaggregation": {"transferBackend": "nixl"}},
            ["disaggregation.transferBackend=nixl"],
        ),
        (
            {"decode": {"extraArgs": ["--speculative-algorithm", "EAGLE"]}},
            ["decode.extraArgs=[--speculative-algorithm, EAGLE]"],
        ),
        ({"image": {"name": "ghcr.io/dsv4/engine:0.1.1"}}, ["image=ghcr.io/dsv4/engine:0.1.1"]),
    ],
    ids=["tool-call parser", "transfer backend", "extraArgs", "image"],
)
def test_render_canary_takes_any_engine_revision_field(tmp_path, capsys, change, argv):
    """Every engine change starts a canary: `--canary` renders the one the operator makes."""
    world = World()
    world.create("flash")
    world.until("Ready", lambda: (world.obj().get("status") or {}).get("phase") == "Ready")
    world.patch_spec("flash", change)
    world.step("flash")
    assert world.phase() == "CanaryStarting"
    printed = keyed(rendered(capsys, str(sample_file(tmp_path)), "--canary", *argv))
    assert printed == applied(world)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--probe-job"], "--probe-job needs --canary"),
        (
            ["--canary", "prefill.replicas=3"],
            "--canary prefill.replicas: spec.prefill.replicas is not an engine-revision field",
        ),
        (["--canary", "indexDtype"], "--canary: expected KEY=VALUE, got 'indexDtype'"),
        (["--canary", "indexDtype=fp8"], "--canary: these are the spec's own flags"),
        (["--canary", "indexDtype=bf16"], "features.indexDtype bf16: SGLang 0.5.23 stores"),
        (["--canary", "hicache.nope=1"], "--canary: spec.features.hicache.nope"),
    ],
)
def test_bad_arguments_are_one_line_naming_the_flag(tmp_path, capsys, argv, message):
    code = main(["render", str(sample_file(tmp_path)), *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1, err


def test_a_file_without_a_deployment_or_with_a_bad_spec_is_one_line(tmp_path, capsys):
    empty = tmp_path / "empty.yaml"
    empty.write_text("kind: ConfigMap\n")
    assert main(["render", str(empty)]) == 2
    assert "no DSV4Deployment in it" in capsys.readouterr().err
    bad = sample_file(tmp_path, {"spec": {"decode": {"tp": 3}}})
    assert main(["render", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "spec.decode: Value error, tp must divide" in err and err.count("\n") == 1
