"""The deploy/kubernetes manifests as shipped: valid objects for the real API server (server-side
dry run), a scheduler configuration kube-scheduler accepts, and, applied as an operator would,
both containers' commands scheduling a gang with their own service accounts' tokens and leader
election on, every call they make allowed and every rule of the extender's roles used."""

from __future__ import annotations

import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.local import replicas
from deploy.local.build import locate_binaries
from deploy.local.cluster import LocalCluster
from deploy.local.replicas import MANIFESTS, PATHS, documents
from deploy.local.scheduler_config import scored_resources
from extender.kube import RestKube
from tests.e2e.test_extender import wait

pytestmark = pytest.mark.e2e


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
    assert [e["urlPrefix"] for e in effective["extenders"]] == ["http://127.0.0.1:8888"] * 3
    assert [e.get("bindVerb", "") for e in effective["extenders"]] == ["", "", "bind"]  # bind apart
    assert [e.get("filterVerb", "") for e in effective["extenders"]] == ["filter", "", ""]
    # prioritize apart, for pods with GPU resources only: the local cluster's list
    assert [e.get("prioritizeVerb", "") for e in effective["extenders"]] == ["", "prioritize", ""]
    scored = [r["name"] for r in effective["extenders"][1]["managedResources"]]
    assert sorted(scored) == sorted(scored_resources())
    assert not effective.get("percentageOfNodesToScore")  # kube-scheduler's adaptive default


