"""The MPS control daemon the share limits need.

A shared GPU's limits (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`,
agent/ledger.py) are MPS *client* settings: they bind only when the client reaches an MPS
control daemon through the pipe directory its containers mount. The agent starts one daemon per
node (`nvidia-cuda-mps-control -d`, which the NVIDIA container runtime mounts with the `compute`
driver capability), as NVIDIA's device plugin does in its mps-control-daemon, with:

- `CUDA_MPS_PIPE_DIRECTORY` = `/run/phalanx/mps` (mounted into every share container);
- `CUDA_MPS_LOG_DIRECTORY` = `/run/phalanx/mps/log`;
- the agent's `/dev/shm` is the host's `/run/phalanx/mps/shm` (the DaemonSet mounts it there,
  and every share container gets the same mount): client and server share memory through it.

`ensure` starts the daemon when it does not answer (`get_server_list` on its control pipe), and
is called before a share container starts: if MPS cannot run, that container does not start
(its limits would not hold). `stop` asks it to `quit`. The protocol is the control client's
stdin, one command per line, as `nvidia-cuda-mps-control` documents it.

Limits of this design (not verified on hardware): the limits are client settings, so they are
cooperative (a container that unsets them gets the daemon's defaults); the control pipe is in
the directory every share container mounts; the daemon lives in the agent's container, so an
agent restart restarts MPS under running share pods. NVIDIA's device plugin runs MPS in a
container of its own with per-device defaults; moving there is the next step.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import structlog

log = structlog.get_logger("phalanx.agent")

MPS_PIPE_DIRECTORY = "/run/phalanx/mps"
MPS_SHM_DIRECTORY = "/run/phalanx/mps/shm"  # host side; /dev/shm in the containers


class MpsError(RuntimeError):
    """MPS cannot run here; the message says why."""


class MpsControl:
    def __init__(
        self,
        *,
        binary: str = "nvidia-cuda-mps-control",
        pipe_dir: str = MPS_PIPE_DIRECTORY,
        timeout_s: float = 10.0,
    ) -> None:
        self.binary = binary
        self.pipe_dir = Path(pipe_dir)
        self.timeout_s = timeout_s
        self._lock = threading.Lock()

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.pipe_dir / "log"),
        }

    def _control(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary],
            input=command + "\n",
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=self.timeout_s,
            check=False,
        )

    def running(self) -> bool:
        if not (self.pipe_dir / "control").exists():
            return False
        try:
            return self._control("get_server_list").returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def ensure(self) -> None:
        """The daemon is running when this returns; raises `MpsError` otherwise."""
        with self._lock:
            if self.running():
                return
            (self.pipe_dir / "log").mkdir(parents=True, exist_ok=True)
            try:
                started = subprocess.run(
                    [self.binary, "-d"], env=self._env(), capture_output=True, text=True, timeout=self.timeout_s
                )
            except (OSError, subprocess.TimeoutExpired) as e:
                raise MpsError(f"cannot start the MPS control daemon ({self.binary} -d): {e}") from None
            if started.returncode != 0 or not self.running():
                detail = (started.stderr or started.stdout).strip()[-300:]
                raise MpsError(
                    f"the MPS control daemon did not start ({self.binary} -d, rc {started.returncode}): {detail}"
                )
            log.info("MPS control daemon started", pipe_dir=str(self.pipe_dir))

    def stop(self) -> None:
        with self._lock:
            if self.running():
                try:
                    self._control("quit")
                except (OSError, subprocess.TimeoutExpired) as e:
                    log.warning("MPS control daemon did not quit", error=str(e))
