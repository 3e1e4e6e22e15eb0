"""`dsv4ctl render FILE`: every object the operator would create for a DSV4Deployment, as
YAML, without a cluster — what GitOps users and security reviewers read.

Nothing is rendered a second way: the children come from `reconcile.desired` (what the
reconciler applies each pass, rollout records included), the canary from the rollout's
own state machine (`rollout.decide`) started with the flags given, and the probe attempt
from `rollout.probe_job` (what the Job executor applies).  Only what the API server
assigns is stood in for: the DSV4Deployment's uid (and a report's) in owner references.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dsv4_engine.cliutil import CommandError
from dsv4_operator.api import KIND
from dsv4_operator.api.errors import first_error
from dsv4_operator.api.names import name_problem
from dsv4_operator.api.rollout import EngineRevision, RolloutStatus
from dsv4_operator.api.samples import merge_patch
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.reconcile.desired import Desired
from dsv4_operator.render.memory import MemorySizingError, pod_memory
from dsv4_operator.render.meta import Owner
from dsv4_operator.render.router import ROUTER_PORT, router_name
from dsv4_operator.rollout.controller import canary_report, canary_settings, cluster_service_url
from dsv4_operator.rollout.decide import Observed, decide, first_status
from dsv4_operator.rollout.probe_job import attempt_objects
from dsv4_operator.rollout.reports import report_skeleton
from dsv4_operator.rollout.slices import REVISION_PATHS, canary_spec, canary_url, spec_revision

# Stands for the uid the API server gives the DSV4Deployment (and a probe report).
UID = "00000000-0000-0000-0000-000000000000"
# The spec's own top-level keys: a --canary path starting with one is a spec path.
SPEC_KEYS = frozenset(f.alias or n for n, f in DSV4DeploymentSpec.model_fields.items())
PROBE_IMAGE = "OPERATOR-IMAGE"  # a probe Job runs the operator pod's own image


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "render",
        help="print every object the operator would create for a DSV4Deployment (YAML)",
        description="Print, as YAML and without a cluster, the objects the operator creates "
        "for each DSV4Deployment in FILE: its children; with --canary, the canary slice it "
        "starts when the flags change to those given; with --probe-job, the first probe "
        "attempt of that canary (report ConfigMap, ServiceAccount, Role, RoleBinding, Job).",
    )
    parser.add_argument("file", type=Path, help="YAML with DSV4Deployment(s), or - for stdin")
    parser.add_argument(
        "--namespace",
        "-n",
        default=None,
        help="namespace of the objects (default: the resource's own, else `default`)",
    )
    parser.add_argument(
        "--canary",
        nargs="+",
        metavar="KEY=VALUE",
        default=None,
        help="the canary's engine revision: a spec path of an engine-revision field "
        "(model.toolCallParser=deepseekv32, decode.extraArgs='[--speculative-algorithm, "
        "EAGLE]', disaggregation.transferBackend=nixl, ...), a path under spec.features "
        "(indexDtype=fp4, hicache.enabled=true), or image=IMAGE; values are YAML",
    )
    parser.add_argument(
        "--probe-job", action="store_true", help="also the canary's first probe attempt"
    )
    parser.add_argument(
        "--probe-image",
        default=PROBE_IMAGE,
        help=f"image the probe Job runs (the operator pod's own; default: {PROBE_IMAGE})",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.probe_job and not args.canary:
        raise CommandError("--probe-job needs --canary: a probe Job probes a canary")
    docs = [d for d in _documents(args.file) if isinstance(d, dict) and d.get("kind") == KIND]
    if not docs:
        raise CommandError(f"{args.file}: no {KIND} in it")
    objects = []
    for doc in docs:
        objects += render(doc, args.namespace, args.canary, args.probe_job, args.probe_image)
    sys.stdout.write(f"# {args.file}: what the operator creates (uid {UID}: assigned later)\n")
    sys.stdout.write(yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False))
    return 0


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (an engine.yaml in its ConfigMap) as readable `|` blocks."""


def _string(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _string)


