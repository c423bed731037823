"""Fluent builders for snapshots and gangs, so each test reads as its scenario.

The shared fixture cluster, drawn (free GPUs per host in brackets, 8-GPU nodes):

    zone z0
    ├── block b0
    │   ├── rack b0r0  [8 8 8 8]
    │   └── rack b0r1  [8 8 4 0]
    └── block b1
        ├── rack b1r0  [8 8 8 0]
        └── rack b1r1  [2 2 2 2]
"""

from __future__ import annotations

from dataclasses import dataclass, field

from solver import (
    ClusterSnapshot,
    EqGroup,
    GangName,
    GangRequest,
    GpuDemand,
    GpuDevice,
    MigSlice,
    Node,
    NodeName,
    PodShape,
    Resources,
    Slice,
    TopologyRequest,
)

LEVELS = ("zone", "block", "rack", "kubernetes.io/hostname")
MODEL = "A100-80GB"
DRAWN = {"b0": {"b0r0": [8, 8, 8, 8], "b0r1": [8, 8, 4, 0]}, "b1": {"b1r0": [8, 8, 8, 0], "b1r1": [2, 2, 2, 2]}}


@dataclass
class ClusterBuilder:
    nodes: list[Node] = field(default_factory=list)
    levels: tuple[str, ...] = LEVELS

    def rack(
        self, block: str, rack: str, free_gpus: list[int], *, model: str = MODEL, zone: str = "z0"
    ) -> ClusterBuilder:
        for i, free in enumerate(free_gpus):
            name = f"{rack}h{i}"
            self.node(name, (zone, block, rack, name), free_gpus=free, model=model)
        return self

    def node(
        self,
        name: str,
        path: tuple[str, ...],
        *,
        free_gpus: int = 8,
        gpus: int = 8,
        model: str = MODEL,
        shares: list[int] | None = None,
        mig: list[tuple[MigSlice, ...]] | None = None,
        cpu: int = 128_000,
        unschedulable: bool = False,
    ) -> ClusterBuilder:
        """`shares`: free milli per device (overrides free_gpus); `mig`: slices per device."""
        devices = []
        for i in range(gpus):
            if mig is not None:
                devices.append(GpuDevice(i, model, 81920, mig=mig[i]))
            elif shares is not None:
                used = 1000 - shares[i]
                devices.append(GpuDevice(i, model, 81920, shares[i], 81920 - used * 80))
            else:
                idle = i >= gpus - free_gpus
                devices.append(GpuDevice(i, model, 81920, 1000 if idle else 0, 81920 if idle else 0))
        alloc = Resources(cpu, 1_048_576, 110)
        self.nodes.append(
            Node(NodeName(name), alloc, Resources(), topology=path, gpus=tuple(devices), unschedulable=unschedulable)
        )
        return self

    def build(self) -> ClusterSnapshot:
        return ClusterSnapshot(tuple(self.nodes), self.levels)


def drawn() -> ClusterSnapshot:
    b = ClusterBuilder()
    for block, racks in DRAWN.items():
        for rack, free in racks.items():
            b.rack(block, rack, free)
    return b.build()


def whole(gpus: int, **kw: object) -> PodShape:
    return PodShape(Resources(1000, 1024, 1), GpuDemand.whole(gpus), **kw)  # type: ignore[arg-type]


def share(milli: int = 0, memory_mib: int = 0, count: int = 1, **kw: object) -> PodShape:
    return PodShape(Resources(100, 256, 1), GpuDemand.share(milli, memory_mib, count), **kw)  # type: ignore[arg-type]


def gang(
    name: str,
    shape: PodShape,
    count: int,
    *,
    required: str = "",
    preferred: str = "",
    slices: tuple[tuple[str, int], ...] = (),
    min_count: int = 0,
    priority: int = 0,
) -> GangRequest:
    topo = TopologyRequest(required, preferred, tuple(Slice(lv, k) for lv, k in slices))
    return GangRequest(GangName(name), (EqGroup("worker", shape, count),), min_count, topo, priority)
