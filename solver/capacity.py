"""Free capacity consumed step by step: one device (`DeviceState`) and one node
(`NodeCapacity`), and the default device choice when a pod takes some.

A solve (the ledger) and the extender's cache start from the snapshot's immutable `Node` and
consume pods from it. How many pods still fit is the fit model's answer (fit.py) over what is
left; which devices a pod takes is decided here: whole GPUs the first idle ones, shares best
fit (or the freest when spreading), MIG slices static first, then dynamic cuts where they cost
the largest profiles least. A preferred device order (packing lead, fragmentation) comes from
above (`NodeState`, preference.py): this module knows nothing of workloads.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

from solver import fit, mig
from solver.device import FULL_SHARE, DeviceFit
from solver.mig import MigSlot, MigTable
from solver.model import DeviceAssignment, GpuDevice, GpuKind, MigSlice, Node, PodShape, Resources


@dataclass(slots=True)
class DeviceState(DeviceFit):
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
    mig_layout: tuple[MigSlot, ...] = ()

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
            self.mig_layout,
        )

    def static_free(self, profile: str) -> int:
        return self.mig.get(profile, 0)

    def consume(self, a: DeviceAssignment) -> None:
        """Take what one assignment grants (no check: the caller decided it fits)."""
        if a.mig_profile and a.mig_start >= 0:
            self.mig_layout = (*self.mig_layout, MigSlot(a.mig_profile, a.mig_start))
        elif a.mig_profile:
            self.mig[a.mig_profile] = self.mig.get(a.mig_profile, 0) - 1
        elif a.milli >= FULL_SHARE:  # whole, or a full share: nothing is left to share
            self.free_milli, self.free_memory_mib, self.free_tflops = 0, 0, 0
        else:
            self.free_milli -= a.milli
            self.free_memory_mib -= a.memory_mib
            self.free_tflops -= a.tflops


class NodeCapacity:
    """Free capacity of one node, consumed pod by pod (`NodeState` adds device preferences)."""

    __slots__ = ("cpu", "devices", "extended", "memory", "name", "pods")

    def __init__(self, node: Node) -> None:
        free = node.free
        self.name = node.name
        self.cpu = free.cpu_milli
        self.memory = free.memory_mib
        self.pods = free.pods
        self.extended = dict(free.extended)
        self.devices = [DeviceState.of(d) for d in node.gpus]

    def copy(self) -> Self:
        """An independent twin (a ledger's savepoint)."""
        twin = type(self).__new__(type(self))
        twin.name, twin.cpu, twin.memory, twin.pods = self.name, self.cpu, self.memory, self.pods
        twin.extended = dict(self.extended)
        twin.devices = [d.copy() for d in self.devices]
        return twin

    def capacity(self, shape: PodShape) -> int:
        """Pods of `shape` that fit on this node as it is now."""
        scalars = fit.scalar_fit(
            shape.requests, cpu=self.cpu, memory=self.memory, pods=self.pods, extended=self._free_extended
        )
        return min(scalars, fit.gpu_fit(fit.allowed_devices(self.devices, shape.gpu_models), shape.gpu))

    def _free_extended(self, name: str) -> int:
        return self.extended.get(name, 0)

    def take_preferring(
        self, shape: PodShape, *, spread: bool = False, prefer: tuple[int, ...] = ()
    ) -> tuple[DeviceAssignment, ...] | None:
        """Consume one pod of `shape`; returns its devices, or None (nothing changed) if it
        does not fit. Whole and share pods take the devices of `prefer` first, in order, when
        enough of them fit; otherwise shares go best fit (fullest device that fits) unless
        `spread` (freest first)."""
        if self.capacity(shape) < 1:
            return None
        return self._consume(shape, spread=spread, prefer=prefer)

    def consume_exactly(self, shape: PodShape, devices: tuple[DeviceAssignment, ...]) -> None:
        """Take one pod of `shape` on exactly `devices` (a member another phase placed)."""
        by_index = {d.index: d for d in self.devices}
        for a in devices:
            by_index[a.index].consume(a)
        self._scalars(shape)

    def _scalars(self, shape: PodShape) -> None:
        req = shape.requests
        self.cpu -= req.cpu_milli
        self.memory -= req.memory_mib
        self.pods -= req.pods
        for key, value in req.extended:
            self.extended[key] = self.extended.get(key, 0) - value

    def _consume(self, shape: PodShape, *, spread: bool, prefer: tuple[int, ...]) -> tuple[DeviceAssignment, ...]:
        """Take one pod that fits (the caller checked `capacity`)."""
        devices = self._pick_devices(shape, spread=spread, prefer=prefer)
        self._scalars(shape)
        return devices

    def as_node(self) -> Node:
        """The free capacity as a solver `Node` (for measures that read `Node`s)."""
        return Node(
            self.name, Resources(self.cpu, self.memory, self.pods), gpus=tuple(d.freeze() for d in self.devices)
        )

    def idle_gpus(self) -> int:
        return sum(1 for d in self.devices if d.is_idle)

    def _pick_devices(self, shape: PodShape, *, spread: bool, prefer: tuple[int, ...]) -> tuple[DeviceAssignment, ...]:
        if prefer:
            chosen = self._pick_preferred(shape, {index: i for i, index in enumerate(prefer)})
            if chosen is not None:
                return chosen
        return self._pick_default(shape, spread=spread)

    def _pick_preferred(self, shape: PodShape, rank: dict[int, int]) -> tuple[DeviceAssignment, ...] | None:
        demand = shape.gpu
        if demand.kind not in (GpuKind.WHOLE, GpuKind.SHARE):
            return None
        allowed = fit.allowed_devices(self.devices, shape.gpu_models)
        devices = sorted((d for d in allowed if d.index in rank), key=lambda d: rank[d.index])
        if demand.kind is GpuKind.WHOLE:
            chosen = [d for d in devices if d.is_idle]
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
        devices = fit.allowed_devices(self.devices, shape.gpu_models)
        if kind is GpuKind.WHOLE:
            chosen = [d for d in devices if d.is_idle][: demand.count]
            whole = tuple(DeviceAssignment(d.index, FULL_SHARE, d.memory_mib) for d in chosen)
            for d, a in zip(chosen, whole, strict=True):
                d.consume(a)
            return whole
        if kind is GpuKind.MIG:
            return _pick_mig(devices, demand.mig_profile, demand.count)
        fitting = [d for d in devices if d.share_fits(demand.milli, demand.memory_mib, demand.tflops) > 0]
        # Best fit: fullest device first keeps idle devices whole for whole-GPU pods.
        fitting.sort(key=lambda d: (d.is_idle, d.free_milli, d.free_memory_mib, d.free_tflops, d.index))
        if spread:
            fitting.sort(key=lambda d: (-d.free_milli, -d.free_memory_mib, -d.free_tflops, d.index))
        out = []
        for d in fitting[: demand.count]:
            a = DeviceAssignment(d.index, demand.milli, demand.memory_mib, tflops=demand.tflops)
            d.consume(a)
            out.append(a)
        return tuple(out)


def _pick_mig(devices: Sequence[DeviceState], profile: str, count: int) -> tuple[DeviceAssignment, ...]:
    """Static slices first (fewest free first: keeps whole partitions free elsewhere), then
    dynamic cuts where they cost the largest profiles least (`mig.best_device`)."""
    out: list[DeviceAssignment] = []
    for d in sorted(devices, key=lambda d: (d.mig.get(profile, 0), d.index)):
        while d.mig.get(profile, 0) > 0 and len(out) < count:
            a = DeviceAssignment(d.index, 0, 0, profile)
            d.consume(a)
            out.append(a)
    while len(out) < count:
        cuttable = [(d, table) for d in devices if (table := d.cuttable()) is not None]
        choice = mig.best_device([mig.MigDevice(table, d.mig_layout) for d, table in cuttable], profile)
        if choice is None:
            break
        device = cuttable[choice.index][0]
        for slot in choice.slots:
            a = DeviceAssignment(device.index, 0, 0, profile, mig_start=slot.start)
            device.consume(a)
            out.append(a)
    return tuple(out)
