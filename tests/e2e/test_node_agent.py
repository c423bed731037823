"""The node side on the real control plane: a node agent per KWOK node (fake NVML backend, its
GPUs from the node's labels), kube-scheduler calling Phalanx, and a test kubelet speaking the
kubelet's device-plugin and pod-resources protocols to each agent (tests/kubelet.py).

    na-a100   4 x A100-80GB      whole GPUs, a memory share; GPU health faults injected here
    na-one    1 x A100-80GB      two fractional shares of one GPU
    na-h100   1 x H100-80GB      dynamic MIG: the agent cuts the slice at bind, removes it after

Each pod's containers get, through Allocate, PreStartContainer and the CDI spec the agent
writes, exactly the devices of its `phalanx.io/gpu-devices` record, named by the UUIDs the
agent's inventory (`phalanx.io/gpu-inventory`) reports.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from agent import cdi
from agent.deviceplugin import GPU_RESOURCE, SHARE_RESOURCE, mig_resource
from deploy.local.cluster import LocalCluster
from extender.agents import AgentRefused, Agents
from extender.app import Extender, Options
from extender.kube import RestKube
from extender.objects import DEVICES_ANNOTATION, INVENTORY_ANNOTATION
from extender.policy.registration import CONFIG_NAME, Registration
from extender.policy.service import webhook_options
from rpc import nodeagent_pb2 as pb
from rpc import nodeagent_pb2_grpc as pb_grpc
from tests.e2e.test_extender import get, wait
from tests.kubelet import Kubelet, pod_resources

pytestmark = pytest.mark.e2e

NS = "default"
SUITE = "e2e-node-agent"
TAINT = {"key": "phalanx.io/e2e", "value": "node-agent", "effect": "NoSchedule"}
A100, H100 = "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"
MIG = mig_resource("3g.40gb")
ROOT = Path(__file__).resolve().parents[2]
WEBHOOK_CONFIGS = Registration.PATHS


def kwok_node(name: str, product: str, gpus: int, labels: dict[str, str]) -> dict[str, Any]:
    alloc = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus), SHARE_RESOURCE: str(10 * gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {
                "kubernetes.io/hostname": name,
                "type": "kwok",
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.memory": "81920",
                **labels,
            },
        },
        "spec": {"taints": [TAINT]},
        "status": {"allocatable": alloc, "capacity": alloc},
    }


NODES = {
    "na-a100": kwok_node("na-a100", A100, 4, {}),
    "na-one": kwok_node("na-one", A100, 1, {}),
    "na-h100": kwok_node("na-h100", H100, 1, {"phalanx.io/mig-mode": "dynamic"}),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class NodeSide:
    """One node's agent process and the test kubelet it talks to."""

    node: str
    home: Path
    port: int
    kubelet: Kubelet
    process: subprocess.Popen[bytes] | None = None

    @property
    def cdi_dir(self) -> Path:
        return self.home / "cdi"

    def start(self, kubeconfig: Path) -> None:
        command = [
            sys.executable,
            "-m",
            "agent",
            "--node",
            self.node,
            "--kubeconfig",
            str(kubeconfig),
            "--backend",
            "fake",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--advertise",
            f"127.0.0.1:{self.port}",
            "--plugin-dir",
            str(self.home / "dp"),
            "--pod-resources-socket",
            str(self.home / "pr.sock"),
            "--cdi-dir",
            str(self.cdi_dir),
            "--state-file",
            str(self.home / "pins.json"),
            "--interval",
            "0.5",
            "--pending-grace",
            "30",
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with (self.home / "agent.log").open("ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None

    def log(self) -> str:
        return (self.home / "agent.log").read_text(errors="replace")[-4000:]


def inventory(kube: RestKube, node: str) -> dict[str, Any] | None:
    r = kube.request("GET", f"/api/v1/nodes/{node}")
    text = ((r.body.get("metadata") or {}).get("annotations") or {}).get(INVENTORY_ANNOTATION)
    return json.loads(text) if text else None


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster) -> RestKube:
    return RestKube.from_kubeconfig(str(cluster.kubeconfig_path))


@pytest.fixture(scope="module")
def sides(cluster: LocalCluster, kube: RestKube) -> Iterator[dict[str, NodeSide]]:
    for body in NODES.values():
        r = kube.request("POST", "/api/v1/nodes", body=body)
        assert r.status in (201, 409), r.body
    base = Path(tempfile.mkdtemp(prefix="na-", dir="/tmp"))  # unix socket paths must stay short
    out: dict[str, NodeSide] = {}
    try:
        for name in NODES:
            home = base / name
            (home / "dp").mkdir(parents=True)
            kubelet = Kubelet(home / "dp", home / "pr.sock")
            kubelet.start()
            side = out[name] = NodeSide(name, home, free_port(), kubelet)
            side.start(cluster.kubeconfig_path)
        for name, side in out.items():
            wait(f"{name}'s agent publishes its inventory", lambda n=name: inventory(kube, n), 60)
            wait(f"{name}'s plugins register", lambda s=side: GPU_RESOURCE in s.kubelet.registered(), 30)
        yield out
    finally:
        for side in out.values():
            side.stop()
            side.kubelet.stop()
        for p in suite_pods(kube):
            kube.request(
                "DELETE", f"/api/v1/namespaces/{NS}/pods/{p['metadata']['name']}", query={"gracePeriodSeconds": "0"}
            )
        for name in NODES:
            kube.request("DELETE", f"/api/v1/nodes/{name}")
        shutil.rmtree(base, ignore_errors=True)


VAP = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
VAP_BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
AGENT_MANIFEST = ROOT / "deploy" / "kubernetes" / "node-agent" / "node-agent.yaml"


def forged(name: str) -> dict[str, Any]:
    body = gpu_pod(name, "na-one", limits={"nvidia.com/gpu": "1"})
    body["metadata"]["annotations"] = {DEVICES_ANNOTATION: '[{"index":0,"milli":1000}]'}
    return body


@pytest.fixture(scope="module")
def guarded(kube: RestKube) -> Iterator[None]:
    """The shipped ValidatingAdmissionPolicy that keeps device records the Binding's alone."""
    docs = [d for d in yaml.safe_load_all(AGENT_MANIFEST.read_text()) if d]
    for doc in docs:
        collection = {"ValidatingAdmissionPolicy": VAP, "ValidatingAdmissionPolicyBinding": VAP_BINDINGS}.get(
            doc["kind"]
        )
        if collection:
            r = kube.request("POST", collection, body=doc)
            assert r.status in (201, 409), r.body

    def refused() -> bool:  # the policy is compiled and served once a forged record is refused
        r = kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=forged("probe"), query={"dryRun": "All"})
        return r.status in (403, 422)

    wait("the device-record policy in force", refused, 60)
    yield
    kube.request("DELETE", f"{VAP_BINDINGS}/phalanx-device-records")
    kube.request("DELETE", f"{VAP}/phalanx-device-records")


