"""The state folder of one local cluster and the ``state.json`` record of a running one.

``state.json`` is what lets a later command (``status``, ``down``, a second ``up``) find the
processes an earlier one started: their pids, binaries, ports and the scheduler's extender. It
is rewritten atomically after each component starts, so a failed ``up`` can still be cleaned up.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
CONTROLLER_MANAGER = "kube-controller-manager"  # optional (ControlPlaneOptions.controller_manager)
"""Start order; they stop in reverse."""


@dataclass(frozen=True)
class StateLayout:
    """Paths inside a cluster's state folder."""

    root: Path

    @property
    def record(self) -> Path:
        return self.root / "state.json"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def ca_file(self) -> Path:
        # kube-apiserver writes its self-signed serving cert (with the CA after it) here.
        return self.pki / "apiserver.crt"

    @property
    def service_account_key(self) -> Path:
        return self.pki / "service-account.key"

    @property
    def token_file(self) -> Path:
        return self.pki / "tokens.csv"

    @property
    def audit_policy(self) -> Path:
        return self.root / "audit-policy.yaml"

    @property
    def audit_log(self) -> Path:
        """kube-apiserver's audit log (JSON lines) when ControlPlaneOptions.audit_users is set."""
        return self.root / "logs" / "audit.log"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def scheduler_kubeconfig(self) -> Path:
        return self.root / "kube-scheduler.kubeconfig"

    @property
    def kwok_kubeconfig(self) -> Path:
        return self.root / "kwok.kubeconfig"

    @property
    def scheduler_config(self) -> Path:
        return self.root / "kube-scheduler.yaml"

    @property
    def kwok_stages(self) -> Path:
        return self.root / "kwok-stages.yaml"

    def log(self, component: str) -> Path:
        return self.root / "logs" / f"{component}.log"


class ComponentRecord(BaseModel):
    """One running component."""

    pid: int
    binary: str
    port: int
    log: str


class ClusterRecord(BaseModel):
    """What ``state.json`` holds about a running cluster."""

    name: str
    components: dict[str, ComponentRecord] = {}
    extender_url: str | None = None
    scheduler_names: tuple[str, ...] = ("default-scheduler",)
    apiserver_url: str = ""


def load_record(layout: StateLayout) -> ClusterRecord | None:
    """Read ``state.json``; None if there is none."""
    if not layout.record.is_file():
        return None
    return ClusterRecord.model_validate_json(layout.record.read_text())


def save_record(layout: StateLayout, record: ClusterRecord) -> None:
    """Write ``state.json`` atomically (write a temporary file, then rename)."""
    layout.root.mkdir(parents=True, exist_ok=True)
    tmp = layout.record.with_suffix(".tmp")
    tmp.write_text(record.model_dump_json(indent=2))
    os.replace(tmp, layout.record)


@contextmanager
def locked(layout: StateLayout) -> Iterator[None]:
    """Hold an exclusive lock on the state folder so two commands never race on it."""
    layout.root.mkdir(parents=True, exist_ok=True)
    with open(layout.lock, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