def render(
    doc: dict[str, Any],
    namespace: str | None,
    canary: list[str] | None = None,
    probe_job: bool = False,
    probe_image: str = PROBE_IMAGE,
    uid: str = UID,
) -> list[dict[str, Any]]:
    """The objects the operator creates for ``doc``, in the order it applies them; ``uid``:
    the deployment's, where the API server has given it one (owner references name it)."""
    meta = doc.get("metadata") or {}
    if not isinstance(meta, dict):
        raise CommandError(f"{KIND} metadata: expected a mapping, got {meta!r}")
    name = str(meta.get("name", ""))
    spec = _spec(doc.get("spec") or {})
    problem = name_problem(name, spec.multinode)
    if problem is not None:
        raise CommandError(problem)
    owner = Owner(name=name, namespace=namespace or meta.get("namespace") or "default", uid=uid)
    now = dt.datetime.now(dt.UTC)
    status = first_status(spec_revision(spec), now).status
    desired = Desired(owner, spec, pod_memory)
    try:
        if canary is None:
            return desired.children(status)
        flags = _canary_flags(doc, spec, canary)
        status = _step(desired, spec, flags, status, Observed(now=now))
        objects = desired.children(status)
        if probe_job:
            probing = _step(desired, spec, flags, status, Observed(now=now, canary_ready=True))
            objects += _probe_attempt(owner, spec, probing, probe_image)
        return objects
    except MemorySizingError as err:
        raise CommandError(str(err)) from None


def _step(
    desired: Desired,
    spec: DSV4DeploymentSpec,
    flags: EngineRevision,
    status: RolloutStatus,
    seen: Observed,
) -> RolloutStatus:
    """The rollout's next status, as a pass that observed ``seen`` decides it."""
    return decide(flags, status, seen, spec.canary, spec.rollout, desired.pairs).status


def _probe_attempt(
    owner: Owner, spec: DSV4DeploymentSpec, status: RolloutStatus, image: str
) -> list[dict[str, Any]]:
    ref = canary_report(status)
    assert ref is not None  # the canary was Ready: attempt 1 started
    report = report_skeleton(owner, ref)
    url = cluster_service_url(owner.namespace, *canary_url(owner))
    stable = cluster_service_url(owner.namespace, router_name(owner), ROUTER_PORT)
    applied = merge_patch(report, {"metadata": {"uid": UID}})  # as the API returns it
    assert status.canary is not None
    tested = canary_spec(spec, status.canary, spec.canary)  # what the canary runs
    return [
        report,
        *attempt_objects(owner, applied, ref.target, canary_settings(tested, url, stable), image),
    ]


def _canary_flags(
    doc: dict[str, Any], spec: DSV4DeploymentSpec, pairs: list[str]
) -> EngineRevision:
    """The flags ``--canary KEY=VALUE ...`` gives, checked as the API server would check
    the spec carrying them."""
    patch: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise CommandError(f"--canary: expected KEY=VALUE, got {pair!r}")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            raise CommandError(f"--canary {key}: {text!r} is not a YAML value") from None
        node = patch
        *parents, leaf = _revision_path(key)
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise CommandError(f"--canary {key}: {part} was given a value of its own")
        node[leaf] = value
    flagged = _spec(merge_patch(doc.get("spec") or {}, patch), "--canary: ")
    flags = spec_revision(flagged)
    if flags.revision == spec_revision(spec).revision:
        raise CommandError("--canary: these are the spec's own flags; a canary tests a change")
    return flags


def _revision_path(key: str) -> list[str]:
    """The spec path ``--canary KEY`` names: `image` is the image's name, a path that starts
    with a spec field must lie in an engine-revision field (what a canary tests), any other
    path is under `spec.features`."""
    if key == "image":
        return ["image", "name"]
    path = key.split(".")
    if path[0] not in SPEC_KEYS:
        return ["features", *path]
    if not any(tuple(path[: len(p)]) == p for p in REVISION_PATHS):
        fields = ", ".join(".".join(p) for p in REVISION_PATHS)
        raise CommandError(
            f"--canary {key}: spec.{key} is not an engine-revision field (it rolls without a "
            f"canary); a canary tests one of: {fields}"
        )
    return path


def _spec(raw: Any, prefix: str = "") -> DSV4DeploymentSpec:
    try:
        return DSV4DeploymentSpec.model_validate(raw)
    except ValidationError as err:
        raise CommandError(prefix + first_error(err)) from None


def _documents(path: Path) -> list[Any]:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as err:
        raise CommandError(f"cannot read {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise CommandError(f"{path} is not UTF-8 text") from None
    try:
        return list(yaml.safe_load_all(text))
    except yaml.YAMLError as err:
        raise CommandError(f"{path} is not YAML: {err}") from None
