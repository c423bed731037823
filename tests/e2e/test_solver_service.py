"""The extender solving through the solver service (`python -m solverd`, a real process on
loopback) on the real control plane: gangs are planned remotely; with the service killed,
placements go on through the in-process fallback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from deploy.local.cluster import LocalCluster
from deploy.local.components import free_port
from deploy.local.paths import REPO_ROOT
from extender.app import Extender, Options, RemoteSolverOptions
from extender.kube import RestKube
from tests.e2e.test_extender import wait
from tests.e2e.test_gangs import RACK, bound, delete_pods, labels_of, member, workload
from tests.e2e.test_gangs import kube as kube  # the fixture: the Workload CRD installed

pytestmark = pytest.mark.e2e


@pytest.fixture
def solverd() -> Iterator[subprocess.Popen[bytes]]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "solverd", f"--address=127.0.0.1:{port}"], env=env, cwd=REPO_ROOT)
    proc.args = f"127.0.0.1:{port}"  # type: ignore[misc]  # where it listens, for the extender
    yield proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def solves(ext: Extender, where: str) -> float:
    return ext.metrics.registry.get_sample_value("phalanx_solves_total", {"where": where}) or 0.0


def test_gangs_are_planned_by_the_service_and_by_the_fallback_once_it_is_killed(
    cluster: LocalCluster, kube: RestKube, solverd: subprocess.Popen[bytes]
) -> None:
    ext = Extender(kube, Options(port=0, solver=RemoteSolverOptions(str(solverd.args))))
    ext.start()
    assert ext.remote_solver is not None
    wait("the solver service serving", lambda: _healthy(ext), 60)
    wait("extender ready", ext.ready)
    cluster.restart_scheduler(ext.server.url)
    try:
        for name, remote_alive in (("remote", True), ("fallback", False)):
            if not remote_alive:
                solverd.kill()
                solverd.wait(timeout=30)
            workload(kube, f"svc-{name}", 4, required=RACK)
            for i in range(4):
                member(kube, f"svc-{name}-{i}", {"phalanx.io/workload": f"svc-{name}"})
            selector = f"phalanx.io/workload=svc-{name}"
            placed = wait(f"the {name} gang bound", lambda s=selector: (b := bound(kube, s)) and len(b) == 4 and b, 120)
            assert len({labels_of(p["spec"]["nodeName"], kube)[RACK] for p in placed}) == 1
            assert solves(ext, name) >= 1, name
            delete_pods(kube, selector)
        assert solves(ext, "refused") == 0
    finally:
        cluster.restart_scheduler(None)
        ext.stop()


def _healthy(ext: Extender) -> bool:
    assert ext.remote_solver is not None
    try:
        return bool(ext.remote_solver.health().serving)
    except Exception:
        return False
