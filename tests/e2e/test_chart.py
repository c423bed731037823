"""The Helm chart charts/phalanx: `helm lint --strict` and `helm template` with helm itself (built
from the Go module proxy, deploy/local/build.py), the rendered objects (defaults and
ci/ha-values.yaml), its CRDs and RBAC equal to config/crds and deploy/kubernetes so the two never
drift, a server-side dry run of every rendered object against the real local API server, the
scheduler configuration accepted by kube-scheduler, and a real install, upgrade and uninstall."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.local import replicas
from deploy.local.build import ensure_helm, locate_binaries
from deploy.local.cluster import LocalCluster
from deploy.local.replicas import PATHS
from deploy.local.scheduler_config import scored_resources
from extender.kube import RestKube
from tests.e2e.test_extender import wait

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "phalanx"
HA_VALUES = CHART / "ci" / "ha-values.yaml"
MANIFESTS = ROOT / "deploy" / "kubernetes"
CONFIG_CRDS = ROOT / "config" / "crds"
NAMESPACE = "phalanx-system"
HA_NAMESPACE = "phalanx-ha"  # ci/ha-values.yaml is rendered into another namespace
HA_LEASE = "phalanx-ha"
AGENT_MANIFEST = MANIFESTS / "node-agent/node-agent.yaml"
# the node agent's DaemonSet, off by default (its share-slot webhook needs policies.enabled)
AGENT = ("--set", "nodeAgent.enabled=true", "--set", "nodeAgent.shareResource=false")

Doc = dict[str, Any]
RBAC = "rbac.authorization.k8s.io/v1"


@dataclass(frozen=True)
class Helm:
    """The pinned helm binary with its own empty home folders (nothing of the user's is read)."""

    binary: Path
    env: dict[str, str]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.binary), *args], capture_output=True, text=True, env=self.env, timeout=300)

    def __call__(self, *args: str) -> str:
        result = self.run(*args)
        assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
        return result.stdout + result.stderr


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """helm, built on first use (about a minute and a half cold; cached after)."""
    if shutil.which("go") is None:
        pytest.skip("the Go toolchain is needed to build helm")
    binary = ensure_helm(lambda message: print(message, flush=True))
    home = tmp_path_factory.mktemp("helm-home")
    env = {**os.environ, **{f"HELM_{k}_HOME": str(home / k.lower()) for k in ("CACHE", "CONFIG", "DATA")}}
    return Helm(binary, env)


def render(helm: Helm, *args: str, namespace: str = NAMESPACE) -> list[Doc]:
    out = helm("template", "phalanx", str(CHART), "--namespace", namespace, *args)
    return [d for d in yaml.safe_load_all(out) if d]


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def manifests() -> list[Doc]:
    """deploy/kubernetes: the top-level files, and the node agent's (opt-in, in its own folder)."""
    docs: list[Doc] = []
    for path in [*sorted(MANIFESTS.glob("*.yaml")), AGENT_MANIFEST]:
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def agent_docs() -> list[Doc]:
    """The node agent's objects of deploy/kubernetes (node-agent/node-agent.yaml)."""
    return [d for d in yaml.safe_load_all(AGENT_MANIFEST.read_text()) if d]


def is_agents(doc: Doc) -> bool:
    return any(d["kind"] == doc["kind"] and d["metadata"]["name"] == doc["metadata"]["name"] for d in agent_docs())


def pod_spec(docs: list[Doc]) -> Doc:
    spec: Doc = one(docs, "Deployment", "phalanx-scheduler")["spec"]["template"]["spec"]
    return spec


def containers(docs: list[Doc]) -> dict[str, Doc]:
    return {c["name"]: c for c in pod_spec(docs)["containers"]}


def scheduler_config(docs: list[Doc]) -> Doc:
    config: Doc = yaml.safe_load(one(docs, "ConfigMap", "phalanx-scheduler-config")["data"]["scheduler.yaml"])
    return config


def rules(docs: list[Doc], kind: str, name: str) -> list[Doc]:
    found: list[Doc] = one(docs, kind, name)["rules"]
    return found


# ---------------------------------------------------------------- helm lint, the chart's files


def test_helm_lint_passes_strict_with_the_defaults_and_the_ha_values(helm: Helm) -> None:
    for extra in ((), ("--values", str(HA_VALUES)), AGENT, ("--values", str(HA_VALUES), *AGENT)):
        out = helm("lint", "--strict", str(CHART), *extra)
        assert "1 chart(s) linted, 0 chart(s) failed" in out, out
        assert "[WARNING]" not in out and "[ERROR]" not in out, out


