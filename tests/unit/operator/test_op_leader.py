"""Lease decisions: who may lead, from the Lease and the clock."""

import datetime as dt

import pytest

from dsv4_operator.leader import Leadership, LeaseConfig, lease_body, lease_verdict
from dsv4_operator.reconcile.kube import Kube, NotLeader

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


def spec(holder, renewed_s_ago, duration=15):
    body = lease_body(
        LeaseConfig("l", "ns", holder, duration), NOW - dt.timedelta(seconds=renewed_s_ago), None
    )
    return body["spec"]


def test_verdicts():
    assert lease_verdict(spec("me", 100), "me", NOW) == "renew"
    assert lease_verdict(spec("other", 5), "me", NOW) == "wait"
    assert lease_verdict(spec("other", 16), "me", NOW) == "take"
    assert lease_verdict({}, "me", NOW) == "take"
    assert (
        lease_verdict({"holderIdentity": None, "renewTime": spec("x", 1)["renewTime"]}, "me", NOW)
        == "take"
    )


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_leader_stops_acting_at_the_renew_deadline_before_anyone_may_take_over():
    config = LeaseConfig("l", "ns", "me")  # 15 s lease, 10 s renew deadline, 2 s retries
    assert config.retry_period_s < config.renew_deadline_s < config.duration_s
    clock = Clock()
    leadership = Leadership(config, clock=clock)
    assert not leadership.held()  # never renewed: never acts
    leadership.renewed_at = clock()
    clock.t += 9.9
    assert leadership.held()
    clock.t += 0.2  # 10.1 s without a renewal: it stops, 4.9 s before the Lease expires
    assert not leadership.held()
    assert config.request_timeout_s <= config.retry_period_s  # a hung request cannot hold on


def test_lease_timing_that_could_let_two_leaders_overlap_is_refused():
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        LeaseConfig("l", "ns", "me", duration_s=10, renew_deadline_s=10)
    scaled = LeaseConfig.scaled("l", "ns", "me", 6)
    assert scaled.retry_period_s < scaled.renew_deadline_s < scaled.duration_s == 6


class RecordingApi:
    """An ApiClient stand-in that records what would be sent (no server here)."""

    def __init__(self) -> None:
        self.sent = []

    def param_serialize(self, method, resource_path, **_):
        return (method, resource_path)

    def call_api(self, method, resource_path, _request_timeout=None):
        self.sent.append((method, resource_path, _request_timeout))

        class Response:
            status = 200

            def read(self):
                return b"{}"

        return Response()


def test_no_write_leaves_a_process_that_no_longer_leads():
    api = RecordingApi()
    kube = Kube(api)
    leading = [True]
    kube.fence = lambda: leading[0]
    kube.delete("StatefulSet", "ns", "a")
    leading[0] = False
    with pytest.raises(NotLeader):
        kube.apply({"kind": "StatefulSet", "metadata": {"name": "a", "namespace": "ns"}})
    kube.get("StatefulSet", "ns", "a")  # reads are harmless
    lease = {"kind": "Lease", "metadata": {"name": "l", "namespace": "ns"}}
    kube.replace(lease, timeout=2.0)  # renewing the Lease is how leadership comes back
    assert [(m, p.rsplit("/", 2)[-2]) for m, p, _ in api.sent] == [
        ("DELETE", "statefulsets"),
        ("GET", "statefulsets"),
        ("PUT", "leases"),
    ]
    assert api.sent[-1][2] == 2.0  # the Lease's own short timeout reached the client
