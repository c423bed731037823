"""The solver's one entry point: `plan(snapshot, requests, params=...) -> PlanResult`.

Algorithm, in phases:
0. Admit and prepare: a request that makes no sense (an unknown level, a slice without a size
   or coarser than the required level, minCount above the members) gets its own UNRESOLVABLE
   answer (`admit.py`) and the others are planned without it. Then the topology tree (zones >
   blocks > racks > hosts) and, per gang group, the exact number of pods that fit on each node
   and each unit (rack); nodes missing a topology label are left out of gangs with a topology
   request at or below it (`SolverParams.unlabeled_nodes`).
1. Greedy: Kueue-style BestFit per level (`greedy.py`). Its plan is the CP-SAT hint and the
   fallback.
2. Domains: the aggregated CP-SAT model (`cpsat.py`) chooses, for all gangs at once, which
   gangs are placed and how many pods of each group go to each unit, minimising domains used
   per level from the coarsest, then hosts. A time limit always applies.
3. Nodes and devices: inside each chosen unit, nodes largest capacity first (least hosts), the
   last one tightest-fit; devices best-fit (`capacity.py`). A unit where the relaxation of
   shared capacity was too loose is repaired by re-placing that gang greedily.
4. Ranks: members of each group sorted by topology path, so ranks are contiguous inside
   domains and slices of consecutive ranks fall inside one domain.
5. Validate the plan independently (`validate.py`); an invalid plan is never returned: the
   greedy plan replaces it, and an invalid greedy plan places nothing.
Unplaced gangs carry the binding constraint in words (`explain.py`).

Around these phases: gangs with sub-groups are left out of phases 1-3 and placed afterwards by
their own search on what the others left (`subgroups.py`); balanced gangs are then spread
evenly over their preferred-level domains (`balance.py`); and when any group has node scores
(preferred nodes, node pools), the whole plan runs once per score tier a scored gang needs,
best tier first (`_preferring`). Priority order for a gang: admission, required topology and quorum
(sub-groups included), then its best preferred tier, then compactness, then balance.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import structlog

from solver.admit import check
from solver.balance import balanced
from solver.compact import compact, floors
from solver.cpsat import DomainModel, DomainSolution
from solver.explain import Explanation, explain
from solver.greedy import greedy, place_gang
from solver.ledger import Ledger
from solver.model import (
    Assignment,
    ClusterSnapshot,
    EqGroup,
    GangName,
    GangPlan,
    GangRequest,
    NodeName,
    Outcome,
    PlanResult,
    ScoreBand,
    SolveStatus,
)
from solver.objective import compactness, domains_used
from solver.params import PlacementMode, SolverParams, UnlabeledNodes
from solver.placement import Member, gang_order, live_caps, pick_nodes, take_selection
from solver.problem import Problem, prepare
from solver.subgroups import explain_subgrouped, place_subgrouped
from solver.topology import TopologyIndex
from solver.validate import validate

log = structlog.get_logger("phalanx.solver")

Placement = dict[int, list[Member]]
DEFAULT_PARAMS = SolverParams()


def plan(
    snapshot: ClusterSnapshot,
    requests: Sequence[GangRequest],
    *,
    params: SolverParams = DEFAULT_PARAMS,
    topology: TopologyIndex | None = None,
) -> PlanResult:
    """Plan every gang (single pods are gangs of one) against one snapshot, all-or-nothing per
    gang. `topology` may be passed in when the caller caches it per snapshot generation."""
    started = time.perf_counter()
    requests = list(requests)
    topo = topology or TopologyIndex(snapshot)
    rejected = {i: why for i, r in enumerate(requests) if (why := check(topo, r)) is not None}
    admitted = [r for i, r in enumerate(requests) if i not in rejected]
    if any(g.node_scores for r in admitted for g in r.groups):
        result = _preferring(snapshot, admitted, params, topo, started)
    else:
        result = _plan(snapshot, admitted, params, topo, started)
    return _with_rejected(requests, rejected, result) if rejected else result


MAX_TIERS = 4  # score tiers tried per gang (the best ones), before all its eligible nodes
# Tiers a caller names (`EqGroup.tiers`) tried at most: 16 node pools, each with a sub-tier for
# its best preferred-affinity nodes, and the unpooled nodes' two take 34.
MAX_GIVEN_TIERS = 40

Level = tuple[ScoreBand | None, ...]  # per group of a gang, the band it keeps to (None: as asked)


def _preferring(
    snapshot: ClusterSnapshot, requests: list[GangRequest], params: SolverParams, topo: TopologyIndex, started: float
) -> PlanResult:
    """Preferred nodes (`EqGroup.node_scores`) as tiers: each gang with scores is first planned
    on its best tier only (its best-scored nodes, or its first node pool), and a gang that
    does not fit there is planned again on the next tier, down to every node it may use. A
    preference never hides capacity: the last tier is the gang as asked. Tiers rank above
    compactness, as a node pool does: a preferred rack is used while it holds the gang. A
    gang that widens skips, unplanned, each tier whose nodes cannot hold its quorum even
    alone (`_has_room`): full node pools cost no solve each."""
    tiers = [_levels(r) for r in requests]
    level = [0] * len(requests)
    every = frozenset(n.name for n in snapshot.nodes)
    room: dict[int, list[dict[NodeName, int]]] = {}  # gang -> per group, pods that fit each node
    while True:
        asked = [_on_tier(r, t[lv], every) for r, t, lv in zip(requests, tiers, level, strict=True)]
        result = _plan(snapshot, asked, params, topo, started)
        widen = [
            i for i, g in enumerate(result.gangs) if g.outcome is not Outcome.PLACED and level[i] < len(tiers[i]) - 1
        ]
        if not widen:
            return result
        for i in widen:
            if i not in room:
                room[i] = _node_room(snapshot, requests[i], topo, params)
            level[i] += 1
            while level[i] < len(tiers[i]) - 1 and not _has_room(requests[i], tiers[i][level[i]], room[i]):
                level[i] += 1


def _levels(request: GangRequest) -> list[Level]:
    """The tiers to plan the gang on, best first, ending with the gang as asked. Groups that
    name tiers (`EqGroup.tiers`) are planned rank by rank, the ranks of them all in order
    (MAX_GIVEN_TIERS at most): at each, every such group keeps to its band of that rank, or
    to no node when it has none, so the gang is planned inside one node pool at a time, never
    spread over two by the position of its groups' tiers. Scored groups that name none take
    the best MAX_TIERS distinct scores s of them all (the band s..100 each), by position.
    Consecutive levels alike are tried once."""
    groups = request.groups
    scored = [g for g in groups if g.node_scores]
    derived = sorted({s for g in scored if not g.tiers for _, s in g.node_scores if s > 0}, reverse=True)
    ranked = [{_rank(b, i): b for i, b in enumerate(g.tiers)} for g in groups]
    ranks = sorted({r for bands in ranked for r in bands})[:MAX_GIVEN_TIERS]
    levels: list[Level] = []
    for i in range(max(min(len(derived), MAX_TIERS), len(ranks))):
        level = tuple(_band(g, bands, derived, ranks, i) for g, bands in zip(groups, ranked, strict=True))
        if not levels or level != levels[-1]:
            levels.append(level)
    return [*levels, tuple(None for _ in groups)]


NOWHERE = ScoreBand(101, 100)  # a band no node scores in


def _rank(band: ScoreBand, position: int) -> int:
    return position if band.rank is None else band.rank


def _band(
    group: EqGroup, bands: dict[int, ScoreBand], derived: list[int], ranks: list[int], i: int
) -> ScoreBand | None:
    if not group.node_scores:
        return None
    if group.tiers:
        if i >= len(ranks):
            return None
        found = bands.get(ranks[i], NOWHERE)
        return ScoreBand(found.low, found.high)  # the rank has done its work: equal bands compare equal
    return ScoreBand(derived[i]) if i < min(len(derived), MAX_TIERS) else None


def _in_band(group: EqGroup, band: ScoreBand, every: frozenset[NodeName]) -> frozenset[NodeName]:
    """The nodes of the snapshot (`every`) that score within `band` (absent nodes score 0)."""
    if band.low > 0:
        return frozenset(n for n, s in group.node_scores if band.low <= s <= band.high)
    return every - {n for n, s in group.node_scores if s > band.high}


def _on_tier(request: GangRequest, level: Level, every: frozenset[NodeName]) -> GangRequest:
    """The request with each group kept to its band of `level`."""
    if all(band is None for band in level):
        return request
    groups = []
    for g, band in zip(request.groups, level, strict=True):
        if band is not None:
            kept = _in_band(g, band, every)
            allowed = g.shape.allowed_nodes
            g = replace(g, shape=replace(g.shape, allowed_nodes=kept if allowed is None else allowed & kept))
        groups.append(g)
    return replace(request, groups=tuple(groups))


def _node_room(
    snapshot: ClusterSnapshot, request: GangRequest, topo: TopologyIndex, params: SolverParams
) -> list[dict[NodeName, int]]:
    """Per group of `request`, the pods of it that fit each node of the snapshot as it is."""
    prepared = prepare(snapshot, [request], topo, unlabeled=params.unlabeled_nodes).gangs[0]
    return [{snapshot.nodes[i].name: c for i, c in caps.node_caps.items()} for caps in prepared.groups]


def _has_room(request: GangRequest, level: Level, room: list[dict[NodeName, int]]) -> bool:
    """Whether the tier's nodes could hold the gang's quorum, each group counted alone on them:
    a necessary condition only (other gangs, topology and shared nodes may still refuse it), so
    a tier that fails it would fail planned too."""
    total = 0
    for group, band, fits in zip(request.groups, level, room, strict=True):
        if band is None:
            total += min(group.count, sum(fits.values()))
        else:
            score = dict(group.node_scores)
            free = sum(c for n, c in fits.items() if band.low <= score.get(n, 0) <= band.high)
            total += min(group.count, free)
    return total >= request.quorum


def _with_rejected(requests: list[GangRequest], rejected: dict[int, Explanation], result: PlanResult) -> PlanResult:
    """The admitted gangs' plan with every rejected request answered in its place."""
    planned = iter(result.gangs)
    gangs = []
    for i, r in enumerate(requests):
        why = rejected.get(i)
        gangs.append(next(planned) if why is None else GangPlan(r.name, why.outcome, explanation=why.message))
    notes = (*result.notes, *(f"{requests[i].name}: {why.message}" for i, why in sorted(rejected.items())))
    return replace(result, gangs=tuple(gangs), notes=notes)


