"""Lease decisions: who may lead, from the Lease and the clock."""

import datetime as dt

from dsv4_operator.leader import LeaseConfig, lease_body, lease_verdict

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
