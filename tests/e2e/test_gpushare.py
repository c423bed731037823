"""GPU sharing at full depth on the real control plane: every request kind on one node at once,
and dynamic MIG cut by Phalanx on a partitionable node.

The module adds two KWOK nodes of its own (tainted, so other suites' pods stay off them):

    gs-a100   8 x A100-80GB        fractions, memory, multi-device, TFLOPs, policy fields, whole
    gs-h100   2 x H100-80GB-HBM3   labelled phalanx.io/mig-mode=dynamic: MIG slices cut on demand

Every placement is made by kube-scheduler calling Phalanx; the tests read annotations back from
the API server and compare them with what the extender's cache accounts.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from deploy.local.cluster import LocalCluster
from deploy.local.scheduler_config import HAMI_RESOURCES
from extender.app import Extender
from extender.gpu import mig_resource
from extender.kube import RestKube
from extender.objects import DEVICES_ANNOTATION
from solver.mig import MigSlot, load_tables, violations
from tests.e2e.test_extender import create, get, start_extender, wait

pytestmark = pytest.mark.e2e

NS = "default"
SUITE = "e2e-gpushare"
TAINT = {"key": "phalanx.io/e2e", "value": "gpushare", "effect": "NoSchedule"}
H100 = load_tables().table_for("NVIDIA-H100-80GB-HBM3")
MIG_RESOURCES = tuple(mig_resource(p.name) for p in H100.profiles) if H100 else ()


def kwok_node(name: str, product: str, gpus: int, labels: dict[str, str]) -> dict[str, Any]:
    alloc = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
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


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster) -> RestKube:
    return RestKube.from_kubeconfig(str(cluster.kubeconfig_path))


@pytest.fixture(scope="module")
def extender(cluster: LocalCluster, kube: RestKube) -> Iterator[Extender]:
    for body in (
        kwok_node("gs-a100", "NVIDIA-A100-SXM4-80GB", 8, {}),
        kwok_node("gs-h100", "NVIDIA-H100-80GB-HBM3", 2, {"phalanx.io/mig-mode": "dynamic"}),
    ):
        r = kube.request("POST", "/api/v1/nodes", body=body)
        assert r.status in (201, 409), r.body
    ext = start_extender(kube)
    wait("nodes in the cache", lambda: ext.cache.node_model("gs-a100") and ext.cache.node_model("gs-h100"))
    # HAMi share resources and MIG resources no node advertises: kube-scheduler must not
    # check them itself (Phalanx accounts for them).
    cluster.restart_scheduler(ext.server.url, ignored_resources=(*HAMI_RESOURCES, *MIG_RESOURCES))
    yield ext
    cluster.restart_scheduler(None)
    ext.stop()
    for p in suite_pods(kube):
        kube.request(
            "DELETE", f"/api/v1/namespaces/{NS}/pods/{p['metadata']['name']}", query={"gracePeriodSeconds": "0"}
        )
    for name in ("gs-a100", "gs-h100"):
        kube.request("DELETE", f"/api/v1/nodes/{name}")


def share_pod(
    name: str, node: str, *, annotations: dict[str, str] | None = None, limits: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"suite": SUITE}, "annotations": annotations or {}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {"name": "c", "image": "x", "resources": {"limits": limits or {}, "requests": {"cpu": "100m"}}}
            ],
        },
    }


def suite_pods(kube: RestKube) -> list[dict[str, Any]]:
    r = kube.request("GET", f"/api/v1/namespaces/{NS}/pods", query={"labelSelector": f"suite={SUITE}"})
    return list(r.body["items"])


def bound_all(kube: RestKube, names: list[str]) -> list[dict[str, Any]] | None:
    pods = [get(kube, n) for n in names]
    return pods if all(p["spec"].get("nodeName") for p in pods) else None


MIXED = {
    "kai-half": {"annotations": {"gpu-fraction": "0.5"}},
    "kai-memory": {"annotations": {"gpu-memory": "20Gi"}},
    "kai-multi": {"annotations": {"gpu-fraction": "0.25", "gpu-fraction-num-devices": "3"}},
    "hami-two": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpucores": "30", "nvidia.com/gpumem": "8192"}},
    "tf-tflops": {"annotations": {"tensor-fusion.ai/tflops-request": "100", "tensor-fusion.ai/vram-request": "10Gi"}},
    "policy-portion": {"annotations": {"phalanx.io/gpuPortionRequest": "0.3"}},
    "whole-two": {"limits": {"nvidia.com/gpu": "2"}},
}


def test_every_request_kind_shares_one_node_and_the_annotations_match_the_cache(
    extender: Extender, kube: RestKube
) -> None:
    for name, spec in MIXED.items():
        create(kube, share_pod(name, "gs-a100", **spec))
    pods = wait("mixed pods bound", lambda: bound_all(kube, list(MIXED)))
    milli: dict[int, int] = defaultdict(int)
    memory: dict[int, int] = defaultdict(int)
    tflops: dict[int, float] = defaultdict(float)
    whole: set[int] = set()
    users: dict[int, int] = defaultdict(int)
    for p in pods:
        assert p["spec"]["nodeName"] == "gs-a100"
        entries = json.loads(p["metadata"]["annotations"][DEVICES_ANNOTATION])
        if p["metadata"]["name"] == "whole-two":
            whole |= {e["index"] for e in entries}
        for e in entries:
            users[e["index"]] += 1
            milli[e["index"]] += e["milli"]
            memory[e["index"]] += e["memoryMiB"]
            tflops[e["index"]] += e.get("tflops", 0)
    assert len(json.loads(get(kube, "kai-multi")["metadata"]["annotations"][DEVICES_ANNOTATION])) == 3
    assert all(users[i] == 1 for i in whole), "whole GPUs are never shared"
    assert all(m <= 1000 for m in milli.values()) and all(m <= 81920 for m in memory.values())

    # What the annotations say is exactly what the cache counts on each device.
    def mismatches() -> list[str]:
        model = extender.cache.node_model("gs-a100")
        assert model is not None
        out = []
        for d in model.gpus:
            if d.index in whole:
                expected = (0, 0, 0)
            else:
                expected = (1000 - milli[d.index], 81920 - memory[d.index], d.tflops - round(tflops[d.index] * 1000))
            if (d.free_milli, d.free_memory_mib, d.free_tflops) != expected:
                out.append(f"gpu {d.index}: cache {d.free_milli, d.free_memory_mib, d.free_tflops} != {expected}")
        return out

    wait("cache accounting equals the annotations", lambda: not mismatches())


def test_dynamic_mig_cuts_only_valid_layouts(extender: Extender, kube: RestKube) -> None:
    """3 x 3g.40gb and 4 x 1g.10gb fill two H100s exactly; an eighth slice does not fit."""
    names = []
    for i in range(3):
        names.append(f"mig-3g-{i}")
        create(kube, share_pod(names[-1], "gs-h100", annotations={"phalanx.io/migProfile": "3g.40gb"}))
    # Pods come one at a time and never move: the large slices first, as a packer would want.
    wait("3g.40gb pods bound", lambda: bound_all(kube, names))
    for i in range(4):
        names.append(f"mig-1g-{i}")
        spec: dict[str, Any] = (
            {"limits": {"nvidia.com/mig-1g.10gb": "1"}}
            if i % 2
            else {"annotations": {"phalanx.io/gpuRequestType": "migProfile", "phalanx.io/migProfile": "1g.10gb"}}
        )
        create(kube, share_pod(names[-1], "gs-h100", **spec))
    pods = wait("MIG pods bound", lambda: bound_all(kube, names))
    layouts: dict[int, list[MigSlot]] = defaultdict(list)
    for p in pods:
        (entry,) = json.loads(p["metadata"]["annotations"][DEVICES_ANNOTATION])
        layouts[entry["index"]].append(MigSlot(entry["mig"], entry["start"]))
    assert H100 is not None
    assert sum(len(v) for v in layouts.values()) == 7
    for index, slots in layouts.items():
        assert violations(H100, tuple(slots)) == [], (index, slots)
    model = extender.cache.node_model("gs-h100")
    assert model is not None
    assert {d.index: set(d.mig_layout) for d in model.gpus} == {i: set(s) for i, s in layouts.items()}
    create(kube, share_pod("mig-one-too-many", "gs-h100", annotations={"phalanx.io/migProfile": "1g.10gb"}))
    r = wait(
        "FailedScheduling for the extra slice",
        lambda: [
            e["message"]
            for e in kube.request(
                "GET",
                f"/api/v1/namespaces/{NS}/events",
                query={"fieldSelector": "involvedObject.name=mig-one-too-many"},
            ).body["items"]
            if e["reason"] == "FailedScheduling"
        ],
    )
    assert any("not enough free MIG slices" in m for m in r), r
