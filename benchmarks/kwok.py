"""What the KWOK benchmarks share: one local control plane with N fake nodes and the extender beside it.

`kwok_session` brings up a control plane (deploy/local) with `nodes` KWOK nodes, runs the
extender as a subprocess on a free port (as a sidecar would) and always tears both down. Solver
benchmarks need no cluster and do not import this module (STYLE: keep them apart).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.local.cluster import LocalCluster
from deploy.local.components import ControlPlaneOptions, free_port
from extender.kube import RestKube

NS = "default"
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class KwokSession:
    cluster: LocalCluster
    kube: RestKube
    ext_url: str  # the extender's base URL
    state: Path  # the control plane's state; the extender logs to state / "extender.log"
    ext_pid: int = 0  # the extender process now (its RSS, CPU time); 0 while stopped
    ready_s: float = 0.0  # extender start to /readyz 200 (the first start)
    _start: Callable[[], subprocess.Popen[bytes]] | None = field(default=None, repr=False)
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def stop_extender(self) -> None:
        """End the extender (a baseline round runs without it: its watches cost CPU)."""
        if self._proc is not None:
            _end(self._proc)
            self._proc, self.ext_pid = None, 0

    def start_extender(self) -> float:
        """A fresh extender at the same URL, once stopped; seconds until it was ready."""
        if self._proc is not None or self._start is None:
            return 0.0
        started = time.monotonic()
        self._proc = self._start()
        self.ext_pid = self._proc.pid
        return time.monotonic() - started


def _end(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@contextmanager
def kwok_session(
    name: str,
    nodes: int,
    *,
    before_extender: Callable[[RestKube], None] | None = None,
    extender_nice: int = 0,
    extender_config: Path | None = None,
    extender_module: str = "extender",
) -> Iterator[KwokSession]:
    """A control plane with `nodes` KWOK nodes and a ready extender; `before_extender` runs first
    (e.g. installs a CRD the extender watches)."""
    state = Path(tempfile.mkdtemp(prefix=f"phalanx-{name}-"))
    cluster = LocalCluster(
        name, state_dir_path=state, options=ControlPlaneOptions(die_with_parent=True, controller_manager=False)
    )
    session = None
    try:
        cluster.up(nodes=False)
        cluster.create_nodes(nodes)
        kube = RestKube.from_kubeconfig(str(cluster.kubeconfig_path))
        if before_extender is not None:
            before_extender(kube)
        port = free_port()
        starts = itertools.count()

        def start() -> subprocess.Popen[bytes]:
            n = next(starts)
            log = state / ("extender.log" if n == 0 else f"extender.{n}.log")
            return start_extender(cluster.kubeconfig_path, port, log, extender_nice, extender_config, extender_module)

        session = KwokSession(cluster, kube, f"http://127.0.0.1:{port}", state, _start=start)
        session.ready_s = session.start_extender()
        yield session
    finally:
        if session is not None:
            session.stop_extender()
        cluster.down()


def http_json(method: str, url: str, kube: RestKube | None = None) -> Any:
    """One call to the extender's REST API with `kube`'s token (every call is authorised)."""
    headers = {"Authorization": kube.headers["Authorization"]} if kube and "Authorization" in kube.headers else {}
    with urllib.request.urlopen(urllib.request.Request(url, method=method, headers=headers), timeout=10) as r:
        return json.loads(r.read())


def start_extender(
    kubeconfig: Path, port: int, log: Path, nice: int, config: Path | None = None, module: str = "extender"
) -> subprocess.Popen[bytes]:
    """The extender (or `module`, run as `python -m module` with the extender's arguments, e.g.
    benchmarks.noop_extender) on `port`, once its /readyz answers 200."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    prefix = ["nice", "-n", str(nice)] if nice else []
    proc = subprocess.Popen(
        [
            *prefix,
            *(sys.executable, "-m", module, "--kubeconfig", str(kubeconfig), "--port", str(port)),
            *(("--config-file", str(config)) if config is not None else ()),
            # Binds answered once checked, journalled beside the log (extender/landing.py), as
            # the chart runs it; the floor (benchmarks/noop_extender.py) answers them alike.
            "--bind-journal",
            str(log.with_suffix(".binds")),
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
