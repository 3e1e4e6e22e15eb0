"""What a reconcile pass applies or deletes, given desired and live objects."""

import copy

from dsv4_operator.reconcile.plan import is_subset, plan, with_applied_hash


def cm(name, data, **meta):
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "ns", **meta},
        "data": data,
    }


def as_live(obj):
    """What the API server returns: our fields plus its own."""
    live = copy.deepcopy(obj)
    live["metadata"].update(uid="u", resourceVersion="7", managedFields=[{"manager": "x"}])
    return live


def test_steady_state_plans_nothing():
    desired = [with_applied_hash(cm("a", {"k": "v"}))]
    assert plan(desired, [as_live(desired[0])]) == []


def test_missing_changed_drifted_and_orphaned():
    a, b = with_applied_hash(cm("a", {"k": "v"})), with_applied_hash(cm("b", {"k": "v"}))
    live_a = as_live(with_applied_hash(cm("a", {"k": "old"})))
    live_b = as_live(b)
    live_b["data"]["k"] = "edited by hand"
    orphan = as_live(with_applied_hash(cm("gone", {})))
    actions = plan([a, b, with_applied_hash(cm("c", {}))], [live_a, live_b, orphan])
    assert [(x.verb, x.name, x.reason) for x in actions] == [
        ("apply", "a", "changed"),
        ("apply", "b", "drifted"),
        ("apply", "c", "missing"),
        ("delete", "gone", "orphaned"),
    ]


def test_an_orphan_already_being_deleted_is_not_deleted_again():
    """A router goes in the foreground: it stays listed while its pods finish; one DELETE."""
    going = as_live(with_applied_hash(cm("router", {})))
    going["metadata"]["deletionTimestamp"] = "2026-11-30T12:00:00Z"
    assert plan([], [going]) == []


def test_a_field_the_operator_stops_setting_is_a_change():
    with_env = with_applied_hash(cm("a", {"k": "v", "extra": "1"}))
    without = with_applied_hash(cm("a", {"k": "v"}))
    (action,) = plan([without], [as_live(with_env)])
    assert action.reason == "changed"


def test_subset_compares_lists_elementwise():
    assert is_subset({"p": [{"port": 1}]}, {"p": [{"port": 1, "protocol": "TCP"}]})
    assert not is_subset({"p": [{"port": 1}]}, {"p": [{"port": 1}, {"port": 2}]})
    assert not is_subset({"a": "1"}, {"a": 1})
