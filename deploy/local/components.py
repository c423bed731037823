"""Command lines of the control-plane components.

Everything binds to 127.0.0.1 on ports chosen free at start. Choices that matter:

* etcd runs with ``--unsafe-no-fsync``: the cluster is disposable and fsync dominates write
  latency on a busy two-core machine, which would skew scheduler benchmarks.
* kube-apiserver has no controller-manager beside it, so two admission plugins are disabled:
  ServiceAccount (pods would need a ``default`` ServiceAccount per namespace) and
  TaintNodesByCondition (it taints new nodes ``node.kubernetes.io/not-ready:NoSchedule`` and
  only the node-lifecycle controller would remove the taint). The endpoint reconciler is off
  too: it would publish the loopback address as the ``kubernetes`` Service endpoint.
* Workload APIs: ``scheduling.k8s.io/v1beta1`` (Workload, PodGroup; beta in 1.37, off by
  default) is enabled through ``--runtime-config`` and the GenericWorkload gate; see
  :data:`DEFAULT_APISERVER_GATES`. Phalanx also reads the 1.36 ``v1alpha2`` shape of the same
  objects, which 1.37 no longer serves.
* kube-scheduler serves health on its secure port with an in-memory self-signed certificate.
* kwok manages only nodes annotated ``kwok.x-k8s.io/node=fake`` and serves ``/healthz``.
* kube-controller-manager (on by default; :attr:`ControlPlaneOptions.controller_manager`) runs
  the workload controllers (Job, Deployment, ReplicaSet, StatefulSet, DaemonSet), garbage
  collection, disruption budgets' status and the rest, without leader election and with its
  own (admin) credentials. Off: the node-lifecycle controller (KWOK nodes heartbeat on their own
  schedule; its taints and evictions would only add noise), node IPAM (KWOK hands out pod IPs),
  the service-account token and CSR-signing controllers and the root-CA publisher (they need
  keys this cluster keeps to the API server), and taint-based evictions.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from deploy.local.nodes import KWOK_SELECTOR

LOOPBACK = "127.0.0.1"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

DEFAULT_APISERVER_GATES: Mapping[str, bool] = MappingProxyType(
    {
        # Serves scheduling.k8s.io/v1beta1 Workload and PodGroup and Pod.spec.schedulingGroup
        # (beta in 1.37, default off; it carries the gang-scheduling fields since 1.37).
        "GenericWorkload": True,
        # PodGroup topology constraints (alpha since 1.36); without it they are dropped on write.
        "TopologyAwareWorkloadScheduling": True,
    }
)
DEFAULT_SCHEDULER_GATES: Mapping[str, bool] = MappingProxyType(
    {
        # kube-scheduler's own PodGroup handling; Phalanx's extender works with or without it.
        "GenericWorkload": True,
    }
)
DEFAULT_RUNTIME_CONFIG: tuple[str, ...] = ("scheduling.k8s.io/v1beta1=true",)


@dataclass(frozen=True)
class ControlPlaneOptions:
    """Knobs of the control plane that tests or benchmarks may want to change."""

    apiserver_feature_gates: Mapping[str, bool] = field(default_factory=lambda: dict(DEFAULT_APISERVER_GATES))
    scheduler_feature_gates: Mapping[str, bool] = field(default_factory=lambda: dict(DEFAULT_SCHEDULER_GATES))
    runtime_config: tuple[str, ...] = DEFAULT_RUNTIME_CONFIG
    scheduler_verbosity: int = 2
    """klog level of kube-scheduler; 2 logs each binding, which e2e failures need."""
    pod_cidr: str = "10.0.0.0/16"
    """Range KWOK draws fake pod IPs from; kwok's default /24 runs out past 254 pods."""
    die_with_parent: bool = False
    """Components are killed when the thread that started them exits (for test sessions)."""
    audit_users: tuple[str, ...] = ()
    """Users whose every API call kube-apiserver writes to its audit log (Metadata level, JSON
    lines): the RBAC test compares what Phalanx's service accounts called with their rules."""
    controllers: tuple[str, ...] = ()
    """Workload controllers to build and run beside it (deploy/local/controllers.py: jobset)."""
    controller_manager: bool = True
    """Run kube-controller-manager: Jobs, Deployments and StatefulSets make their pods. Off for
    suites and benchmarks that make pods by hand (with owners whose controllers would act on
    them) or measure the scheduler alone."""


