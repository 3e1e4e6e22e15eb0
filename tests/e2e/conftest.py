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
from dsv4_operator.api.crd import CRD_PATH

# Under pytest-xdist (`make test` runs four workers) the e2e files fall into groups; a group
# runs on one worker, in file order, on that worker's own control plane, so the groups wait
# side by side.  The default canaries on reference engines (598 samples each) make one
# group; installing the operator for real (its manifests, its token, its fence) another;
# every other file the third.  A group is one worker's sequence, so the longest group bounds
# `make test`'s wall time: the groups hold similar shares, and the rest of the suite fills
# the fourth worker and the groups' gaps.  Local probe mode (one FAIL) runs with the third
# for that balance (with the first, that group's worker ran nothing else all run long).
GROUPS = {
    "e2e-engines": {
        "test_rollout.py",
        "test_probe_jobs.py",
        "test_monitoring.py",
        "test_readme_tour.py",
    },
    "e2e-installs": {
        "test_install.py",
        "test_namespaced_install.py",
        "test_operator_lifecycle.py",
        "test_stuck.py",
        "test_bad_input_sweep.py",
        "test_control_plane.py",
        "test_operator_validation.py",
        "test_known_issues.py",
    },
}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.e2e)
            # A group runs on one worker, in file order, sharing its session's control plane.
            name = os.path.basename(item.fspath)
            group = next((g for g, files in GROUPS.items() if name in files), "e2e")
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="module")
def crd(cluster: LocalCluster) -> LocalCluster:
    """The cluster with the DSV4Deployment CRD applied and established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_PATH))
    cluster.wait_established("crd/dsv4deployments.inference.dsv4.dev")
    return cluster


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    workdir = tmp_path_factory.mktemp("kwok")
    local = LocalCluster(name="e2e", workdir=workdir)
    try:
        local.up(log=lambda message: None)
        yield local
    finally:
        local.down(log=lambda message: None)


@pytest.fixture(autouse=True)
def _grouped(request: pytest.FixtureRequest) -> None:
    """Under `--dist loadgroup`, pytest-xdist groups tests by suffixing their node ids with
    the group.  A pytest that ignores that rewrite (9.2 with xdist 3.8, pytest-xdist#1386)
    spreads every e2e file's tests over the workers, each with its own control plane: a
    module's objects are then missing from half its tests.  Fail every e2e test saying so,
    instead of failing some of them at random."""
    if getattr(request.config.option, "loadgroup", False) and "@" not in request.node.nodeid:
        raise RuntimeError(
            f"pytest-xdist did not group {request.node.nodeid} (--dist loadgroup): the e2e "
            f"files would share no control plane; pin a pytest that keeps xdist's groups "
            f"(requirements/base.txt)"
        )
