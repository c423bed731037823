"""Start, probe and stop the control-plane processes.

Components run in their own session (process group) so they outlive the ``up`` command and can
be signalled as a group. Pids are recorded in the state folder; before signalling a recorded pid
we check ``/proc/<pid>/cmdline`` still names our binary, so a recycled pid is never killed.
Stopping sends SIGTERM, polls until the process is gone, and sends SIGKILL past a deadline.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_POLL_SECONDS = 0.05
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


@dataclass(frozen=True)
class Launched:
    """A started component: its pid and the live Popen handle (None once reloaded from disk)."""

    pid: int
    handle: subprocess.Popen[bytes] | None


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: ask the kernel for SIGKILL when the parent
    # thread exits, so a test run that is killed outright leaves no control plane behind
    # (SIGKILL, not SIGTERM: kube-apiserver lingers in graceful shutdown once etcd is gone).
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def start(
    argv: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    die_with_parent: bool = False,
) -> Launched:
    """Start ``argv`` detached from our terminal, appending stdout and stderr to ``log_path``.

    ``die_with_parent`` ties the process to the calling thread's life (Linux
    ``PR_SET_PDEATHSIG``); use it from long-lived test sessions, never from a short-lived CLI
    or from a worker thread that exits before the cluster should stop.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        handle = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            preexec_fn=_die_with_parent if die_with_parent else None,
        )
    _await_exec(handle, Path(argv[0]))
    return Launched(pid=handle.pid, handle=handle)


def _await_exec(handle: subprocess.Popen[bytes], binary: Path, timeout: float = 10.0) -> None:
    # Right after Popen returns, /proc/<pid>/cmdline can still be empty (the exec is not quite
    # done); wait for it so that later is_running() checks never see that transient.
    deadline = time.monotonic() + timeout
    while not is_running(handle.pid, binary) and handle.poll() is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{binary} (pid {handle.pid}) did not start within {timeout} s")
        time.sleep(0.01)


def _reap(pid: int) -> None:
    # Our own children stay zombies (and look alive to kill(pid, 0)) until waited for.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def is_running(pid: int, binary: Path) -> bool:
    """Tell whether ``pid`` is alive, not a zombie, and still runs ``binary``."""
    _reap(pid)
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X") and cmdline.split(b"\0", 1)[0] == str(binary).encode()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)


def stop(
    pid: int,
    binary: Path,
    *,
    grace_seconds: float = 15.0,
    handle: subprocess.Popen[bytes] | None = None,
) -> bool:
    """Stop a component: SIGTERM, wait up to ``grace_seconds``, then SIGKILL.

    Returns False if nothing was running under ``pid`` (already gone or a recycled pid).
    """
    if not is_running(pid, binary):
        _wait_handle(handle)
        return False
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while is_running(pid, binary) and time.monotonic() < deadline:
        time.sleep(_POLL_SECONDS)
    if is_running(pid, binary):
        _signal_group(pid, signal.SIGKILL)
        kill_deadline = time.monotonic() + 5.0
        while is_running(pid, binary) and time.monotonic() < kill_deadline:
            time.sleep(_POLL_SECONDS)
    _wait_handle(handle)
    return True


def kill(pid: int, binary: Path, *, handle: subprocess.Popen[bytes] | None = None) -> bool:
    """SIGKILL a component's process group at once, as a crash would (fault tests), and wait
    until it is gone. Returns False if nothing was running under ``pid``."""
    if not is_running(pid, binary):
        _wait_handle(handle)
        return False
    _signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while is_running(pid, binary) and time.monotonic() < deadline:
        time.sleep(_POLL_SECONDS)
    _wait_handle(handle)
    return True


def _wait_handle(handle: subprocess.Popen[bytes] | None) -> None:
    # Collect the exit status so Popen does not warn about a child it never waited for.
    if handle is not None:
        with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
            handle.wait(timeout=5.0)


def log_tail(log_path: Path, lines: int = 25) -> str:
    """Return the last ``lines`` lines of a component log, for error messages."""
    try:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
