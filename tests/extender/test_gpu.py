"""Every accepted GPU spelling normalizes to the same demand; contradictions are rejected."""

from __future__ import annotations

from typing import Any

import pytest

from extender.gpu import DemandError, demand
from solver.model import GpuDemand


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
    ],
)
def test_contradictions_are_rejected_with_the_fields(case: str, obj: dict[str, Any], message: str) -> None:
    with pytest.raises(DemandError, match=message.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        demand(obj)
