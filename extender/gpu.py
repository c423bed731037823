"""GPU demand of a pod, from every spelling Phalanx accepts, normalized to `GpuDemand`.

Accepted spellings (per pod; container requests and limits are summed, limits win). One
spelling per pod; mixing two is rejected with a reason naming the fields of both:
- whole GPUs: resource `nvidia.com/gpu: N`;
- KAI-style annotations: `gpu-fraction` (0 < f <= 1 of one device), `gpu-memory` (MiB of one
  device), `gpu-fraction-num-devices` (the same share on N devices);
- HAMi-style resources: `nvidia.com/gpumem` (MiB per device), `nvidia.com/gpucores` (percent of
  a device), with `nvidia.com/gpu: N` as the number of shared devices;
- TensorFusion-style annotations: `tensor-fusion.ai/tflops-request` (TFLOPs per device, a
  quantity: "20", "71200m"), `tensor-fusion.ai/vram-request` (GPU memory per device: "4Gi"),
  `tensor-fusion.ai/gpu-count` (devices, default 1); the `-limit` twins must not be below them;
- workload-policy compute fields as pod annotations `phalanx.io/<field>`: `gpuDeviceRequest`
  (devices), `gpuRequestType` (portion | memory | migProfile), `gpuPortionRequest` (0..1 per
  device, or "500m"; a whole number > 1 without a device count means whole GPUs, as the policy
  reference keeps for compatibility), `gpuMemoryRequest` (per device: "10Gi", bare = MiB),
  `migProfile`, `gpuPortionLimit` / `gpuMemoryLimit` (not below the request);
- MIG (mixed strategy): resource `nvidia.com/mig-<profile>: N`. On nodes with static MIG the
  slices exist; on dynamic-MIG nodes the solver picks the GPU and position.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from extender import quantity
from solver import FULL_SHARE, GpuDemand

GPU = "nvidia.com/gpu"
GPUMEM = "nvidia.com/gpumem"
GPUCORES = "nvidia.com/gpucores"
MIG_PREFIX = "nvidia.com/mig-"
FRACTION = "gpu-fraction"
MEMORY = "gpu-memory"
NUM_DEVICES = "gpu-fraction-num-devices"
TF_TFLOPS = "tensor-fusion.ai/tflops-request"
TF_VRAM = "tensor-fusion.ai/vram-request"
TF_TFLOPS_LIMIT = "tensor-fusion.ai/tflops-limit"
TF_VRAM_LIMIT = "tensor-fusion.ai/vram-limit"
TF_COUNT = "tensor-fusion.ai/gpu-count"
POLICY_PREFIX = "phalanx.io/"
POLICY_FIELDS = (
    "gpuDeviceRequest",
    "gpuRequestType",
    "gpuPortionRequest",
    "gpuPortionLimit",
    "gpuMemoryRequest",
    "gpuMemoryLimit",
    "migProfile",
)
REQUEST_TYPES = ("portion", "memory", "migProfile")
#: Resources the extender accounts for itself; they are never passed to the solver as scalars.
MANAGED = (GPU, GPUMEM, GPUCORES)


def profile_of(resource: str) -> str:
    """MIG profile of a resource name: the device plugin writes a profile's "+" as "." (resource
    names allow no "+"), so `nvidia.com/mig-1g.10gb.me` is profile `1g.10gb+me`."""
    profile = resource[len(MIG_PREFIX) :]
    return profile[:-3] + "+me" if profile.endswith(".me") else profile


def mig_resource(profile: str) -> str:
    """The resource name of a MIG profile (inverse of `profile_of`)."""
    return MIG_PREFIX + profile.replace("+", ".")


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
    if gpus < 0:
        raise DemandError(f"{GPU} must not be negative, not {resources.get(GPU)!r}")
    mig = {profile_of(k): quantity.count(v) for k, v in resources.items() if k.startswith(MIG_PREFIX)}
    mig = {k: v for k, v in mig.items() if v > 0}
    fraction, memory = annotations.get(FRACTION), annotations.get(MEMORY)
    hami_mem, hami_cores = resources.get(GPUMEM), resources.get(GPUCORES)
    policy = {f: annotations[POLICY_PREFIX + f] for f in POLICY_FIELDS if POLICY_PREFIX + f in annotations}
    tf = {k: v for k, v in annotations.items() if k in (TF_TFLOPS, TF_VRAM, TF_TFLOPS_LIMIT, TF_VRAM_LIMIT, TF_COUNT)}
    spellings = [
        name
        for name, present in (
            ("MIG resource nvidia.com/mig-*", bool(mig)),
            ("annotations gpu-fraction/gpu-memory", fraction is not None or memory is not None),
            ("resources nvidia.com/gpumem/gpucores", hami_mem is not None or hami_cores is not None),
            ("annotations tensor-fusion.ai/*-request", bool(tf)),
            (f"annotations {', '.join(POLICY_PREFIX + f for f in policy)}", bool(policy)),
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
    if tf:
        return _tensor_fusion(tf, gpus)
    if policy:
        return _policy(policy, gpus)
    return GpuDemand.whole(gpus) if gpus else GpuDemand()


def _tensor_fusion(tf: dict[str, str], gpus: int) -> GpuDemand:
    if gpus:
        raise DemandError(f"conflicting GPU requests: {GPU} and annotations tensor-fusion.ai/*-request")
    if TF_TFLOPS not in tf and TF_VRAM not in tf:
        raise DemandError(f"annotations {TF_TFLOPS} or {TF_VRAM} required with the other tensor-fusion.ai fields")
    count = _positive_int(tf[TF_COUNT], TF_COUNT) if TF_COUNT in tf else 1
    tflops = _tflops(tf[TF_TFLOPS], TF_TFLOPS) if TF_TFLOPS in tf else 0
    vram = _mib(tf[TF_VRAM], TF_VRAM, plain_is_mib=False) if TF_VRAM in tf else 0
    if TF_TFLOPS_LIMIT in tf and _tflops(tf[TF_TFLOPS_LIMIT], TF_TFLOPS_LIMIT) < tflops:
        raise DemandError(f"annotation {TF_TFLOPS_LIMIT}: {tf[TF_TFLOPS_LIMIT]!r} is below {TF_TFLOPS}")
    if TF_VRAM_LIMIT in tf and _mib(tf[TF_VRAM_LIMIT], TF_VRAM_LIMIT, plain_is_mib=False) < vram:
        raise DemandError(f"annotation {TF_VRAM_LIMIT}: {tf[TF_VRAM_LIMIT]!r} is below {TF_VRAM}")
    return GpuDemand.share(0, vram, count, tflops=tflops)


def _policy(fields: dict[str, str], gpus: int) -> GpuDemand:
    """The workload-policy compute fields (`phalanx.io/gpuPortionRequest`, ...)."""

    def name(f: str) -> str:
        return f"annotation {POLICY_PREFIX}{f}"

    devices = (
        _positive_int(fields["gpuDeviceRequest"], POLICY_PREFIX + "gpuDeviceRequest")
        if "gpuDeviceRequest" in fields
        else 0
    )
    if gpus and devices and gpus != devices:
        raise DemandError(f"conflicting GPU requests: {GPU}={gpus} and {name('gpuDeviceRequest')}={devices}")
    devices = devices or gpus
    given = [
        t
        for t, f in (("portion", "gpuPortionRequest"), ("memory", "gpuMemoryRequest"), ("migProfile", "migProfile"))
        if f in fields
    ]
    kind = fields.get("gpuRequestType", "")
    if kind and kind not in REQUEST_TYPES:
        raise DemandError(f"{name('gpuRequestType')}: {kind!r} must be one of {', '.join(REQUEST_TYPES)}")
    if kind and devices > 1:
        raise DemandError(f"{name('gpuRequestType')} may be set only when gpuDeviceRequest is 1, got {devices}")
    if len(given) > 1:
        if not kind:
            raise DemandError(f"{', '.join(given)} requested together: set {name('gpuRequestType')} to pick one")
        given = [kind]
    if kind and given != [kind]:
        raise DemandError(f"{name('gpuRequestType')} is {kind!r} but that field is not set")
    request = given[0] if given else ""
    if request == "migProfile":
        return GpuDemand.mig(fields["migProfile"].strip(), devices or 1)
    if request == "memory":
        mem = _mib(fields["gpuMemoryRequest"], POLICY_PREFIX + "gpuMemoryRequest", plain_is_mib=True)
        if (
            "gpuMemoryLimit" in fields
            and _mib(fields["gpuMemoryLimit"], POLICY_PREFIX + "gpuMemoryLimit", plain_is_mib=True) < mem
        ):
            raise DemandError(f"{name('gpuMemoryLimit')} is below gpuMemoryRequest")
        return GpuDemand.share(0, mem, devices or 1)
    if request == "portion":
        return _portion(fields, devices, name)
    if not devices:
        raise DemandError(f"{name('gpuDeviceRequest')} or a portion, memory or MIG request is required")
    return GpuDemand.whole(devices)


def _portion(fields: dict[str, str], devices: int, name: Callable[[str], str]) -> GpuDemand:
    text = fields["gpuPortionRequest"]
    try:
        value = quantity.parse(text)
    except ValueError:
        raise DemandError(f"{name('gpuPortionRequest')}: {text!r} is not a number") from None
    if value > 1:
        if devices or value != value.to_integral_value():
            raise DemandError(f"{name('gpuPortionRequest')}: {text!r} must be in (0, 1] per device")
        return GpuDemand.whole(int(value))  # compatibility: a device count in the portion field
    if value <= 0:
        raise DemandError(f"{name('gpuPortionRequest')}: {text!r} must be in (0, 1]")
    milli = max(1, round(value * FULL_SHARE))
    if "gpuPortionLimit" in fields:
        try:
            limit = quantity.parse(fields["gpuPortionLimit"])
        except ValueError:
            raise DemandError(f"{name('gpuPortionLimit')}: {fields['gpuPortionLimit']!r} is not a number") from None
        if limit < value:
            raise DemandError(f"{name('gpuPortionLimit')} is below gpuPortionRequest")
    return GpuDemand.whole(devices or 1) if milli >= FULL_SHARE else GpuDemand.share(milli, 0, devices or 1)


def _tflops(text: str, field: str) -> int:
    """TFLOPs as a quantity ("20", "71200m") in milli-TFLOPs."""
    try:
        value = quantity.milli(text)
    except ValueError:
        raise DemandError(f"annotation {field}: {text!r} is not a TFLOPs quantity") from None
    if value <= 0:
        raise DemandError(f"annotation {field}: {text!r} must be positive")
    return value


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
