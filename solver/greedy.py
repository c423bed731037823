"""Greedy baseline: Kueue-style BestFit per topology level.

Used three ways: as the plan when CP-SAT finds nothing in time (fallback), as the CP-SAT hint,
and as the comparison in tests and benchmarks ("the solver is at least as compact").

Per gang, in priority order:
1. Pick the starting domain: with a required level, the tightest domain of that level that
   holds the gang (a gang of several groups tries each domain that holds every group, so a
   leader never confines its workers to a domain too small for them); otherwise the
   tightest domain at the preferred level, moving one level up each time none holds it;
   above the top level the gang spreads over top-level domains.
2. Descend: if one child holds what is left, take the tightest such child; otherwise take
   the largest child and repeat. Capacities are counted in whole slices when slices apply.
3. Inside a unit, nodes go largest capacity first, the last one tightest-fit; equal
   capacities go in node order (deterministic).
A gang that does not fit in full tries its quorum (minCount); otherwise it is rolled back.
"""

from __future__ import annotations

import math

from solver.ledger import Ledger
from solver.placement import Member, Selection, domain_caps, gang_order, live_caps, pick_nodes, take_selection
from solver.problem import GangProblem, Problem
from solver.topology import TopologyIndex


def greedy(problem: Problem, ledger: Ledger) -> dict[int, list[Member]]:
    """Place gangs one after another (priority, then size, then name); returns placed ones."""
    placed: dict[int, list[Member]] = {}
    for gp in gang_order(problem):
        members = place_gang(problem.topo, gp, ledger)
        if members is not None:
            placed[gp.index] = members
    return placed


def place_gang(topo: TopologyIndex, gp: GangProblem, ledger: Ledger) -> list[Member] | None:
    for counts in _targets(gp):
        for scope in _scopes(topo, gp, counts, ledger):
            ledger.begin()
            members = _place_counts(topo, gp, counts, ledger, scope)
            if members is not None:
                ledger.commit()
                return members
            ledger.rollback()
    return None


# Domains of the required level a multi-group gang tries, tightest first: enough to find one
# that holds every group in practice, few enough to bound the time of a gang that fits none
# (the CP-SAT model searches them all).
MAX_SCOPES = 128


def _scopes(topo: TopologyIndex, gp: GangProblem, counts: list[int], ledger: Ledger) -> list[int | None]:
    """Where to place a gang with a required level: for one group, [None] (the group picks
    its tightest domain). For several groups, every domain of the required level (nodes for
    the host level) that holds each group on its own, tightest first, so the gang is placed in
    a domain that holds it whole and the order of the groups never decides feasibility."""
    wanted = [(caps, need) for caps, need in zip(gp.groups, counts, strict=True) if need > 0]
    if len(wanted) < 2 or gp.required_level < 0:
        return [None]
    per_group = [(live_caps(caps, ledger), need) for caps, need in wanted]
    if gp.required_level == topo.host_level:
        hosts = [n for n in sorted(per_group[0][0]) if all(live.get(n, 0) >= need for live, need in per_group)]
        hosts.sort(key=lambda n: (sum(live[n] for live, _ in per_group), n))
        return list(hosts[:MAX_SCOPES])
    held = [(domain_caps(topo, gp, live), need) for live, need in per_group]
    domains = [d for d in topo.levels_of[gp.required_level] if all(c.get(d, 0) >= need for c, need in held)]
    domains.sort(key=lambda d: (sum(c[d] for c, _ in held), topo.domains[d].path))
    return list(domains[:MAX_SCOPES])


def _targets(gp: GangProblem) -> list[list[int]]:
    """Full gang first, then the quorum (trimming the last groups first)."""
    full = [g.count for g in gp.groups]
    out = [full]
    quorum = gp.request.quorum
    step = math.lcm(*(s.size for s in gp.slices), gp.groups[0].host_slice)
    quorum = -(-quorum // step) * step  # slices are whole: round the quorum up to a slice multiple
    if quorum < sum(full):
        cut, trimmed = sum(full) - quorum, list(full)
        for i in reversed(range(len(trimmed))):
            take = min(cut, trimmed[i])
            trimmed[i] -= take
            cut -= take
        out.append(trimmed)
    return out


def _place_counts(
    topo: TopologyIndex, gp: GangProblem, counts: list[int], ledger: Ledger, scope: int | None
) -> list[Member] | None:
    """Every group's pods, inside `scope` (a domain of the required level, or the node for
    the host level) when given; otherwise inside the domain the first group chooses."""
    members: list[Member] = []
    one_host = gp.required_level == topo.host_level
    for caps, need in zip(gp.groups, counts, strict=True):
        if need == 0:
            continue
        live = live_caps(caps, ledger)
        if one_host and (scope is not None or members):
            host = scope if scope is not None else members[0].node
            live = {n: c for n, c in live.items() if n == host}
        selection = select(topo, gp, live, need, None if one_host else scope)
        if selection is None:
            return None
        if gp.required_level >= 0 and scope is None and not one_host:
            # Later groups stay inside the domain the first group chose.
            scope = topo.ancestor(topo.unit_of[selection[0].node], gp.required_level)
        if not take_selection(ledger, caps, selection, members):
            return None
    return members


def select(
    topo: TopologyIndex, gp: GangProblem, live: dict[int, int], need: int, scope: int | None = None
) -> Selection | None:
    """Nodes and pod counts for `need` pods of one group, or None."""
    if any(need % s.size for s in gp.slices):
        return None
    caps = domain_caps(topo, gp, live)

    def fits(d: int) -> bool:
        return caps.get(d, 0) >= need

    if scope is not None:
        return _descend(topo, scope, need, caps, live, gp) if fits(scope) else None
    if gp.required_level == topo.host_level:
        return pick_nodes(list(live), need, live, single=True)
    if gp.required_level >= 0:
        start, stop = gp.required_level, gp.required_level
    else:
        start, stop = min(gp.start_level, topo.above), 0
    if start >= topo.above:  # host-level start: one pool of nodes
        return pick_nodes(list(live), need, live)
    for level in range(start, stop - 1, -1):
        candidates = [d for d in topo.levels_of[level] if fits(d)]
        if candidates:
            best = min(candidates, key=lambda d: (caps[d], topo.domains[d].path))
            return _descend(topo, best, need, caps, live, gp)
    if gp.required_level >= 0:
        return None
    return _spread(topo, topo.levels_of[0], need, caps, live, gp)


def _descend(
    topo: TopologyIndex, d: int, need: int, caps: dict[int, int], live: dict[int, int], gp: GangProblem
) -> Selection | None:
    domain = topo.domains[d]
    if domain.level == topo.above - 1:
        return pick_nodes([n for n in domain.nodes if n in live], need, live)
    return _spread(topo, domain.children, need, caps, live, gp)


def _spread(
    topo: TopologyIndex, children: list[int], need: int, caps: dict[int, int], live: dict[int, int], gp: GangProblem
) -> Selection | None:
    pool = sorted((c for c in children if caps.get(c, 0) > 0), key=lambda c: (-caps[c], topo.domains[c].path))
    out: Selection = []
    remaining = need
    while remaining > 0 and pool:
        fitting = [c for c in pool if caps[c] >= remaining]
        child = min(fitting, key=lambda c: (caps[c], topo.domains[c].path)) if fitting else pool[0]
        pool.remove(child)
        amount = min(caps[child], remaining)
        part = _descend(topo, child, amount, caps, live, gp)
        if part is None:
            return None
        out.extend(part)
        remaining -= amount
    return out if remaining == 0 else None
