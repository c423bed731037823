"""GPU demand of a pod, from every spelling Phalanx accepts, normalized to `GpuDemand`.

Accepted spellings (per pod; container requests and limits are summed, limits win):
- whole GPUs: resource `nvidia.com/gpu: N`;
- KAI-style annotations: `gpu-fraction` (0 < f <= 1 of one device), `gpu-memory` (MiB of one
  device), `gpu-fraction-num-devices` (the same share on N devices);
- HAMi-style resources: `nvidia.com/gpumem` (MiB per device), `nvidia.com/gpucores` (percent of
  a device), with `nvidia.com/gpu: N` as the number of shared devices;
- static MIG (mixed strategy): resource `nvidia.com/mig-<profile>: N`.
Conflicting spellings are rejected with a reason naming the fields.
"""

from __future__ import annotations

from typing import Any

from extender import quantity
from solver.model import FULL_SHARE, GpuDemand

GPU = "nvidia.com/gpu"
GPUMEM = "nvidia.com/gpumem"
GPUCORES = "nvidia.com/gpucores"
MIG_PREFIX = "nvidia.com/mig-"
FRACTION = "gpu-fraction"
MEMORY = "gpu-memory"
NUM_DEVICES = "gpu-fraction-num-devices"
#: Resources the extender accounts for itself; they are never passed to the solver as scalars.
MANAGED = (GPU, GPUMEM, GPUCORES)


class DemandError(ValueError):
    """A pod's GPU request is malformed or contradictory; the message names the fields."""


def container_resources(pod: dict[str, Any]) -> dict[str, str]:
    """Per-resource totals over the pod's containers (limit, else request)."""
    totals: dict[str, Any] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        merged = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        for name, value in merged.items():
            totals[name] = totals.get(name, 0) + quantity.parse(value)
    return {k: str(v) for k, v in totals.items()}


def demand(pod: dict[str, Any], resources: dict[str, str] | None = None) -> GpuDemand:
    resources = container_resources(pod) if resources is None else resources
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    gpus = quantity.count(resources.get(GPU, 0))
    mig = {k[len(MIG_PREFIX) :]: quantity.count(v) for k, v in resources.items() if k.startswith(MIG_PREFIX)}
    mig = {k: v for k, v in mig.items() if v > 0}
    fraction, memory = annotations.get(FRACTION), annotations.get(MEMORY)
    hami_mem, hami_cores = resources.get(GPUMEM), resources.get(GPUCORES)
    spellings = [
        name
        for name, present in (
            ("mig", bool(mig)),
            ("annotations gpu-fraction/gpu-memory", fraction is not None or memory is not None),
            ("resources nvidia.com/gpumem/gpucores", hami_mem is not None or hami_cores is not None),
        )
        if present
    ]
    if len(spellings) > 1:
        raise DemandError(f"conflicting GPU requests: {' and '.join(spellings)}")
    if mig:
        return _mig(mig, gpus)
    if fraction is not None or memory is not None:
        return _kai(fraction, memory, annotations.get(NUM_DEVICES), gpus)
    if hami_mem is not None or hami_cores is not None:
        return _hami(hami_mem, hami_cores, gpus)
    return GpuDemand.whole(gpus) if gpus else GpuDemand()


def _mig(mig: dict[str, int], gpus: int) -> GpuDemand:
    if gpus:
        raise DemandError("conflicting GPU requests: nvidia.com/gpu and a MIG resource in one pod")
    if len(mig) > 1:
        raise DemandError(f"one MIG profile per pod is supported, got {sorted(mig)}")
    ((profile, n),) = mig.items()
    return GpuDemand.mig(profile, n)


def _kai(fraction: str | None, memory: str | None, devices: str | None, gpus: int) -> GpuDemand:
    if gpus:
        raise DemandError("conflicting GPU requests: nvidia.com/gpu and annotation gpu-fraction/gpu-memory")
    if fraction is not None and memory is not None:
        raise DemandError("conflicting GPU requests: annotations gpu-fraction and gpu-memory")
    count = _positive_int(devices, NUM_DEVICES) if devices is not None else 1
    if fraction is not None:
        try:
            value = float(fraction)
        except ValueError:
            raise DemandError(f"annotation gpu-fraction: {fraction!r} is not a number") from None
        if not 0 < value <= 1:
            raise DemandError(f"annotation gpu-fraction: {fraction!r} must be in (0, 1]")
        return GpuDemand.share(max(1, round(value * FULL_SHARE)), 0, count)
    mem = _mib(memory, MEMORY, plain_is_mib=True)
    return GpuDemand.share(0, mem, count)


def _hami(mem: str | None, cores: str | None, gpus: int) -> GpuDemand:
    count = gpus or 1
    mem_mib = _mib(mem, GPUMEM, plain_is_mib=True) if mem is not None else 0
    milli = 0
    if cores is not None:
        percent = quantity.count(cores)
        if not 0 < percent <= 100:
            raise DemandError(f"resource nvidia.com/gpucores: {cores!r} must be a percentage in (0, 100]")
        milli = percent * 10
    return GpuDemand.share(milli, mem_mib, count)


def _positive_int(text: str, field: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise DemandError(f"annotation {field}: {text!r} is not a whole number") from None
    if value < 1:
        raise DemandError(f"annotation {field}: {text!r} must be at least 1")
    return value


def _mib(text: str | None, field: str, *, plain_is_mib: bool) -> int:
    """GPU memory: a bare number means MiB (as KAI and HAMi write it); a suffix is a quantity."""
    assert text is not None
    try:
        value = quantity.mib(text) if not text.strip().isdigit() or not plain_is_mib else int(text)
    except ValueError:
        raise DemandError(f"{field}: {text!r} is not a memory size") from None
    if value <= 0:
        raise DemandError(f"{field}: {text!r} must be positive")
    return value
