"""The local control plane works: KWOK GPU nodes, scheduling, alpha APIs, extender wiring.

Deadlines are generous (the machine has two cores and may be running benchmarks) and every
wait polls an observable condition.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
from kubernetes import client

from deploy.local.cluster import LocalCluster
from deploy.local.kubeapi import request_json
from deploy.local.nodes import BLOCK_LABEL, RACK_LABEL, is_ready, list_nodes, node_manifests
from deploy.local.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]  # a cold first run builds binaries

POD_DEADLINE = 120.0


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    with cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        yield name
        # No kube-controller-manager runs, so deleting the namespace would not delete its pods.
        core.delete_collection_namespaced_pod(name)
        core.delete_namespace(name)


def _plain_pod(name: str, **spec: Any) -> client.V1Pod:
    container = client.V1Container(
        name="main",
        image="busybox",
        resources=client.V1ResourceRequirements(requests={"cpu": "100m", "memory": "64Mi"}),
    )
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(containers=[container], **spec),
    )


def _wait_running(api: client.ApiClient, namespace: str, name: str) -> str:
    """Wait until the pod is Running and return the name of its node."""
    core = client.CoreV1Api(api)

    def running() -> str | None:
        pod = core.read_namespaced_pod(name, namespace)
        if pod.status is None or pod.status.phase != "Running" or pod.spec is None:
            return None
        return pod.spec.node_name

    return wait_for(running, timeout=POD_DEADLINE, what=f"pod {namespace}/{name} Running")


def test_nodes_from_cluster_yaml_are_ready_with_gpus_and_topology(cluster: LocalCluster) -> None:
    """Every node of config/cluster.yaml exists, is Ready, and carries GPU capacity and labels."""
    expected = {body["metadata"]["name"]: body for body in node_manifests(cluster.spec)}
    with cluster.api_client() as api:
        nodes = {node["metadata"]["name"]: node for node in list_nodes(api, "type=kwok")}
    assert set(nodes) == set(expected)
    for name, node in nodes.items():
        want = expected[name]
        assert is_ready(node), name
        for key in (BLOCK_LABEL, RACK_LABEL, "kubernetes.io/hostname", "nvidia.com/gpu.product"):
            assert node["metadata"]["labels"][key] == want["metadata"]["labels"][key]
        for resource, quantity in want["status"]["allocatable"].items():
            assert node["status"]["allocatable"][resource] == quantity, (name, resource)
    mig_nodes = [n for n in nodes.values() if "nvidia.com/mig-1g.10gb" in n["status"]["allocatable"]]
    assert len(mig_nodes) == cluster.spec.topology.nodes_per_rack * len(cluster.spec.mig_racks)


def test_plain_pod_is_scheduled_to_a_kwok_node_and_runs(cluster: LocalCluster, namespace: str) -> None:
    """A pod without GPUs is bound by the vanilla kube-scheduler and KWOK marks it Running."""
    with cluster.api_client() as api:
        client.CoreV1Api(api).create_namespaced_pod(namespace, _plain_pod("plain"))
        node = client.CoreV1Api(api).read_node(_wait_running(api, namespace, "plain"))
    assert node.metadata is not None and node.metadata.labels is not None
    assert node.metadata.labels["type"] == "kwok"


def test_scheduling_v1beta1_workload_api_is_served(cluster: LocalCluster) -> None:
    """scheduling.k8s.io/v1beta1 serves Workload and PodGroup (Kubernetes 1.37, GenericWorkload
    gate on and the version enabled: beta APIs are off by default)."""
    with cluster.api_client() as api:
        resources = client.CustomObjectsApi(api).get_api_resources("scheduling.k8s.io", "v1beta1")
    assert {"workloads", "podgroups", "podgroups/status"} <= {r.name for r in resources.resources}


class _RecordingExtender(BaseHTTPRequestHandler):
    """A minimal extender: filter passes every node, bind posts the binding, all calls recorded."""

    calls: ClassVar[list[str]] = []
    api: ClassVar[client.ApiClient]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        verb = self.path.rsplit("/", 1)[-1]
        type(self).calls.append(verb)
        reply: Any = {}
        if verb == "filter":
            reply = {"NodeNames": body["NodeNames"], "FailedNodes": {}, "Error": ""}
        elif verb == "prioritize":
            reply = [{"Host": name, "Score": 0} for name in body["NodeNames"]]
        elif verb == "bind":
            namespace, name = body["PodNamespace"], body["PodName"]
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, "namespace": namespace, "uid": body["PodUID"]},
                "target": {"kind": "Node", "name": body["Node"]},
            }
            path = f"/api/v1/namespaces/{namespace}/pods/{name}/binding"
            response = request_json(self.api, "POST", path, body=binding)
            reply = {"Error": "" if response.status < 300 else str(response.body)}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_restart_scheduler_with_extender_routes_filter_and_bind(cluster: LocalCluster, namespace: str) -> None:
    """restart_scheduler(url) makes kube-scheduler call the extender's filter and bind verbs."""
    with cluster.api_client() as api:
        _RecordingExtender.api, _RecordingExtender.calls = api, []
        server = ThreadingHTTPServer(("127.0.0.1", 0), _RecordingExtender)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            cluster.restart_scheduler(f"http://127.0.0.1:{server.server_address[1]}")
            client.CoreV1Api(api).create_namespaced_pod(namespace, _plain_pod("via-extender"))
            _wait_running(api, namespace, "via-extender")
        finally:
            cluster.restart_scheduler(None)
            server.shutdown()
            server.server_close()
    assert "filter" in _RecordingExtender.calls
    assert "bind" in _RecordingExtender.calls
