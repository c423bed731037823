"""Phase 2 of `plan`: the aggregated CP-SAT model that decides how many pods of each gang
group go to each unit (rack), which domains are used and how many hosts each unit needs.

Variables are counts per (gang, group, unit), never per pod or per node, so 16k nodes in 512
racks give a model of a few thousand variables. The model is exact for single-group gangs:
a unit's capacity is the sum of its nodes' exact capacities, and the least number of hosts
holding y pods is captured by one line per distinct node capacity (`families.host_lines`).
Gangs with several groups, and several gangs on one unit, share unit capacity through a
per-resource relaxation; phase 3 places nodes and devices and repairs any gap.

The constraint families are in families.py, one class each; this module creates the
variables, asks each family to add its constraints, sets the objectives and solves.
Two objectives in two stages: members placed (by priority) first; then, with that many fixed,
domains used per counted level from the coarsest (lexicographic through weights), then hosts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ortools.sat.python import cp_model

from solver.families import (
    BoundFamily,
    CapacityFamily,
    GangFamily,
    GangVars,
    HostFamily,
    LinearTerms,
    TopologyFamily,
    unit_label,
)
from solver.objective import level_weights
from solver.params import SolverParams
from solver.placement import Member, domain_caps
from solver.problem import Problem
from solver.topology import TopologyIndex


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
                            0, min(cap, caps.count), f"{gp.request.name}/g{caps.group}/{unit_label(topo, u)}"
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
    """Weight of one member per priority: one member of a higher priority outweighs every
    member of all lower priorities together. A member of the lowest priority weighs
    `compact_max`; `build` passes 1 because compactness is minimised in a stage of its own
    (`solve`), so the member objective never has to outweigh it."""
    weights: dict[int, int] = {}
    below = 0
    for prio in sorted({g.gang.request.priority for g in gangs}):
        weights[prio] = compact_max + below
        below += weights[prio] * sum(g.gang.request.count for g in gangs if g.gang.request.priority == prio)
    return weights


def _under(topo: TopologyIndex, unit: int, d: int) -> bool:
    return unit >= 0 and topo.ancestor(unit, topo.domains[d].level) == d
