"""The shipped Deployment (deploy/kubernetes) as local processes: what kubelet would run.

`install` applies the manifests as an operator would (server-side apply, with the CRDs), and
mints each service account's token the way kubelet does for a pod (TokenRequest, written to a
file a kubeconfig names with `tokenFile`, so both clients re-read it). A `Replica` is one pod:
the kube-scheduler and extender containers' own commands, with the shipped configuration, run
as processes with those tokens; only what a pod has to itself is moved (ports, the bind
journal's emptyDir, and the kubeconfig that stands in for the in-cluster credentials). Kill one,
start it again: a pod restart. Used by the manifest and failover tests and by
`benchmarks/kwok_failover.py`.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from deploy.local import process
from deploy.local.build import locate_binaries
from deploy.local.components import LOOPBACK, free_port
from deploy.local.paths import REPO_ROOT

MANIFESTS = REPO_ROOT / "deploy" / "kubernetes"
CRDS = sorted((REPO_ROOT / "config" / "crds").glob("*.yaml"))
NAMESPACE = "phalanx-system"
PATHS = {
    ("v1", "Namespace"): "/api/v1/namespaces",
    ("v1", "ServiceAccount"): "/api/v1/namespaces/{ns}/serviceaccounts",
    ("v1", "ConfigMap"): "/api/v1/namespaces/{ns}/configmaps",
    ("v1", "Secret"): "/api/v1/namespaces/{ns}/secrets",
    ("v1", "Service"): "/api/v1/namespaces/{ns}/services",
    ("apps/v1", "Deployment"): "/apis/apps/v1/namespaces/{ns}/deployments",
    ("apps/v1", "DaemonSet"): "/apis/apps/v1/namespaces/{ns}/daemonsets",
    ("policy/v1", "PodDisruptionBudget"): "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    ("networking.k8s.io/v1", "NetworkPolicy"): "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    ("rbac.authorization.k8s.io/v1", "Role"): "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): (
        "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"
    ),
    **{
        ("admissionregistration.k8s.io/v1", kind): f"/apis/admissionregistration.k8s.io/v1/{plural}"
        for kind, plural in (
            ("MutatingWebhookConfiguration", "mutatingwebhookconfigurations"),
            ("ValidatingWebhookConfiguration", "validatingwebhookconfigurations"),
            ("ValidatingAdmissionPolicy", "validatingadmissionpolicies"),
            ("ValidatingAdmissionPolicyBinding", "validatingadmissionpolicybindings"),
        )
    },
}


class InstallError(RuntimeError):
    pass


def documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def collection(doc: dict[str, Any]) -> str:
    return PATHS[(doc["apiVersion"], doc["kind"])].format(ns=doc["metadata"].get("namespace", ""))


def apply(kube: Any, doc: dict[str, Any]) -> None:
    """Server-side apply, as `kubectl apply --server-side` does."""
    meta = doc["metadata"]
    r = kube.request(
        "PATCH",
        f"{collection(doc)}/{meta['name']}",
        body=doc,
        query={"fieldManager": "phalanx-operator", "force": "true"},
        content_type="application/apply-patch+yaml",
    )
    if r.status not in (200, 201):
        raise InstallError(f"apply {doc['kind']}/{meta['name']}: {r.status} {r.body}")


def install(kube: Any) -> list[dict[str, Any]]:
    """The CRDs and the manifests, applied; returns the manifests' documents."""
    for path in CRDS:
        crd = yaml.safe_load(path.read_text())
        r = kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd)
        if r.status not in (201, 409):
            raise InstallError(f"CRD {path.name}: {r.status} {r.body}")
    docs = documents()
    for doc in docs:
        apply(kube, doc)
    return docs


def mint(kube: Any, account: str, bound_to: str) -> str:
    """What kubelet does for a pod: a token of `account` (TokenRequest), bound to an object (a
    Secret here, a pod there) whose deletion invalidates it."""
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": bound_to, "namespace": NAMESPACE}}
    r = kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/secrets", body=secret)
    if r.status not in (201, 409):
        raise InstallError(f"secret {bound_to}: {r.status} {r.body}")
    uid = kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/{bound_to}").body["metadata"]["uid"]
    spec = {
        "expirationSeconds": 3600,
        "boundObjectRef": {"apiVersion": "v1", "kind": "Secret", "name": bound_to, "uid": uid},
    }
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    r = kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token", body=body)
    if r.status != 201:
        raise InstallError(f"token of {account}: {r.status} {r.body}")
    return str(r.body["status"]["token"])


