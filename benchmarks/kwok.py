"""What the KWOK benchmarks share: one local control plane with N fake nodes and the extender beside it.

`kwok_session` brings up a control plane (deploy/local) with `nodes` KWOK nodes, runs the
extender as a subprocess on a free port (as a sidecar would) and always tears both down. Solver
benchmarks need no cluster and do not import this module (STYLE: keep them apart).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.local.cluster import LocalCluster
from deploy.local.components import ControlPlaneOptions, free_port
from extender.kube import RestKube

NS = "default"
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class KwokSession:
    cluster: LocalCluster
    kube: RestKube
    ext_url: str  # the extender's base URL
    state: Path  # the control plane's state; the extender logs to state / "extender.log"
    ext_pid: int = 0  # the extender process (its RSS, CPU time)
    ready_s: float = 0.0  # extender start to /readyz 200


@contextmanager
def kwok_session(
    name: str,
    nodes: int,
    *,
    before_extender: Callable[[RestKube], None] | None = None,
    extender_nice: int = 0,
    extender_config: Path | None = None,
) -> Iterator[KwokSession]:
    """A control plane with `nodes` KWOK nodes and a ready extender; `before_extender` runs first
    (e.g. installs a CRD the extender watches)."""
    state = Path(tempfile.mkdtemp(prefix=f"phalanx-{name}-"))
    cluster = LocalCluster(
        name, state_dir_path=state, options=ControlPlaneOptions(die_with_parent=True, controller_manager=False)
    )
    ext = None
    try:
        cluster.up(nodes=False)
        cluster.create_nodes(nodes)
        kube = RestKube.from_kubeconfig(str(cluster.kubeconfig_path))
        if before_extender is not None:
            before_extender(kube)
        port = free_port()
        started = time.monotonic()
        ext = start_extender(cluster.kubeconfig_path, port, state / "extender.log", extender_nice, extender_config)
        ready = time.monotonic() - started
        yield KwokSession(cluster, kube, f"http://127.0.0.1:{port}", state, ext.pid, ready)
    finally:
        if ext is not None:
            ext.terminate()
            ext.wait(10)
        cluster.down()


def http_json(method: str, url: str, kube: RestKube | None = None) -> Any:
    """One call to the extender's REST API with `kube`'s token (every call is authorised)."""
    headers = {"Authorization": kube.headers["Authorization"]} if kube and "Authorization" in kube.headers else {}
    with urllib.request.urlopen(urllib.request.Request(url, method=method, headers=headers), timeout=10) as r:
        return json.loads(r.read())


def start_extender(
    kubeconfig: Path, port: int, log: Path, nice: int, config: Path | None = None
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    prefix = ["nice", "-n", str(nice)] if nice else []
    proc = subprocess.Popen(
        [
            *prefix,
            *(sys.executable, "-m", "extender", "--kubeconfig", str(kubeconfig), "--port", str(port)),
            *(("--config-file", str(config)) if config is not None else ()),
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"extender did not become ready; see {log}")
