"""`kubectl get ... -o json` answered in process: the same API server reads, without a
kubectl process each.

The e2e tests poll the API server while they wait for states (every half second, for
minutes), and each kubectl start cost ~0.11 CPU-seconds: 18% of test_engine_revision's CPU
on a two-core machine.  This reads the same objects through the API server's REST paths,
resolving a resource as kubectl does (plural, singular or short name, the core group
first, then the groups in discovery order, each at its preferred version) and printing
what kubectl prints: the object, or a `List` of items with their kind and apiVersion, without
managedFields.
Anything else kubectl accepts (`all`, `type/name`, other flags, several types) is left to
kubectl.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kubernetes import config

from dsv4_dev.cluster.local import ClusterError, LocalCluster
from dsv4_operator.kube.client import ApiError, Kube

DEFAULT_NAMESPACE = "default"  # the local cluster's kubeconfig context sets none


@dataclass(frozen=True)
class Resource:
    group_version: str  # "v1", "apps/v1"
    plural: str
    kind: str
    namespaced: bool

    def path(self, namespace: str | None, name: str | None) -> str:
        base = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        scope = f"/namespaces/{namespace}" if self.namespaced else ""
        return f"{base}{scope}/{self.plural}" + (f"/{name}" if name else "")


@dataclass(frozen=True)
class Query:
    resource: str
    name: str | None
    namespace: str | None
    labels: str | None
    fields: str | None


_FLAGS = {
    "-n": "namespace",
    "--namespace": "namespace",
    "-l": "labels",
    "--selector": "labels",
    "--field-selector": "fields",
}


def query(args: tuple[str, ...]) -> Query | None:
    """The `kubectl get` arguments as a query this module answers; None: kubectl's."""
    words: list[str] = []
    values: dict[str, str] = {}
    at = 0
    while at < len(args):
        arg = args[at]
        flag, eq, value = arg.partition("=")
        if flag in _FLAGS and eq:
            values[_FLAGS[flag]] = value
        elif arg in _FLAGS and at + 1 < len(args):
            values[_FLAGS[arg]] = args[at + 1]
            at += 1
        elif arg.startswith("-"):
            return None
        else:
            words.append(arg)
        at += 1
    if not 1 <= len(words) <= 2 or any(c in words[0] for c in ",/") or words[0] == "all":
        return None
    if len(words) == 2 and ("labels" in values or "fields" in values):
        return None  # kubectl refuses a name with a selector: let it say so
    return Query(
        resource=words[0].lower(),
        name=words[1] if len(words) == 2 else None,
        namespace=values.get("namespace"),
        labels=values.get("labels"),
        fields=values.get("fields"),
    )


class Reader:
    """One cluster's API client and resource names (discovered again for a name not yet
    known: a CRD applied since)."""

    def __init__(self, kubeconfig: str) -> None:
        self.kube = Kube(config.new_client_from_config(config_file=kubeconfig))
        self.names: dict[str, Resource] = {}

    def get(self, q: Query) -> dict[str, Any] | None:
        """kubectl's JSON for ``q``; None where the resource is unknown (kubectl's)."""
        resource = self.names.get(q.resource) or self._discover().get(q.resource)
        if resource is None:
            return None
        namespace = (q.namespace or DEFAULT_NAMESPACE) if resource.namespaced else None
        params = [
            (k, v) for k, v in (("labelSelector", q.labels), ("fieldSelector", q.fields)) if v
        ]
        try:
            body = self.kube.request("GET", resource.path(namespace, q.name), query=params)
        except ApiError as err:
            raise ClusterError(f"kubectl get {q} failed: Error from server: {err}") from None
        if q.name is not None:
            return _shown(body)
        for item in body.get("items", []):
            item.setdefault("apiVersion", resource.group_version)
            item.setdefault("kind", resource.kind)
            _shown(item)
        return {
            "apiVersion": "v1",
            "items": body.get("items", []),
            "kind": "List",
            "metadata": {"resourceVersion": ""},
        }

    def _discover(self) -> dict[str, Resource]:
        """Every resource's names, first come first kept: the core group, then each group
        at its preferred version in the API server's order (kubectl's priority)."""
        names: dict[str, Resource] = {}
        versions = ["v1"]
        groups = self.kube.request("GET", "/apis")
        versions += [g["preferredVersion"]["groupVersion"] for g in groups.get("groups", [])]
        for version in versions:
            base = "/api/v1" if version == "v1" else f"/apis/{version}"
            listing = self.kube.request("GET", base)
            for r in listing.get("resources", []):
                if "/" in r["name"] or "get" not in r.get("verbs", []):
                    continue  # a subresource, or nothing to read
                resource = Resource(version, r["name"], r["kind"], r["namespaced"])
                for name in (
                    r["name"],
                    r.get("singularName") or r["kind"].lower(),
                    *r.get("shortNames", []),
                ):
                    names.setdefault(name, resource)
        self.names = names
        return names


def _shown(obj: dict[str, Any]) -> dict[str, Any]:
    """As kubectl prints it: without managedFields (its --show-managed-fields=false)."""
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


_READERS: dict[str, Reader] = {}


def get_json(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    """What `kubectl get ARGS -o json` prints (see the module)."""
    q = query(args)
    if q is not None:
        if cluster.kubeconfig not in _READERS:
            _READERS[cluster.kubeconfig] = Reader(cluster.kubeconfig)
        found = _READERS[cluster.kubeconfig].get(q)
        if found is not None:
            return found
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)