@pytest.fixture(scope="module")
def extender(
    cluster: LocalCluster,
    kube: RestKube,
    sides: dict[str, NodeSide],
    guarded: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Extender]:
    """The extender with its webhooks on and --gpu-share-resource: pods asking GPUs by
    annotation get their phalanx.io/gpu-share slot at creation."""
    r = kube.request(
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "phalanx-system"}},
    )
    assert r.status in (201, 409), r.body
    port = free_port()
    webhook = webhook_options(
        "127.0.0.1", port, None, f"https://127.0.0.1:{port}", tmp_path_factory.mktemp("webhook"), gpu_share=True
    )
    ext = Extender(kube, Options(port=0, webhook=webhook))
    ext.start()
    wait("extender ready", ext.ready)
    assert ext.policy_service is not None
    wait("webhooks registered", ext.policy_service.started.is_set, 120)
    wait(
        "agents' inventories in the cache",
        lambda: all(ext.cache.node_annotation(n, INVENTORY_ANNOTATION) for n in NODES),
    )
    cluster.restart_scheduler(ext.server.url, ignored_resources=(MIG,))
    try:
        yield ext
    finally:
        cluster.restart_scheduler(None)
        ext.stop()  # before its webhook configurations go, so it cannot write them again
        for collection in WEBHOOK_CONFIGS:
            kube.request("DELETE", f"{collection}/{CONFIG_NAME}")


