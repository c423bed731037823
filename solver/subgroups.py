"""Gangs with sub-groups: each sub-group placed whole (at least its minimum) or not at all,
inside its own required domain, all inside the gang's.

Such gangs are rare and small in number of parts (a leader and its workers, the replicas of a
composite gang), so they are placed by a search rather than in the CP-SAT domain model: for each
domain of the gang's required level that could hold its quorum, tightest first, the sub-groups
are placed one after another, each as a gang of its own (`greedy.place_gang`: its required
domain, preferred compactness and slices) restricted to that domain, then the members in no
sub-group. Sub-groups go largest quorum first; when that order fails, every other order is tried
(up to `MAX_ORDERS`), so the order in which a request lists its groups never decides
feasibility. The first domain and order that place the quorum win; the search stops at the
solver's time limit.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace

from solver.explain import Explanation, explain, level_name
from solver.greedy import place_gang
from solver.ledger import Ledger
from solver.model import EqGroup, GangName, GangRequest, NodeName, Outcome, SubGroup, TopologyRequest
from solver.params import UnlabeledNodes
from solver.placement import Member, domain_caps, live_caps
from solver.problem import GangProblem, Problem, prepare
from solver.topology import TopologyIndex

MAX_SCOPES = 64  # domains of the gang's required level tried, tightest first
MAX_ORDERS = 24  # orders of the sub-groups tried in one domain (all of them up to 4 sub-groups)


def place_subgrouped(
    problem: Problem, gp: GangProblem, ledger: Ledger, unlabeled: UnlabeledNodes, *, time_limit_s: float = 1.0
) -> list[Member] | None:
    """The gang's members, or None (the ledger unchanged). The search stops at the first
    placement, or once `time_limit_s` has passed (a gang that fits nowhere on a large cluster
    would otherwise try every domain and order)."""
    deadline = time.monotonic() + time_limit_s
    for scope in _scopes(problem, gp, ledger):
        saved = ledger.checkpoint()
        members = _in_scope(problem, gp, ledger, unlabeled, scope, deadline)
        if members is not None:
            return members
        ledger.restore(saved)
        if time.monotonic() > deadline:
            break
    return None


def _scopes(problem: Problem, gp: GangProblem, ledger: Ledger) -> list[frozenset[NodeName] | None]:
    """Node sets of the domains of the gang's required level (nodes for the host level) that
    hold its quorum counting every group, tightest first; [None] without a required level."""
    topo = problem.topo
    level = gp.required_level
    if level < 0:
        return [None]
    quorum = gp.request.quorum
    lives = [live_caps(caps, ledger) for caps in gp.groups]
    names = [n.name for n in problem.snapshot.nodes]
    if level == topo.host_level:
        totals: dict[int, int] = {}
        for live in lives:
            for n, c in live.items():
                totals[n] = totals.get(n, 0) + c
        hosts = sorted((n for n, t in totals.items() if t >= quorum), key=lambda n: (totals[n], n))
        return [frozenset({names[n]}) for n in hosts[:MAX_SCOPES]]
    held: dict[int, int] = {}
    for live in lives:
        for d, c in domain_caps(topo, gp, live).items():
            held[d] = held.get(d, 0) + c
    domains = [d for d in topo.levels_of[level] if held.get(d, 0) >= quorum]
    domains.sort(key=lambda d: (held[d], topo.domains[d].path))
    return [frozenset(names[n] for n in _nodes_under(topo, d)) for d in domains[:MAX_SCOPES]]


def _nodes_under(topo: TopologyIndex, domain: int) -> list[int]:
    d = topo.domains[domain]
    if d.level == topo.above - 1:
        return list(d.nodes)
    return [n for c in d.children for n in _nodes_under(topo, c)]


def _in_scope(
    problem: Problem,
    gp: GangProblem,
    ledger: Ledger,
    unlabeled: UnlabeledNodes,
    scope: frozenset[NodeName] | None,
    deadline: float,
) -> list[Member] | None:
    request = gp.request
    parts = sorted(request.subgroups, key=lambda s: (-s.quorum(request), s.name))
    orders = itertools.islice(itertools.permutations(parts), MAX_ORDERS)
    start = ledger.checkpoint()
    for order in orders:
        members = _in_order(problem, gp, ledger, unlabeled, scope, order)
        if members is not None:
            return members
        ledger.restore(start)
        if time.monotonic() > deadline:
            break
    return None


def _in_order(
    problem: Problem,
    gp: GangProblem,
    ledger: Ledger,
    unlabeled: UnlabeledNodes,
    scope: frozenset[NodeName] | None,
    order: tuple[SubGroup, ...],
) -> list[Member] | None:
    request = gp.request
    index = {g.name: i for i, g in enumerate(request.groups)}
    members: list[Member] = []
    placed_parts = 0
    for n, sub in enumerate(order):
        part = _part(request, f"{request.name}/{sub.name}", sub.groups, sub.min_count, sub.topology, scope)
        got = _place(problem, part, ledger, unlabeled, index)
        if got is not None:
            members.extend(got)
            placed_parts += 1
        elif placed_parts + len(order) - n - 1 < request.subgroup_quorum:
            return None  # too few sub-groups left to reach the quorum of sub-groups
    if placed_parts < request.subgroup_quorum:
        return None
    grouped = {g for sub in request.subgroups for g in sub.groups}
    free = tuple(g.name for g in request.groups if g.name not in grouped and g.count > 0)
    if free:
        need = max(1, request.quorum - len(members))
        free_count = sum(g.count for g in request.groups if g.name in free)
        topology = TopologyRequest(preferred=request.topology.preferred)
        part = _part(request, f"{request.name}/-", free, min(need, free_count), topology, scope)
        got = _place(problem, part, ledger, unlabeled, index)
        if got is not None:
            members.extend(got)
    return members if len(members) >= request.quorum else None


def _part(
    request: GangRequest,
    name: str,
    groups: tuple[str, ...],
    min_count: int,
    topology: TopologyRequest,
    scope: frozenset[NodeName] | None,
) -> GangRequest:
    """Some of the gang's groups as a gang of their own, inside `scope`."""
    if not topology.preferred and not topology.required and request.topology.preferred:
        topology = replace(topology, preferred=request.topology.preferred)
    eqs = tuple(_within(g, scope) for g in request.groups if g.name in groups and g.count > 0)
    return GangRequest(GangName(name), eqs, min_count=min_count, topology=topology, priority=request.priority)


