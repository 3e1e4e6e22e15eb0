"""Lease decisions: who may lead, from the Lease and the clock; a renewal that landed is
not mistaken for a lost lead."""

import datetime as dt

import pytest

from dsv4_operator.leader import Leadership, LeaseConfig, lease_body, lease_verdict, try_hold
from dsv4_operator.reconcile.kube import Kube, NotLeader
from tests.unit.operator.memory_api import MemoryApi

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


class RepeatedRenewal(MemoryApi):
    """The API as a renewal whose answer timed out sees it: the HTTP client sent the PUT
    again, the first one landed, and the repeat is refused for its stale version."""

    def replace(self, obj, timeout=0):
        super().replace(obj, timeout)
        return super().replace(obj, timeout)  # 409: the version moved


def test_a_renewal_refused_only_because_it_was_sent_twice_keeps_the_lead():
    config = LeaseConfig("l", "ns", "me")
    api = RepeatedRenewal()
    assert try_hold(api, config)  # created
    assert try_hold(api, config)  # renewed, though the repeat was refused
    assert api.get("Lease", "ns", "l")["spec"]["holderIdentity"] == "me"


def test_a_renewal_refused_because_another_holder_wrote_loses_the_lead():
    config = LeaseConfig("l", "ns", "me")
    api = MemoryApi()
    assert try_hold(api, config)
    lease = api.get("Lease", "ns", "l")
    other = MemoryApi.replace

    def taken_meanwhile(self, obj, timeout=0):
        current = self.objects[("Lease", "ns", "l")]
        current["spec"] = {**current["spec"], "holderIdentity": "other"}
        self._bump(current)
        return other(self, obj, timeout)

    api.replace = taken_meanwhile.__get__(api)
    assert not try_hold(api, config)
    assert lease["spec"]["holderIdentity"] == "me"
