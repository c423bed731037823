"""Every accepted GPU spelling normalizes to the same demand; contradictions are rejected."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.gpu import DemandError, demand
from extender.objects import pod_info
from solver import NodeState
from solver.model import GpuDemand, GpuDevice, Node, NodeName, PodShape, Resources


def pod(annotations: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"annotations": annotations or {}},
        "spec": {"containers": [{"resources": {"limits": limits or {}}}]},
    }


@pytest.mark.parametrize(
    ("spelling", "obj", "expected"),
    [
        ("no GPU", pod(limits={"cpu": "2"}), GpuDemand()),
        ("whole GPUs", pod(limits={"nvidia.com/gpu": "4"}), GpuDemand.whole(4)),
        ("KAI fraction", pod({"gpu-fraction": "0.5"}), GpuDemand.share(500)),
        (
            "KAI fraction on two devices",
            pod({"gpu-fraction": "0.25", "gpu-fraction-num-devices": "2"}),
            GpuDemand.share(250, 0, 2),
        ),
        ("KAI memory (MiB)", pod({"gpu-memory": "10240"}), GpuDemand.share(0, 10240)),
        ("KAI memory with a suffix", pod({"gpu-memory": "10Gi"}), GpuDemand.share(0, 10240)),
        ("HAMi memory", pod(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240"}), GpuDemand.share(0, 10240)),
        ("HAMi cores", pod(limits={"nvidia.com/gpucores": "50"}), GpuDemand.share(500)),
        (
            "HAMi on two devices",
            pod(limits={"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "25"}),
            GpuDemand.share(250, 4096, 2),
        ),
        ("static MIG", pod(limits={"nvidia.com/mig-1g.10gb": "1"}), GpuDemand.mig("1g.10gb")),
        ("MIG with media extensions", pod(limits={"nvidia.com/mig-1g.10gb.me": "1"}), GpuDemand.mig("1g.10gb+me")),
        ("TensorFusion TFLOPs", pod({"tensor-fusion.ai/tflops-request": "71200m"}), GpuDemand.share(tflops=71200)),
        (
            "TensorFusion TFLOPs and VRAM on two devices",
            pod(
                {
                    "tensor-fusion.ai/tflops-request": "20",
                    "tensor-fusion.ai/vram-request": "4Gi",
                    "tensor-fusion.ai/vram-limit": "8Gi",
                    "tensor-fusion.ai/gpu-count": "2",
                }
            ),
            GpuDemand.share(0, 4096, 2, tflops=20000),
        ),
        ("policy portion", pod({"phalanx.io/gpuPortionRequest": "0.5"}), GpuDemand.share(500)),
        ("policy portion in milli", pod({"phalanx.io/gpuPortionRequest": "500m"}), GpuDemand.share(500)),
        (
            "policy portion on three devices",
            pod({"phalanx.io/gpuPortionRequest": "0.25", "phalanx.io/gpuDeviceRequest": "3"}),
            GpuDemand.share(250, 0, 3),
        ),
        ("policy whole devices", pod({"phalanx.io/gpuDeviceRequest": "2"}), GpuDemand.whole(2)),
        ("policy portion as a device count", pod({"phalanx.io/gpuPortionRequest": "2"}), GpuDemand.whole(2)),
        (
            "policy memory with request type",
            pod(
                {
                    "phalanx.io/gpuRequestType": "memory",
                    "phalanx.io/gpuMemoryRequest": "10Gi",
                    "phalanx.io/gpuDeviceRequest": "1",
                }
            ),
            GpuDemand.share(0, 10240),
        ),
        ("policy MIG profile", pod({"phalanx.io/migProfile": "3g.40gb"}), GpuDemand.mig("3g.40gb")),
    ],
)
def test_spellings_normalize(spelling: str, obj: dict[str, Any], expected: GpuDemand) -> None:
    assert demand(obj) == expected


@pytest.mark.parametrize(
    ("case", "obj", "message"),
    [
        (
            "fraction and whole GPUs",
            pod({"gpu-fraction": "0.5"}, {"nvidia.com/gpu": "1"}),
            "nvidia.com/gpu and annotation",
        ),
        ("fraction and memory", pod({"gpu-fraction": "0.5", "gpu-memory": "100"}), "gpu-fraction and gpu-memory"),
        ("fraction above one", pod({"gpu-fraction": "1.5"}), "must be in (0, 1]"),
        ("fraction not a number", pod({"gpu-fraction": "half"}), "is not a number"),
        ("zero devices", pod({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "0"}), "at least 1"),
        ("MIG and KAI", pod({"gpu-fraction": "0.5"}, {"nvidia.com/mig-1g.10gb": "1"}), "conflicting"),
        (
            "two MIG profiles",
            pod(limits={"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-3g.40gb": "1"}),
            "one MIG profile",
        ),
        ("cores above 100", pod(limits={"nvidia.com/gpucores": "150"}), "percentage"),
        (
            "TensorFusion and KAI",
            pod({"tensor-fusion.ai/tflops-request": "10", "gpu-fraction": "0.5"}),
            "gpu-fraction/gpu-memory and annotations tensor-fusion.ai",
        ),
        (
            "TensorFusion limit below request",
            pod({"tensor-fusion.ai/vram-request": "8Gi", "tensor-fusion.ai/vram-limit": "4Gi"}),
            "vram-limit",
        ),
        ("TensorFusion TFLOPs not a quantity", pod({"tensor-fusion.ai/tflops-request": "lots"}), "not a TFLOPs"),
        (
            "policy portion and memory without a type",
            pod({"phalanx.io/gpuPortionRequest": "0.5", "phalanx.io/gpuMemoryRequest": "1Gi"}),
            "set annotation phalanx.io/gpuRequestType",
        ),
        (
            "policy request type with several devices",
            pod(
                {
                    "phalanx.io/gpuRequestType": "portion",
                    "phalanx.io/gpuPortionRequest": "0.5",
                    "phalanx.io/gpuDeviceRequest": "2",
                }
            ),
            "only when gpuDeviceRequest is 1",
        ),
        (
            "policy request type names an unset field",
            pod({"phalanx.io/gpuRequestType": "memory", "phalanx.io/gpuPortionRequest": "0.5"}),
            "is 'memory' but that field is not set",
        ),
        ("policy portion above one per device", pod({"phalanx.io/gpuPortionRequest": "1.5"}), "must be in (0, 1]"),
        (
            "policy portion limit below request",
            pod({"phalanx.io/gpuPortionRequest": "0.5", "phalanx.io/gpuPortionLimit": "0.25"}),
            "gpuPortionLimit is below",
        ),
        (
            "policy device count disagrees with nvidia.com/gpu",
            pod({"phalanx.io/gpuDeviceRequest": "2"}, {"nvidia.com/gpu": "4"}),
            "nvidia.com/gpu=4 and annotation phalanx.io/gpuDeviceRequest=2",
        ),
        ("policy and HAMi", pod({"phalanx.io/gpuPortionRequest": "0.5"}, {"nvidia.com/gpucores": "50"}), "conflicting"),
    ],
)
def test_contradictions_are_rejected_with_the_fields(case: str, obj: dict[str, Any], message: str) -> None:
    with pytest.raises(DemandError, match=message.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        demand(obj)


SAME_REQUEST = {
    "half a GPU": [
        pod({"gpu-fraction": "0.5"}),
        pod(limits={"nvidia.com/gpucores": "50"}),
        pod({"phalanx.io/gpuPortionRequest": "0.5"}),
        pod({"phalanx.io/gpuPortionRequest": "500m", "phalanx.io/gpuRequestType": "portion"}),
    ],
    "a quarter on two GPUs": [
        pod({"gpu-fraction": "0.25", "gpu-fraction-num-devices": "2"}),
        pod(limits={"nvidia.com/gpu": "2", "nvidia.com/gpucores": "25"}),
        pod({"phalanx.io/gpuPortionRequest": "0.25", "phalanx.io/gpuDeviceRequest": "2"}),
    ],
    "20 GiB of one GPU": [
        pod({"gpu-memory": "20480"}),
        pod({"gpu-memory": "20Gi"}),
        pod(limits={"nvidia.com/gpumem": "20480"}),
        pod({"tensor-fusion.ai/vram-request": "20Gi"}),
        pod({"phalanx.io/gpuMemoryRequest": "20Gi"}),
    ],
    "two whole GPUs": [
        pod(limits={"nvidia.com/gpu": "2"}),
        pod({"phalanx.io/gpuDeviceRequest": "2"}),
        pod({"phalanx.io/gpuPortionRequest": "2"}),
    ],
}


@pytest.mark.parametrize("request_name", sorted(SAME_REQUEST))
@given(free=st.lists(st.integers(0, 1000), min_size=4, max_size=8), seed=st.integers(0, 3))
@settings(max_examples=40, deadline=None)
def test_every_spelling_gives_the_same_placement(request_name: str, free: list[int], seed: int) -> None:
    """On any partly used node, every spelling of one request takes the same devices."""
    gpus = tuple(
        GpuDevice(i, "A100", 81920, f, 81920 * f // 1000, tflops=312_000, free_tflops=312_000 * f // 1000)
        for i, f in enumerate(free)
    )
    node = Node(NodeName("n"), Resources(64_000, 1 << 20, 110), gpus=gpus)
    placements = set()
    for obj in SAME_REQUEST[request_name]:
        info = pod_info(obj)  # the extender's own parsing: scalar requests and GPU demand
        shape = PodShape(info.requests, info.demand)
        placements.add(NodeState(node).take(shape, spread=seed % 2 == 1))
    assert len(placements) == 1