def gpu_pod(
    name: str, node: str, *, annotations: dict[str, str] | None = None, limits: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"suite": SUITE}, "annotations": annotations or {}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "c", "image": "x", "resources": {"limits": limits or {}, "requests": {"cpu": "100m"}}}
            ],
        },
    }


def suite_pods(kube: RestKube) -> list[dict[str, Any]]:
    r = kube.request("GET", f"/api/v1/namespaces/{NS}/pods", query={"labelSelector": f"suite={SUITE}"})
    return list(r.body["items"])


def submit(kube: RestKube, pods: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    for body in pods.values():
        r = kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=body)
        assert r.status == 201, r.body

    def all_bound() -> dict[str, dict[str, Any]] | None:
        got = {n: get(kube, n) for n in pods}
        return got if all(p["spec"].get("nodeName") for p in got.values()) else None

    bound: dict[str, dict[str, Any]] = wait(f"{', '.join(pods)} bound", all_bound, 90)
    return bound


def delete(kube: RestKube, *names: str) -> None:
    for name in names:
        kube.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}", query={"gracePeriodSeconds": "0"})
    wait(
        "pods gone",
        lambda: all(kube.request("GET", f"/api/v1/namespaces/{NS}/pods/{n}").status == 404 for n in names),
        60,
    )