def account_kubeconfig(kube: Any, admin_kubeconfig: Path, account: str, folder: Path) -> Path:
    """A kubeconfig naming a token file (`tokenFile`, re-read by both clients, as a projected
    token is), holding a token of `account` bound to the Secret `<account>-1`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{account}.token").write_text(mint(kube, account, f"{account}-1"))
    server = yaml.safe_load(admin_kubeconfig.read_text())["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": server}],
        "users": [{"name": account, "user": {"tokenFile": str(folder / f"{account}.token")}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": account}}],
        "current-context": "c",
    }
    path = folder / f"{account}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@dataclass
class Replica:
    """One pod of the shipped Deployment: its two containers as processes."""

    name: str
    folder: Path
    scheduler_kubeconfig: Path
    extender_kubeconfig: Path
    docs: list[dict[str, Any]]
    # Seconds of kube-scheduler's leaderElection (duration, renew deadline, retry); None: as shipped.
    lease_timing: tuple[float, float, float] | None = None
    port: int = field(default_factory=free_port)
    secure_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    _scheduler: process.Launched | None = None
    _extender: process.Launched | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        config = next(d for d in self.docs if d["metadata"]["name"] == "phalanx-scheduler-config")
        text = config["data"]["scheduler.yaml"].replace("http://127.0.0.1:8888", self.url)
        scheduler_yaml = yaml.safe_load(text)
        scheduler_yaml["clientConnection"] = {"kubeconfig": str(self.scheduler_kubeconfig)}  # in a pod: in-cluster
        if self.lease_timing is not None:
            duration, deadline, retry = self.lease_timing
            scheduler_yaml["leaderElection"].update(
                leaseDuration=f"{duration}s", renewDeadline=f"{deadline}s", retryPeriod=f"{retry}s"
            )
        (self.folder / "scheduler.yaml").write_text(yaml.safe_dump(scheduler_yaml))
        deployment = next(d for d in self.docs if d["kind"] == "Deployment")
        containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
        scheduler_argv = [
            str(locate_binaries().kube_scheduler),
            *[a for a in containers["kube-scheduler"]["command"][1:] if not a.startswith("--config")],
            f"--config={self.folder / 'scheduler.yaml'}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={self.secure_port}",
            f"--authentication-kubeconfig={self.scheduler_kubeconfig}",
            f"--authorization-kubeconfig={self.scheduler_kubeconfig}",
        ]
        # The ports a pod has to itself are shared here: the extender's, and the scheduler's
        # whose /metrics says whether it leads.
        moved = {
            "--port=8888": f"--port={self.port}",
            "--metrics-address=0.0.0.0:9090": f"--metrics-address={LOOPBACK}:{self.metrics_port}",
            "--scheduler-metrics-url=https://127.0.0.1:10259/metrics": (
                f"--scheduler-metrics-url=https://127.0.0.1:{self.secure_port}/metrics"
            ),
            # The pod's emptyDir: this replica's folder, empty at each start as a new pod's is.
            "--bind-journal=/var/lib/phalanx/binds.jsonl": f"--bind-journal={self.folder / 'binds.jsonl'}",
        }
        (self.folder / "binds.jsonl").unlink(missing_ok=True)
        command = containers["phalanx-extender"]["command"][1:]
        if not set(moved) <= set(command):
            raise InstallError(f"the shipped extender command changed: {command}")
        extender_argv = [
            sys.executable,
            *(moved.get(a, a) for a in command),
            "--kubeconfig",
            str(self.extender_kubeconfig),
        ]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        log = self.folder / "extender.log"
        self._extender = process.start(extender_argv, log_path=log, env=env, die_with_parent=True)
        self._scheduler = process.start(scheduler_argv, log_path=self.folder / "scheduler.log", die_with_parent=True)

    def kill(self) -> None:
        """SIGKILL both containers, as a node or pod dying would."""
        for launched, binary in self._launched():
            process.kill(launched.pid, binary, handle=launched.handle)
        self._scheduler = self._extender = None

    def stop(self) -> None:
        for launched, binary in self._launched():
            process.stop(launched.pid, binary, handle=launched.handle)
        self._scheduler = self._extender = None

    def _launched(self) -> list[tuple[process.Launched, Path]]:
        out = []
        if self._scheduler is not None:
            out.append((self._scheduler, locate_binaries().kube_scheduler))
        if self._extender is not None:
            out.append((self._extender, Path(sys.executable)))
        return out

    def ready(self) -> bool:
        return _get(f"{self.url}/readyz") == 200

    def leading(self) -> bool:
        """The extender says it may bind (its `phalanx_leading` gauge)."""
        try:
            with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return False
        return any(line.startswith("phalanx_leading ") and line.split()[1] == "1.0" for line in text.splitlines())


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0
