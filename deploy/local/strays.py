"""Find control-plane processes of one state folder that ``state.json`` no longer knows about.

A process counts only if it runs one of our cached binaries *and* names this state folder in
its arguments (every component gets a path inside it), so clusters in other state folders and
unrelated processes are never touched. This is the safety net behind ``down``.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from pathlib import Path

from deploy.local.build import Binaries


@dataclass(frozen=True)
class Stray:
    """A leftover component process."""

    pid: int
    binary: Path


def _cmdline(pid_dir: Path) -> list[bytes]:
    try:
        return pid_dir.joinpath("cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def find_strays(state_dir: Path, binaries: Binaries, extra: tuple[Path, ...] = ()) -> list[Stray]:
    """Return processes running one of ``binaries`` (or ``extra``: the workload controllers')
    with ``state_dir`` in their arguments."""
    ours = {str(path).encode(): Path(path) for path in (*astuple(binaries), *extra)}
    marker = str(state_dir).encode() + b"/"
    strays = []
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        argv = _cmdline(pid_dir)
        if argv and argv[0] in ours and any(marker in arg for arg in argv[1:]):
            strays.append(Stray(pid=int(pid_dir.name), binary=ours[argv[0]]))
    return strays