def test_the_node_agent_manifest_runs_what_the_agent_parses_with_its_host_paths_and_least_privilege(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No cluster: node-agent/node-agent.yaml's DaemonSet, read as kubelet would run it (the command
    through the agent's own parser), mounts every host path its flags name, and its roles are
    exactly what the agent calls; the extender may make every NodeAgent call the agent reviews."""
    from agent.__main__ import parse
    from agent.auth import GROUP, RESOURCE
    from agent.mps import MPS_PIPE_DIRECTORY, MPS_SHM_DIRECTORY

    docs = [d for d in yaml.safe_load_all((MANIFESTS / "node-agent/node-agent.yaml").read_text()) if d]
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    assert daemonset["metadata"]["namespace"] == "phalanx-system"
    assert spec["serviceAccountName"] == "phalanx-node-agent"
    assert spec["priorityClassName"] == "system-node-critical"
    [container] = spec["containers"]
    extender = next(d for d in documents() if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == next(c["image"] for c in extender if c["name"] == "phalanx-extender")
    assert container["securityContext"]["privileged"] is True
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["NVIDIA_DRIVER_CAPABILITIES"]) == ("all", "compute,utility")
    monkeypatch.setenv("NODE_NAME", "gpu-1")
    assert container["command"][:3] == ["python", "-m", "agent"]
    args = parse(container["command"][3:])
    port = int(args.listen.rsplit(":", 1)[1])
    assert [p["containerPort"] for p in container["ports"]] == [port] == [9444]
    assert container["readinessProbe"]["tcpSocket"]["port"] == container["ports"][0]["name"]
    volumes = {v["name"]: v["hostPath"] for v in spec["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]]["path"] for m in container["volumeMounts"]}
    assert mounts.pop("/dev/shm") == MPS_SHM_DIRECTORY  # the MPS daemon's shared memory
    assert all(path == host for path, host in mounts.items())
    needed = (args.plugin_dir.rstrip("/"), str(Path(args.pod_resources_socket).parent), args.cdi_dir)
    assert set(mounts) == {*needed, MPS_PIPE_DIRECTORY, str(Path(args.state_file).parent)}

    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "phalanx-node-agent")
    assert rule_set(role["rules"]) == {
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods/eviction", "create"),
        ("", "nodes", "get"),
        ("", "nodes", "patch"),
        ("", "events", "create"),
    }
    subject = [{"kind": "ServiceAccount", "name": "phalanx-node-agent", "namespace": "phalanx-system"}]
    bindings = {d["roleRef"]["name"]: d["subjects"] for d in docs if d["kind"] == "ClusterRoleBinding"}
    assert bindings == {"phalanx-node-agent": subject, "system:auth-delegator": subject}
    shipped = documents()
    extender_role = next(
        d for d in shipped if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "phalanx-extender"
    )
    assert {(GROUP, RESOURCE, verb) for verb in ("create", "delete", "get")} <= rule_set(extender_role["rules"])


# ---------------------------------------------------------------- the manifests as shipped

NS_E2E = "manifests-e2e"
EXTENDER_USER = "system:serviceaccount:phalanx-system:phalanx-extender"
SCHEDULER_USER = "system:serviceaccount:phalanx-system:phalanx-scheduler"
#: Rules of the extender's roles this test cannot call, and why they are still needed.
NOT_EXERCISED = {
    ("", "configmaps", "patch"): "POST/DELETE /api/v1/workload-types persist there (test_resource_interfaces)",
    ("scheduling.k8s.io", "podgroups/status", "patch"): "a native PodGroup gang's status (test_gangs)",
    ("", "pods", "get"): "a bind answered 409 reads the pod: was it bound where we wanted already?",
    ("phalanx.io", "queues/status", "patch"): "a Queue's status, written once a Queue exists (test_queues)",
    ("", "pods/eviction", "create"): "gang-aware preemption's evictions (test_queues)",
    ("phalanx.io", "workloads", "patch"): "a job's priority boost put back when it expires (test_allocation_api)",
    # Not calls to the API server: the node agents' SubjectAccessReviews of the extender's
    # NodeAgent calls name this resource (no agent runs here; test_node_agent, tests/agent).
    ("phalanx.io", "nodeagents", "create"): "BindAllocation, reviewed by the node's agent",
    ("phalanx.io", "nodeagents", "delete"): "EvictAllocation, reviewed by the node's agent",
    ("phalanx.io", "nodeagents", "get"): "GetResourceSnapshot and Heartbeat, reviewed by the node's agent",
}
RI_GROUPS = {"kubeflow.org", "jobset.x-k8s.io", "leaderworkerset.x-k8s.io", "serving.kserve.io"}
RI_GROUPS |= {"trainer.kubeflow.org", "ray.io", "apps", "batch"}


def audit(cluster: LocalCluster, user: str) -> list[dict[str, Any]]:
    lines = cluster.layout.audit_log.read_text().splitlines()
    events = [json.loads(line) for line in lines if line.strip()]
    return [e for e in events if e["user"]["username"] == user and "objectRef" in e]


def rule_set(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every resource rule (nonResourceURLs rules are not API calls)."""
    resource_rules = [rule for rule in rules if "resources" in rule]
    return {
        (g, r, v)
        for rule in resource_rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


@pytest.fixture
def shipped(cluster: LocalCluster, tmp_path: Path) -> Iterator[tuple[RestKube, int, Path]]:
    """The manifests applied as an operator would, both containers' commands running as local
    processes with their service accounts' tokens, leader election on. Yields the admin
    client, the extender's port and the folder of the token files."""
    kube = RestKube.from_kubeconfig(str(cluster.kubeconfig_path))
    docs = replicas.install(kube)
    wait("Workloads served", lambda: kube.request("GET", "/apis/phalanx.io/v1alpha1/workloads").status == 200)
    scheduler_kc = replicas.account_kubeconfig(kube, cluster.kubeconfig_path, "phalanx-scheduler", tmp_path)
    extender_kc = replicas.account_kubeconfig(kube, cluster.kubeconfig_path, "phalanx-extender", tmp_path)
    config = next(d for d in docs if d["metadata"]["name"] == "phalanx-scheduler-config")
    assert yaml.safe_load(config["data"]["scheduler.yaml"])["leaderElection"]["leaderElect"] is True
    replica = replicas.Replica("a", tmp_path, scheduler_kc, extender_kc, docs)
    replica.start()
    r = kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NS_E2E}})
    assert r.status in (201, 409), r.body
    try:
        wait("extender ready", replica.ready, 120)
        yield kube, replica.port, tmp_path
    finally:
        replica.stop()
        kube.request("DELETE", f"/api/v1/namespaces/{NS_E2E}/pods", query={"gracePeriodSeconds": "0"})
        for account in ("phalanx-scheduler", "phalanx-extender"):
            for i in (1, 2):
                kube.request("DELETE", f"/api/v1/namespaces/phalanx-system/secrets/{account}-{i}")
        for name in ("scheduler", "extender"):
            log = (tmp_path / f"{name}.log").read_text(errors="replace")
            print(f"--- {name} log (tail)\n" + "\n".join(log.splitlines()[-40:]))