def record(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list(json.loads(pod["metadata"]["annotations"][DEVICES_ANNOTATION]))


def start_container(side: NodeSide, pods: dict[str, tuple[str, list[str]]]) -> dict[str, dict[str, str]]:
    """Play the kubelet for `pods` (name -> resource and slot ids) on one node: Allocate, list
    them in pod-resources, PreStartContainer; the environment each container's CDI spec gives."""
    side.kubelet.list_pods(*(pod_resources(NS, n, {"c": {r: ids}}) for n, (r, ids) in pods.items()))
    out = {}
    for name, (resource, ids) in pods.items():
        answer = side.kubelet.allocate(resource, ids).container_responses[0]
        claim = answer.cdi_devices[0].name.split("=", 1)[1]
        side.kubelet.prestart(resource, ids)
        spec = json.loads(cdi.spec_path(side.cdi_dir, claim).read_text())
        out[name] = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
    return out


def snapshot(side: NodeSide, authorization: str) -> Any:
    """The agent's GetResourceSnapshot, called as the extender calls it (its bearer token)."""
    with grpc.insecure_channel(f"127.0.0.1:{side.port}") as channel:
        return pb_grpc.NodeAgentStub(channel).GetResourceSnapshot(
            pb.SnapshotRequest(node_id=side.node), timeout=5, metadata=(("authorization", authorization),)
        )


@pytest.fixture(autouse=True)
def clean(kube: RestKube) -> Iterator[None]:
    """Each test starts and ends with none of the suite's pods (a failed test leaves none behind)."""
    yield
    names = [p["metadata"]["name"] for p in suite_pods(kube)]
    if names:
        delete(kube, *names)


def uuids(kube: RestKube, node: str) -> dict[int, str]:
    inv = inventory(kube, node) or {}
    return {g["index"]: g["uuid"] for g in inv["gpus"]}


def test_each_container_gets_exactly_the_devices_of_its_record(
    extender: Extender, kube: RestKube, sides: dict[str, NodeSide]
) -> None:
    bound = submit(
        kube,
        {
            "whole": gpu_pod("whole", "na-a100", limits={"nvidia.com/gpu": "2"}),
            "memory": gpu_pod("memory", "na-a100", annotations={"gpu-memory": "20480"}),
            "half": gpu_pod("half", "na-one", annotations={"gpu-fraction": "0.5"}),
            "quarter": gpu_pod("quarter", "na-one", annotations={"gpu-fraction": "0.25"}),
            "mig": gpu_pod("mig", "na-h100", limits={MIG: "1"}),
        },
    )
    # the pods asking by annotation got their slot from the webhook (--gpu-share-resource)
    slots = {n: p["spec"]["containers"][0]["resources"]["limits"].get(SHARE_RESOURCE) for n, p in bound.items()}
    assert slots == {"whole": None, "memory": "1", "half": "1", "quarter": "1", "mig": None}
    a100 = uuids(kube, "na-a100")
    env = start_container(
        sides["na-a100"],
        {"whole": (GPU_RESOURCE, ["gpu-slot-2", "gpu-slot-3"]), "memory": (SHARE_RESOURCE, ["share-slot-0"])},
    )
    # the slots the kubelet picked (2, 3) say nothing; the record says which GPUs
    assert env["whole"]["NVIDIA_VISIBLE_DEVICES"] == ",".join(a100[d["index"]] for d in record(bound["whole"]))
    (mem,) = record(bound["memory"])
    assert env["memory"]["NVIDIA_VISIBLE_DEVICES"] == a100[mem["index"]]
    assert env["memory"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={mem['memoryMiB']}M" == "0=20480M"

    env = start_container(
        sides["na-one"], {"half": (SHARE_RESOURCE, ["share-slot-0"]), "quarter": (SHARE_RESOURCE, ["share-slot-1"])}
    )
    (gpu,) = uuids(kube, "na-one").values()
    assert env["half"]["NVIDIA_VISIBLE_DEVICES"] == env["quarter"]["NVIDIA_VISIBLE_DEVICES"] == gpu
    threads = [int(env[n]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]) for n in ("half", "quarter")]
    memory = [
        int(env[n]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].removeprefix("0=").removesuffix("M"))
        for n in ("half", "quarter")
    ]
    assert threads == [50, 25] and sum(memory) <= 81920, (threads, memory)

    (slice_,) = record(bound["mig"])
    # cut at BindAllocation, before the Binding: the agent holds it before any container starts
    (gpu_,) = snapshot(sides["na-h100"], kube.headers["Authorization"]).gpus
    assert [(m.profile, m.start, m.allocation_id) for m in gpu_.mig_devices] == [
        ("3g.40gb", slice_["start"], "default/mig")
    ]
    cut = wait(
        "the slice published",
        lambda: [
            s
            for g in inventory(kube, "na-h100")["gpus"]  # type: ignore[index]
            for s in g.get("slices", [])
        ],
        30,
    )
    assert [(s["profile"], s["start"], s["uuid"]) for s in cut] == [
        ("3g.40gb", slice_["start"], gpu_.mig_devices[0].uuid)
    ]
    env = start_container(sides["na-h100"], {"mig": (MIG, ["mig-3g.40gb-slot-0"])})
    assert env["mig"]["NVIDIA_VISIBLE_DEVICES"] == cut[0]["uuid"]
    delete(kube, *bound)
    wait(
        "the slice removed after its pod",
        lambda: (
            not [
                s
                for g in inventory(kube, "na-h100")["gpus"]  # type: ignore[index]
                for s in g.get("slices", [])
            ]
        ),
        30,
    )


