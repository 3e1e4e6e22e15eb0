"""Lease decisions: who may lead, from the Lease and the clock; a renewal that landed is
not mistaken for a lost lead."""

import datetime as dt

import pytest

from dsv4_operator.kube.client import REQUEST_TIMEOUT_S, Kube, NotLeader
from dsv4_operator.leader import Leadership, LeaseConfig, lease_body, lease_verdict, try_hold
from tests.unit.operator.memory_api import MemoryApi

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


def spec(holder, renewed_s_ago, duration=15):
    body = lease_body(
        LeaseConfig("l", "ns", holder, duration), NOW - dt.timedelta(seconds=renewed_s_ago), None
    )
    return body["spec"]


def test_verdicts():
    assert lease_verdict(spec("me", 100), "me", None, 0.0)[0] == "renew"
    assert lease_verdict(spec("other", 5), "me", None, 0.0)[0] == "wait"
    assert lease_verdict({}, "me", None, 0.0)[0] == "take"
    free = {"holderIdentity": None, "renewTime": spec("x", 1)["renewTime"]}
    assert lease_verdict(free, "me", None, 0.0)[0] == "take"


@pytest.mark.parametrize("skew_s", [-3600, 0, 3600])
def test_a_candidate_measures_expiry_on_its_own_clock_whatever_the_holders_clock_says(skew_s):
    """The holder's renewTime is read as a change, never as a time: a holder whose clock is
    an hour behind is not taken over at once, one an hour ahead not waited for an hour."""
    held = spec("other", skew_s)  # renewTime an hour ago, now, or an hour ahead
    verdict, seen = lease_verdict(held, "me", None, 1000.0)
    assert verdict == "wait" and seen.seen_at == 1000.0
    verdict, seen = lease_verdict(held, "me", seen, 1014.9)
    assert verdict == "wait"
    renewed = {**held, "renewTime": spec("other", skew_s - 10)["renewTime"]}
    verdict, seen = lease_verdict(renewed, "me", seen, 1015.0)  # a renewal: counted again
    assert verdict == "wait" and seen.seen_at == 1015.0
    assert lease_verdict(renewed, "me", seen, 1029.9)[0] == "wait"
    assert lease_verdict(renewed, "me", seen, 1030.0)[0] == "take"  # 15 s of no change


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
    clock = Clock()
    leadership = Leadership(LeaseConfig("l", "ns", "me"), renewed_at=clock(), clock=clock)
    kube.fence = leadership.remaining
    kube.delete("StatefulSet", "ns", "a")
    clock.t += 10.0  # the renew deadline
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


def test_a_write_is_abandoned_by_the_renew_deadline_at_the_latest():
    """A write waits at most what is left of the lead, not its usual 30 s: 10 s right
    after a renewal, 3 s seven seconds later.  No answer is awaited past the moment this
    process stops leading."""
    api = RecordingApi()
    kube = Kube(api)
    clock = Clock()
    leadership = Leadership(LeaseConfig("l", "ns", "me"), renewed_at=clock(), clock=clock)
    kube.fence = leadership.remaining
    kube.delete("StatefulSet", "ns", "a")
    clock.t += 7.0
    kube.apply({"kind": "StatefulSet", "metadata": {"name": "a", "namespace": "ns"}})
    assert [timeout for _, _, timeout in api.sent] == [10.0, pytest.approx(3.0)]
    assert REQUEST_TIMEOUT_S > 10.0


class RepeatedRenewal(MemoryApi):
    """The API as a renewal whose answer timed out sees it: the HTTP client sent the PUT
    again, the first one landed, and the repeat is refused for its stale version."""

    def replace(self, obj, timeout=0):
        super().replace(obj, timeout)
        return super().replace(obj, timeout)  # 409: the version moved


def test_a_renewal_refused_only_because_it_was_sent_twice_keeps_the_lead():
    leadership = Leadership(LeaseConfig("l", "ns", "me"))
    api = RepeatedRenewal()
    assert try_hold(api, leadership)  # created
    assert try_hold(api, leadership)  # renewed, though the repeat was refused
    assert api.get("Lease", "ns", "l")["spec"]["holderIdentity"] == "me"


def test_a_renewal_refused_because_another_holder_wrote_loses_the_lead():
    leadership = Leadership(LeaseConfig("l", "ns", "me"))
    api = MemoryApi()
    assert try_hold(api, leadership)
    lease = api.get("Lease", "ns", "l")
    other = MemoryApi.replace

    def taken_meanwhile(self, obj, timeout=0):
        current = self.objects[("Lease", "ns", "l")]
        current["spec"] = {**current["spec"], "holderIdentity": "other"}
        self._bump(current)
        return other(self, obj, timeout)

    api.replace = taken_meanwhile.__get__(api)
    assert not try_hold(api, leadership)
    assert lease["spec"]["holderIdentity"] == "me"