def test_the_chart_crds_are_the_config_crds() -> None:
    chart_crds = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    config_crds = {p.name: p.read_bytes() for p in CONFIG_CRDS.glob("*.yaml")}
    assert sorted(chart_crds) == sorted(config_crds), "charts/phalanx/crds/ must hold a copy of each config/crds file"
    for name, text in config_crds.items():
        assert chart_crds[name] == text, f"charts/phalanx/crds/{name} differs from config/crds/{name}: copy it again"


def test_values_the_schema_does_not_allow_are_refused(helm: Helm) -> None:
    bad_values: tuple[str, ...] = (
        "replica=2",
        "podAntiAffinity=sometimes",
        "extender.port=10259",
        "image.digest=latest",
    )
    bad_values += ("nodeAgent.enabled=yes", "nodeAgent.gpuSlots=0", "nodeAgent.port=0", "nodeAgent.image.digest=v1")
    bad_values += ("solverService.port=0", "solverService.deadlineSeconds=-1", "solverService.remote=yes")
    for bad in bad_values:
        result = helm.run("template", "phalanx", str(CHART), "--set", bad)
        assert result.returncode != 0, f"--set {bad} was accepted"
        assert "values don't meet the specifications of the schema" in result.stderr, result.stderr


# ---------------------------------------------------------------- what helm template renders


