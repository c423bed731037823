"""GPU pools and TFLOPs: oversubscription per pool, pool-bound pods, capacity summaries.

Cluster used below (A100 = 312 TFLOPs):

    pool "train"  (label pool=train, oversell 500 %):  t0 (1 GPU), t1 (1 GPU)
    no pool       (oversell 100 %):                    free0 (1 GPU)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from extender.app import Extender, Options
from extender.config import ConfigError, GpuConfig, parse
from extender.objects import DEVICES_ANNOTATION, decode_devices
from extender.pools import NOT_IN_POOL, UNKNOWN_POOL, Hardware
from solver import NodeState
from solver.model import GpuDemand, GpuDevice, Node, NodeName, PodShape, Resources
from tests.extender.fakes import FakeKube, node, pod, serving
from tests.extender.test_server import call

CONFIG = """
gpu:
  pools:
    - name: train
      spec:
        nodeManagerConfig:
          nodeSelector:
            nodeSelectorTerms:
              - matchExpressions: [{key: pool, operator: In, values: [train]}]
        capacityConfig: {oversubscription: {tflopsOversellRatio: 500}}
        schedulingConfig: {placement: {mode: LowLoadFirst}}
        qosConfig:
          defaultQoS: low
          definitions: [{name: low, priority: 1}, {name: high, priority: 50}]
