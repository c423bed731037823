"""Fixtures for end-to-end tests against the real local control plane (deploy/local).

One cluster per test session, in a temporary state folder so it never touches a developer's
``make run`` cluster. The first run on a machine builds the binaries (several minutes); later
runs start the cluster in seconds.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from deploy.local.cluster import LocalCluster
from deploy.local.components import ControlPlaneOptions

SHIPPED_ACCOUNTS = (
    "system:serviceaccount:phalanx-system:phalanx-scheduler",
    "system:serviceaccount:phalanx-system:phalanx-extender",
)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A running LocalCluster with the nodes of config/cluster.yaml, torn down at session end."""
    if shutil.which("go") is None:
        pytest.skip("the Go toolchain is needed to build the local control plane")
    # die_with_parent: a session killed outright (e.g. by a CI timeout) takes its cluster along.
    # The shipped service accounts' calls go to the audit log (test_manifests checks the RBAC).
    # No controller manager in this cluster: its suites make pods by hand, some with owners
    # (suspended Jobs, StatefulSets of 0 replicas) whose controllers would delete them.
    # tests/e2e/test_controllers.py runs a cluster with it.
    options = ControlPlaneOptions(die_with_parent=True, audit_users=SHIPPED_ACCOUNTS, controller_manager=False)
    local = LocalCluster("e2e", state_dir_path=tmp_path_factory.mktemp("cluster"), options=options)
    try:
        local.up()
        yield local
    finally:
        local.down()
