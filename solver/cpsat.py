"""Phase 1: the aggregated CP-SAT model that decides how many pods of each gang group go to
each unit (rack), which domains are used and how many hosts each unit needs.

Variables are counts per (gang, group, unit), never per pod or per node, so 16k nodes in 512
racks give a model of a few thousand variables. The model is exact for single-group gangs:
a unit's capacity is the sum of its nodes' exact capacities, and the least number of hosts
holding y pods is captured by one line per distinct node capacity (see `host_lines`). Gangs
with several groups, and several gangs on one unit, share unit capacity through a
per-resource relaxation; phase 2 places nodes and devices and repairs any gap.

Constraint families, each a class that adds its constraints and returns objective terms:
`GangFamily` (all-or-nothing, quorum), `CapacityFamily` (shared unit capacity),
`TopologyFamily` (domain use, required level, slices), `HostFamily` (hosts per unit).
Two objectives in two stages: members placed (by priority) first; then, with that many fixed,
domains used per counted level from the coarsest (lexicographic through weights), then hosts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ortools.sat.python import cp_model

from solver.compact import domains_at, scope_floors
from solver.model import GpuKind, PodShape
from solver.objective import level_weights
from solver.params import SolverParams
from solver.placement import Member, domain_caps
from solver.problem import GangProblem, Problem, host_lines
from solver.topology import TopologyIndex

LinearTerms = list[tuple[int, cp_model.IntVar]]


@dataclass(slots=True)
class GangVars:
    """The variables of one gang, with contextual names."""

    gang: GangProblem
    placed: cp_model.IntVar
    members: list[cp_model.IntVar] = field(default_factory=list)  # per group
    y: list[dict[int, cp_model.IntVar]] = field(default_factory=list)  # per group: unit -> pods
    used: dict[int, cp_model.IntVar] = field(default_factory=dict)  # domain -> used
    hosts: dict[int, cp_model.IntVar] = field(default_factory=dict)  # unit -> hosts
    domain_caps: list[dict[int, int]] = field(default_factory=list)  # per group

    def units(self) -> set[int]:
        return {u for per_group in self.y for u in per_group}

    def pods_in(self, units: list[int]) -> cp_model.LinearExpr:
        return sum((g[u] for g in self.y for u in units if u in g), cp_model.LinearExpr.constant(0))


class GangFamily:
    """All-or-nothing: every group at full count, or at least the quorum in total, or none."""

    def add(self, m: cp_model.CpModel, gv: GangVars) -> None:
        req = gv.gang.request
        for caps, var, per_unit in zip(gv.gang.groups, gv.members, gv.y, strict=True):
            m.add(sum(per_unit.values(), cp_model.LinearExpr.constant(0)) == var)
            if req.quorum >= req.count:
                m.add(var == caps.count * gv.placed)
            else:
                m.add(var <= caps.count * gv.placed)
        if req.quorum < req.count:
            m.add(sum(gv.members) >= req.quorum * gv.placed)


class CapacityFamily:
    """Gangs and groups sharing a unit share its resources (a relaxation per resource)."""

    def add(self, m: cp_model.CpModel, gangs: list[GangVars], problem: Problem) -> None:
        sharers: dict[int, list[tuple[PodShape, cp_model.IntVar]]] = {}
        for gv in gangs:
            for caps, per_unit in zip(gv.gang.groups, gv.y, strict=True):
                for u, var in per_unit.items():
                    sharers.setdefault(u, []).append((caps.shape, var))
        for u, items in sharers.items():
            if len(items) < 2:
                continue  # a lone group's exact capacity is already its variable's bound
            free = _unit_free(problem, u)
            for dim, total in free.items():
                terms = [(_demand(shape, dim), var) for shape, var in items]
                terms = [(c, v) for c, v in terms if c > 0]
                if len(terms) > 1:
                    m.add(sum(c * v for c, v in terms) <= total)


class TopologyFamily:
    """Domain-use flags for counted levels, one domain at the required level, slices."""

    def add(self, m: cp_model.CpModel, gv: GangVars, topo: TopologyIndex) -> None:
        gp = gv.gang
        levels = {lv for lv in gp.counted_levels if lv < topo.above}
        if 0 <= gp.required_level < topo.above:
            levels.add(gp.required_level)
        one_host = gp.required_level == topo.host_level and topo.above > 0
        if one_host:
            levels.add(topo.above - 1)
        totals = _total_caps(gv)
        for level in sorted(levels):
            for d in topo.levels_of[level]:
                cap = totals.get(d, 0)
                if cap <= 0:
                    continue
                used = m.new_bool_var(f"{gp.request.name}/used/{topo.domains[d].label}")
                gv.used[d] = used
                m.add(gv.pods_in(_units(topo, d)) <= min(cap, gp.request.count) * used)
        required = topo.above - 1 if one_host else gp.required_level
        if 0 <= required < topo.above:
            m.add(sum(gv.used[d] for d in topo.levels_of[required] if d in gv.used) <= 1)
        host_slice = gp.groups[0].host_slice if gp.groups else 1
        if host_slice > 1:
            # k pods per host: each unit holds a multiple of k (node capacities are multiples).
            for u in sorted(gv.units()):
                t = m.new_int_var(
                    0, gp.request.count // host_slice, f"{gp.request.name}/host-slices/{_unit_label(topo, u)}"
                )
                m.add(gv.pods_in([u]) == host_slice * t)
        for s in gp.slices:
            for d in topo.levels_of[s.level]:
                cap = totals.get(d, 0)
                if cap < s.size:
                    m.add(gv.pods_in(_units(topo, d)) == 0)
                    continue
                t = m.new_int_var(0, cap // s.size, f"{gp.request.name}/slices/{topo.domains[d].label}")
                m.add(gv.pods_in(_units(topo, d)) == s.size * t)


class HostFamily:
    """hosts[u] >= the least number of nodes of unit u that hold the pods placed there."""

    def add(self, m: cp_model.CpModel, gv: GangVars, topo: TopologyIndex) -> None:
        gp = gv.gang
        for u in sorted(gv.units()):
            nodes = topo.unit_nodes(u)
            groups = [(caps, per_unit[u]) for caps, per_unit in zip(gp.groups, gv.y, strict=True) if u in per_unit]
            limit = 1 if gp.required_level == topo.host_level else len(nodes)
            h = m.new_int_var(0, limit, f"{gp.request.name}/hosts/{_unit_label(topo, u)}")
            gv.hosts[u] = h
            for caps, var in groups:
                node_caps = [caps.node_caps[n] for n in nodes if n in caps.node_caps]
                for c, a, s in host_lines(node_caps):
                    m.add(c * h >= var - s + c * a)


class BoundFamily:
    """Redundant lower-bound cuts that let CP-SAT prove optimality at once.

    For every counted level the gang uses at least as many domains as the fewest that could
    hold its quorum (`compact.scope_floors`), inside each domain of the required level (an
    enforced cut) and across all of them (a plain cut, which CP-SAT linearizes into its LP at
    any level; without it the LP spreads pods fractionally and the bound stays weak).
    """

    def add(self, m: cp_model.CpModel, gv: GangVars, topo: TopologyIndex) -> None:
        gp = gv.gang
        per_scope = scope_floors(topo, gp)
        everywhere: dict[int, int] = {}
        for roots, least in per_scope:
            flag = gv.used.get(roots[0]) if len(per_scope) > 1 else gv.placed
            if flag is None:
                continue
            if least is None:
                m.add(flag == 0)
                continue
            for level, floor in least.items():
                everywhere[level] = min(everywhere.get(level, floor), floor)
                if floor > 1 and len(per_scope) > 1:
                    m.add(sum(self._counters(gv, topo, roots, level)) >= floor * flag)
        all_roots = [r for roots, _ in per_scope for r in roots]
        for level, floor in everywhere.items():
            if floor > 1:
                m.add(sum(self._counters(gv, topo, all_roots, level)) >= floor * gv.placed)

    @staticmethod
    def _counters(gv: GangVars, topo: TopologyIndex, roots: list[int], level: int) -> list[cp_model.IntVar]:
        if level == topo.host_level:
            return [gv.hosts[u] for u in domains_at(topo, roots, topo.above - 1 if topo.above else 0) if u in gv.hosts]
        return [gv.used[d] for d in domains_at(topo, roots, level) if d in gv.used]


@dataclass(slots=True)
class DomainSolution:
    status: str
    units: dict[int, list[dict[int, int]]]  # gang index -> per group: unit -> pods
    objective: int
    bound: int
    proven: bool


class DomainModel:
    def __init__(self, problem: Problem, params: SolverParams) -> None:
        self.problem = problem
        self.params = params
        self.model = cp_model.CpModel()
        self.gangs: list[GangVars] = []
        self.weights: dict[int, dict[int, int]] = {}  # gang -> level -> weight
        self.member_terms: LinearTerms = []
        self.compact_terms: LinearTerms = []

    def build(self) -> None:
        topo, m = self.problem.topo, self.model
        for gp in self.problem.gangs:
            gv = GangVars(gp, m.new_bool_var(f"{gp.request.name}/placed"))
            for caps in gp.groups:
                gv.members.append(m.new_int_var(0, caps.count, f"{gp.request.name}/g{caps.group}/members"))
                gv.y.append(
                    {
                        u: m.new_int_var(
                            0, min(cap, caps.count), f"{gp.request.name}/g{caps.group}/{_unit_label(topo, u)}"
                        )
                        for u, cap in sorted(caps.unit_caps.items())
                    }
                )
                gv.domain_caps.append(domain_caps(topo, gp, caps.node_caps))
            GangFamily().add(m, gv)
            TopologyFamily().add(m, gv, topo)
            if topo.host_level in gp.counted_levels or gp.required_level == topo.host_level:
                HostFamily().add(m, gv, topo)
            BoundFamily().add(m, gv, topo)
            self.gangs.append(gv)
        CapacityFamily().add(m, self.gangs, self.problem)
        self._objective()

    def _objective(self) -> None:
        """Two objectives, solved in two stages (see `solve`): members placed weighted by
        priority, then compactness. Keeping them apart keeps coefficients small, which keeps
        CP-SAT's LP relaxation numerically sound and its bound tight."""
        topo = self.problem.topo
        for gv in self.gangs:
            weights = level_weights(topo, gv.gang)
            self.weights[gv.gang.index] = weights
            for d, used in gv.used.items():
                level = topo.domains[d].level
                if level in weights:
                    self.compact_terms.append((weights[level], used))
            for h in gv.hosts.values():
                self.compact_terms.append((weights.get(topo.host_level, 0), h))
        by_priority = member_weights(self.gangs, 1)
        for gv in self.gangs:
            w = by_priority[gv.gang.request.priority]
            self.member_terms.extend((w, var) for var in gv.members)

    def hint(self, placed: dict[int, list[Member]]) -> None:
        topo = self.problem.topo
        for gv in self.gangs:
            members = placed.get(gv.gang.index, [])
            self.model.add_hint(gv.placed, 1 if members else 0)
            per_group: list[dict[int, int]] = [{} for _ in gv.y]
            nodes_per_unit: dict[int, set[int]] = {}
            for mem in members:
                u = topo.unit_of[mem.node]
                per_group[mem.group][u] = per_group[mem.group].get(u, 0) + 1
                nodes_per_unit.setdefault(u, set()).add(mem.node)
            for g, per_unit in enumerate(gv.y):
                self.model.add_hint(gv.members[g], sum(per_group[g].values()))
                for u, var in per_unit.items():
                    self.model.add_hint(var, per_group[g].get(u, 0))
            used_units = set(nodes_per_unit)
            for d, var in gv.used.items():
                self.model.add_hint(var, 1 if any(_under(topo, u, d) for u in used_units) else 0)
            for u, var in gv.hosts.items():
                self.model.add_hint(var, len(nodes_per_unit.get(u, ())))

    def solve(self, baseline: dict[int, list[Member]]) -> DomainSolution:
        """Stage 1 maximises members placed (skipped when the greedy baseline already places
        every gang in full: nothing can beat that); stage 2 fixes that many and minimises
        compactness. The time limit covers both stages."""
        m, p = self.model, self.params
        deadline = time.perf_counter() + p.time_limit_s
        members = sum(c * v for c, v in self.member_terms)
        full = len(baseline) == len(self.gangs) and all(
            len(baseline[gv.gang.index]) == gv.gang.request.count for gv in self.gangs
        )
        members_proven = full
        if full:
            for gv in self.gangs:
                m.add(gv.placed == 1)
                for caps, var in zip(gv.gang.groups, gv.members, strict=True):
                    m.add(var == caps.count)
        else:
            m.maximize(members)
            first = self._run(deadline - (deadline - time.perf_counter()) / 2)
            if first.code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                return DomainSolution(first.solver.status_name(first.code), {}, 0, 0, proven=False)
            best = round(first.solver.objective_value)
            m.add(members >= best)
            members_proven = first.code == cp_model.OPTIMAL
            self._rehint(first.solver)
        m.minimize(sum(c * v for c, v in self.compact_terms if c))
        second = self._run(deadline)
        code, solver = second.code, second.solver
        status = solver.status_name(code)
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return DomainSolution(status, {}, 0, 0, proven=False)
        units: dict[int, list[dict[int, int]]] = {}
        for gv in self.gangs:
            if solver.value(gv.placed):
                units[gv.gang.index] = [
                    {u: v for u, var in per_unit.items() if (v := solver.value(var)) > 0} for per_unit in gv.y
                ]
        proven = code == cp_model.OPTIMAL and members_proven
        return DomainSolution(status, units, round(solver.objective_value), round(solver.best_objective_bound), proven)

    def _run(self, deadline: float) -> _Run:
        solver = cp_model.CpSolver()
        p = self.params
        solver.parameters.max_time_in_seconds = max(0.05, deadline - time.perf_counter())
        solver.parameters.num_workers = p.workers
        solver.parameters.random_seed = p.seed
        return _Run(solver, solver.solve(self.model))

    def _rehint(self, solver: cp_model.CpSolver) -> None:
        self.model.clear_hints()  # type: ignore[no-untyped-call]
        for gv in self.gangs:
            variables = [gv.placed, *gv.members, *gv.used.values(), *gv.hosts.values()]
            variables.extend(v for per_unit in gv.y for v in per_unit.values())
            for var in variables:
                self.model.add_hint(var, solver.value(var))