def test_an_unhealthy_gpu_is_reported_its_pod_evicted_and_nothing_placed_on_it(
    extender: Extender, kube: RestKube, sides: dict[str, NodeSide]
) -> None:
    holder = submit(kube, {"holder": gpu_pod("holder", "na-a100", limits={"nvidia.com/gpu": "1"})})["holder"]
    (held,) = record(holder)
    sick = held["index"]
    patch = {"metadata": {"annotations": {"phalanx.io/fake-gpu-health": json.dumps({str(sick): "XID 79"})}}}
    kube.request("PATCH", "/api/v1/nodes/na-a100", body=patch, content_type="application/merge-patch+json")
    try:
        wait(
            "the agent reports the GPU unhealthy",
            lambda: any(g["index"] == sick and not g["healthy"] for g in inventory(kube, "na-a100")["gpus"]),
            30,
        )  # type: ignore[index]
        wait(
            "the holder evicted", lambda: kube.request("GET", f"/api/v1/namespaces/{NS}/pods/holder").status == 404, 60
        )
        wait(
            "the extender drops the GPU",
            lambda: (
                sick
                not in {d.index for d in next(i for i in extender.cache.node_infos() if i.name == "na-a100").devices}
            ),
            30,
        )
        after = submit(kube, {"after": gpu_pod("after", "na-a100", limits={"nvidia.com/gpu": "3"})})["after"]
        assert sorted(d["index"] for d in record(after)) == sorted({0, 1, 2, 3} - {sick})
        delete(kube, "after")
    finally:
        patch = {"metadata": {"annotations": {"phalanx.io/fake-gpu-health": None}}}
        kube.request("PATCH", "/api/v1/nodes/na-a100", body=patch, content_type="application/merge-patch+json")
    wait("the GPU healthy again", lambda: all(g["healthy"] for g in inventory(kube, "na-a100")["gpus"]), 30)  # type: ignore[index]


def test_a_restarted_agent_rebuilds_from_the_pods_and_refuses_what_it_does_not_know(
    cluster: LocalCluster, extender: Extender, kube: RestKube, sides: dict[str, NodeSide]
) -> None:
    bound = submit(kube, {"keep": gpu_pod("keep", "na-one", annotations={"gpu-fraction": "0.5"})})
    side = sides["na-one"]
    side.stop()
    side.start(cluster.kubeconfig_path)
    endpoint = f"127.0.0.1:{side.port}"
    token = kube.headers["Authorization"]

    def held() -> Any:
        try:
            return snapshot(side, token)
        except grpc.RpcError:
            return None

    snap = wait("the restarted agent holds the pod again", lambda: (s := held()) and s.allocations and s, 60)
    assert [(a.allocation_id, a.grants[0].index, a.grants[0].milli) for a in snap.allocations] == [
        ("default/keep", record(bound["keep"])[0]["index"], 500)
    ]
    agents = Agents(lambda node: endpoint, lambda: token)
    with pytest.raises(AgentRefused, match="UnknownDevice"):
        agents.bind(namespace=NS, name="ghost", uid="u", node="na-one", record='[{"index":3,"milli":1000}]')
    with pytest.raises(AgentRefused, match="Oversubscribed"):
        agents.bind(namespace=NS, name="ghost", uid="u", node="na-one", record='[{"index":0,"milli":600}]')
    with pytest.raises(AgentRefused, match="UNAUTHENTICATED"):
        Agents(lambda node: endpoint, lambda: "Bearer not-a-token").bind(
            namespace=NS, name="ghost", uid="u", node="na-one", record='[{"index":0,"milli":100}]'
        )
    delete(kube, "keep")


def test_only_the_binding_writes_a_device_record(extender: Extender, kube: RestKube) -> None:
    """A pod created with a record, or given one later, is refused by the shipped policy; the
    records of the pods Phalanx bound (every test above) came through the Binding."""
    r = kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=forged("forged"))
    assert r.status in (403, 422) and "written by the scheduler's Binding only" in r.body["message"], r.body
    plain = submit(kube, {"plain": gpu_pod("plain", "na-one", annotations={"gpu-fraction": "0.5"})})["plain"]
    assert record(plain)  # written by the Binding, through the policy
    patch = {"metadata": {"annotations": {DEVICES_ANNOTATION: '[{"index":0,"milli":1000}]'}}}
    r = kube.request(
        "PATCH", f"/api/v1/namespaces/{NS}/pods/plain", body=patch, content_type="application/merge-patch+json"
    )
    assert r.status in (403, 422), r.body
