"""One solve's prepared data: per gang group, how many pods fit on each node and unit.

Capacities are computed once per solve from the immutable snapshot (no per-device objects
are built for nodes the plan never touches), so preparing 16k nodes costs tens of ms.
A slice at host level (k pods per host) rounds each node's capacity down to a multiple of k.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from solver.fit import eligible, node_fit
from solver.model import ClusterSnapshot, GangRequest, PodShape
from solver.topology import TopologyIndex


@dataclass(slots=True)
class GroupCaps:
    """Where one group of one gang can go: capacity per node and per unit (pods)."""

    gang: int
    group: int
    shape: PodShape
    count: int
    node_caps: dict[int, int] = field(default_factory=dict)  # node index -> pods (> 0 only)
    unit_caps: dict[int, int] = field(default_factory=dict)  # unit domain id -> pods
    host_slice: int = 1
    eligible: int = 0  # nodes statically eligible (selector, cordon, GPU model), fit or not

    @property
    def total(self) -> int:
        return sum(self.node_caps.values())


@dataclass(frozen=True, slots=True)
class LevelSlice:
    """Slices of `size` consecutive ranks, each inside one domain of snapshot level `level`."""

    level: int
    size: int


@dataclass(slots=True)
class GangProblem:
    index: int
    request: GangRequest
    groups: list[GroupCaps]
    required_level: int  # -1: none
    counted_levels: list[int]  # levels whose domain counts the objective minimises
    slices: list[LevelSlice]  # above hosts; host-level slices are folded into the node caps


@dataclass(slots=True)
class Problem:
    snapshot: ClusterSnapshot
    topo: TopologyIndex
    gangs: list[GangProblem]


def prepare(snapshot: ClusterSnapshot, requests: list[GangRequest], topo: TopologyIndex) -> Problem:
    gangs = [_prepare_gang(i, r, snapshot, topo) for i, r in enumerate(requests)]
    return Problem(snapshot, topo, gangs)


def _prepare_gang(index: int, request: GangRequest, snapshot: ClusterSnapshot, topo: TopologyIndex) -> GangProblem:
    tr = request.topology
    required = topo.level_of(tr.required) if tr.required else -1
    slices = sorted({(topo.level_of(s.level), s.size) for s in tr.slices if s.size > 1})
    host_slice = 1
    for level, size in slices:
        if level == topo.host_level:
            host_slice = size
    groups = []
    for g, eq in enumerate(request.groups):
        caps = GroupCaps(index, g, eq.shape, eq.count, host_slice=host_slice)
        for i, node in enumerate(snapshot.nodes):
            if not eligible(node, eq.shape):
                continue
            caps.eligible += 1
            c = node_fit(node, eq.shape)
            if host_slice > 1:
                c -= c % host_slice
            if c > 0:
                caps.node_caps[i] = min(c, eq.count)
                unit = topo.unit_of[i]
                caps.unit_caps[unit] = caps.unit_caps.get(unit, 0) + caps.node_caps[i]
        groups.append(caps)
    return GangProblem(
        index=index,
        request=request,
        groups=groups,
        required_level=required,
        counted_levels=_counted_levels(tr.required, tr.preferred, tr.any, topo),
        slices=[LevelSlice(lv, sz) for lv, sz in slices if lv != topo.host_level],
    )


def _counted_levels(required: str, preferred: str, any_topology: bool, topo: TopologyIndex) -> list[int]:
    """Levels whose domain count the objective minimises, coarsest first.

    With a preferred level: that level and every level below it. With only a required level:
    the levels below it (the required one is fixed at one domain). With no topology request
    at all: hosts only (fewest nodes), so gangs without topology still pack.
    """
    if preferred:
        start = topo.level_of(preferred)
    elif required:
        start = topo.level_of(required) + 1
    elif any_topology:
        start = 0
    else:
        start = topo.host_level
    return list(range(min(start, topo.host_level), topo.host_level + 1))
