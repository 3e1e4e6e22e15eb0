"""The watch-fed cache answers "is there such an object" (`Store.exists`) the way a list
would, from its label index when the selector pins an indexed label."""

from __future__ import annotations

from dsv4_operator.kube.cache import Store
from dsv4_operator.render.placement import GPU_PRODUCT_LABEL


def node(name: str, product: str | None, **labels: str) -> dict:
    if product is not None:
        labels[GPU_PRODUCT_LABEL] = product
    return {"kind": "Node", "metadata": {"name": name, "labels": labels}}


def pod(namespace: str, name: str, **labels: str) -> dict:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels}}


def nodes() -> Store:
    store = Store("Node", (GPU_PRODUCT_LABEL,))
    store.replace(
        [node(f"b200-{i}", "NVIDIA-B200", zone=f"z{i % 3}") for i in range(1000)]
        + [node("cpu-0", None, zone="z0"), node("gb200-0", "NVIDIA-GB200", zone="z9")]
    )
    return store


def test_exists_answers_as_a_list_would_through_the_index():
    store = nodes()
    selectors = [
        f"{GPU_PRODUCT_LABEL} in (NVIDIA-B200)",
        f"{GPU_PRODUCT_LABEL} in (NVIDIA-H100,NVIDIA-GB200)",
        f"{GPU_PRODUCT_LABEL} in (NVIDIA-H100)",
        f"{GPU_PRODUCT_LABEL} in (NVIDIA-B200),zone=z9",  # terms past the pinned label count
        f"{GPU_PRODUCT_LABEL} in (NVIDIA-GB200),zone=z9",
        "zone=z0",  # no indexed label pinned: every node is a candidate
        "zone=z7",
    ]
    answers = {s: store.exists(None, s) for s in selectors}
    assert answers == {s: bool(store.select(None, s, None)) for s in selectors}
    assert list(answers.values()) == [True, True, False, False, True, True, False]


def test_exists_keeps_to_the_namespace_asked():
    store = Store("Pod", ("app.kubernetes.io/instance",))
    store.replace([pod("serving", "flash-0", **{"app.kubernetes.io/instance": "flash"})])
    assert store.exists("serving", "app.kubernetes.io/instance in (flash)")
    assert not store.exists("other", "app.kubernetes.io/instance in (flash)")
    assert not store.exists("other", "")
    assert store.exists(None, "")
