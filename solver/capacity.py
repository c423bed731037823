"""How many pods of one shape fit on one node, and which devices they take.

`NodeState` is the mutable free capacity of one node during a solve (the greedy baseline and
the device phase consume from it); `capacity()` answers "how many pods of this shape fit" in
constant time per device. For a single shape the answer is exact, which is what makes the
aggregated CP-SAT model exact for single-group gangs: whole GPUs count idle devices, shares
count per-device fits, MIG counts free slices of the profile.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

from solver import frag, mig
from solver.frag import WorkloadClass
from solver.mig import MigSlot, MigTable
from solver.model import FULL_SHARE, DeviceAssignment, GpuDevice, GpuKind, MigSlice, Node, PodShape, Resources

UNLIMITED = 1 << 30


@dataclass(slots=True)
class DeviceState:
    """One device's free capacity, consumed step by step (solver phases, the extender cache)."""

    index: int
    model: str
    memory_mib: int
    free_milli: int
    free_memory_mib: int
    mig: dict[str, int]
    tflops: int = 0
    free_tflops: int = 0
    partition: MigTable | None = None
    layout: tuple[MigSlot, ...] = ()

    @staticmethod
    def of(d: GpuDevice) -> DeviceState:
        return DeviceState(
            d.index,
            d.model,
            d.memory_mib,
            d.free_milli,
            d.free_memory_mib,
            {s.profile: s.free for s in d.mig},
            d.tflops,
            d.free_tflops,
            d.partition,
            d.mig_layout,
        )

    def copy(self) -> DeviceState:
        twin = copy.copy(self)
        twin.mig = dict(self.mig)
        return twin

    def freeze(self) -> GpuDevice:
        return GpuDevice(
            self.index,
            self.model,
            self.memory_mib,
            max(0, self.free_milli),
            max(0, self.free_memory_mib),
            tuple(MigSlice(p, max(0, n)) for p, n in self.mig.items()),
            self.tflops,
            max(0, self.free_tflops),
            self.partition,
            self.layout,
        )

    @property
    def idle(self) -> bool:
        return (
            not self.mig
            and not self.layout
            and self.free_milli == FULL_SHARE
            and self.free_memory_mib == self.memory_mib
            and self.free_tflops == self.tflops
        )

    def share_fits(self, milli: int, memory_mib: int, tflops: int = 0) -> int:
        """How many (milli, memory, TFLOPs) shares still fit on this device."""
        if self.mig or self.layout or not (milli or memory_mib or tflops):
            return 0
        by_share = self.free_milli // milli if milli else UNLIMITED
        by_memory = self.free_memory_mib // memory_mib if memory_mib else UNLIMITED
        by_tflops = self.free_tflops // tflops if tflops else UNLIMITED
        return max(0, min(by_share, by_memory, by_tflops))

    def mig_count(self, profile: str) -> int:
        """Slices of `profile` still available: static free slices plus what a dynamic
        partition can still cut."""
        static = self.mig.get(profile, 0)
        if self.partition is not None and (self.layout or self.idle):
            return static + mig.capacity(self.partition, self.layout, profile)
        return static

    def consume(self, a: DeviceAssignment) -> None:
        """Take what one assignment grants (no check: the caller decided it fits)."""
        if a.mig_profile and a.mig_start >= 0:
            self.layout = (*self.layout, MigSlot(a.mig_profile, a.mig_start))
        elif a.mig_profile:
            self.mig[a.mig_profile] = self.mig.get(a.mig_profile, 0) - 1
        elif a.milli >= FULL_SHARE:  # whole, or a full share: nothing is left to share
            self.free_milli, self.free_memory_mib, self.free_tflops = 0, 0, 0
        else:
            self.free_milli -= a.milli
            self.free_memory_mib -= a.memory_mib
            self.free_tflops -= a.tflops


