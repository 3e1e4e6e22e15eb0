"""A pass reads its children once: the stable slice's and the canary's in the same reads."""

from dsv4_operator.reconcile.reconciler import CHILD_KINDS, Reconciler
from dsv4_operator.render.meta import LABEL_INSTANCE, Owner, metadata
from dsv4_operator.rollout.slices import canary_owner
from tests.unit.operator.harness import NS, World

OWNER = Owner(name="flash", namespace="serving", uid="u-1")


class ListingKube:
    """Answers every list with the objects of that kind the selector's instances own."""

    def __init__(self, objects):
        self.objects = objects
        self.lists = []

    def list(self, kind, namespace, selector=None):
        self.lists.append((kind, namespace, selector))
        wanted = selector.split(" in (", 1)[1].split(")", 1)[0].split(",")
        return [
            o
            for o in self.objects
            if o["kind"] == kind and o["metadata"]["labels"][LABEL_INSTANCE] in wanted
        ]

    def served(self, kind):
        return True


def child(kind, owner, name, uid=None):
    meta = metadata(owner, name, "decode")
    meta["ownerReferences"][0]["uid"] = uid or owner.uid
    return {"kind": kind, "metadata": meta}


def test_stable_and_canary_children_come_from_one_list_per_kind():
    canary = canary_owner(OWNER)
    stable_sts = child("StatefulSet", OWNER, "flash-decode")
    canary_sts = child("StatefulSet", canary, "flash--canary-decode")
    canary_cm = child("ConfigMap", canary, "flash--canary-engine")
    other = child("StatefulSet", Owner("other", "serving", "u-2"), "other-decode")
    kube = ListingKube([stable_sts, canary_sts, canary_cm, other])

    stable, canary_live, unserved = Reconciler(None, kube, rollout=None)._children(OWNER)

    # The canary's objects never count as the stable slice's (it would prune them).
    assert stable == [stable_sts]
    assert canary_live == [canary_cm, canary_sts]
    assert unserved == frozenset()
    assert [(kind, ns) for kind, ns, _ in kube.lists] == [(k, "serving") for k in CHILD_KINDS]
    assert {selector for _, _, selector in kube.lists} == {
        "app.kubernetes.io/instance in (flash,flash--canary),"
        "app.kubernetes.io/managed-by=dsv4-operator,"
        "app.kubernetes.io/component notin (probe,rollout-report)"
    }


def test_children_with_our_labels_but_another_owner_are_never_ours():
    """A same-named predecessor's children still being garbage-collected, or objects some
    other controller labelled like ours: matched by label, refused by owner UID."""
    leftover = child("StatefulSet", OWNER, "flash-decode", uid="uid-of-a-deleted-flash")
    kube = ListingKube([leftover])
    stable, canary_live, _ = Reconciler(None, kube, rollout=None)._children(OWNER)
    assert (stable, canary_live) == ([], [])


def test_an_upgrade_prunes_the_routers_old_binding_and_binds_the_shipped_cluster_role():
    """Earlier versions wrote the router a Role and a RoleBinding of the same name; a
    RoleBinding's roleRef cannot change, so the new one binding dsv4-router has another
    name, and the old binding goes as any orphaned child does.  The old Role, bound to no
    one then, is left to the garbage collector (it goes with the deployment): the operator
    writes no Roles, so it neither watches nor deletes them."""
    world = World()
    world.create("flash")
    world.step("flash")
    flash = world.obj()
    owner = Owner(name="flash", namespace=NS, uid=flash["metadata"]["uid"])
    for kind in ("Role", "RoleBinding"):
        world.api.user_apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
                              "metadata": metadata(owner, "flash-router", "router")})  # fmt: skip
    world.step("flash")
    children = world.children("flash")
    assert ("RoleBinding", "flash-router") not in children
    assert ("Role", "flash-router") in children  # the garbage collector's
    assert not [w for w in world.api.log if w.key[0] == "Role"], "the operator wrote a Role"
    binding = children[("RoleBinding", "flash-router-discovery")]
    assert binding["roleRef"]["kind"] == "ClusterRole"