@dataclass(slots=True)
class _Run:
    solver: cp_model.CpSolver
    code: Any


def member_weights(gangs: list[GangVars], compact_max: int) -> dict[int, int]:
    """Weight of one member per priority: above all compactness, and one member of a higher
    priority above every member of all lower priorities together."""
    weights: dict[int, int] = {}
    below = 0
    for prio in sorted({g.gang.request.priority for g in gangs}):
        weights[prio] = compact_max + below
        below += weights[prio] * sum(g.gang.request.count for g in gangs if g.gang.request.priority == prio)
    return weights


def _total_caps(gv: GangVars) -> dict[int, int]:
    totals: dict[int, int] = {}
    for caps in gv.domain_caps:
        for d, c in caps.items():
            totals[d] = totals.get(d, 0) + c
    return totals


def _units(topo: TopologyIndex, d: int) -> list[int]:
    """The units (leaf domains) under domain d."""
    return domains_at(topo, [d], topo.above - 1)


def _under(topo: TopologyIndex, unit: int, d: int) -> bool:
    return unit >= 0 and topo.ancestor(unit, topo.domains[d].level) == d


def _unit_label(topo: TopologyIndex, u: int) -> str:
    return topo.domains[u].label if u >= 0 else "all"


def _unit_free(problem: Problem, u: int) -> dict[str, int]:
    free: dict[str, int] = {}
    for n in problem.topo.unit_nodes(u):
        node = problem.snapshot.nodes[n]
        f = node.free
        for dim, value in (("cpu", f.cpu_milli), ("memory", f.memory_mib), ("pods", f.pods), *f.extended):
            free[dim] = free.get(dim, 0) + max(0, value)
        for d in node.gpus:
            table = d.cuttable()
            if table is not None:
                # Each profile's own count: a relaxation across profiles (validated downstream).
                for p in table.profiles:
                    free[f"mig:{p.name}"] = free.get(f"mig:{p.name}", 0) + d.mig_free(p.name)
            if d.is_mig:
                for s in d.mig:
                    free[f"mig:{s.profile}"] = free.get(f"mig:{s.profile}", 0) + s.free
            else:
                free["gpu:idle"] = free.get("gpu:idle", 0) + (1 if d.is_idle else 0)
                free["gpu:milli"] = free.get("gpu:milli", 0) + d.free_milli
                free["gpu:tflops"] = free.get("gpu:tflops", 0) + d.free_tflops
    return free


def _demand(shape: PodShape, dim: str) -> int:
    req, gpu = shape.requests, shape.gpu
    kind = gpu.kind
    if dim == "cpu":
        return req.cpu_milli
    if dim == "memory":
        return req.memory_mib
    if dim == "pods":
        return req.pods
    if dim == "gpu:idle":
        return gpu.count if kind is GpuKind.WHOLE else 0
    if dim == "gpu:milli":
        return gpu.count * gpu.milli if kind in (GpuKind.WHOLE, GpuKind.SHARE) else 0
    if dim == "gpu:tflops":
        return gpu.count * gpu.tflops if kind is GpuKind.SHARE else 0
    if dim.startswith("mig:"):
        return gpu.count if kind is GpuKind.MIG and dim == f"mig:{gpu.mig_profile}" else 0
    return req.get(dim)