def _plan(
    snapshot: ClusterSnapshot, requests: list[GangRequest], params: SolverParams, topo: TopologyIndex, started: float
) -> PlanResult:
    full = prepare(snapshot, requests, topo, unlabeled=params.unlabeled_nodes)
    # Gangs with sub-groups are placed by their own search once the others are (`subgroups.py`);
    # the others are solved as a problem of their own (gang indices are list positions).
    plain = [gp.index for gp in full.gangs if not gp.request.subgroups]
    if len(plain) < len(full.gangs):
        problem = prepare(snapshot, [requests[i] for i in plain], topo, unlabeled=params.unlabeled_nodes)
    else:
        problem = full
    spread = params.placement_mode is PlacementMode.LOW_LOAD_FIRST
    baseline = greedy(problem, Ledger(snapshot, spread=spread, workload=params.workload))
    hint = _better(problem, compact(problem, Ledger(snapshot, spread=spread, workload=params.workload)), baseline)
    notes: list[str] = []
    if _meets_floors(problem, hint):
        placed, status, bound = hint, SolveStatus.OPTIMAL, None
        notes.append("proven by bound: every gang placed in full at its compactness floor")
    else:
        model = DomainModel(problem, params)
        model.build()
        model.hint(hint)
        solution = model.solve(hint)
        bound = solution.bound
        if solution.status in ("OPTIMAL", "FEASIBLE"):
            placed, repaired = realize(problem, solution, Ledger(snapshot, spread=spread, workload=params.workload))
            notes.extend(repaired)
            status = SolveStatus.OPTIMAL if solution.proven and not repaired else SolveStatus.FEASIBLE
            if _score(problem, placed) < _score(problem, hint):
                # The relaxation of shared capacity let the model promise more than nodes and
                # devices hold: never return less than the heuristic plan.
                notes.append("model plan could not be realized in full; heuristic plan kept")
                placed, status, bound = hint, SolveStatus.FEASIBLE, None
        else:
            log.warning("cp-sat found no plan in time; using the heuristic plan", status=solution.status)
            notes.append(f"cp-sat {solution.status}: heuristic fallback")
            placed, status, bound = hint, SolveStatus.FALLBACK, None
    if problem is not full:
        placed = _with_subgrouped(full, {plain[k]: v for k, v in placed.items()}, params)
        baseline = _with_subgrouped(full, {plain[k]: v for k, v in baseline.items()}, params)
        status = SolveStatus.FEASIBLE if status is SolveStatus.OPTIMAL else status
    if any(gp.request.topology.balanced for gp in full.gangs):
        ledger = Ledger(snapshot, spread=spread, workload=params.workload)
        placed = balanced(full, placed, ledger, params.unlabeled_nodes)
    result = _result(full, placed, status, bound, notes, started, params.unlabeled_nodes)
    errors = validate(snapshot, requests, result)
    if errors and placed is not baseline:
        log.error("plan failed validation; using the greedy plan", errors=errors[:5])
        result = _result(
            full, baseline, SolveStatus.FALLBACK, None, [*notes, *errors[:3]], started, params.unlabeled_nodes
        )
        errors = validate(snapshot, requests, result)
    if errors:
        log.error("greedy plan failed validation; placing nothing", errors=errors[:5])
        result = _result(full, {}, SolveStatus.INFEASIBLE, None, [*notes, *errors[:3]], started, params.unlabeled_nodes)
    return result