def _within(group: EqGroup, scope: frozenset[NodeName] | None) -> EqGroup:
    if scope is None:
        return group
    allowed = group.shape.allowed_nodes
    inside = scope if allowed is None else allowed & scope
    return replace(group, shape=replace(group.shape, allowed_nodes=inside))


def _place(
    problem: Problem, part: GangRequest, ledger: Ledger, unlabeled: UnlabeledNodes, index: dict[str, int]
) -> list[Member] | None:
    if not part.groups:
        return None
    sub_gp = prepare(problem.snapshot, [part], problem.topo, unlabeled=unlabeled).gangs[0]
    got = place_gang(problem.topo, sub_gp, ledger)
    if got is None:
        return None
    return [Member(index[part.groups[m.group].name], m.node, m.devices) for m in got]


SUBGROUPS_DO_NOT_FIT_TOGETHER = "sub-groups do not fit together"


def explain_subgrouped(
    problem: Problem, gp: GangProblem, unlabeled: UnlabeledNodes, *, others_placed: bool
) -> Explanation:
    """The binding constraint of an unplaced gang with sub-groups: the first required sub-group
    (largest first) that cannot be placed even alone on the free capacity, named; otherwise
    that they do not fit together (or next to the other gangs of the plan)."""
    request = gp.request
    parts = sorted(request.subgroups, key=lambda s: (-s.quorum(request), s.name))
    cannot = []
    for sub in parts:
        part = _part(request, f"{request.name}/{sub.name}", sub.groups, sub.min_count, sub.topology, None)
        if not part.groups:
            continue
        if request.topology.required and not sub.topology.required:
            part = replace(part, topology=replace(part.topology, required=request.topology.required))
        alone = prepare(problem.snapshot, [part], problem.topo, unlabeled=unlabeled)
        if place_gang(problem.topo, alone.gangs[0], Ledger(problem.snapshot)) is None:
            why = explain(alone, alone.gangs[0], others_placed=False)
            cannot.append(Explanation(why.outcome, f"sub-group {sub.name!r}: {why.message}"))
    if len(cannot) > len(parts) - request.subgroup_quorum:
        return cannot[0]
    where = f" within one {level_name(request.topology.required)}" if request.topology.required else ""
    detail = f"each needed sub-group fits alone, but not all of them{where} together"
    if others_placed:
        detail += " next to the other gangs of this plan"
    return Explanation(Outcome.UNSCHEDULABLE, f"{SUBGROUPS_DO_NOT_FIT_TOGETHER}: {detail}")
