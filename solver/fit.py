"""How many pods of one shape fit on one node: the one fit model.

Every question of fit goes through here: the CP-SAT preparation counts each node's capacity
per gang group from the snapshot (`node_fit`), the placers ask the free capacity a solve has
consumed so far (`NodeCapacity.capacity`, capacity.py), and the single-pod filter and its
reasons (single.py) ask one node. Devices answer for themselves (`DeviceFit`, device.py).

For one shape the count is exact: scalars divide, whole GPUs count idle devices, MIG counts
free slices of the profile, shares count per-device fits (several devices per pod: see
`_multi_device_fit`). This exactness is what makes the aggregated CP-SAT model exact for
single-group gangs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from solver.device import UNLIMITED, DeviceFit
from solver.model import GpuDemand, GpuKind, Node, PodShape, Resources

D = TypeVar("D", bound=DeviceFit)


def allowed(node: Node, shape: PodShape) -> bool:
    """The node is in the pod's allowed set (selector, affinity, taints, as the extender resolved)."""
    return shape.allowed_nodes is None or node.name in shape.allowed_nodes


def eligible(node: Node, shape: PodShape) -> bool:
    """Static eligibility (not capacity): cordon, allowed set, GPU model."""
    if node.unschedulable or not allowed(node, shape):
        return False
    if shape.gpu.count and shape.gpu_models is not None:
        return any(d.model in shape.gpu_models for d in node.gpus)
    return True


def allowed_devices(devices: Sequence[D], models: frozenset[str] | None) -> Sequence[D]:
    """The devices of an allowed model (all of them when the pod names no model)."""
    if models is None:
        return devices
    return [d for d in devices if d.model in models]


def scalar_fit(req: Resources, *, cpu: int, memory: int, pods: int, extended: Callable[[str], int]) -> int:
    """Pods of `req` that the free scalars hold; `extended(name)` is the free amount of an
    extended resource. A dimension the pod does not ask for does not limit it."""
    fit = UNLIMITED
    # Comparisons, not min(): this runs once per node and gang group when a solve is prepared.
    if req.cpu_milli > 0 and cpu // req.cpu_milli < fit:
        fit = cpu // req.cpu_milli
    if req.memory_mib > 0 and memory // req.memory_mib < fit:
        fit = memory // req.memory_mib
    if req.pods > 0 and pods // req.pods < fit:
        fit = pods // req.pods
    for key, value in req.extended:
        if value > 0 and extended(key) // value < fit:
            fit = extended(key) // value
    return max(0, fit)


@dataclass(frozen=True, slots=True)
class Shortfall:
    """A scalar resource that cannot hold one pod: its name, what is free, what one pod needs."""

    resource: str  # "cpu", "memory", "pods" or an extended resource's name
    free: int
    need: int


def scalar_shortfall(req: Resources, free: Resources) -> Shortfall | None:
    """The first dimension, in `scalar_fit`'s order, that holds no pod of `req`; None when
    every dimension holds one (the scalars fit)."""
    dimensions = (
        ("cpu", free.cpu_milli, req.cpu_milli),
        ("memory", free.memory_mib, req.memory_mib),
        ("pods", free.pods, req.pods),
        *((key, free.get(key), value) for key, value in req.extended),
    )
    for resource, amount, need in dimensions:
        if need > 0 and amount // need < 1:
            return Shortfall(resource, amount, need)
    return None


def gpu_fit(devices: Sequence[DeviceFit], demand: GpuDemand) -> int:
    """Pods of `demand` that `devices` (already filtered by model) hold."""
    kind = demand.kind
    if kind is GpuKind.NONE:
        return UNLIMITED
    if kind is GpuKind.WHOLE:
        return sum(1 for d in devices if d.is_idle) // demand.count
    if kind is GpuKind.MIG:
        return sum(d.mig_free(demand.mig_profile) for d in devices) // demand.count
    fits = [d.share_fits(demand.milli, demand.memory_mib, demand.tflops) for d in devices]
    return _multi_device_fit(fits, demand.count)


def node_fit(node: Node, shape: PodShape) -> int:
    """Pods of `shape` that fit on an eligible `node` as the snapshot has it."""
    alloc, used = node.allocatable, node.used
    fit = scalar_fit(
        shape.requests,
        cpu=alloc.cpu_milli - used.cpu_milli,
        memory=alloc.memory_mib - used.memory_mib,
        pods=alloc.pods - used.pods,
        extended=node.free_of,
    )
    if fit <= 0:
        return 0
    demand = shape.gpu
    if demand.kind is GpuKind.WHOLE and shape.gpu_models is None:
        return min(fit, node.idle_gpus // demand.count)  # counted once, when the node was built
    return min(fit, gpu_fit(allowed_devices(node.gpus, shape.gpu_models), demand))


def fits(node: Node, shape: PodShape) -> bool:
    """One pod of `shape` fits on `node` now."""
    return eligible(node, shape) and node_fit(node, shape) > 0


def _multi_device_fit(fits: list[int], per_pod: int) -> int:
    """Pods needing `per_pod` distinct devices each, given per-device fits: the largest t
    with sum(min(fit, t)) >= per_pod * t."""
    if per_pod == 1:
        return sum(fits)
    t = sum(fits) // per_pod
    while t > 0 and sum(min(f, t) for f in fits) < per_pod * t:
        t -= 1
    return t
