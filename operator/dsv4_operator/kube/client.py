"""The one door to the Kubernetes API: every request the reconciler makes passes here.

One door means one place that retries transient failures (429, 5xx, dropped connections)
with backoff, one field manager for every server-side apply, one counter of requests by
verb (how a steady-state reconcile is shown to make zero writes), and one fence: with a
leader check installed, no write leaves a process that may no longer lead.

A 409 is never retried here: it answers a precondition (a resourceVersion that moved on, an
object that already exists), and sending the same request again cannot change the answer —
the caller re-reads and decides again.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import orjson
import urllib3
from kubernetes import client

from dsv4_operator.api import GROUP, KIND, PLURAL, VERSION
from dsv4_operator.render.lws import LWS_API_VERSION, LWS_KIND, LWS_PLURAL

FIELD_MANAGER = "dsv4-operator"
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
TRANSIENT_STATUS = frozenset({0, 429, 500, 502, 503, 504})
REQUEST_TIMEOUT_S = 30.0
# A watch is ended by the server after this long and resumed from its last version (a
# list only when that version is too old): the watch requests of a steady state.
WATCH_TIMEOUT_S = 600
PAGE_SIZE = 500
JSON = "application/json"
METADATA_ONLY = "application/json;g=meta.k8s.io;v=v1"
T = TypeVar("T")


@dataclass(frozen=True)
class Resource:
    prefix: str
    plural: str
    namespaced: bool = True


RESOURCES: dict[str, Resource] = {
    KIND: Resource(f"/apis/{GROUP}/{VERSION}", PLURAL),
    "ConfigMap": Resource("/api/v1", "configmaps"),
    "Service": Resource("/api/v1", "services"),
    "ServiceAccount": Resource("/api/v1", "serviceaccounts"),
    "PersistentVolumeClaim": Resource("/api/v1", "persistentvolumeclaims"),
    "Event": Resource("/api/v1", "events"),
    "EndpointSlice": Resource("/apis/discovery.k8s.io/v1", "endpointslices"),
    "Node": Resource("/api/v1", "nodes", namespaced=False),
    "Pod": Resource("/api/v1", "pods"),
    "StatefulSet": Resource("/apis/apps/v1", "statefulsets"),
    LWS_KIND: Resource(f"/apis/{LWS_API_VERSION}", LWS_PLURAL),
    "Deployment": Resource("/apis/apps/v1", "deployments"),
    "PodDisruptionBudget": Resource("/apis/policy/v1", "poddisruptionbudgets"),
    "NetworkPolicy": Resource("/apis/networking.k8s.io/v1", "networkpolicies"),
    "Job": Resource("/apis/batch/v1", "jobs"),
    "Role": Resource("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": Resource("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "Lease": Resource("/apis/coordination.k8s.io/v1", "leases"),
}


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class NotLeader(Exception):
    """A write was about to leave a process that no longer holds the leader Lease."""


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter; `attempts` tries in all."""

    attempts: int = 6
    base: float = 0.2
    cap: float = 5.0

    def delays(self, rng: random.Random) -> Iterator[float]:
        for attempt in range(self.attempts - 1):
            yield rng.uniform(0, min(self.cap, self.base * 2**attempt))


