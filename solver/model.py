"""The normalized placement model: what the solver reads and what it returns.

Everything here is immutable (frozen dataclasses, tuples) and buildable from plain values, so
tests and benchmarks need no cluster. Units: CPU in milli-cores, memory in MiB, GPU share in
milli-GPU (1000 = one whole device), GPU memory in MiB, GPU compute in milli-TFLOPs.

GPUs are modelled as devices, never as a scalar resource: a whole-GPU request takes fully free
devices, a share request takes part of one device's share and memory, a MIG request takes a
free slice of its profile. The extender strips `nvidia.com/gpu` and MIG resources from the
scalar requests before it builds a `PodShape`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NewType

from solver.device import FULL_SHARE as FULL_SHARE  # the model's unit of GPU share, re-exported
from solver.device import DeviceFit
from solver.mig import MigSlot, MigTable

NodeName = NewType("NodeName", str)
GangName = NewType("GangName", str)


@dataclass(frozen=True, slots=True)
class Resources:
    """Scalar resources: CPU (milli), memory (MiB), pod slots and extended resources."""

    cpu_milli: int = 0
    memory_mib: int = 0
    pods: int = 0
    extended: tuple[tuple[str, int], ...] = ()

    def get(self, name: str) -> int:
        for key, value in self.extended:
            if key == name:
                return value
        return 0

    def minus(self, other: Resources) -> Resources:
        names = sorted({k for k, _ in self.extended} | {k for k, _ in other.extended})
        return Resources(
            cpu_milli=self.cpu_milli - other.cpu_milli,
            memory_mib=self.memory_mib - other.memory_mib,
            pods=self.pods - other.pods,
            extended=tuple((n, self.get(n) - other.get(n)) for n in names),
        )

    def times(self, count: int) -> Resources:
        return Resources(
            cpu_milli=self.cpu_milli * count,
            memory_mib=self.memory_mib * count,
            pods=self.pods * count,
            extended=tuple((k, v * count) for k, v in self.extended),
        )


@dataclass(frozen=True, slots=True)
class MigSlice:
    """Free slices of one MIG profile on one device (static MIG, mixed strategy)."""

    profile: str
    free: int


@dataclass(frozen=True, slots=True)
class GpuDevice(DeviceFit):
    """One physical GPU on a node with what is still free on it (the device rule: `DeviceFit`)."""

    index: int
    model: str
    memory_mib: int
    free_milli: int = FULL_SHARE
    free_memory_mib: int = -1  # -1: all of memory_mib
    mig: tuple[MigSlice, ...] = ()
    # Compute in milli-TFLOPs, oversubscription included (pool `tflopsOversellRatio`); 0 when
    # the model's TFLOPs are unknown: TFLOPs requests then do not fit this device.
    tflops: int = 0
    free_tflops: int = -1  # -1: all of tflops
    # Dynamic MIG: the model's profile table when Phalanx may cut this GPU into MIG slices on
    # demand, and the slices cut so far. An idle partitionable GPU takes whole, share or MIG
    # pods; once it holds a slice it takes MIG pods only, until its last slice is gone.
    partition: MigTable | None = None
    mig_layout: tuple[MigSlot, ...] = ()

    def __post_init__(self) -> None:
        if self.free_memory_mib < 0:
            object.__setattr__(self, "free_memory_mib", self.memory_mib)
        if self.free_tflops < 0:
            object.__setattr__(self, "free_tflops", self.tflops)

    def static_free(self, profile: str) -> int:
        for s in self.mig:
            if s.profile == profile:
                return s.free
        return 0


@dataclass(frozen=True, slots=True)
class Node:
    """A node: allocatable and used scalars, labels, taints, topology path and GPU devices."""

    name: NodeName
    allocatable: Resources
    used: Resources = Resources()
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[str, ...] = ()
    topology: tuple[str, ...] = ()  # one value per snapshot level, coarsest first
    gpus: tuple[GpuDevice, ...] = ()
    unschedulable: bool = False
    idle_gpus: int = field(init=False, compare=False)  # devices a whole-GPU pod can take

    def __post_init__(self) -> None:
        object.__setattr__(self, "idle_gpus", sum(1 for d in self.gpus if d.is_idle))

    @property
    def free(self) -> Resources:
        return self.allocatable.minus(self.used)

    def free_of(self, name: str) -> int:
        """Free amount of one extended resource (without building all of `free`)."""
        return self.allocatable.get(name) - self.used.get(name)


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """All nodes at one moment, and the topology levels their paths follow.

    `levels` are label keys, coarsest first, e.g. ("zone", "block", "rack", "hostname"). The
    last level may be the host itself; a node's `topology` has one value per level.
    """

    nodes: tuple[Node, ...]
    levels: tuple[str, ...] = ()
    generation: int = 0


class GpuKind(enum.Enum):
    NONE = "none"
    WHOLE = "whole"  # `count` fully free devices
    SHARE = "share"  # `milli` share, `memory_mib` and/or `tflops` of each of `count` devices
    MIG = "mig"  # `count` slices of `mig_profile`


@dataclass(frozen=True, slots=True)
class GpuDemand:
    """GPU demand of one pod, normalized to devices."""

    count: int = 0
    milli: int = 0  # per device; FULL_SHARE with memory 0 means whole devices
    memory_mib: int = 0  # per device
    mig_profile: str = ""
    tflops: int = 0  # milli-TFLOPs per device

    @staticmethod
    def whole(count: int) -> GpuDemand:
        return GpuDemand(count=count, milli=FULL_SHARE)

    @staticmethod
    def share(milli: int = 0, memory_mib: int = 0, count: int = 1, tflops: int = 0) -> GpuDemand:
        return GpuDemand(count=count, milli=milli, memory_mib=memory_mib, tflops=tflops)

    @staticmethod
    def mig(profile: str, count: int = 1) -> GpuDemand:
        return GpuDemand(count=count, mig_profile=profile)

    @property
    def kind(self) -> GpuKind:
        if self.count == 0:
            return GpuKind.NONE
        if self.mig_profile:
            return GpuKind.MIG
        if self.milli >= FULL_SHARE and self.memory_mib == 0 and self.tflops == 0:
            return GpuKind.WHOLE
        return GpuKind.SHARE

    @property
    def gpus(self) -> float:
        """GPU-equivalents this demand takes, for reports and explanations."""
        if self.kind is GpuKind.WHOLE:
            return float(self.count)
        if self.kind is GpuKind.SHARE:
            return self.count * self.milli / FULL_SHARE
        return 0.0


@dataclass(frozen=True, slots=True)
class PodShape:
    """What one pod needs and where it may go.

    `allowed_nodes` is the eligibility the extender resolved (selector, required affinity,
    taints and tolerations); None means every node. `gpu_models` restricts devices by model.
    """

    requests: Resources = Resources(pods=1)
    gpu: GpuDemand = GpuDemand()
    allowed_nodes: frozenset[NodeName] | None = None
    gpu_models: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class ScoreBand:
    """The nodes scoring `low`..`high` in a group's `node_scores` (absent nodes score 0): one
    tier a gang is planned on. `rank` orders tiers across a gang's groups: at each rank every
    group keeps to its band of that rank, and a group without one to no node (None: the band's
    position in its group's tiers)."""

    low: int
    high: int = 100
    rank: int | None = None


@dataclass(frozen=True, slots=True)
class EqGroup:
    """`count` identical pods; groups of a gang are ranked in the order given.

    `node_scores` are the members' preferred nodes (preferred node affinity, node-pool order):
    (node, 0..100), absent nodes 0. `plan()` places the gang on the first tier it fits in,
    then as compactly as it can there (see `solver/plan.py`). `tiers` are those tiers, best
    first, when the caller knows them: node pools make each pool a band of its own (its nodes
    alone, not the better pools' too). () lets `plan()` take the best distinct scores s, each
    the band s..100. After its tiers a group may use every node it is allowed; without
    `node_scores`, `tiers` mean nothing."""

    name: str
    shape: PodShape
    count: int
    node_scores: tuple[tuple[NodeName, int], ...] = ()
    tiers: tuple[ScoreBand, ...] = ()


@dataclass(frozen=True, slots=True)
class Slice:
    """Pods go in slices of `size` consecutive ranks, each slice inside one domain of `level`."""

    level: str
    size: int


@dataclass(frozen=True, slots=True)
class TopologyRequest:
    """Required level: every member in one domain of it. Preferred: as few domains as possible
    at that level and every level below it. Slices: see `Slice`. Balanced (with a preferred
    level): the members spread as evenly as they can over the fewest preferred-level domains
    that hold them (Kueue's balanced placement): 4 + 4 rather than 7 + 1."""

    required: str = ""
    preferred: str = ""
    slices: tuple[Slice, ...] = ()
    balanced: bool = False

    @property
    def any(self) -> bool:
        return bool(self.required or self.preferred or self.slices)


@dataclass(frozen=True, slots=True)
class SubGroup:
    """Members of some of a gang's groups with their own minimum and topology (a leader and
    its workers, a replica of a composite gang): placed with at least `min_count` members (0:
    all of them) or not at all, every placed member inside the sub-group's own required domain,
    within the gang's."""

    name: str
    groups: tuple[str, ...]  # names of the gang's EqGroups in it; a group is in one sub-group at most
    min_count: int = 0
    topology: TopologyRequest = TopologyRequest()

    def members(self, request: GangRequest) -> int:
        return sum(g.count for g in request.groups if g.name in self.groups)

    def quorum(self, request: GangRequest) -> int:
        return self.min_count or self.members(request)


@dataclass(frozen=True, slots=True)
class GangRequest:
    """All-or-nothing: at least `min_count` members placed, or none. 0 means all members.
    With sub-groups, also at least `min_subgroups` of them placed (0: every one)."""

    name: GangName
    groups: tuple[EqGroup, ...]
    min_count: int = 0
    topology: TopologyRequest = TopologyRequest()
    priority: int = 0
    subgroups: tuple[SubGroup, ...] = ()
    min_subgroups: int = 0

    @property
    def subgroup_quorum(self) -> int:
        return self.min_subgroups or len(self.subgroups)

    @property
    def count(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def quorum(self) -> int:
        return self.min_count or self.count

    @staticmethod
    def single(name: str, shape: PodShape, priority: int = 0) -> GangRequest:
        return GangRequest(GangName(name), (EqGroup("pod", shape, 1),), priority=priority)


# ---------------------------------------------------------------------------- results


class SolveStatus(enum.Enum):
    """How the plan was found."""

    OPTIMAL = "optimal"  # proven best for the objective
    FEASIBLE = "feasible"  # valid, not proven best (time limit)
    FALLBACK = "fallback"  # CP-SAT found nothing in time; the greedy plan is used
    INFEASIBLE = "infeasible"  # no gang could be placed


class Outcome(enum.Enum):
    """What a gang's result causes in the extender."""

    PLACED = "placed"  # members are assigned nodes and devices; filter answers from the plan
    UNSCHEDULABLE = "unschedulable"  # does not fit now; may fit when capacity frees (retry)
    UNRESOLVABLE = "unresolvable"  # can never fit this cluster as it is (no retry helps)


@dataclass(frozen=True, slots=True)
class DeviceAssignment:
    index: int
    milli: int = FULL_SHARE
    memory_mib: int = 0
    mig_profile: str = ""
    tflops: int = 0  # milli-TFLOPs granted on this device
    mig_start: int = -1  # dynamic MIG: the memory-slice position the slice is created at


@dataclass(frozen=True, slots=True)
class Assignment:
    """One member: its group, rank inside the gang, node and devices."""

    gang: GangName
    group: str
    rank: int
    node: NodeName
    devices: tuple[DeviceAssignment, ...] = ()


@dataclass(frozen=True, slots=True)
class GangPlan:
    gang: GangName
    outcome: Outcome
    assignments: tuple[Assignment, ...] = ()
    explanation: str = ""
    domains_used: tuple[int, ...] = ()  # per snapshot level, how many domains hold members


@dataclass(frozen=True, slots=True)
class PlanResult:
    status: SolveStatus
    gangs: tuple[GangPlan, ...]
    objective: int = 0
    bound: int = 0
    solve_seconds: float = 0.0
    notes: tuple[str, ...] = ()

    def gang(self, name: str) -> GangPlan:
        for g in self.gangs:
            if g.gang == name:
                return g
        raise KeyError(name)