"""


@pytest.fixture
def ext() -> Iterator[Extender]:
    extender = Extender(FakeKube(), Options(port=0))
    extender.apply(parse(CONFIG, source="test"))
    extender.cache.replace_nodes(
        [
            node("t0", gpus=1, labels={"pool": "train"}),
            node("t1", gpus=1, labels={"pool": "train"}),
            node("free0", gpus=1),
        ]
    )
    extender.cache.replace_pods([])
    with serving(extender):
        yield extender


def tflops_pod(name: str, tflops: str, pool: str = "", **extra: str) -> dict[str, Any]:
    annotations = {"tensor-fusion.ai/tflops-request": tflops, **extra}
    if pool:
        annotations["phalanx.io/gpu-pool"] = pool
    return pod(name, annotations=annotations)


def test_tflops_capacity_is_the_rating_times_the_pool_ratio(ext: Extender) -> None:
    """A100 devices offer 312 TFLOPs, 1,560 inside a 500 % pool."""
    pooled, plain = ext.cache.node_model("t0"), ext.cache.node_model("free0")
    assert pooled is not None and plain is not None
    assert pooled.gpus[0].tflops == 1_560_000
    assert plain.gpus[0].tflops == 312_000
    shape = PodShape(Resources(pods=1), GpuDemand.share(tflops=100_000))
    assert NodeState(pooled).capacity(shape) == 15
    assert NodeState(plain).capacity(shape) == 3


def test_unrated_models_do_not_take_tflops_requests() -> None:
    hardware = Hardware(GpuConfig())
    assert hardware.tflops("NVIDIA-Mystery-9000", None) == 0
    rating = hardware.tflops("NVIDIA-Mystery-9000", None)
    node = Node(
        NodeName("n"), Resources(1000, 1000, 10), gpus=(GpuDevice(0, "NVIDIA-Mystery-9000", 81920, tflops=rating),)
    )
    assert NodeState(node).capacity(PodShape(gpu=GpuDemand.share(tflops=1000))) == 0


def test_a_pool_pod_runs_only_on_its_pool_and_an_unknown_pool_is_named(ext: Extender) -> None:
    _, body = call(ext, "/filter", {"Pod": tflops_pod("p", "100", "train"), "NodeNames": ["t0", "t1", "free0"]})
    assert body["NodeNames"] in (["t0"], ["t1"])  # Phalanx picks one of the pool's nodes (filter.sampleNodes)
    assert body["FailedNodes"] == {"free0": f"{NOT_IN_POOL} train"}
    _, body = call(ext, "/filter", {"Pod": tflops_pod("q", "100", "nope"), "NodeNames": ["t0"]})
    assert body["NodeNames"] == []
    assert body["FailedAndUnresolvableNodes"] == {"t0": f"{UNKNOWN_POOL}: 'nope'"}  # no eviction defines it


def test_pool_pods_spread_with_low_load_first(ext: Extender) -> None:
    """The pool's LowLoadFirst mode scores the idle node above the used one (CompactFirst,
    the global default, would do the reverse)."""
    kube = ext.kube
    assert isinstance(kube, FakeKube)
    for i in range(3):
        obj = kube.pods[f"default/a{i}"] = tflops_pod(f"a{i}", "100", "train")
        ext.cache.pod_event("ADDED", obj)
        assert (
            ext.verbs.bind({"PodNamespace": "default", "PodName": f"a{i}", "PodUID": f"uid-a{i}", "Node": "t0"})[
                "Error"
            ]
            == ""
        )
    scores = orjson.loads(
        orjson.dumps(ext.verbs.prioritize({"Pod": tflops_pod("b", "1", "train"), "NodeNames": ["t0", "t1"]}))
    )
    assert [s["Host"] for s in scores] == ["t1"]


def test_pool_summary_counts_tflops_and_vram_allocated(ext: Extender) -> None:
    kube = ext.kube
    assert isinstance(kube, FakeKube)
    obj = tflops_pod("p", "200", "train", **{"tensor-fusion.ai/vram-request": "10Gi"})
    kube.pods["default/p"] = obj
    ext.cache.replace_pods([obj])
    reply = ext.verbs.bind({"PodNamespace": "default", "PodName": "p", "PodUID": "uid-p", "Node": "t0"})
    assert reply == {"Error": ""}
    devices = decode_devices(obj["metadata"]["annotations"][DEVICES_ANNOTATION])
    assert devices is not None and devices[0].tflops == 200_000 and devices[0].memory_mib == 10240
    status, body = call(ext, "/api/v1/pools/train")
    assert status == 200
    assert body["totalNodes"] == 2 and body["totalGPUs"] == 2
    assert body["totalTFlops"] == 624 and body["virtualTFlops"] == 3120
    assert body["allocatedTFlops"] == 200 and body["availableTFlops"] == 2920
    assert body["allocatedVRAMMiB"] == 10240 and body["placementMode"] == "LowLoadFirst"
    assert body["qos"] == {"low": 1, "high": 50}
    status, body = call(ext, "/api/v1/pools")
    assert [p["name"] for p in body["pools"]] == ["train", "-"]
    assert call(ext, "/api/v1/pools/none")[0] == 404


@pytest.mark.parametrize(
    ("case", "text", "field"),
    [
        (
            "ratio below 100 %",
            "gpu: {pools: [{name: a, spec: {nodeManagerConfig: {nodeSelector: {nodeSelectorTerms: [{}]}}, "
            "capacityConfig: {oversubscription: {tflopsOversellRatio: 50}}}}]}",
            "gpu.pools.0.spec.capacityConfig.oversubscription.tflopsOversellRatio",
        ),
        ("pool without node selector", "gpu: {pools: [{name: a, spec: {}}]}", "gpu.pools.0.spec.nodeManagerConfig"),
        (
            "unknown GPU filter",
            "gpu: {pools: [{name: a, spec: {nodeManagerConfig: {nodeSelector: {nodeSelectorTerms: [{}]}}, "
            "schedulingConfig: {placement: {gpuFilters: [{type: avoidHot, params: {}}]}}}}]}",
            "gpu.pools.0.spec.schedulingConfig.placement.gpuFilters.0.type",
        ),
        (
            "duplicate pool names",
            "gpu: {pools: [{name: a, spec: {nodeManagerConfig: {nodeSelector: {nodeSelectorTerms: [{}]}}}}, "
            "{name: a, spec: {nodeManagerConfig: {nodeSelector: {nodeSelectorTerms: [{}]}}}}]}",
            "gpu.pools",
        ),
    ],
)
def test_invalid_pools_are_rejected_with_the_field(case: str, text: str, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        parse(text, source="test")