def test_one_replica_has_no_budget_and_no_spread(helm: Helm) -> None:
    docs = render(helm, "--set", "replicas=1")
    assert not [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert "affinity" not in pod_spec(docs)
    assert one(docs, "Deployment", "phalanx-scheduler")["spec"]["replicas"] == 1


def test_monitoring_objects_render_when_enabled(helm: Helm) -> None:
    from deploy import monitoring

    plain = render(helm)
    service = one(plain, "Service", "phalanx-metrics")
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics"}]
    assert "--metrics-address=0.0.0.0:9090" in containers(plain)["phalanx-extender"]["command"]
    assert not [d for d in plain if d["kind"] in ("ServiceMonitor", "PrometheusRule")]
    enabled = ("metrics.serviceMonitor.enabled", "metrics.prometheusRule.enabled", "metrics.dashboard.enabled")
    docs = render(helm, *[arg for key in enabled for arg in ("--set", f"{key}=true")])
    assert one(docs, "ServiceMonitor", "phalanx")["spec"]["endpoints"] == [{"port": "metrics", "interval": "30s"}]
    rules = one(docs, "PrometheusRule", "phalanx")["spec"]["groups"][0]["rules"]
    assert [r["alert"] for r in rules] == [a.name for a in monitoring.ALERTS]
    board = one(docs, "ConfigMap", "phalanx-grafana-dashboard")
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(board["data"]["phalanx.json"]) == monitoring.dashboard()


def test_the_defaults_render_two_replicas_as_a_second_scheduler_hardened(helm: Helm) -> None:
    docs = render(helm)
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
    assert ("PodDisruptionBudget", "phalanx-scheduler") in kinds  # two replicas: a budget
    assert not any(d["kind"] in ("Namespace", "CustomResourceDefinition") for d in docs)  # --namespace, crds/
    # The node agent replaces NVIDIA's device plugin where it runs: off unless asked for.
    assert not [d for d in docs if d["kind"] == "DaemonSet" or is_agents(d)]
    assert {"apiGroups": ["phalanx.io"], "resources": ["nodeagents"], "verbs": ["create", "delete", "get"]} in rules(
        docs, "ClusterRole", "phalanx-extender"
    )  # the agents' SubjectAccessReviews of the extender's calls: granted whether agents run or not
    for doc in docs:
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding") and doc["metadata"]["name"] != (
            "phalanx-scheduler-extension-apiserver-authentication-reader"
        ):
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["metadata"]
        assert doc["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"

    deployment = one(docs, "Deployment", "phalanx-scheduler")
    assert deployment["spec"]["replicas"] == 2
    spec = pod_spec(docs)
    assert spec["affinity"]["podAntiAffinity"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in spec["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False, container["name"]
        assert context["readOnlyRootFilesystem"] is True, container["name"]
        assert context["capabilities"]["drop"] == ["ALL"], container["name"]
        assert container["resources"]["requests"], container["name"]
    by_name = containers(docs)
    assert by_name["kube-scheduler"]["image"] == "registry.k8s.io/kube-scheduler:v1.37.2"
    assert by_name["phalanx-extender"]["image"] == "phalanx-extender:latest"
    assert "imagePullPolicy" not in by_name["phalanx-extender"]
    command = by_name["phalanx-extender"]["command"]
    assert "--host=127.0.0.1" in command
    assert f"--config-namespace={NAMESPACE}" in command
    assert f"--follow-scheduler-lease={NAMESPACE}/phalanx-scheduler" in command

    config = scheduler_config(docs)
    assert config["leaderElection"] == {
        "leaderElect": True,
        "resourceNamespace": NAMESPACE,
        "resourceName": "phalanx-scheduler",
    }
    assert [p["schedulerName"] for p in config["profiles"]] == ["phalanx"]
    assert [e["urlPrefix"] for e in config["extenders"]] == ["http://127.0.0.1:8888"] * 3
    assert [bool(e.get("bindVerb")) for e in config["extenders"]] == [False, False, True]  # bind apart
    # prioritize apart, for pods with GPU resources only: the local cluster's list
    scored = [r["name"] for r in config["extenders"][1]["managedResources"]]
    assert config["extenders"][1]["prioritizeVerb"] == "prioritize" and sorted(scored) == sorted(scored_resources())

    policy = one(docs, "NetworkPolicy", "phalanx-scheduler")
    assert policy["spec"]["podSelector"] == {"matchLabels": {"app": "phalanx-scheduler"}}
    assert policy["spec"]["policyTypes"] == ["Ingress"] and policy["spec"]["ingress"] == []  # nothing admitted

    phalanx_config = yaml.safe_load(one(docs, "ConfigMap", "phalanx-config")["data"]["config.yaml"])
    assert phalanx_config["solver"]["timeLimitSeconds"] == 1.0
    assert phalanx_config["topology"]["levels"][-1] == "kubernetes.io/hostname"


def test_the_ha_values_render_two_spread_replicas_with_a_budget_in_place_of_the_default_scheduler(
    helm: Helm,
) -> None:
    docs = render(helm, "--values", str(HA_VALUES), namespace=HA_NAMESPACE)
    assert one(docs, "Deployment", "phalanx-scheduler")["spec"]["replicas"] == 2
    budget = one(docs, "PodDisruptionBudget", "phalanx-scheduler")
    assert budget["metadata"]["namespace"] == HA_NAMESPACE
    assert budget["spec"] == {"minAvailable": 1, "selector": {"matchLabels": {"app": "phalanx-scheduler"}}}
    pod_labels = one(docs, "Deployment", "phalanx-scheduler")["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["app"] == "phalanx-scheduler"

    spec = pod_spec(docs)
    preferred = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred == [
        {
            "weight": 100,
            "podAffinityTerm": {
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"app": "phalanx-scheduler"}},
            },
        }
    ]
    assert spec["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}
    assert spec["tolerations"][0]["key"] == "node-role.kubernetes.io/control-plane"
    extender = containers(docs)["phalanx-extender"]
    digest = "sha256:" + "0123456789abcdef" * 4
    assert extender["image"] == f"registry.example.com/phalanx/phalanx-extender@{digest}"
    assert extender["imagePullPolicy"] == "IfNotPresent"
    assert f"--follow-scheduler-lease={HA_NAMESPACE}/{HA_LEASE}" in extender["command"]
    assert f"--config-namespace={HA_NAMESPACE}" in extender["command"]

    config = scheduler_config(docs)
    assert [p["schedulerName"] for p in config["profiles"]] == ["default-scheduler"]
    assert config["leaderElection"]["resourceNamespace"] == HA_NAMESPACE
    assert config["leaderElection"]["resourceName"] == HA_LEASE

    # The lease: kube-scheduler may create leases and get/update this one; the extender reads it.
    lease = one(docs, "Role", "phalanx-scheduler-lease")
    assert lease["metadata"]["namespace"] == HA_NAMESPACE
    assert lease["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [HA_LEASE],
            "verbs": ["get", "update"],
        },
    ]
    extender_lease = [r for r in rules(docs, "Role", "phalanx-config-reader") if r["resources"] == ["leases"]]
    assert extender_lease == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [HA_LEASE], "verbs": ["get"]}
    ]
    for doc in docs:
        for subject in doc.get("subjects", []):
            assert subject["namespace"] == HA_NAMESPACE, doc["metadata"]["name"]

    policy = one(docs, "NetworkPolicy", "phalanx-scheduler")
    assert policy["spec"]["ingress"] == [
        {
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
            "ports": [{"protocol": "TCP", "port": 10259}, {"protocol": "TCP", "port": 9090}],
        },
        {"ports": [{"protocol": "TCP", "port": 9443}]},  # policies.enabled: the API server calls the webhooks
    ]
    assert f"--webhook-service={HA_NAMESPACE}/phalanx-webhook:443" in extender["command"]
    assert one(docs, "Service", "phalanx-webhook")["metadata"]["namespace"] == HA_NAMESPACE