def _with_subgrouped(full: Problem, placed: Placement, params: SolverParams) -> Placement:
    """`placed` plus the gangs with sub-groups, placed on what the others left."""
    ledger = Ledger(
        full.snapshot, spread=params.placement_mode is PlacementMode.LOW_LOAD_FIRST, workload=params.workload
    )
    for k, members in placed.items():
        for m in members:
            ledger.apply(m.node, full.gangs[k].request.groups[m.group].shape, m.devices)
    out = dict(placed)
    for gp in gang_order(full):
        if gp.request.subgroups:
            found = place_subgrouped(full, gp, ledger, params.unlabeled_nodes, time_limit_s=params.time_limit_s)
            if found is not None:
                out[gp.index] = found
    return out


def _score(problem: Problem, placed: Placement) -> tuple[int, ...]:
    """Members placed per priority (highest first), then negated compactness: larger is better."""
    priorities = sorted({gp.request.priority for gp in problem.gangs}, reverse=True)
    members = [sum(len(v) for k, v in placed.items() if problem.gangs[k].request.priority == p) for p in priorities]
    return (*members, -sum(compactness(problem.topo, problem.gangs[k], v) for k, v in placed.items()))


def _better(problem: Problem, a: Placement, b: Placement) -> Placement:
    return a if _score(problem, a) >= _score(problem, b) else b


