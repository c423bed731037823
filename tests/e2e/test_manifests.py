"""The deploy/kubernetes manifests are valid objects for the real API server (server-side dry
run), and the scheduler configuration they carry is one kube-scheduler accepts."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.local.build import locate_binaries
from deploy.local.cluster import LocalCluster
from extender.kube import RestKube

pytestmark = pytest.mark.e2e

MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
PATHS = {
    ("v1", "Namespace"): "/api/v1/namespaces",
    ("v1", "ServiceAccount"): "/api/v1/namespaces/{ns}/serviceaccounts",
    ("v1", "ConfigMap"): "/api/v1/namespaces/{ns}/configmaps",
    ("apps/v1", "Deployment"): "/apis/apps/v1/namespaces/{ns}/deployments",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    ("rbac.authorization.k8s.io/v1", "Role"): "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
}


def documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def test_every_manifest_passes_a_server_side_dry_run(cluster: LocalCluster) -> None:
    kube = RestKube.from_kubeconfig(str(cluster.kubeconfig_path))
    kube.request(
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "phalanx-system"}},
    )
    for doc in documents():
        path = PATHS[(doc["apiVersion"], doc["kind"])].format(ns=doc["metadata"].get("namespace", ""))
        r = kube.request("POST", path, body=doc, query={"dryRun": "All"})
        assert r.status in (200, 201, 409), f"{doc['kind']}/{doc['metadata']['name']}: {r.status} {r.body}"


def test_the_shipped_scheduler_configuration_is_accepted_by_kube_scheduler(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    config = next(d for d in documents() if d["metadata"]["name"] == "phalanx-scheduler-config")
    scheduler_yaml = yaml.safe_load(config["data"]["scheduler.yaml"])
    scheduler_yaml["clientConnection"] = {"kubeconfig": str(cluster.kubeconfig_path)}
    scheduler_yaml["leaderElection"] = {"leaderElect": False}
    path = tmp_path / "scheduler.yaml"
    path.write_text(yaml.safe_dump(scheduler_yaml))
    binary = locate_binaries().kube_scheduler
    # --write-config-to validates and writes the effective configuration, then exits.
    result = subprocess.run(
        [str(binary), f"--config={path}", f"--write-config-to={tmp_path / 'effective.yaml'}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    effective = yaml.safe_load((tmp_path / "effective.yaml").read_text())
    assert effective["extenders"][0]["urlPrefix"] == "http://127.0.0.1:8888"
    assert effective["percentageOfNodesToScore"] == 100
