"""One solve's prepared data: per gang group, how many pods fit on each node and unit.

Capacities are computed once per solve from the immutable snapshot (no per-device objects
are built for nodes the plan never touches), so preparing 16k nodes costs tens of ms.
A slice at host level (k pods per host) rounds each node's capacity down to a multiple of k.
A node missing a topology label at or above the finest level a gang's topology request names
is left out of that gang (`SolverParams.unlabeled_nodes`) and counted in `GroupCaps.unlabeled`
so that an explanation can say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from solver.fit import eligible, node_fit
from solver.model import ClusterSnapshot, GangRequest, PodShape, TopologyRequest
from solver.params import UnlabeledNodes
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
    unlabeled: int = 0  # of those, nodes left out because they lack a topology label

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
    start_level: int = 0  # the greedy baseline's first level to try (the preferred one)
    label_level: int = -1  # finest level the topology request names; -1: no topology request


@dataclass(slots=True)
class Problem:
    snapshot: ClusterSnapshot
    topo: TopologyIndex
    gangs: list[GangProblem]


def prepare(
    snapshot: ClusterSnapshot,
    requests: list[GangRequest],
    topo: TopologyIndex,
    *,
    unlabeled: UnlabeledNodes = UnlabeledNodes.EXCLUDE,
) -> Problem:
    """Requests must be admitted (`admit.check`): an unknown level raises ValueError here."""
    gangs = [_prepare_gang(i, r, snapshot, topo, unlabeled) for i, r in enumerate(requests)]
    return Problem(snapshot, topo, gangs)


def label_level(topo: TopologyIndex, tr: TopologyRequest) -> int:
    """The finest level a topology request names (required, preferred, slices); -1: none."""
    named = [tr.required, tr.preferred, *(s.level for s in tr.slices)]
    return max((topo.level_of(n) for n in named if n), default=-1)


def _prepare_gang(
    index: int, request: GangRequest, snapshot: ClusterSnapshot, topo: TopologyIndex, unlabeled: UnlabeledNodes
) -> GangProblem:
    tr = request.topology
    required = topo.level_of(tr.required) if tr.required else -1
    finest = label_level(topo, tr)
    # A node lacking a label at or above the finest requested level is in no real domain there.
    cut = min(finest, topo.above - 1) if unlabeled is UnlabeledNodes.EXCLUDE else -1
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
            if topo.missing_from[i] <= cut:
                caps.unlabeled += 1
                continue
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
        start_level=_start_level(tr.required, tr.preferred, tr.any, topo),
        label_level=finest,
    )


def _counted_levels(required: str, preferred: str, any_topology: bool, topo: TopologyIndex) -> list[int]:
    """Levels whose domain count the objective minimises, coarsest first (lexicographic: one
    block fewer outweighs any number of racks, as Kueue's BestFit descends from the top).

    With a preferred level: every level below the required one (every level when none is
    required), so a gang never crosses a block boundary to save a rack or a host. With only a
    required level: the levels below it (the required one is fixed at one domain). With no
    topology request at all: hosts only (fewest nodes), so gangs without topology still pack.
    """
    start = _start_level(required, preferred, any_topology, topo)
    if preferred:
        start = min(start, topo.level_of(required) + 1 if required else 0)
    return list(range(min(start, topo.host_level), topo.host_level + 1))


def _start_level(required: str, preferred: str, any_topology: bool, topo: TopologyIndex) -> int:
    """The first level the greedy baseline tries: the preferred one, else the one below the
    required level, else the top (any topology request), else hosts."""
    if preferred:
        start = topo.level_of(preferred)
    elif required:
        start = topo.level_of(required) + 1
    elif any_topology:
        start = 0
    else:
        start = topo.host_level
    return min(start, topo.host_level)