def _get(url: str, method: str = "GET", token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


def test_the_shipped_manifests_schedule_a_gang_with_leader_election_and_least_privilege(
    cluster: LocalCluster, shipped: tuple[RestKube, int, Path]
) -> None:
    kube, port, _ = shipped
    lease = wait(
        "kube-scheduler holds its lease",
        lambda: (
            (
                r := kube.request(
                    "GET", "/apis/coordination.k8s.io/v1/namespaces/phalanx-system/leases/phalanx-scheduler"
                )
            ).status
            == 200
            and r.body["spec"].get("holderIdentity")
        ),
        120,
    )
    assert lease
    # Members first: kube-scheduler finds them unschedulable (no gang yet) and parks them, so
    # the plan must wake them (the pods patch) and nominate their nodes (pods/status).
    for i in range(4):
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"m-{i}", "labels": {"phalanx.io/workload": "shipped"}},
            "spec": {
                "schedulerName": "phalanx",
                "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
            },
        }
        assert kube.request("POST", f"/api/v1/namespaces/{NS_E2E}/pods", body=body).status == 201

    def unschedulable() -> bool:
        items = kube.request("GET", f"/api/v1/namespaces/{NS_E2E}/pods").body["items"]
        conditions = [c for p in items for c in p.get("status", {}).get("conditions", [])]
        return sum(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions) == 4

    wait("4 members parked", unschedulable, 120)
    workload = {
        "apiVersion": "phalanx.io/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": "shipped", "namespace": NS_E2E},
        "spec": {
            "gangGroups": [
                {
                    "name": "workers",
                    "minCount": 4,
                    "topologyRequest": {"required": "topology.phalanx.io/rack"},
                    "rankedGroups": [{"name": "all", "eqGroups": [{"name": "w", "count": 4}]}],
                }
            ]
        },
    }
    r = kube.request("POST", f"/apis/phalanx.io/v1alpha1/namespaces/{NS_E2E}/workloads", body=workload)
    assert r.status == 201, r.body

    def placed() -> list[str]:
        items = kube.request("GET", f"/api/v1/namespaces/{NS_E2E}/pods").body["items"]
        nodes = [p["spec"].get("nodeName") for p in items]
        return [n for n in nodes if n] if all(nodes) and len(nodes) == 4 else []

    nodes = wait("the gang bound", placed, 120)
    labels = [kube.request("GET", f"/api/v1/nodes/{n}").body["metadata"]["labels"] for n in nodes]
    racks = {node_labels["topology.phalanx.io/rack"] for node_labels in labels}
    assert len(racks) == 1
    wait(
        "Workload status written",
        lambda: (
            kube.request("GET", f"/apis/phalanx.io/v1alpha1/namespaces/{NS_E2E}/workloads/shipped")
            .body.get("status", {})
            .get("phase")
            == "Scheduled"
        ),
    )
    # The REST API: a write without a token is refused; an operator's (the admin's) is reviewed.
    url = f"http://127.0.0.1:{port}/api/v1/stats"
    assert _get(url, "DELETE")[0] == 401
    admin_token = yaml.safe_load(cluster.kubeconfig_path.read_text())["users"][0]["user"]["token"]
    assert _get(url, "DELETE", admin_token)[0] == 200

    # Least privilege: no call of either account was refused, and every rule of the extender's
    # roles was called (or is listed above with the reason this test cannot call it).
    def refused(user: str) -> list[str]:
        events = audit(cluster, user)
        return [f"{e['verb']} {e['requestURI']}" for e in events if e.get("responseStatus", {}).get("code") == 403]

    wait("audit events of the extender", lambda: audit(cluster, EXTENDER_USER))
    assert refused(SCHEDULER_USER) == []
    assert refused(EXTENDER_USER) == []
    called = set()
    for e in audit(cluster, EXTENDER_USER):
        ref = e["objectRef"]
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        called.add((ref.get("apiGroup", ""), resource, e["verb"]))
    docs = documents()
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "phalanx-extender")
    config_role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "phalanx-config-reader")
    granted = rule_set(role["rules"]) | rule_set(config_role["rules"])
    # Resource Interface kinds are watched once their CRDs exist (test_resource_interfaces).
    granted = {g for g in granted if g[0] not in RI_GROUPS}
    unused = sorted(g for g in granted - called if g not in NOT_EXERCISED)
    assert unused == [], f"rules nothing called: {unused}; calls: {sorted(called)}"
    reviews = {
        ("authentication.k8s.io", "tokenreviews", "create"),
        ("authorization.k8s.io", "subjectaccessreviews", "create"),
    }
    assert reviews <= called