@dataclass(frozen=True)
class Ports:
    """The loopback ports of one cluster run."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    scheduler: int
    kwok: int
    controller_manager: int = 0


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def pick_ports() -> Ports:
    """Choose six distinct free ports."""
    chosen: list[int] = []
    while len(chosen) < 6:
        port = free_port()
        if port not in chosen:
            chosen.append(port)
    return Ports(*chosen)


def _gates(gates: Mapping[str, bool]) -> list[str]:
    if not gates:
        return []
    joined = ",".join(f"{name}={str(on).lower()}" for name, on in sorted(gates.items()))
    return [f"--feature-gates={joined}"]


def etcd_argv(binary: Path, *, data_dir: Path, ports: Ports) -> list[str]:
    """Return the etcd command line (single member, plain HTTP on loopback)."""
    client = f"http://{LOOPBACK}:{ports.etcd_client}"
    peer = f"http://{LOOPBACK}:{ports.etcd_peer}"
    return [
        str(binary),
        "--name=phalanx",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=phalanx={peer}",
        "--initial-cluster-state=new",
        "--unsafe-no-fsync",
        "--quota-backend-bytes=8589934592",
        "--log-level=warn",
    ]


@dataclass(frozen=True)
class ApiserverFiles:
    """Files kube-apiserver reads or writes."""

    cert_dir: Path
    service_account_key: Path
    token_file: Path
    audit_policy: Path | None = None
    audit_log: Path | None = None


def apiserver_argv(binary: Path, *, ports: Ports, files: ApiserverFiles, options: ControlPlaneOptions) -> list[str]:
    """Return the kube-apiserver command line."""
    runtime = [f"--runtime-config={','.join(options.runtime_config)}"] if options.runtime_config else []
    audit = []
    if files.audit_policy is not None and files.audit_log is not None:
        audit = [
            f"--audit-policy-file={files.audit_policy}",
            f"--audit-log-path={files.audit_log}",
            "--audit-log-format=json",
            "--audit-log-maxbackup=1",
        ]
    return [
        str(binary),
        f"--etcd-servers=http://{LOOPBACK}:{ports.etcd_client}",
        f"--bind-address={LOOPBACK}",
        f"--advertise-address={LOOPBACK}",
        f"--secure-port={ports.apiserver}",
        f"--cert-dir={files.cert_dir}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={files.service_account_key}",
        f"--service-account-signing-key-file={files.service_account_key}",
        f"--token-auth-file={files.token_file}",
        "--authorization-mode=Node,RBAC",
        "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
        "--endpoint-reconciler-type=none",
        "--service-cluster-ip-range=10.96.0.0/16",
        "--allow-privileged=true",
        "--profiling=false",
        *runtime,
        *audit,
        *_gates(options.apiserver_feature_gates),
    ]


def audit_policy(users: tuple[str, ...]) -> dict[str, object]:
    """An audit Policy recording every call of `users` (who, verb, resource, name, response
    code; no bodies) and nothing else."""
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", "users": list(users)}, {"level": "None"}],
    }


def scheduler_argv(
    binary: Path, *, port: int, config: Path, kubeconfig: Path, options: ControlPlaneOptions
) -> list[str]:
    """Return the kube-scheduler command line (its configuration file names the kubeconfig)."""
    return [
        str(binary),
        f"--config={config}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={port}",
        # /metrics unauthenticated on loopback: benchmarks read the scheduling-cycle breakdown.
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
        f"--v={options.scheduler_verbosity}",
        *_gates(options.scheduler_feature_gates),
    ]


#: Controllers kube-controller-manager does not run here (see the module docstring).
CONTROLLERS_OFF = (
    "node-lifecycle-controller",
    "node-ipam-controller",
    "taint-eviction-controller",
    "device-taint-eviction-controller",
    "serviceaccount-token-controller",
    "certificatesigningrequest-signing-controller",
    "root-ca-certificate-publisher-controller",
)


def controller_manager_argv(binary: Path, *, port: int, kubeconfig: Path) -> list[str]:
    """Return the kube-controller-manager command line (health on its secure port, served with
    an in-memory self-signed certificate, as kube-scheduler's)."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={port}",
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
        "--leader-elect=false",
        "--use-service-account-credentials=false",
        f"--controllers=*,{','.join('-' + c for c in CONTROLLERS_OFF)}",
        "--v=1",
    ]


def kwok_argv(
    binary: Path, *, port: int, kubeconfig: Path, stage_config: Path, options: ControlPlaneOptions
) -> list[str]:
    """Return the kwok controller command line."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--config={stage_config}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_SELECTOR}",
        f"--server-address={LOOPBACK}:{port}",
        f"--cidr={options.pod_cidr}",
    ]
