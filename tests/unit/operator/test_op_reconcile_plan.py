"""What a reconcile pass applies or deletes, given desired and live objects."""

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

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


def subset_by_definition(desired, actual):
    """What `is_subset` means, written plainly: its shortcuts must not change an answer."""
    if isinstance(desired, dict):
        return isinstance(actual, dict) and all(
            k in actual and subset_by_definition(v, actual[k]) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(actual, list)
            and len(desired) == len(actual)
            and all(subset_by_definition(d, a) for d, a in zip(desired, actual, strict=True))
        )
    return desired == actual


# JSON as a child holds it, with the values that compare equal across types in Python
# (1, 1.0 and True; 0, False) and keys shared often enough that subtrees overlap.
JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from([0, 1, 1.0, 2, "1", "a", ""]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), inner, max_size=4),
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(desired=JSON_VALUES, actual=JSON_VALUES, extra=JSON_VALUES)
def test_subset_answers_as_its_definition_does(desired, actual, extra):
    assert is_subset(desired, actual) == subset_by_definition(desired, actual)
    # The live object: the desired one as sent, with a field the server added.
    live = {"spec": copy.deepcopy(desired), "status": extra}
    assert is_subset({"spec": desired}, live)
    if isinstance(desired, dict):
        served = {**copy.deepcopy(desired), "defaulted": extra}
        assert is_subset(desired, served) == subset_by_definition(desired, served)