def test_a_rotated_token_is_picked_up_and_the_old_one_is_never_needed_again(
    cluster: LocalCluster, shipped: tuple[RestKube, int, Path]
) -> None:
    """kubelet rewrites a projected token file before the old token expires; the extender must
    carry on with the new one (binds, watches) once the old one is refused."""
    kube, _, folder = shipped
    old = (folder / "phalanx-extender.token").read_text()
    (folder / "phalanx-extender.token").write_text(replicas.mint(kube, "phalanx-extender", "phalanx-extender-2"))
    r = kube.request("DELETE", "/api/v1/namespaces/phalanx-system/secrets/phalanx-extender-1")
    assert r.status == 200, r.body
    # The first token is refused from now on (once kube-apiserver's 10 s cache of good tokens
    # has forgotten it).
    server = yaml.safe_load(cluster.kubeconfig_path.read_text())["clusters"][0]["cluster"]["server"]
    context = ssl.create_default_context(cafile=str(cluster.layout.ca_file))

    def refused() -> bool:
        request = urllib.request.Request(f"{server}/api/v1/namespaces/{NS_E2E}/pods")
        request.add_header("Authorization", f"Bearer {old}")
        try:
            urllib.request.urlopen(request, timeout=10, context=context).close()
        except urllib.error.HTTPError as e:
            return e.code == 401
        return False

    wait("the old token refused", refused, 60)
    invalidated = time.time()
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "after-rotation"},
        "spec": {"schedulerName": "phalanx", "containers": [{"name": "c", "image": "x"}]},
    }
    assert kube.request("POST", f"/api/v1/namespaces/{NS_E2E}/pods", body=body).status == 201
    path = f"/api/v1/namespaces/{NS_E2E}/pods/after-rotation"
    wait("the pod bound by the extender", lambda: kube.request("GET", path).body["spec"].get("nodeName"), 60)
    assert time.time() - invalidated < 60

    # The old token was refused once (the bind's first try), the file read again, and the bind
    # sent once more: the extender's log says so.
    log = [json.loads(line) for line in (folder / "extender.log").read_text().splitlines() if line.startswith("{")]
    assert [e for e in log if e["event"] == "credentials re-read: the token changed" and e["after_401"]]
