"""An in-memory stand-in for the Kubernetes API, for exhaustive crash-point unit tests.

It answers the `Kube` methods the operator uses (get, list, apply, create, replace, delete,
patch_merge) with the semantics the reconcile relies on: resourceVersions and their
preconditions (409), `generation` bumps on spec changes only, the status subresource,
create-only 409s, garbage collection through owner references, label selectors.  It can
make the operator "die" right before its N-th write (`crash_before_write`), which a real API
server cannot do on cue.  The end-to-end tests run the same operator against the real
control plane; this double never replaces them.

Alongside the API it plays the controllers the operator depends on: `settle` is the
StatefulSet/Deployment controller and kubelet (every workload rolled and Ready, or held back
for chosen names), `run_probe_jobs` is a probe Job's pod (files a scripted verdict into the
report as the probe does, then completes the Job).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from dsv4_operator.api.times import stamp
from dsv4_operator.kube.client import ApiError
from dsv4_operator.kube.selectors import field_match, label_match
from dsv4_operator.rollout.reports import OUTCOME_KEY

Key = tuple[str, str | None, str]  # (kind, namespace, name)
WRITES = ("apply", "create", "replace", "delete", "patch_merge")


def _json_copy(value: Any) -> Any:
    """``value`` after a JSON round trip: every object crosses this API as a copy, as over
    the wire, through the operator's own JSON library (most of this double's time was
    copying; orjson's round trip is ~3x faster than a copy written in Python)."""
    return orjson.loads(orjson.dumps(value))


class Crashed(BaseException):
    """The operator process died (injected).  A BaseException: no `except Exception` in the
    operator may swallow it, as none could swallow a SIGKILL."""


@dataclass
class Write:
    verb: str
    key: Key
    body: dict[str, Any] | None
    created: bool = False  # this write made the object exist


