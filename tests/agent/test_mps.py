"""The MPS control daemon, driven through its control client's protocol (`-d` starts the daemon,
commands on stdin, one per line) by a stand-in binary that keeps its state in the pipe directory
as the real one does (its `control` pipe). No GPU here: the real daemon is not run."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.backends import FakeBackend
from agent.ledger import Ledger
from agent.mps import MpsControl, MpsError
from agent.node import NodeLoop, PodUnknown

STAND_IN = """#!{python}
import os, sys
pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
calls = os.path.join(pipe, "calls")
with open(calls, "a") as f:
    f.write(" ".join(sys.argv[1:]) or "client")
    f.write("\\n")
control = os.path.join(pipe, "control")
if sys.argv[1:] == ["-d"]:
    if os.environ.get("STAND_IN_BROKEN"):
        print("An instance of this daemon is already running", file=sys.stderr)
        sys.exit(1)
    assert os.path.isdir(os.environ["CUDA_MPS_LOG_DIRECTORY"])
    open(control, "w").close()
    sys.exit(0)
if not os.path.exists(control):
    print("Cannot find MPS control daemon process", file=sys.stderr)
    sys.exit(1)
for line in sys.stdin:
    if line.strip() == "quit":
        os.remove(control)
sys.exit(0)
"""


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    path = tmp_path / "nvidia-cuda-mps-control"
    path.write_text(STAND_IN.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def calls(pipe: Path) -> list[str]:
    return (pipe / "calls").read_text().split("\n")[:-1] if (pipe / "calls").exists() else []


def test_ensure_starts_the_daemon_once_and_stop_quits_it(binary: Path, tmp_path: Path) -> None:
    pipe = tmp_path / "mps"
    pipe.mkdir()
    mps = MpsControl(binary=str(binary), pipe_dir=str(pipe))
    assert not mps.running()
    mps.ensure()
    mps.ensure()  # answers: not started again
    assert calls(pipe).count("-d") == 1 and mps.running()
    mps.stop()
    assert not mps.running()


def test_a_daemon_that_does_not_start_is_an_error_naming_why(
    binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAND_IN_BROKEN", "1")
    mps = MpsControl(binary=str(binary), pipe_dir=str(tmp_path / "mps"))
    with pytest.raises(MpsError, match=r"did not start.*already running"):
        mps.ensure()
    with pytest.raises(MpsError, match="cannot start"):
        MpsControl(binary=str(tmp_path / "absent"), pipe_dir=str(tmp_path / "mps")).ensure()


def node_loop(mps: MpsControl) -> NodeLoop:
    node: dict[str, Any] = {
        "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        "status": {"allocatable": {"nvidia.com/gpu": "1"}},
    }
    loop = NodeLoop(None, "n1", Ledger(FakeBackend.from_node(node)), mps=mps)  # type: ignore[arg-type]
    for name, record in (("share", [{"index": 0, "milli": 500, "memoryMiB": 1024}]),):
        loop._seen(
            {
                "metadata": {
                    "name": name,
                    "namespace": "ns",
                    "uid": name,
                    "annotations": {"phalanx.io/gpu-devices": json.dumps(record)},
                },
                "spec": {"nodeName": "n1"},
                "status": {"phase": "Pending"},
            }
        )
    return loop


def test_a_share_container_starts_only_with_mps_running(binary: Path, tmp_path: Path) -> None:
    pipe = tmp_path / "mps"
    edits = node_loop(MpsControl(binary=str(binary), pipe_dir=str(pipe))).resolve("ns", "share")
    assert edits.mps and (pipe / "control").exists()
    assert {(m.host_path, m.container_path) for m in edits.mounts} == {
        ("/run/phalanx/mps", "/run/phalanx/mps"),
        ("/run/phalanx/mps/shm", "/dev/shm"),
    }
    broken = node_loop(MpsControl(binary=str(tmp_path / "absent"), pipe_dir=str(tmp_path / "other")))
    with pytest.raises(PodUnknown, match="pod ns/share shares a GPU, but cannot start the MPS control daemon"):
        broken.resolve("ns", "share")