def _meets_floors(problem: Problem, placed: Placement) -> bool:
    """Every gang placed in full and at the floor of every counted level: nothing can be
    more compact, so the plan is optimal without a search."""
    for gp in problem.gangs:
        members = placed.get(gp.index)
        if members is None or len(members) != gp.request.count:
            return False
        least = floors(problem.topo, gp)
        if least is None:
            return False
        used = domains_used(problem.topo, [m.node for m in members])
        if any(used[level] > floor for level, floor in least.items()):
            return False
    return True


def realize(problem: Problem, solution: DomainSolution, ledger: Ledger) -> tuple[Placement, list[str]]:
    """Phase 3: nodes and devices inside the units the model chose, gang by gang."""
    placed: Placement = {}
    notes: list[str] = []
    order = sorted(solution.units, key=lambda k: (-problem.gangs[k].request.priority, k))
    for k in order:
        gp = problem.gangs[k]
        ledger.begin()
        members = _realize_gang(problem, k, solution.units[k], ledger)
        if members is not None:
            ledger.commit()
        else:
            ledger.rollback()
            members = place_gang(problem.topo, gp, ledger)  # transactional itself
            notes.append(f"{gp.request.name}: unit capacity relaxation repaired greedily")
            if members is None:
                notes.append(f"{gp.request.name}: could not be realized")
                continue
        placed[k] = members
    return placed, notes