def test_the_solver_service_runs_beside_the_extender_on_loopback_when_enabled(helm: Helm) -> None:
    assert "phalanx-solver" not in containers(render(helm))
    docs = render(helm, "--set", "solverService.enabled=true", "--set", "solverService.deadlineSeconds=4.5")
    solver = containers(docs)["phalanx-solver"]
    assert solver["command"] == ["python", "-m", "solverd", "--address=127.0.0.1:50551"]
    probe = ["python", "-m", "solverd", "--probe=127.0.0.1:50551"]
    assert solver["readinessProbe"]["exec"]["command"] == solver["livenessProbe"]["exec"]["command"] == probe
    assert "volumeMounts" not in solver  # no token: it reads nothing from the API server
    assert solver["securityContext"] == containers(docs)["phalanx-extender"]["securityContext"]
    args = containers(docs)["phalanx-extender"]["command"]
    assert "--solver-address=127.0.0.1:50551" in args and "--solver-deadline=4.5" in args


def test_the_api_port_is_served_over_tls_behind_its_service_when_enabled(helm: Helm) -> None:
    assert not [d for d in render(helm) if d["kind"] == "Service" and d["metadata"]["name"] == "phalanx-api"]
    docs = render(helm, "--set", "apiServer.enabled=true", "--set", "networkPolicy.enabled=true")
    extender = containers(docs)["phalanx-extender"]
    for flag in (
        "--api-address=0.0.0.0:8443",
        "--api-tls-cert-file=/etc/phalanx/api-tls/tls.crt",
        "--api-tls-private-key-file=/etc/phalanx/api-tls/tls.key",
    ):
        assert flag in extender["command"]
    assert "--host=127.0.0.1" in extender["command"]  # the verbs stay on loopback
    assert {"name": "api", "containerPort": 8443} in extender["ports"]
    assert {"name": "api-tls", "mountPath": "/etc/phalanx/api-tls", "readOnly": True} in extender["volumeMounts"]
    service = one(docs, "Service", "phalanx-api")
    assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "api", "protocol": "TCP"}]
    assert service["spec"]["sessionAffinity"] == "ClientIP"  # a paged list, a drain's progress: per replica
    policy = one(docs, "NetworkPolicy", "phalanx-scheduler")
    assert {"ports": [{"protocol": "TCP", "port": 8443}]} in policy["spec"]["ingress"]


def test_extra_watched_kinds_are_read_only(helm: Helm) -> None:
    watched = ("--set", "extender.watchedResources[0].apiGroups={example.com}")
    watched += ("--set", "extender.watchedResources[0].resources={myjobs}")
    default, extended = (
        rules(render(helm), "ClusterRole", "phalanx-extender"),
        rules(render(helm, *watched), "ClusterRole", "phalanx-extender"),
    )
    added = [r for r in extended if r not in default]
    assert added == [{"apiGroups": ["example.com"], "resources": ["myjobs"], "verbs": ["list", "watch"]}]
    assert len(extended) == len(default) + 1


