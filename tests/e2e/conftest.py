"""Session-scoped real control plane for end-to-end tests.

One cluster per test session, in a private workdir (so it never touches a developer's own
`dsv4ctl cluster up`), torn down even when tests fail.  Every test in this folder is marked
`e2e` automatically.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from dsv4_dev.cluster.local import LocalCluster


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.e2e)
            # Under pytest-xdist (`make test`), every e2e test runs on one worker: they share
            # one control plane (the session fixture below) and run in file order.
            item.add_marker(pytest.mark.xdist_group("e2e"))


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    workdir = tmp_path_factory.mktemp("kwok")
    local = LocalCluster(name="e2e", workdir=workdir)
    try:
        local.up(log=lambda message: None)
        yield local
    finally:
        local.down(log=lambda message: None)