def _realize_gang(problem: Problem, k: int, units: list[dict[int, int]], ledger: Ledger) -> list[Member] | None:
    gp = problem.gangs[k]
    host = _one_host(problem, k, units, ledger) if gp.required_level == problem.topo.host_level else None
    members: list[Member] = []
    for caps, per_unit in zip(gp.groups, units, strict=True):
        live = live_caps(caps, ledger)
        for unit, pods in sorted(per_unit.items()):
            nodes = [n for n in problem.topo.unit_nodes(unit) if n in live]
            if host is not None:
                nodes = [n for n in nodes if n == host]
            selection = pick_nodes(nodes, pods, live)
            if selection is None:
                return None
            if not take_selection(ledger, caps, selection, members):
                return None
    return members


def _one_host(problem: Problem, k: int, units: list[dict[int, int]], ledger: Ledger) -> int | None:
    """The node a one-host gang goes to: the tightest that holds every group's pods, each
    group counted alone (whichever group comes first); None when none does (the caller's
    repair then places the gang greedily)."""
    gp = problem.gangs[k]
    groups = zip(gp.groups, units, strict=True)
    wanted = [(live_caps(caps, ledger), need) for caps, per_unit in groups if (need := sum(per_unit.values())) > 0]
    if not wanted:
        return None
    hosts = [n for n in wanted[0][0] if all(live.get(n, 0) >= need for live, need in wanted)]
    return min(hosts, key=lambda n: (sum(live[n] for live, _ in wanted), n), default=None)


def _result(
    problem: Problem,
    placed: Placement,
    status: SolveStatus,
    bound: int | None,
    notes: list[str],
    started: float,
    unlabeled: UnlabeledNodes = UnlabeledNodes.EXCLUDE,
) -> PlanResult:
    gangs = []
    objective = 0
    for gp in problem.gangs:
        members = placed.get(gp.index)
        if members:
            assignments = _ranked(problem, gp.index, members)
            used = domains_used(problem.topo, [m.node for m in members])
            objective += compactness(problem.topo, gp, members)
            gangs.append(GangPlan(gp.request.name, Outcome.PLACED, assignments, domains_used=used))
        else:
            others = any(k != gp.index for k in placed)
            if gp.request.subgroups:
                why = explain_subgrouped(problem, gp, unlabeled, others_placed=others)
            else:
                why = explain(problem, gp, others_placed=others)
            gangs.append(GangPlan(gp.request.name, why.outcome, explanation=why.message))
    if not placed:
        status = SolveStatus.INFEASIBLE
    # Without a search bound, only a plan proven by its floors has one: its own objective.
    final_bound = bound if bound is not None else (objective if status is SolveStatus.OPTIMAL else 0)
    return PlanResult(status, tuple(gangs), objective, final_bound, time.perf_counter() - started, tuple(notes))


def _ranked(problem: Problem, k: int, members: list[Member]) -> tuple[Assignment, ...]:
    gp = problem.gangs[k]
    nodes = problem.snapshot.nodes
    out: list[Assignment] = []
    offset = 0
    for g, eq in enumerate(gp.request.groups):
        mine = [m for m in members if m.group == g]
        mine.sort(key=lambda m: (nodes[m.node].topology, nodes[m.node].name, [d.index for d in m.devices]))
        for i, m in enumerate(mine):
            out.append(Assignment(GangName(gp.request.name), eq.name, offset + i, nodes[m.node].name, m.devices))
        offset += eq.count
    return tuple(out)