@dataclass
class MemoryApi:
    objects: dict[Key, dict[str, Any]] = field(default_factory=dict)
    log: list[Write] = field(default_factory=list)
    crash_countdown: int | None = None
    # Called right before a status write lands: a test changes the object "concurrently".
    before_status_write: Callable[[MemoryApi, Key], None] | None = None
    # Writes the "server" refuses: (verb, kind) -> the error it answers (403, 422, ...).
    refuse: dict[tuple[str, str], ApiError] = field(default_factory=dict)
    lists: Counter[str] = field(default_factory=Counter)  # list requests, by kind
    # Kinds this "server" does not serve (a CRD not installed: LeaderWorkerSet without LWS).
    unserved: set[str] = field(default_factory=set)
    gets: Counter[str] = field(default_factory=Counter)  # get requests, by kind
    _versions: itertools.count = field(default_factory=lambda: itertools.count(1))
    _uids: itertools.count = field(default_factory=lambda: itertools.count(1))

    # -- fault injection ----------------------------------------------------------------
    def crash_before_write(self, n: int | None) -> None:
        """The n-th write from now (1 = the next) kills the operator instead of landing."""
        self.crash_countdown = n

    def _write(self, verb: str, key: Key) -> None:
        refused = self.refuse.get((verb, key[0]))
        if refused is not None:
            raise refused
        if self.crash_countdown is not None:
            self.crash_countdown -= 1
            if self.crash_countdown <= 0:
                self.crash_countdown = None
                raise Crashed(f"before {verb} {key}")

    # -- reads --------------------------------------------------------------------------
    def get(
        self, kind: str, namespace: str | None, name: str, timeout: float = 0
    ) -> dict[str, Any] | None:
        self.gets[kind] += 1
        found = self.objects.get((kind, namespace, name))
        return _json_copy(found) if found is not None else None

    def list(
        self,
        kind: str,
        namespace: str | None,
        selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        self.lists[kind] += 1
        if kind in self.unserved:
            raise ApiError(404, f"the server could not find the requested resource ({kind})")
        return self.select(kind, namespace, selector, field_selector)

    def select(
        self,
        kind: str,
        namespace: str | None,
        selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """What a list answers, without counting a request (how the harness fills the
        operator's cache, as its watches would)."""
        match = label_match(selector)
        fields = field_match(field_selector)
        found = [
            (str(key), obj)
            for key, obj in self.objects.items()
            if key[0] == kind
            and (namespace is None or key[1] == namespace)
            and match(obj["metadata"].get("labels") or {})
            and fields(obj)
        ]
        return [_json_copy(obj) for _, obj in sorted(found, key=lambda pair: pair[0])]

    def requests(self) -> int:
        """Reads and writes the operator sent (the cache's filling excluded)."""
        return sum(self.lists.values()) + sum(self.gets.values()) + len(self.log)

    # -- writes -------------------------------------------------------------------------
    def apply(self, obj: dict[str, Any], manager: str = "dsv4-operator") -> dict[str, Any]:
        key = _key(obj)
        self._write("apply", key)
        current = self.objects.get(key)
        wanted = obj["metadata"].get("resourceVersion")
        if wanted and current is not None and current["metadata"]["resourceVersion"] != wanted:
            raise ApiError(409, f"{key}: the object has been modified")
        created = current is None
        if created:
            current = self._new(obj)
        else:
            self._merge(current, obj)
        self.objects[key] = current
        self.log.append(Write("apply", key, _json_copy(obj), created))
        return _json_copy(current)

    def create(self, obj: dict[str, Any], timeout: float = 0) -> dict[str, Any]:
        meta = obj["metadata"]
        if "name" not in meta:  # generateName (Events)
            obj = {**obj, "metadata": {**meta, "name": f"{meta['generateName']}{next(self._uids)}"}}
        key = _key(obj)
        self._write("create", key)
        if key in self.objects:
            raise ApiError(409, f"{key} already exists")
        self.objects[key] = self._new(obj)
        self.log.append(Write("create", key, _json_copy(obj), True))
        return _json_copy(self.objects[key])

    def replace(self, obj: dict[str, Any], timeout: float = 0) -> dict[str, Any]:
        key = _key(obj)
        self._write("replace", key)
        current = self.objects.get(key)
        if current is None:
            raise ApiError(404, f"{key} not found")
        if obj["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiError(409, f"{key}: the object has been modified")
        replaced = _json_copy(obj)
        replaced["metadata"] = {**current["metadata"], **obj["metadata"]}
        self._bump(replaced)
        self.objects[key] = replaced
        self.log.append(Write("replace", key, _json_copy(obj)))
        return _json_copy(replaced)

    def delete(self, kind: str, namespace: str, name: str, propagation: str | None = None) -> None:
        key = (kind, namespace, name)
        self._write("delete", key)
        if key not in self.objects:
            return
        self.log.append(Write("delete", key, None))
        self._collect(self.objects.pop(key)["metadata"]["uid"])

    def patch_merge(
        self, kind: str, namespace: str, name: str, changes: dict[str, Any]
    ) -> dict[str, Any]:
        key = (kind, namespace, name)
        self._write("patch_merge", key)
        current = self.objects.get(key)
        if current is None:
            raise ApiError(404, f"{key} not found")
        current.update(_json_copy(changes))
        self._bump(current)
        self.log.append(Write("patch_merge", key, _json_copy(changes)))
        return _json_copy(current)

    def patch_status(
        self, kind: str, namespace: str, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """A JSON patch of the status subresource, as the API server applies one: an op
        that sets the resourceVersion to another than the object's is a 409, and only the
        status changes (logged as a "status" write: the status after it, and the ops)."""
        key = (kind, namespace, name)
        self._write("status", key)
        if key not in self.objects:
            raise ApiError(404, f"{key} not found")
        if self.before_status_write is not None:
            self.before_status_write(self, key)
        current = self.objects[key]
        patched = apply_json_patch(current, ops)
        if patched["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]:
            raise ApiError(409, f"{key}: the object has been modified")
        current["status"] = patched.get("status")
        self._bump(current)
        after = {"status": current["status"], "ops": ops}
        self.log.append(Write("status", key, _json_copy(after)))
        return _json_copy(current)

    # -- what a user does (not the operator: never counted as its writes) ----------------
    def user_apply(self, obj: dict[str, Any]) -> None:
        key = _key(obj)
        current = self.objects.get(key)
        if current is None:
            self.objects[key] = self._new(obj)
        else:
            self._merge(current, obj)

    def user_patch(
        self, kind: str, namespace: str, name: str, change: Callable[[dict], None]
    ) -> None:
        current = self.objects[(kind, namespace, name)]
        before = json.dumps(current.get("spec"), sort_keys=True)
        change(current)
        if json.dumps(current.get("spec"), sort_keys=True) != before:
            current["metadata"]["generation"] += 1
        self._bump(current)

    # -- controllers the operator relies on ----------------------------------------------
    def names(self, kind: str) -> set[str]:
        return {name for (k, _, name) in self.objects if k == kind}

    def settle(self, held: Callable[[dict[str, Any]], bool] = lambda obj: False) -> None:
        """Every StatefulSet, LeaderWorkerSet and Deployment rolled out and Ready, but those
        ``held`` (kept at their previous template, as when pods cannot be scheduled).  An
        LWS's status counts groups and carries no revisions (as the real one's)."""
        for (kind, _, _), obj in self.objects.items():
            if kind not in ("StatefulSet", "LeaderWorkerSet", "Deployment") or held(obj):
                continue
            replicas = obj["spec"].get("replicas", 1)
            revision = _digest(obj["spec"].get("template"))
            status: dict[str, Any] = {
                "observedGeneration": obj["metadata"]["generation"],
                "replicas": replicas,
                "readyReplicas": replicas,
                "updatedReplicas": replicas,
                "availableReplicas": replicas,
                "currentRevision": revision,
                "updateRevision": revision,
            }
            if kind == "LeaderWorkerSet":
                status = {k: v for k, v in status.items() if not k.endswith("Revision")}
            if obj.get("status") != status:
                obj["status"] = status
                self._bump(obj)

    def _stateful_set(self, name: str) -> dict[str, Any]:
        return next(o for (k, _, n), o in self.objects.items() if (k, n) == ("StatefulSet", name))

    def unschedulable(self, stateful_set: str, message: str, since: dt.datetime) -> None:
        """The first pod of a StatefulSet exists and the scheduler cannot place it (what the
        kube-scheduler writes on the pod)."""
        meta = self._stateful_set(stateful_set)["metadata"]
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": stamp(since),
        }
        template = self._stateful_set(stateful_set)["spec"]["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{stateful_set}-0",
                "namespace": meta["namespace"],
                "labels": dict(template["metadata"]["labels"]),
                "ownerReferences": [
                    {
                        "kind": "StatefulSet",
                        "name": stateful_set,
                        "uid": meta["uid"],
                        "controller": True,
                    }
                ],
            },
            "status": {"phase": "Pending", "conditions": [condition]},
        }
        self.user_apply(pod)

    def failed_create(self, stateful_set: str, message: str, since: dt.datetime) -> None:
        """The StatefulSet controller could not create a pod (the Event it records)."""
        meta = self._stateful_set(stateful_set)["metadata"]
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{stateful_set}.failed", "namespace": meta["namespace"]},
            "involvedObject": {"kind": "StatefulSet", "name": stateful_set, "uid": meta["uid"]},
            "type": "Warning",
            "reason": "FailedCreate",
            "message": message,
            "firstTimestamp": stamp(since),
            "lastTimestamp": stamp(since),
        }
        self.user_apply(event)

    def run_probe_jobs(
        self,
        verdict_of: Callable[[dict[str, Any]], dict[str, Any] | None],
        only: set[str] | None = None,
        exit_now: bool = True,
    ) -> int:
        """Run the probe Jobs not run yet (``only``: just these names): file
        ``verdict_of(job)`` (an outcome dict) into its report as the probe does, then mark the
        Job Complete (PASS) or Failed — or, ``exit_now`` False, leave it active as a pod that
        filed and has not exited yet (`exit_probe_jobs` ends it).  A verdict of None is a
        probe that could not file its verdict (exit 4, which fails the Job: `probe_job`'s
        podFailurePolicy).  Returns how many ran."""
        ran = 0
        for (kind, ns, name), job in list(self.objects.items()):
            if kind != "Job" or job.get("status") or (only is not None and name not in only):
                continue
            report = job["metadata"]["annotations"]["inference.dsv4.dev/report"]
            outcome = verdict_of(job)
            if outcome is None:  # nothing filed; the pod exits 4 and the Job fails
                _end_job(job, "NOT_FILED")
                self._bump(job)
                ran += 1
                continue
            cm = self.objects.get(("ConfigMap", ns, report))
            if cm is not None:
                cm.setdefault("data", {})[OUTCOME_KEY] = json.dumps(outcome)
                cm["data"]["report.json"] = json.dumps({"verdict": outcome["verdict"]})
                self._bump(cm)
            if exit_now:
                _end_job(job, outcome["verdict"])
            else:
                job["status"] = {"active": 1, "filed": outcome["verdict"]}
            self._bump(job)
            ran += 1
        return ran

    def exit_probe_jobs(self) -> int:
        """The pods of Jobs that filed their report (``exit_now`` False) exit now: Complete
        after a PASS, Failed otherwise, as `dsv4ctl probe`'s exit code makes them.  Returns
        how many ended."""
        ended = 0
        for (kind, _, _), job in self.objects.items():
            filed = (job.get("status") or {}).get("filed") if kind == "Job" else None
            if filed is not None:
                _end_job(job, filed)
                self._bump(job)
                ended += 1
        return ended

    # -- internals ----------------------------------------------------------------------
    def _new(self, obj: dict[str, Any]) -> dict[str, Any]:
        made = _json_copy(obj)
        meta = made["metadata"]
        meta.pop("resourceVersion", None)
        serial = next(self._uids)
        created = dt.datetime(2026, 11, 30, tzinfo=dt.UTC) + dt.timedelta(seconds=serial)
        meta.update(uid=f"uid-{serial}", generation=1, creationTimestamp=stamp(created))
        self._bump(made)
        return made

    def _merge(self, current: dict[str, Any], obj: dict[str, Any]) -> None:
        spec_before = json.dumps(current.get("spec"), sort_keys=True)
        for key, value in obj.items():
            if key == "metadata":
                meta = current["metadata"]
                for part in ("labels", "annotations"):
                    if part in value:
                        meta[part] = {**(meta.get(part) or {}), **value[part]}
                if "ownerReferences" in value:
                    meta["ownerReferences"] = _json_copy(value["ownerReferences"])
            elif key != "status":
                current[key] = _json_copy(value)
        if json.dumps(current.get("spec"), sort_keys=True) != spec_before:
            current["metadata"]["generation"] += 1
        self._bump(current)

    def _bump(self, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self._versions))

    def _collect(self, uid: str) -> None:
        """Garbage collection: dependents of a deleted owner go too (recursively)."""
        for key, obj in list(self.objects.items()):
            refs = obj["metadata"].get("ownerReferences") or []
            if any(ref.get("uid") == uid for ref in refs) and key in self.objects:
                self._collect(self.objects.pop(key)["metadata"]["uid"])


def _key(obj: dict[str, Any]) -> Key:
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace"), meta["name"]


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:10]


def _end_job(job: dict[str, Any], verdict: str) -> None:
    done = "Complete" if verdict == "PASS" else "Failed"
    job["status"] = {"conditions": [{"type": done, "status": "True", "reason": "Ran"}]}


def apply_json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """``doc`` with RFC 6902 add/replace/remove ops applied (a copy); a path that does not
    exist where an op needs it is a 422, as the API server answers."""
    doc = _json_copy(doc)
    for op in ops:
        *parents, last = [
            k.replace("~1", "/").replace("~0", "~") for k in op["path"].split("/")[1:]
        ]
        target = doc
        for k in parents:
            if not isinstance(target.get(k), dict):
                raise ApiError(422, f"{op['path']}: no such path")
            target = target[k]
        if op["op"] == "remove" or op["op"] == "replace":
            if last not in target:
                raise ApiError(422, f"{op['op']} {op['path']}: no such path")
        if op["op"] == "remove":
            del target[last]
        else:
            target[last] = _json_copy(op["value"])
    return doc
