"""CDI spec files: how a container gets exactly the devices Phalanx's record names.

The kubelet's device-plugin API cannot carry the devices themselves: Allocate gets opaque slot
ids and no pod identity (see `agent.deviceplugin`). So Allocate answers with a CDI device name,
`phalanx.io/gpu=<claim>`, where the claim is a short hash of the resource and the container's
sorted slot ids; the kubelet passes the same ids to PreStartContainer, which learns the pod,
resolves its record and writes the spec of that claim here. The container runtime resolves CDI
names when it creates the container, after PreStartContainer returned, so the container gets the
record's devices and nothing else.

One file per claim, `phalanx.io-gpu-<claim>.json` in the CDI spec directory, written atomically
(a temporary file that the CDI registry ignores, renamed over the spec) so the runtime never
reads half a spec. A claim outlives its container (the kubelet may hand the same slots to
another one later, which rewrites the file); `remove_stale` deletes the specs no container holds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from agent.ledger import ContainerEdits

CDI_VERSION = "0.6.0"  # the oldest spec version with every field used here; containerd >= 1.7 reads it
KIND = "phalanx.io/gpu"
DEFAULT_CDI_DIR = Path("/var/run/cdi")
CLAIM_LENGTH = 16  # hex digits of sha1: 64 bits, ample for the few hundred claims of one node

_SPEC_FILE = re.compile(rf"phalanx\.io-gpu-([0-9a-f]{{{CLAIM_LENGTH}}})\.json")


def claim_id(resource: str, device_ids: Iterable[str]) -> str:
    """The claim of the container holding `device_ids` of `resource` (order does not matter)."""
    text = "\n".join([resource, *sorted(device_ids)])
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:CLAIM_LENGTH]


def device_name(claim: str) -> str:
    """The fully qualified CDI device name the runtime resolves."""
    return f"{KIND}={claim}"


def spec_path(cdi_dir: Path, claim: str) -> Path:
    return cdi_dir / f"phalanx.io-gpu-{claim}.json"


def spec(claim: str, edits: ContainerEdits) -> dict[str, Any]:
    """The CDI spec of one claim: its environment (sorted, so equal edits give equal files) and
    bind mounts."""
    mounts = [
        {"hostPath": m.host_path, "containerPath": m.container_path, "options": ["ro" if m.read_only else "rw", "bind"]}
        for m in edits.mounts
    ]
    container_edits: dict[str, Any] = {"env": [f"{k}={v}" for k, v in sorted(edits.env.items())]}
    if mounts:
        container_edits["mounts"] = mounts
    return {"cdiVersion": CDI_VERSION, "kind": KIND, "devices": [{"name": claim, "containerEdits": container_edits}]}


def write_spec(cdi_dir: Path, claim: str, edits: ContainerEdits) -> Path:
    """Write (or replace) the spec of `claim` atomically; returns its path."""
    cdi_dir.mkdir(parents=True, exist_ok=True)
    path = spec_path(cdi_dir, claim)
    fd, tmp = tempfile.mkstemp(dir=cdi_dir, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(spec(claim, edits), f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; runtimes and CDI tools read it as other users too
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def spec_claims(cdi_dir: Path) -> dict[str, Path]:
    """The claims that have a spec file here (other vendors' specs are not ours and not listed)."""
    try:
        entries = list(cdi_dir.iterdir())
    except FileNotFoundError:
        return {}
    found = ((_SPEC_FILE.fullmatch(p.name), p) for p in entries)
    return {m.group(1): p for m, p in found if m}


def remove_stale(cdi_dir: Path, live: Collection[str], *, before: float) -> list[str]:
    """Delete the specs of claims not in `live` last written before `before` (epoch seconds);
    returns the removed claims, sorted.

    `live` comes from a pod-resources List; a spec written after that List began may belong to a
    container the List did not see yet, so the caller passes the List's start as `before`."""
    removed = []
    for claim, path in sorted(spec_claims(cdi_dir).items()):
        if claim in live:
            continue
        try:
            if path.stat().st_mtime >= before:
                continue
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(claim)
    return removed