def retrying(
    call: Callable[[], T],
    backoff: Backoff,
    rng: random.Random,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`call()`, again after a pause while it fails transiently; the last error is raised."""
    for delay in backoff.delays(rng):
        try:
            return call()
        except ApiError as err:
            if err.status not in TRANSIENT_STATUS:
                raise
        sleep(delay)
    return call()


def path(kind: str, namespace: str | None = None, name: str | None = None) -> str:
    res = RESOURCES[kind]
    parts = [res.prefix]
    if res.namespaced and namespace is not None:
        parts.append(f"namespaces/{quote(namespace)}")
    parts.append(res.plural)
    if name is not None:
        parts.append(quote(name))
    return "/".join(parts)


class Kube:
    """Synchronous JSON client over the configured kubernetes ApiClient (run it in a thread)."""

    def __init__(
        self,
        api: client.ApiClient,
        backoff: Backoff = Backoff(),
        rng: random.Random | None = None,
    ) -> None:
        self._api = api
        self._backoff = backoff
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, str]] = Counter()
        # Called (lock held) once a request is counted, before it is sent: the development
        # launcher's crash injection (dsv4_dev.operator); None in the image.
        self.counted: Callable[[], None] | None = None
        # Before every write but the Lease's own: the seconds this process may still write
        # (`leader.Leadership.remaining`); none is sent at 0, and each is abandoned by then.
        # None: no fence.
        self.fence: Callable[[], float] | None = None

    def _send(
        self,
        method: str,
        url_path: str,
        body: Any,
        content_type: str,
        query: list[tuple[str, str]],
        timeout: float | tuple[float, float],
        accept: str = JSON,
        counted_as: str | None = None,
    ) -> Any:
        """Send one request; returns the undecoded response (checked for errors)."""
        write = method in WRITE_VERBS and "/leases" not in url_path
        if write and self.fence is not None:
            left = self.fence()
            if left <= 0:
                raise NotLeader(f"{method} {url_path}: this operator no longer holds the lease")
            if isinstance(timeout, int | float):  # a write's is; only a watch has a pair
                timeout = min(timeout, left)
        with self._lock:
            self.requests[(counted_as or method, url_path)] += 1
            if self.counted is not None:
                self.counted()
        serialized = self._api.param_serialize(
            method=method,
            resource_path=url_path,
            query_params=query,
            header_params={"Content-Type": content_type, "Accept": accept},
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self._api.call_api(*serialized, _request_timeout=timeout)
        except client.ApiException as err:
            raise ApiError(err.status or 0, str(err.reason)) from err
        except urllib3.exceptions.HTTPError as err:
            raise ApiError(0, f"connection: {err}") from err
        if response.status >= 400:
            raise ApiError(response.status, _message(response.read()))
        return response

    def _once(
        self,
        method: str,
        url_path: str,
        body: Any,
        content_type: str,
        query: list[tuple[str, str]],
        timeout: float,
        accept: str = JSON,
    ) -> Any:
        response = self._send(method, url_path, body, content_type, query, timeout, accept)
        try:
            data = response.read()
        except urllib3.exceptions.HTTPError as err:
            raise ApiError(0, f"connection: {err}") from err
        return orjson.loads(data) if data else None

    def request(
        self,
        method: str,
        url_path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: list[tuple[str, str]] | None = None,
        timeout: float = REQUEST_TIMEOUT_S,
        accept: str = JSON,
    ) -> Any:
        return retrying(
            lambda: self._once(method, url_path, body, content_type, query or [], timeout, accept),
            self._backoff,
            self._rng,
        )

    def get(
        self, kind: str, namespace: str | None, name: str, timeout: float = REQUEST_TIMEOUT_S
    ) -> dict[str, Any] | None:
        try:
            return self.request("GET", path(kind, namespace, name), timeout=timeout)
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def serves(self, group: str, version: str, plural: str) -> bool:
        """Whether the API server serves ``plural`` in ``group/version`` now: its discovery
        document, which every authenticated client may read, lists it once a CRD is
        established."""
        try:
            found = self.request("GET", f"/apis/{group}/{version}")
        except ApiError as err:
            if err.status == 404:  # the group/version is not served at all
                return False
            raise
        return any(r.get("name") == plural for r in (found or {}).get("resources") or [])

    def list(
        self,
        kind: str,
        namespace: str | None,
        selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """Items as full objects: a list response leaves apiVersion and kind off its items."""
        return self.snapshot(kind, namespace, selector, field_selector)[0]

    def snapshot(
        self,
        kind: str,
        namespace: str | None,
        selector: str | None = None,
        field_selector: str | None = None,
        metadata_only: bool = False,
    ) -> tuple[list[dict[str, Any]], str]:
        """Every matching object and the resourceVersion of the list, read in pages (what a
        watch then starts from).  ``metadata_only``: the objects' metadata alone
        (PartialObjectMetadata), for what needs only labels and existence."""
        query = _selectors(selector, field_selector) + [("limit", str(PAGE_SIZE))]
        accept = f"{METADATA_ONLY};as=PartialObjectMetadataList" if metadata_only else JSON
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            page = query + ([("continue", token)] if token else [])
            listed = self.request("GET", path(kind, namespace), query=page, accept=accept)
            items += listed.get("items") or []  # a metadata list of nothing says null
            token = listed["metadata"].get("continue") or ""
            if not token:
                break
        version = listed["metadata"].get("resourceVersion", "")
        typed = {"apiVersion": api_version(kind), "kind": kind}
        return [{**item, **typed} for item in items], version

    def watch(
        self,
        kind: str,
        namespace: str | None,
        version: str,
        selector: str | None = None,
        field_selector: str | None = None,
        metadata_only: bool = False,
        timeout_s: int = WATCH_TIMEOUT_S,
    ) -> Iterator[dict[str, Any]]:
        """The changes after ``version``, one watch event at a time (bookmarks included),
        until the server ends the watch (after about ``timeout_s``) or it fails.  Never
        retried here: the caller knows where to resume."""
        query = _selectors(selector, field_selector) + [
            ("watch", "true"),
            ("resourceVersion", version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_s)),
        ]
        accept = f"{METADATA_ONLY};as=PartialObjectMetadata" if metadata_only else JSON
        response = self._send(
            "GET",
            path(kind, namespace),
            None,
            JSON,
            query,
            (REQUEST_TIMEOUT_S, timeout_s + REQUEST_TIMEOUT_S),
            accept,
            counted_as="WATCH",
        )
        try:
            for line in response.response:
                if line.strip():
                    yield orjson.loads(line)
        except urllib3.exceptions.HTTPError as err:
            raise ApiError(0, f"watch connection: {err}") from err
        finally:
            response.response.release_conn()

    def apply(self, obj: dict[str, Any], manager: str = FIELD_MANAGER) -> dict[str, Any]:
        """Server-side apply, conflicts forced, under the operator's one field manager (a
        probe filing its report uses its own, so it leaves the operator's fields alone)."""
        meta = obj["metadata"]
        return self.request(
            "PATCH",
            path(obj["kind"], meta.get("namespace"), meta["name"]),
            # Serialized here (JSON is YAML): the generated client would walk the object to
            # sanitize it, then encode it with the standard library, both several times slower.
            body=orjson.dumps(obj),
            content_type="application/apply-patch+yaml",
            query=[("fieldManager", manager), ("force", "true")],
        )

    def patch_merge(self, kind: str, namespace: str, name: str, changes: dict[str, Any]) -> Any:
        """A JSON merge patch (RFC 7386): the given fields replaced, the rest left alone."""
        return self.request(
            "PATCH",
            path(kind, namespace, name),
            changes,
            content_type="application/merge-patch+json",
        )

    def patch_status(self, kind: str, namespace: str, name: str, ops: list[dict[str, Any]]) -> Any:
        """A JSON patch (RFC 6902) of the status subresource, under the operator's field
        manager; an op that sets ``/metadata/resourceVersion`` makes it conditional (409
        when the object moved on)."""
        return self.request(
            "PATCH",
            f"{path(kind, namespace, name)}/status",
            ops,
            content_type="application/json-patch+json",
            query=[("fieldManager", FIELD_MANAGER)],
        )

    def create(self, obj: dict[str, Any], timeout: float = REQUEST_TIMEOUT_S) -> dict[str, Any]:
        """A plain create (409 when the name is taken), under the operator's field manager."""
        url = path(obj["kind"], obj["metadata"].get("namespace"))
        query = [("fieldManager", FIELD_MANAGER)]
        return self.request("POST", url, obj, query=query, timeout=timeout)

    def replace(self, obj: dict[str, Any], timeout: float = REQUEST_TIMEOUT_S) -> dict[str, Any]:
        meta = obj["metadata"]
        url = path(obj["kind"], meta.get("namespace"), meta["name"])
        return self.request("PUT", url, obj, timeout=timeout)

    def delete(self, kind: str, namespace: str, name: str, propagation: str | None = None) -> None:
        """``propagation``: Background/Foreground/Orphan; None: the API's default for kind."""
        body = None
        if propagation is not None:
            body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        try:
            self.request("DELETE", path(kind, namespace, name), body)
        except ApiError as err:
            if err.status != 404:
                raise

    def writes(self) -> int:
        """Writes for DSV4Deployments and their children (leader-election renewals excluded)."""
        return sum(
            n
            for (verb, url), n in self.requests.items()
            if verb in WRITE_VERBS and "/leases" not in url
        )


def api_version(kind: str) -> str:
    """The apiVersion of a kind's objects (a list or watch of them leaves it off)."""
    prefix = RESOURCES[kind].prefix
    return "v1" if prefix == "/api/v1" else prefix.removeprefix("/apis/")


def _selectors(selector: str | None, field_selector: str | None) -> list[tuple[str, str]]:
    query = [("labelSelector", selector)] if selector else []
    if field_selector:
        query.append(("fieldSelector", field_selector))
    return query


def _message(data: bytes) -> str:
    try:
        return str(orjson.loads(data).get("message", data[:200]))
    except (orjson.JSONDecodeError, AttributeError):
        return data[:200].decode(errors="replace")
