"""The CP-SAT constraint families of the domain model (cpsat.py), each a class that adds its
constraints for one gang (`CapacityFamily`: for all gangs at once); the objective terms are
cpsat.py's, from the variables the families fill in.

Variables live in `GangVars`, per gang, with contextual names ("<gang>/g0/<rack>"):
`GangFamily` (all-or-nothing, quorum), `CapacityFamily` (units shared by several groups or
gangs: a relaxation per resource), `TopologyFamily` (domain-use flags, the required level,
slices), `HostFamily` (hosts per unit, through `host_lines`), `BoundFamily` (redundant
lower-bound cuts from `compact.scope_floors`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from solver.compact import domains_at, scope_floors
from solver.model import GpuKind, PodShape
from solver.problem import GangProblem, Problem
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
                    0, gp.request.count // host_slice, f"{gp.request.name}/host-slices/{unit_label(topo, u)}"
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
            h = m.new_int_var(0, limit, f"{gp.request.name}/hosts/{unit_label(topo, u)}")
            gv.hosts[u] = h
            for caps, var in groups:
                node_caps = [caps.node_caps[n] for n in nodes if n in caps.node_caps]
                for line in host_lines(node_caps):
                    m.add(line.cap * h >= var - line.larger_total + line.cap * line.larger)


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
        for scope in per_scope:
            roots, least = scope.roots, scope.least
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
        all_roots = [r for scope in per_scope for r in scope.roots]
        for level, floor in everywhere.items():
            if floor > 1:
                m.add(sum(self._counters(gv, topo, all_roots, level)) >= floor * gv.placed)

    @staticmethod
    def _counters(gv: GangVars, topo: TopologyIndex, roots: list[int], level: int) -> list[cp_model.IntVar]:
        if level == topo.host_level:
            return [gv.hosts[u] for u in domains_at(topo, roots, topo.above - 1 if topo.above else 0) if u in gv.hosts]
        return [gv.used[d] for d in domains_at(topo, roots, level) if d in gv.used]


def _total_caps(gv: GangVars) -> dict[int, int]:
    totals: dict[int, int] = {}
    for caps in gv.domain_caps:
        for d, c in caps.items():
            totals[d] = totals.get(d, 0) + c
    return totals


def _units(topo: TopologyIndex, d: int) -> list[int]:
    """The units (leaf domains) under domain d."""
    return domains_at(topo, [d], topo.above - 1)


def unit_label(topo: TopologyIndex, u: int) -> str:
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


@dataclass(frozen=True, slots=True)
class HostLine:
    """One line of the host bound: hosts h holding y pods satisfy cap*h >= y - larger_total
    + cap*larger, where `larger` nodes have a capacity above `cap` and hold `larger_total`."""

    cap: int
    larger: int
    larger_total: int


def host_lines(caps: list[int]) -> list[HostLine]:
    """The lines of the host bound for nodes of these capacities: with caps sorted descending,
    one line per distinct cap value. Exact: the least h meeting all lines is the least number
    of nodes whose capacities sum to y (take the largest first)."""
    lines = []
    ordered = sorted(caps, reverse=True)
    a = s = 0
    i = 0
    while i < len(ordered):
        c = ordered[i]
        lines.append(HostLine(c, a, s))
        while i < len(ordered) and ordered[i] == c:
            a += 1
            s += c
            i += 1
    return lines
