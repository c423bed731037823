"""Placement primitives shared by every placer: the greedy baseline (`greedy.py`), the
bound-guided heuristic (`compact.py`), the CP-SAT realization (`plan.py`) and the model's
per-domain capacities (`cpsat.py`, `explain.py`).

A placer works in pod counts: `live_caps` gives what each node still holds of one group (in
whole host slices), `domain_caps` sums that per domain, `pick_nodes` chooses nodes inside a
pool, and `take_selection` turns the chosen counts into members with devices, consuming them
from the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.ledger import Ledger
from solver.model import DeviceAssignment
from solver.problem import GangProblem, GroupCaps, Problem
from solver.topology import TopologyIndex


@dataclass(frozen=True, slots=True)
class Member:
    """One placed pod of a gang: its group, node index and devices (ranks come later)."""

    group: int
    node: int
    devices: tuple[DeviceAssignment, ...]


@dataclass(frozen=True, slots=True)
class NodePods:
    """`pods` pods of one group go to node index `node`."""

    node: int
    pods: int


Selection = list[NodePods]


def gang_order(problem: Problem) -> list[GangProblem]:
    """The order heuristics place gangs in: higher priority, then larger, then by name."""
    return sorted(problem.gangs, key=lambda g: (-g.request.priority, -g.request.count, g.request.name))


def take_selection(ledger: Ledger, caps: GroupCaps, selection: Selection, members: list[Member]) -> bool:
    """Consume devices for every pod of `selection`, appending members; False as soon as one
    does not fit (the caller rolls the transaction back)."""
    for pick in selection:
        for _ in range(pick.pods):
            devices = ledger.take(pick.node, caps.shape)
            if devices is None:
                return False
            members.append(Member(caps.group, pick.node, devices))
    return True


def live_caps(caps: GroupCaps, ledger: Ledger) -> dict[int, int]:
    """Pods of the group each node still holds (> 0 only), in whole host slices."""
    out = {}
    step = caps.host_slice
    for node, prepared in caps.node_caps.items():
        c = ledger.capacity(node, caps.shape, prepared)
        c -= c % step
        if c > 0:
            out[node] = c
    return out


def domain_caps(topo: TopologyIndex, gp: GangProblem, live: dict[int, int]) -> dict[int, int]:
    """Pods per domain (every level above hosts), counted in whole slices where slices apply."""
    slice_at = {s.level: s.size for s in gp.slices}
    caps: dict[int, int] = {}
    for node, c in live.items():
        unit = topo.unit_of[node]
        if unit >= 0:
            caps[unit] = caps.get(unit, 0) + c
    for level in range(topo.above - 1, -1, -1):
        size = slice_at.get(level, 1)
        for d in topo.levels_of[level]:
            if level < topo.above - 1:
                caps[d] = sum(caps.get(c, 0) for c in topo.domains[d].children)
            if size > 1 and d in caps:
                caps[d] -= caps[d] % size
    return caps


def pick_nodes(nodes: list[int], need: int, live: dict[int, int], *, single: bool = False) -> Selection | None:
    """Largest capacity first (equal capacities in node order), the last node the tightest
    that holds the rest (among equals, the last in node order); `single`: all on the tightest
    one node (among equals, the lowest index). None when the nodes cannot hold `need`."""
    fitting = [n for n in nodes if live[n] >= need]
    if single:
        return [NodePods(min(fitting, key=lambda n: (live[n], n)), need)] if fitting else None
    pool = sorted(nodes, key=lambda n: (-live[n], n))
    out: Selection = []
    remaining = need
    i = 0
    while remaining > 0 and i < len(pool):
        if live[pool[i]] >= remaining:
            # Tightest node that holds the rest: scan from the small end of the sorted pool.
            j = len(pool) - 1
            while live[pool[j]] < remaining:
                j -= 1
            out.append(NodePods(pool[j], remaining))
            return out
        out.append(NodePods(pool[i], live[pool[i]]))
        remaining -= live[pool[i]]
        i += 1
    return out if remaining == 0 else None
