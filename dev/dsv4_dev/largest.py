"""The largest DSV4Deployment the API server admits: every list, map and string a tenant
fills at will, at its limit.

A review ran the operator out of memory with eight 1.27 MB DSV4Deployments (issue 62); the
spec's bounds now refuse those at apply.  What is left is this one: the scale bench creates
eight of it next to the operator (its memory against the limit), and the unit tests render
it (every child and every annotation within the API server's limits).  It is built from
the bounds' own constants, so a bound raised there makes it larger here.

Left at the sample's values: what must name something real to be admitted or placed (the
image and the model path, under the operator's allow-lists; the known issues acknowledged,
which must exist; tolerations, under the toleration allow-list; an RDMA device, under the
device allow-list); and `placement.topologyKey`, which changes where pods may go.
"""

from __future__ import annotations

from typing import Any

from dsv4_operator.api.samples import load_sample, merge_patch
from dsv4_operator.api.spec import MAX_ENV_CHARS, MAX_EXTRA_ARGS_CHARS

# The spec's per-item bounds (`api/spec.py`, `engine_config.py`): list lengths and the
# longest string of each.
LIST_ITEMS = 64  # extraArgs, env
EXTRA_ARG_CHARS = 256
LABELS = 32  # nodeSelector
LABEL_KEY_CHARS, LABEL_VALUE_CHARS = 317, 63
GPU_PRODUCTS = 16
IB_DEVICES, IB_DEVICE_CHARS = 32, 64
SERVED_MODEL_NAME_CHARS = 253


def _padded(prefix: str, length: int) -> str:
    return prefix + "x" * (length - len(prefix))


def _label_key(i: int) -> str:
    """A label key of LABEL_KEY_CHARS: a DNS prefix of 253 (labels of ≤ 63), `/`, a name of 63."""
    prefix = ".".join(["a" * 63, "b" * 63, "c" * 63, _padded(f"k{i:02d}", 61)])
    return f"{prefix}/{_padded(f'n{i:02d}', 63)}"


def _extra_args() -> list[str]:
    """Flag and value in one item, each item at its bound, up to the role's budget: a
    watchdog timeout of 300 s written with leading zeros (SGLang parses it as a float)."""
    flag = "--watchdog-timeout="
    item = flag + "300".rjust(EXTRA_ARG_CHARS - len(flag), "0")
    return [item] * min(LIST_ITEMS, MAX_EXTRA_ARGS_CHARS // EXTRA_ARG_CHARS)


def _env() -> list[dict[str, str]]:
    """LIST_ITEMS variables sharing the role's budget of names and values."""
    each = MAX_ENV_CHARS // LIST_ITEMS
    return [
        {"name": (name := f"BENCH_PAD_{i:02d}"), "value": "v" * (each - len(name))}
        for i in range(LIST_ITEMS)
    ]


def node_labels() -> dict[str, str]:
    """The labels its nodeSelector asks of a node (what the bench gives the nodes)."""
    return {_label_key(i): _padded(f"v{i:02d}", LABEL_VALUE_CHARS) for i in range(LABELS)}


def largest(namespace: str, name: str) -> dict[str, Any]:
    """The sample as the largest admitted object, named ``namespace``/``name``."""
    role = {"extraArgs": _extra_args(), "env": _env()}
    spec = {
        "model": {"servedModelName": _padded("served", SERVED_MODEL_NAME_CHARS)},
        "prefill": role,
        "decode": role,
        "placement": {
            "gpuProducts": ["NVIDIA-B200"]
            + [_padded(f"p{i:02d}", LABEL_VALUE_CHARS) for i in range(GPU_PRODUCTS - 1)],
            "nodeSelector": node_labels(),
        },
        "disaggregation": {
            "ibDevices": [_padded(f"mlx5_{i:02d}", IB_DEVICE_CHARS) for i in range(IB_DEVICES)]
        },
    }
    return merge_patch(
        load_sample(), {"metadata": {"name": name, "namespace": namespace}, "spec": spec}
    )