def agent_container(docs: list[Doc]) -> Doc:
    containers: list[Doc] = one(docs, "DaemonSet", "phalanx-node-agent")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def test_the_node_agent_renders_a_privileged_daemonset_its_flags_what_the_agent_parses(
    helm: Helm, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.__main__ import parse
    from agent.mps import MPS_PIPE_DIRECTORY, MPS_SHM_DIRECTORY

    monkeypatch.setenv("NODE_NAME", "gpu-1")  # what the fieldRef gives the pod
    monkeypatch.delenv("POD_IP", raising=False)
    docs = render(helm, *AGENT)
    daemonset = one(docs, "DaemonSet", "phalanx-node-agent")
    spec = daemonset["spec"]["template"]["spec"]
    assert daemonset["spec"]["selector"] == {"matchLabels": {"app": "phalanx-node-agent"}}
    assert spec["serviceAccountName"] == "phalanx-node-agent"
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert "runtimeClassName" not in spec and "hostNetwork" not in spec
    container = agent_container(docs)
    assert container["image"] == "phalanx-extender:latest"  # the extender's image
    assert container["securityContext"]["privileged"] is True
    assert container["securityContext"]["runAsUser"] == 0
    assert container["command"][:3] == ["python", "-m", "agent"]
    args = parse(container["command"][3:])
    assert (args.node, args.backend, args.listen) == ("gpu-1", "auto", "0.0.0.0:9444")
    assert (args.gpu_slots, args.evict_unhealthy, args.device_plugins) == (1, True, True)
    assert args.dynamic_mig_label == "phalanx.io/mig-mode=dynamic"
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env == {
        "NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},
        "POD_IP": {"fieldRef": {"fieldPath": "status.podIP"}},
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    }
    assert container["ports"] == [{"name": "grpc", "containerPort": 9444, "protocol": "TCP"}]
    assert container["readinessProbe"]["tcpSocket"] == {"port": "grpc"}
    # Every host path the flags name is mounted at the same path, from the host.
    volumes = {v["name"]: v["hostPath"] for v in spec["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    assert mounts.pop("/dev/shm")["path"] == MPS_SHM_DIRECTORY  # the MPS daemon's shared memory
    assert all(path == host["path"] for path, host in mounts.items())
    needed = (args.plugin_dir.rstrip("/"), str(Path(args.pod_resources_socket).parent), args.cdi_dir)
    assert set(mounts) == {*needed, MPS_PIPE_DIRECTORY, str(Path(args.state_file).parent)}
    assert mounts[args.cdi_dir]["type"] == mounts[MPS_PIPE_DIRECTORY]["type"] == "DirectoryOrCreate"

    assert rules(docs, "ClusterRole", "phalanx-node-agent") == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]
    agent = [{"kind": "ServiceAccount", "name": "phalanx-node-agent", "namespace": NAMESPACE}]
    for binding, role in (
        ("phalanx-node-agent", "phalanx-node-agent"),
        ("phalanx-node-agent-auth-delegator", "system:auth-delegator"),
    ):
        doc = one(docs, "ClusterRoleBinding", binding)
        assert (doc["roleRef"]["name"], doc["subjects"]) == (role, agent)

    policy = one(docs, "NetworkPolicy", "phalanx-node-agent")["spec"]
    assert policy == {
        "podSelector": {"matchLabels": {"app": "phalanx-node-agent"}},
        "policyTypes": ["Ingress"],
        "ingress": [
            {
                "from": [{"podSelector": {"matchLabels": {"app": "phalanx-scheduler"}}}],
                "ports": [{"protocol": "TCP", "port": 9444}],
            }
        ],
    }


def test_the_node_agent_values_reach_its_flags_image_and_policy(helm: Helm, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.__main__ import parse

    monkeypatch.setenv("NODE_NAME", "gpu-1")
    values = {
        "nodeAgent.port": "9555",
        "nodeAgent.gpuSlots": "4",
        "nodeAgent.evictUnhealthy": "false",
        "nodeAgent.extraArgs[0]": "--interval=2",
        "nodeAgent.nodeSelector.gpu": "yes",
        "nodeAgent.nodeSelector.nvidia\\.com/gpu\\.present": "null",
        "nodeAgent.image.repository": "registry.example.com/phalanx-agent",
        "nodeAgent.image.tag": "0.2.0",
        "config.gpu.dynamicMigLabel": "example.com/mig=on-demand",
        "image.pullPolicy": "IfNotPresent",
    }
    docs = render(helm, *AGENT, *[arg for k, v in values.items() for arg in ("--set", f"{k}={v}")])
    container = agent_container(docs)
    assert container["image"] == "registry.example.com/phalanx-agent:0.2.0"
    assert container["imagePullPolicy"] == "IfNotPresent"  # the extender's, not overridden
    args = parse(container["command"][3:])
    assert (args.listen, args.gpu_slots, args.evict_unhealthy, args.interval) == ("0.0.0.0:9555", 4, False, 2.0)
    assert args.dynamic_mig_label == "example.com/mig=on-demand"  # follows the extender's configuration
    assert container["ports"][0]["containerPort"] == 9555
    spec = one(docs, "DaemonSet", "phalanx-node-agent")["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"gpu": "yes"}
    policy = one(docs, "NetworkPolicy", "phalanx-node-agent")["spec"]
    assert policy["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 9555}]

    # No override: the extender's image, pinned by its digest; no NetworkPolicy when disabled.
    digest = "sha256:" + "0123456789abcdef" * 4
    docs = render(helm, *AGENT, "--set", f"image.digest={digest}", "--set", "networkPolicy.enabled=false")
    assert agent_container(docs)["image"] == f"phalanx-extender@{digest}"
    assert not [d for d in docs if d["kind"] == "NetworkPolicy"]


# ---------------------------------------------------------------- the same as deploy/kubernetes


@pytest.mark.parametrize("agent", [False, True], ids=["defaults", "node-agent"])
def test_the_default_rbac_is_the_rbac_of_deploy_kubernetes(helm: Helm, agent: bool) -> None:
    """With nodeAgent.enabled all of it; by default all but the node agent's objects."""
    rendered = render(helm, *(AGENT if agent else ()))
    shipped = [d for d in manifests() if agent or not is_agents(d)]
    kinds = ("ServiceAccount", "ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding")
    names = {kind: sorted(d["metadata"]["name"] for d in shipped if d["kind"] == kind) for kind in kinds}
    assert {kind: sorted(d["metadata"]["name"] for d in rendered if d["kind"] == kind) for kind in kinds} == names
    for kind in ("ClusterRole", "Role"):
        for name in names[kind]:
            assert rules(rendered, kind, name) == rules(shipped, kind, name), f"{kind}/{name}"
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for name in names[kind]:
            ours, theirs = one(rendered, kind, name), one(shipped, kind, name)
            assert ours["roleRef"] == theirs["roleRef"], f"{kind}/{name}"
            assert ours["subjects"] == theirs["subjects"], f"{kind}/{name}"
            assert ours["metadata"].get("namespace") == theirs["metadata"].get("namespace"), f"{kind}/{name}"


def test_the_chart_renders_the_objects_of_deploy_kubernetes(helm: Helm) -> None:
    """With the manifests' replica count and the node agent on, every object of deploy/kubernetes
    (but the Namespace, which `helm install --create-namespace` makes) renders the same, but for
    the chart's own labels and the config checksum; the chart adds only its NetworkPolicies."""
    shipped = [d for d in manifests() if d["kind"] != "Namespace"]
    replicas = one(shipped, "Deployment", "phalanx-scheduler")["spec"]["replicas"]
    rendered = render(helm, "--set", f"replicas={replicas}", *AGENT)
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    policies = [("NetworkPolicy", "phalanx-scheduler"), ("NetworkPolicy", "phalanx-node-agent")]
    assert sorted(map(key, rendered)) == sorted([*map(key, shipped), *policies])
    for theirs in shipped:
        ours = one(rendered, theirs["kind"], theirs["metadata"]["name"])
        assert _plain(ours) == _plain(theirs), f"{theirs['kind']}/{theirs['metadata']['name']}"


@pytest.mark.parametrize("share", [False, True], ids=["agent without share slots", "agent with share slots"])
def test_policies_render_the_objects_of_deploy_kubernetes_policies(helm: Helm, share: bool) -> None:
    """`policies.enabled` renders deploy/kubernetes/policies/policies.yaml, and the Deployment
    that deployment-patch.json makes of the shipped one (and, with the agent's share slots,
    node-agent/deployment-patch.json after it); the NetworkPolicy admits the webhook port."""
    shipped = [d for d in manifests() if d["kind"] != "Namespace"]
    replicas = one(shipped, "Deployment", "phalanx-scheduler")["spec"]["replicas"]
    agent = ("--set", "nodeAgent.enabled=true") if share else AGENT
    rendered = render(helm, "--set", f"replicas={replicas}", "--set", "policies.enabled=true", *agent)
    extra = [d for d in yaml.safe_load_all((MANIFESTS / "policies" / "policies.yaml").read_text()) if d]
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    policies = [("NetworkPolicy", "phalanx-scheduler"), ("NetworkPolicy", "phalanx-node-agent")]
    expected = [*map(key, shipped), *map(key, extra), *policies]
    assert sorted(map(key, rendered)) == sorted(expected)
    for theirs in extra:
        assert _plain(one(rendered, *key(theirs))) == _plain(theirs), key(theirs)
    deployment = json.loads(json.dumps(one(shipped, "Deployment", "phalanx-scheduler")))
    patches = [MANIFESTS / "policies" / "deployment-patch.json"]
    if share:
        patches.append(MANIFESTS / "node-agent" / "deployment-patch.json")
    for op in [op for patch in patches for op in json.loads(patch.read_text())]:
        assert op["op"] == "add" and op["path"].endswith("/-"), op  # appends only: applied here by hand
        target: Any = deployment
        for part in op["path"].strip("/").split("/")[:-1]:
            target = target[int(part)] if isinstance(target, list) else target[part]
        target.append(op["value"])
    assert _plain(one(rendered, "Deployment", "phalanx-scheduler")) == _plain(deployment)
    ingress = one(rendered, "NetworkPolicy", "phalanx-scheduler")["spec"]["ingress"]
    assert {"ports": [{"protocol": "TCP", "port": 9443}]} in ingress


def _plain(doc: Doc) -> Doc:
    """A document without the chart's own labels and annotations, its ConfigMaps' YAML parsed."""
    doc = json.loads(json.dumps(doc))
    metas = [doc["metadata"]]
    if doc["kind"] in ("Deployment", "DaemonSet"):
        metas.append(doc["spec"]["template"]["metadata"])
    for meta in metas:
        for field, ours in (("labels", ("app.kubernetes.io/", "helm.sh/")), ("annotations", ("checksum/",))):
            kept = {k: v for k, v in meta.pop(field, {}).items() if not k.startswith(ours)}
            if kept:
                meta[field] = kept
    if doc["kind"] == "ConfigMap":
        doc["data"] = {k: yaml.safe_load(v) for k, v in doc["data"].items()}
    return doc


# ---------------------------------------------------------------- against the real cluster


def _dry_run(kube: RestKube, doc: Doc) -> None:
    """Create with dryRun=All and strict field validation (unknown or duplicate fields fail); an
    object that exists already (409) is validated as an update by a dry-run server-side apply."""
    meta = doc["metadata"]
    collection = PATHS[(doc["apiVersion"], doc["kind"])].format(ns=meta.get("namespace", ""))
    query = {"dryRun": "All", "fieldValidation": "Strict"}
    r = kube.request("POST", collection, body=doc, query=query)
    if r.status == 409:
        r = kube.request(
            "PATCH",
            f"{collection}/{meta['name']}",
            body=doc,
            query={**query, "fieldManager": "helm", "force": "true"},
            content_type="application/apply-patch+yaml",
        )
    assert r.status in (200, 201), f"{doc['kind']}/{meta['name']}: {r.status} {r.body}"


def test_every_rendered_object_passes_a_server_side_dry_run(helm: Helm, cluster: LocalCluster) -> None:
    kube = RestKube.from_kubeconfig(str(cluster.kubeconfig_path))
    for namespace in (NAMESPACE, HA_NAMESPACE):
        r = kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
        assert r.status in (201, 409), r.body
    renders = [
        render(helm, "--include-crds"),
        render(helm, "--values", str(HA_VALUES), namespace=HA_NAMESPACE),
        render(helm, *AGENT),
    ]
    for docs in renders:
        for doc in docs:
            _dry_run(kube, doc)
    assert {d["kind"] for d in renders[0]} >= {"CustomResourceDefinition", "Deployment", "NetworkPolicy"}
    assert "PodDisruptionBudget" in {d["kind"] for d in renders[1]}
    assert "DaemonSet" in {d["kind"] for d in renders[2]}


@pytest.mark.parametrize("values", ["defaults", "ha"])
def test_the_rendered_scheduler_configuration_is_accepted_by_kube_scheduler(
    helm: Helm, cluster: LocalCluster, tmp_path: Path, values: str
) -> None:
    args = ("--values", str(HA_VALUES)) if values == "ha" else ()
    config = scheduler_config(render(helm, *args))
    config["clientConnection"] = {"kubeconfig": str(cluster.kubeconfig_path)}
    config["leaderElection"]["leaderElect"] = False  # validate only: no lease taken
    path = tmp_path / "scheduler.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(  # --write-config-to validates, writes the effective configuration, exits
        [str(locate_binaries().kube_scheduler), f"--config={path}", f"--write-config-to={tmp_path / 'out.yaml'}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    effective = yaml.safe_load((tmp_path / "out.yaml").read_text())
    names = [p["schedulerName"] for p in effective["profiles"]]
    assert names == (["default-scheduler"] if values == "ha" else ["phalanx"])
    assert [e["nodeCacheCapable"] for e in effective["extenders"]] == [True, True, True]
    assert [e.get("bindVerb", "") for e in effective["extenders"]] == ["", "", "bind"]
    assert [e.get("prioritizeVerb", "") for e in effective["extenders"]] == ["", "prioritize", ""]


def test_helm_install_upgrade_and_uninstall_keep_what_the_extender_wrote(helm: Helm, cluster: LocalCluster) -> None:
    """A real release: installed (CRDs included), then upgraded with a changed Phalanx config
    while a workload type the extender stored in phalanx-config survives (helm's three-way merge
    leaves keys it never rendered), then uninstalled."""
    kube = RestKube.from_kubeconfig(str(cluster.kubeconfig_path))
    namespace, release = "phalanx-helm-e2e", "phalanx"
    kubeconfig = ("--kubeconfig", str(cluster.kubeconfig_path), "--namespace", namespace)
    config_path = f"/api/v1/namespaces/{namespace}/configmaps/phalanx-config"
    # --take-ownership: the cluster-wide RBAC may be there from deploy/kubernetes (test_manifests).
    helm("install", release, str(CHART), *kubeconfig, "--create-namespace", "--take-ownership", "--set", "replicas=1")
    try:
        assert kube.request("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/phalanx-scheduler").status == 200
        crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/workloads.phalanx.io"
        assert kube.request("GET", crd).status == 200
        stored = {"data": {"workload-type.example.com.MyJob.yaml": "kind: MyJob\n"}}
        r = kube.request("PATCH", config_path, body=stored, content_type="application/merge-patch+json")
        assert r.status == 200, r.body

        upgrade = ("--set", "config.server.logLevel=debug", "--set", "replicas=2")
        helm("upgrade", release, str(CHART), *kubeconfig, *upgrade)
        data = kube.request("GET", config_path).body["data"]
        assert yaml.safe_load(data["config.yaml"])["server"]["logLevel"] == "debug"
        assert data["workload-type.example.com.MyJob.yaml"] == "kind: MyJob\n"
        budget = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/phalanx-scheduler"
        assert kube.request("GET", budget).status == 200
    finally:
        helm("uninstall", release, *kubeconfig)
    assert kube.request("GET", config_path).status == 404
    assert kube.request("GET", f"/apis/{RBAC}/clusterroles/phalanx-extender").status == 404


def test_the_rendered_chart_schedules_a_gang_with_leader_election(
    helm: Helm, cluster: LocalCluster, tmp_path: Path
) -> None:
    """The e2e of the shipped manifests, on what the chart renders: applied with server-side
    apply, the Deployment's two commands run with their service accounts' tokens, leader
    election on; a 4-member gang lands whole in one rack."""
    kube = RestKube.from_kubeconfig(str(cluster.kubeconfig_path))
    for path in sorted(CONFIG_CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        r = kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd)
        assert r.status in (201, 409), r.body
    wait("Workloads served", lambda: kube.request("GET", "/apis/phalanx.io/v1alpha1/workloads").status == 200)
    r = kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NAMESPACE}})
    assert r.status in (201, 409), r.body
    docs = render(helm)
    for doc in docs:
        replicas.apply(kube, doc)
    scheduler = replicas.account_kubeconfig(kube, cluster.kubeconfig_path, "phalanx-scheduler", tmp_path)
    extender = replicas.account_kubeconfig(kube, cluster.kubeconfig_path, "phalanx-extender", tmp_path)
    replica = replicas.Replica("chart", tmp_path / "chart", scheduler, extender, docs)
    namespace = "chart-e2e"
    assert kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}}).status in (201, 409)
    replica.start()
    try:
        wait("the extender ready", replica.ready, 120)
        wait("the replica leads", replica.leading, 120)
        group = {
            "name": "workers",
            "minCount": 4,
            "topologyRequest": {"required": "topology.phalanx.io/rack"},
            "rankedGroups": [{"name": "all", "eqGroups": [{"name": "w", "count": 4}]}],
        }
        workload = {"apiVersion": "phalanx.io/v1alpha1", "kind": "Workload", "metadata": {"name": "charted"}}
        workload["spec"] = {"gangGroups": [group]}
        r = kube.request("POST", f"/apis/phalanx.io/v1alpha1/namespaces/{namespace}/workloads", body=workload)
        assert r.status == 201, r.body
        for i in range(4):
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"charted-{i}"}}
            pod["metadata"]["labels"] = {"phalanx.io/workload": "charted"}
            container = {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
            pod["spec"] = {"schedulerName": "phalanx", "containers": [container]}
            assert kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=pod).status == 201

        def bound() -> list[str]:
            items = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods").body["items"]
            nodes = [p["spec"].get("nodeName") for p in items]
            return [n for n in nodes if n] if len(nodes) == 4 and all(nodes) else []

        nodes = wait("the gang bound", bound, 120)
        labels = [kube.request("GET", f"/api/v1/nodes/{n}").body["metadata"]["labels"] for n in nodes]
        assert len({node_labels["topology.phalanx.io/rack"] for node_labels in labels}) == 1
    finally:
        replica.stop()
        kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods", query={"gracePeriodSeconds": "0"})


def test_the_node_agents_share_slots_need_the_webhooks(helm: Helm) -> None:
    """nodeAgent.shareResource (on by default) makes the extender give annotation-only GPU pods
    their phalanx.io/gpu-share slot, a mutating webhook: without policies.enabled the chart
    refuses to render, naming both values; with it the extender runs --gpu-share-resource."""
    result = helm.run("template", "t", str(CHART), "--set", "nodeAgent.enabled=true")
    assert result.returncode != 0
    assert "nodeAgent.shareResource needs policies.enabled" in result.stderr
    docs = render(helm, "--set", "nodeAgent.enabled=true", "--set", "policies.enabled=true")
    [extender] = [
        c
        for c in one(docs, "Deployment", "phalanx-scheduler")["spec"]["template"]["spec"]["containers"]
        if c["name"] == "phalanx-extender"
    ]
    assert "--gpu-share-resource" in extender["command"] and "--webhook-port=9443" in extender["command"]