class NodeState:
    """Free capacity of one node that a solve consumes step by step."""

    __slots__ = ("cpu", "devices", "extended", "memory", "name", "pods")

    def __init__(self, node: Node) -> None:
        free = node.free
        self.name = node.name
        self.cpu = free.cpu_milli
        self.memory = free.memory_mib
        self.pods = free.pods
        self.extended = dict(free.extended)
        self.devices = [DeviceState.of(d) for d in node.gpus]

    def scalar_fit(self, shape: PodShape) -> int:
        req = shape.requests
        fit = UNLIMITED
        if req.cpu_milli > 0:
            fit = min(fit, self.cpu // req.cpu_milli)
        if req.memory_mib > 0:
            fit = min(fit, self.memory // req.memory_mib)
        if req.pods > 0:
            fit = min(fit, self.pods // req.pods)
        for key, value in req.extended:
            if value > 0:
                fit = min(fit, self.extended.get(key, 0) // value)
        return max(0, fit)

    def _devices_for(self, shape: PodShape) -> list[DeviceState]:
        models = shape.gpu_models
        if models is None:
            return self.devices
        return [d for d in self.devices if d.model in models]

    def gpu_fit(self, shape: PodShape) -> int:
        demand = shape.gpu
        kind = demand.kind
        if kind is GpuKind.NONE:
            return UNLIMITED
        devices = self._devices_for(shape)
        if kind is GpuKind.WHOLE:
            return sum(1 for d in devices if d.idle) // demand.count
        if kind is GpuKind.MIG:
            return sum(d.mig_count(demand.mig_profile) for d in devices) // demand.count
        fits = [d.share_fits(demand.milli, demand.memory_mib, demand.tflops) for d in devices]
        return _multi_device_fit(fits, demand.count)

    def capacity(self, shape: PodShape) -> int:
        """Pods of `shape` that fit on this node as it is now."""
        return min(self.scalar_fit(shape), self.gpu_fit(shape))

    def take(
        self,
        shape: PodShape,
        *,
        spread: bool = False,
        workload: Sequence[WorkloadClass] = (),
        lead: Sequence[int] = (),
    ) -> tuple[DeviceAssignment, ...] | None:
        """Consume one pod of `shape`; returns its devices, or None (nothing changed) if it
        does not fit. Shares go best-fit (fullest device that fits) unless `spread`; with a
        target `workload` (and not spreading), whole and share pods take the devices where its
        fragmentation grows least (`frag.preferred_devices`). Devices in `lead` (a packing
        plan's choice, solver.packing) are tried before all others, in order."""
        if self.capacity(shape) < 1:
            return None
        prefer = frag.preferred_devices(self.as_node(), shape, workload) if workload and not spread else ()
        if lead:
            prefer = (*lead, *(i for i in prefer if i not in lead))
        devices = self._pick_devices(shape, spread=spread, prefer=prefer)
        req = shape.requests
        self.cpu -= req.cpu_milli
        self.memory -= req.memory_mib
        self.pods -= req.pods
        for key, value in req.extended:
            self.extended[key] = self.extended.get(key, 0) - value
        return devices

    def as_node(self) -> Node:
        """The free capacity as a solver `Node` (for measures that read `Node`s)."""
        return Node(
            self.name, Resources(self.cpu, self.memory, self.pods), gpus=tuple(d.freeze() for d in self.devices)
        )

    def _pick_devices(
        self, shape: PodShape, *, spread: bool, prefer: tuple[int, ...] = ()
    ) -> tuple[DeviceAssignment, ...]:
        if prefer:
            chosen = self._pick_preferred(shape, {index: i for i, index in enumerate(prefer)})
            if chosen is not None:
                return chosen
        return self._pick_default(shape, spread=spread)

    def _pick_preferred(self, shape: PodShape, rank: dict[int, int]) -> tuple[DeviceAssignment, ...] | None:
        demand = shape.gpu
        if demand.kind not in (GpuKind.WHOLE, GpuKind.SHARE):
            return None
        devices = sorted((d for d in self._devices_for(shape) if d.index in rank), key=lambda d: rank[d.index])
        if demand.kind is GpuKind.WHOLE:
            chosen = [d for d in devices if d.idle]
            grants = [DeviceAssignment(d.index, FULL_SHARE, d.memory_mib) for d in chosen]
        else:
            chosen = [d for d in devices if d.share_fits(demand.milli, demand.memory_mib, demand.tflops) > 0]
            grants = [DeviceAssignment(d.index, demand.milli, demand.memory_mib, tflops=demand.tflops) for d in chosen]
        if len(chosen) < demand.count:
            return None
        for d, a in zip(chosen[: demand.count], grants[: demand.count], strict=True):
            d.consume(a)
        return tuple(grants[: demand.count])

    def _pick_default(self, shape: PodShape, *, spread: bool) -> tuple[DeviceAssignment, ...]:
        demand = shape.gpu
        kind = demand.kind
        if kind is GpuKind.NONE:
            return ()
        devices = self._devices_for(shape)
        if kind is GpuKind.WHOLE:
            chosen = [d for d in devices if d.idle][: demand.count]
            whole = tuple(DeviceAssignment(d.index, FULL_SHARE, d.memory_mib) for d in chosen)
            for d, a in zip(chosen, whole, strict=True):
                d.consume(a)
            return whole
        if kind is GpuKind.MIG:
            return self._pick_mig(devices, demand.mig_profile, demand.count)
        fitting = [d for d in devices if d.share_fits(demand.milli, demand.memory_mib, demand.tflops) > 0]
        # Best fit: fullest device first keeps idle devices whole for whole-GPU pods.
        fitting.sort(key=lambda d: (d.idle, d.free_milli, d.free_memory_mib, d.free_tflops, d.index))
        if spread:
            fitting.sort(key=lambda d: (-d.free_milli, -d.free_memory_mib, -d.free_tflops, d.index))
        out = []
        for d in fitting[: demand.count]:
            a = DeviceAssignment(d.index, demand.milli, demand.memory_mib, tflops=demand.tflops)
            d.consume(a)
            out.append(a)
        return tuple(out)

    @staticmethod
    def _pick_mig(devices: list[DeviceState], profile: str, count: int) -> tuple[DeviceAssignment, ...]:
        """Static slices first (fewest free first: keeps whole partitions free elsewhere), then
        dynamic cuts where they cost the largest profiles least (`mig.best_device`)."""
        out: list[DeviceAssignment] = []
        for d in sorted(devices, key=lambda d: (d.mig.get(profile, 0), d.index)):
            while d.mig.get(profile, 0) > 0 and len(out) < count:
                a = DeviceAssignment(d.index, 0, 0, profile)
                d.consume(a)
                out.append(a)
        while len(out) < count:
            cuttable = [(d, d.partition) for d in devices if d.partition is not None and (d.layout or d.idle)]
            choice = mig.best_device([mig.MigDevice(table, d.layout) for d, table in cuttable], profile)
            if choice is None:
                break
            device = cuttable[choice.index][0]
            for slot in choice.slots:
                a = DeviceAssignment(device.index, 0, 0, profile, mig_start=slot.start)
                device.consume(a)
                out.append(a)
        return tuple(out)

    def idle_gpus(self) -> int:
        return sum(1 for d in self.devices if d.idle)


def _multi_device_fit(fits: list[int], per_pod: int) -> int:
    """Pods needing `per_pod` distinct devices each, given per-device fits: the largest t
    with sum(min(fit, t)) >= per_pod * t."""
    if per_pod == 1:
        return sum(fits)
    t = sum(fits) // per_pod
    while t > 0 and sum(min(f, t) for f in fits) < per_pod * t:
        t -= 1
    return t


def eligible(node: Node, shape: PodShape) -> bool:
    """Static eligibility (not capacity): cordon, allowed set, GPU model."""
    if node.unschedulable:
        return False
    if shape.allowed_nodes is not None and node.name not in shape.allowed_nodes:
        return False
    if shape.gpu.count and shape.gpu_models is not None:
        return any(d.model in shape.gpu_models for d in node.gpus)
    return True


def clone_state(state: NodeState) -> NodeState:
    twin = NodeState.__new__(NodeState)
    twin.name, twin.cpu, twin.memory, twin.pods = state.name, state.cpu, state.memory, state.pods
    twin.extended = dict(state.extended)
    twin.devices = [d.copy() for d in state.devices]
    return twin
