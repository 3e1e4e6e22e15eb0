"""What the operator's administrator allows a DSV4Deployment to ask for, which the tenant
who writes the spec cannot widen: the images its pods run and the taints they tolerate
(and, in `api.host_paths`, the host directories a model may come from).

Both are set once, in the ConfigMap `dsv4-system/dsv4-operator-settings` that the admission
fence reads too (manifests/base/fence.yaml, keys `allowedImages`, `allowedTolerations`,
`allowedDeviceResources` and `allowedPriorityClasses`),
so what the operator accepts here is what the fence admits from its token, and a
compromised operator can run no other image, toleration, device or priority either.

- An image: `spec.image.name` is the engine's, `spec.router.image` the router's (the
  engine image if unset).  Free text would let a tenant run anything with the router's
  ServiceAccount token; the allow-list holds registries (`ghcr.io`), repository paths
  (`ghcr.io/dsv4`) or exact images (`repo:tag`, `repo@sha256:…`).  An image is allowed when
  it is an entry, or continues one with `/`, `:` or `@` (`ghcr.io/dsv4` allows
  `ghcr.io/dsv4/engine:0.1.0`, not `ghcr.io/dsv4-evil/x`); an entry ending in one of those
  is a plain prefix (`lmsysorg/sglang:` allows every tag of that repository).  Images are
  compared as written, as the kubelet is given them (`docker.io/x/y` and `x/y` are two
  entries).  Shipped: `ghcr.io/dsv4`, the project's own images.
- A toleration, written as the taint it tolerates in `kubectl taint` notation:
  `key=value:Effect` (operator Equal), `key:Effect` (operator Exists: any value), `key`
  or `key=value` (no effect: every effect), `*` for an empty key (Exists: every taint).
  A pod's toleration must be one of the entries exactly.  `operator: Exists` on an empty
  key tolerates every taint, so a tenant could otherwise land on any taint-partitioned
  GPU pool; the administrator lists the pools tenants may use.  Shipped:
  `nvidia.com/gpu:NoSchedule`, the toleration the operator gives every engine pod itself
  (`render.placement.GPU_TOLERATION`): keep it listed.
- A device resource, `spec.<role>.resources.rdma.resourceName`: the extended resource an
  engine pod requests for its RDMA NICs.  Free text would let a tenant request any device
  a node advertises (`devices.kubevirt.io/kvm`, with the IPC_LOCK the operator adds for
  RDMA); the allow-list holds exact resource names.  Shipped: the RDMA device plugins'
  (`rdma/ib`, the spec's default; `rdma/rdma_shared_device_a`, NVIDIA Network Operator's;
  `rdma/hca_shared_devices_a`, k8s-rdma-shared-dev-plugin's example; `nvidia.com/hostdev`,
  SR-IOV host devices).  A name that would shadow what the operator sets itself (`cpu`,
  `memory`, `nvidia.com/gpu`, any name without a domain or in `kubernetes.io`) is refused
  by the CRD whatever the list says.
- A priority class, `spec.placement.priorityClassName`: the PriorityClass of the engine
  pods.  Free text would let a tenant preempt everyone else's pods (`system-node-critical`);
  the allow-list holds exact PriorityClass names.  Shipped: none (the engine pods get the
  cluster's default priority); list the classes your inference tier may use.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SETTINGS = "ConfigMap dsv4-system/dsv4-operator-settings"

IMAGES_KEY = "allowedImages"
IMAGES_FLAG = "--allowed-images"
IMAGES_ENV = "DSV4_ALLOWED_IMAGES"  # the flag's default, from the settings ConfigMap
SHIPPED_IMAGES = "ghcr.io/dsv4"  # the flag's default without the variable, as shipped

TOLERATIONS_KEY = "allowedTolerations"
TOLERATIONS_FLAG = "--allowed-tolerations"
TOLERATIONS_ENV = "DSV4_ALLOWED_TOLERATIONS"
SHIPPED_TOLERATIONS = "nvidia.com/gpu:NoSchedule"

DEVICES_KEY = "allowedDeviceResources"
DEVICES_FLAG = "--allowed-device-resources"
DEVICES_ENV = "DSV4_ALLOWED_DEVICE_RESOURCES"
SHIPPED_DEVICES = "rdma/ib,rdma/rdma_shared_device_a,rdma/hca_shared_devices_a,nvidia.com/hostdev"
PRIORITY_CLASSES_KEY = "allowedPriorityClasses"
PRIORITY_CLASSES_FLAG = "--allowed-priority-classes"
PRIORITY_CLASSES_ENV = "DSV4_ALLOWED_PRIORITY_CLASSES"
SHIPPED_PRIORITY_CLASSES = ""
# A PriorityClass name: a DNS subdomain (Kubernetes' rule for object names).
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# An extended resource name: a DNS domain, `/`, a name (Kubernetes' own rule for them).
EXTENDED_RESOURCE = r"^[a-z0-9]+([.-][a-z0-9]+)*/[A-Za-z0-9]+([._-][A-Za-z0-9]+)*$"

_SEPARATORS = ("/", ":", "@")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_ANY_KEY = "*"
# A taint key (an optional DNS prefix, then a name), a label value, an effect.
_TOLERATION = re.compile(
    r"^(?P<key>\*|([a-z0-9.-]+/)?[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?)"
    r"(=(?P<value>[A-Za-z0-9._-]*))?(:(?P<effect>[A-Za-z]+))?$"
)


def _items(text: str) -> list[str]:
    return [item for item in (part.strip() for part in text.split(",")) if item]


def parse_images(text: str) -> tuple[str, ...]:
    """A comma-separated allow-list of image prefixes; ValueError says what is wrong."""
    images = _items(text)
    for image in images:
        if any(c.isspace() for c in image) or image[0] in _SEPARATORS:
            raise ValueError(f"{IMAGES_FLAG}: {image!r} is not a registry, repository or image")
    return tuple(images)


def parse_tolerations(text: str) -> tuple[str, ...]:
    """A comma-separated allow-list of tolerations in taint notation (module docstring);
    ValueError says what is wrong."""
    entries = _items(text)
    for entry in entries:
        found = _TOLERATION.match(entry)
        if found is None or (found["effect"] is not None and found["effect"] not in _EFFECTS):
            raise ValueError(
                f"{TOLERATIONS_FLAG}: {entry!r} is not KEY[=VALUE][:EFFECT] "
                f"(EFFECT one of {', '.join(_EFFECTS)}; KEY {_ANY_KEY} for every key)"
            )
        if found["key"] == _ANY_KEY and found["value"] is not None:
            raise ValueError(f"{TOLERATIONS_FLAG}: {entry!r}: the key {_ANY_KEY} takes no value")
    return tuple(entries)


def parse_devices(text: str) -> tuple[str, ...]:
    """A comma-separated allow-list of extended resource names; ValueError says what is
    wrong."""
    names = _items(text)
    for name in names:
        if re.match(EXTENDED_RESOURCE, name) is None:
            raise ValueError(
                f"{DEVICES_FLAG}: {name!r} is not an extended resource name (DOMAIN/NAME)"
            )
    return tuple(names)


def parse_priority_classes(text: str) -> tuple[str, ...]:
    """A comma-separated allow-list of PriorityClass names; ValueError says what is wrong."""
    names = _items(text)
    for name in names:
        if len(name) > 253 or re.match(DNS_SUBDOMAIN, name) is None:
            raise ValueError(
                f"{PRIORITY_CLASSES_FLAG}: {name!r} is not a PriorityClass name (a DNS "
                "subdomain: lowercase letters, digits, '-' and '.')"
            )
    return tuple(names)


def image_allowed(image: str, allowed: Sequence[str]) -> bool:
    """``image`` is an entry of ``allowed`` or continues one with `/`, `:` or `@` (an entry
    ending in one of those is a plain prefix).  The fence's `refusedImages` is this rule."""
    for entry in allowed:
        if entry.endswith(_SEPARATORS):
            if image.startswith(entry):
                return True
        elif image == entry or any(image.startswith(entry + sep) for sep in _SEPARATORS):
            return True
    return False


