"""Everything from the project's images: the operator and its probe Jobs from the operator
image (`from_images`), and every engine pod of the shipped reference sample from the CPU
engine image — the pod's command, user, security context and environment, its engine.yaml
where its ConfigMap volume puts it — so a canary's engines and the promoted ones are
containers of that image.

The CPU engine image is a cold build of minutes and GBs: `make test` leaves this module out,
`make test-images` (and CI) runs it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dsv4_dev import images
from dsv4_dev.cluster.local import LocalCluster
from dsv4_operator.render.meta import LABEL_COMPONENT
from tests.e2e.from_images import (
    apply_sample_until_ready,
    engine_pods,
    from_images,
    pass_a_clean_flag_change,
)
from tests.e2e.helpers import Installed

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.images, pytest.mark.engine_image]

NS = "dsv4-engine-image-e2e"


@pytest.fixture(scope="module")
def engine_image() -> str:
    return images.build("engine-cpu")


@pytest.fixture(scope="module")
def running(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory, engine_image: str
) -> Iterator[tuple[Installed, str]]:
    workdir = tmp_path_factory.mktemp("engine-image")
    with from_images(cluster, NS, workdir, engine_image) as running:
        yield running


def containers_of_engine_pods(cluster: LocalCluster) -> dict[str, str]:
    """Each running engine pod's name -> the image of its podman container (absent: none)."""
    listed = images.podman("ps", "--format", "{{.Names}} {{.Image}}", check=True).stdout
    running = dict(line.split() for line in listed.splitlines() if line.strip())
    found = {}
    for pod in engine_pods(cluster, NS):
        role = pod["metadata"]["labels"][LABEL_COMPONENT]
        name = f"dsv4-{role}-{pod['metadata']['uid']}"
        if name in running:
            found[pod["metadata"]["name"]] = running[name]
    return found


def test_the_sample_is_ready_on_engines_from_the_engine_image(
    cluster: LocalCluster, running: tuple[Installed, str], engine_image: str
) -> None:
    installed, _ = running
    apply_sample_until_ready(cluster, installed, NS)
    pods = {p["metadata"]["name"] for p in engine_pods(cluster, NS)}
    assert len(pods) == 2  # one prefill, one decode
    assert containers_of_engine_pods(cluster) == dict.fromkeys(pods, engine_image)


def test_a_clean_flag_change_is_canaried_on_the_engine_image_and_promoted(
    cluster: LocalCluster, running: tuple[Installed, str], engine_image: str
) -> None:
    installed, image = running
    before = {p["metadata"]["uid"] for p in engine_pods(cluster, NS)}
    pass_a_clean_flag_change(cluster, installed, image, NS)
    # The promoted revision's engines are new pods, each a container of the engine image.
    after = engine_pods(cluster, NS)
    assert not before & {p["metadata"]["uid"] for p in after}
    assert containers_of_engine_pods(cluster) == dict.fromkeys(
        (p["metadata"]["name"] for p in after), engine_image
    )
