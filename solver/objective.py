"""Compactness: how a placed gang is scored, shared by the CP-SAT model, the heuristics
and the reported objective so that all three agree on what "more compact" means.

A gang's compactness counts the domains holding its members at each counted level (see
`problem._counted_levels`), weighted lexicographically: one domain fewer at a coarser level
outweighs any number of domains at the finer levels below it.
"""

from __future__ import annotations

from solver.placement import Member
from solver.problem import GangProblem
from solver.topology import TopologyIndex


def level_weights(topo: TopologyIndex, gp: GangProblem) -> dict[int, int]:
    """Weight per counted level: the deepest weighs 1, each level above weighs one more than
    the largest possible total of all levels below it."""
    weights: dict[int, int] = {}
    w = 1
    top = 0
    usable = _usable_domains(topo, gp)
    for level in sorted(gp.counted_levels, reverse=True):
        most = gp.request.count if level == topo.host_level else min(gp.request.count, usable.get(level, 0))
        weights[level] = w
        top += w * most
        w = top + 1
    return weights


def _usable_domains(topo: TopologyIndex, gp: GangProblem) -> dict[int, int]:
    """Per level above hosts, how many domains hold some capacity for the gang."""
    units = {topo.unit_of[n] for caps in gp.groups for n in caps.node_caps}
    out: dict[int, int] = {}
    level_sets: dict[int, set[int]] = {}
    for u in units:
        if u < 0:
            continue
        d = u
        while d >= 0:
            dom = topo.domains[d]
            level_sets.setdefault(dom.level, set()).add(d)
            d = dom.parent
    for level, ds in level_sets.items():
        out[level] = len(ds)
    return out


def domains_used(topo: TopologyIndex, nodes: list[int]) -> tuple[int, ...]:
    """Distinct domains holding the given member nodes, per level (hosts last)."""
    per_level: list[set[int]] = [set() for _ in range(topo.above)]
    for n in nodes:
        for level, d in enumerate(topo.path_of_node(n)):
            per_level[level].add(d)
    return (*(len(s) for s in per_level), len(set(nodes)))


def compactness(topo: TopologyIndex, gp: GangProblem, members: list[Member]) -> int:
    weights = level_weights(topo, gp)
    used = domains_used(topo, [m.node for m in members])
    return sum(weights.get(level, 0) * count for level, count in enumerate(used))