def toleration_text(toleration: Mapping[str, Any]) -> str:
    """A pod's toleration in the allow-list's notation (the fence's `refusedTolerations`
    writes it the same way): the taint it tolerates."""
    key = toleration.get("key") or _ANY_KEY
    exists = toleration.get("operator") == "Exists"
    value = "" if exists else "=" + (toleration.get("value") or "")
    effect = toleration.get("effect") or ""
    return key + value + (":" + effect if effect else "")


@dataclass(frozen=True)
class Allowed:
    """What the administrator allows (flags or the settings ConfigMap); each default is
    what the install ships."""

    model_host_paths: tuple[str, ...] = ()
    images: tuple[str, ...] = parse_images(SHIPPED_IMAGES)
    tolerations: tuple[str, ...] = parse_tolerations(SHIPPED_TOLERATIONS)
    device_resources: tuple[str, ...] = parse_devices(SHIPPED_DEVICES)
    priority_classes: tuple[str, ...] = parse_priority_classes(SHIPPED_PRIORITY_CLASSES)

    def priority_class_problem(self, name: str | None) -> str | None:
        """Why the engine pods may not run at PriorityClass ``name``; None when they may
        (or when the spec names none)."""
        if name is None or name in self.priority_classes:
            return None
        return (
            f"spec.placement.priorityClassName: {name} is not a priority class the operator "
            f"allows ({PRIORITY_CLASSES_KEY} in {SETTINGS}: {_listed(self.priority_classes)}); "
            "leave it unset for the cluster's default, or ask the operator's administrator "
            "to list it"
        )

    def device_problem(self, devices: Sequence[tuple[str, str]]) -> str | None:
        """Why one of ``devices`` ((field, resource name) pairs) may not be requested; None
        when all may."""
        for field, name in devices:
            if name not in self.device_resources:
                return (
                    f"{field}: {name} is not a device resource the operator allows "
                    f"({DEVICES_KEY} in {SETTINGS}: {_listed(self.device_resources)}); name "
                    "your RDMA device plugin's resource, or ask the operator's administrator "
                    "to list it"
                )
        return None

    def image_problem(self, images: Sequence[tuple[str, str]]) -> str | None:
        """Why one of ``images`` ((field, image) pairs) may not run; None when all may."""
        for field, image in images:
            if not image_allowed(image, self.images):
                return (
                    f"{field}: {image} is not an image the operator allows ({IMAGES_KEY} in "
                    f"{SETTINGS}: {_listed(self.images)}); use an image under one of them, "
                    "or ask the operator's administrator to allow its registry or repository"
                )
        return None

    def toleration_problem(
        self, tolerations: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> str | None:
        """Why one of ``tolerations`` ((field, toleration) pairs) may not be given to a
        pod; None when all may."""
        for field, toleration in tolerations:
            text = toleration_text(toleration)
            if text not in self.tolerations:
                return (
                    f"{field}: the toleration {text} is not one the operator allows "
                    f"({TOLERATIONS_KEY} in {SETTINGS}: {_listed(self.tolerations)}); tolerate "
                    "only the taints of the GPU pools listed there, or ask the operator's "
                    "administrator to list the pool"
                )
        return None


def _listed(entries: Sequence[str]) -> str:
    return ", ".join(entries) if entries else "none"


SHIPPED = Allowed()  # what the install ships (manifests/base/fence.yaml's settings)
