"""Image tests: the operator image and the engine image's two local variants (CPU, and
production-equivalent on SGLang's GPU stack), built by hack/images.sh (cached outside the
checkout: a rebuild of unchanged sources takes seconds) and run with podman as their pods run
them.

Every test here is marked `images`; under pytest-xdist they share one worker, so each image
is built once per session, one build at a time.
"""

from __future__ import annotations

import os

import pytest

from dsv4_dev import images


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.images)
            item.add_marker(pytest.mark.xdist_group("images"))


@pytest.fixture(scope="session")
def operator_image() -> str:
    return images.build("operator")


@pytest.fixture(scope="session")
def engine_cpu_image() -> str:
    return images.build("engine-cpu")


@pytest.fixture(scope="session")
def engine_sglang_image() -> str:
    return images.build("engine-sglang")


@pytest.fixture(
    scope="session",
    params=[
        pytest.param("engine_cpu_image", id="cpu"),
        pytest.param("engine_sglang_image", id="sglang", marks=pytest.mark.sglang_image),
    ],
)
def engine_variant_image(request: pytest.FixtureRequest) -> str:
    """Each local variant of the engine image, for what both must do as production's."""
    return request.getfixturevalue(request.param)
