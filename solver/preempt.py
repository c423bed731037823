"""Gang-aware preemption: which running units to evict so that a gang fits, cheapest first.

A unit is a whole gang or a single pod, evicted whole or not at all, so no victim is ever left
running part of its gang. The caller (the extender) passes only eligible units: lower
priority, or borrowed (over-quota) usage a queue under its deserved quota reclaims, with units
a PodDisruptionBudget protects left out.

The cost of a victim set is lexicographic: (highest victim priority, victims not borrowed,
victim units, milli-GPUs freed). Algorithm, in phases:
1. Fits now? A capacity count (`_Tally`), then a solve: no victims needed.
2. Fits with every unit freed? A count; when even that fails, one solve on the all-freed
   snapshot gives the explanation.
3. Per domain of the required level (the whole cluster without one): candidates are the
   units whose pods all lie inside the domain, so nothing outside the chosen domain is
   evicted. A domain where freeing every candidate still leaves too little is skipped.
4. In each domain, with the count as the test: for each of a few orders (cheapest class
   first -- priority, then borrowed -- and inside a class by node locality, largest or
   smallest first), the shortest feasible prefix, pruned by trying to drop each chosen unit,
   most expensive first. The cheapest result of the orders is the domain's candidate set.
   Counting is exact for one group with only a required level; otherwise it is a necessary
   condition, and phase 5 corrects it.
5. Domains in order of their counted cost: solve (`solver.plan`) on the domain's nodes with
   the set freed. When the solve disagrees with the count, a binary search over the prefix
   with solves, then pruning with solves, within the budget. Victims none of whose pods sit
   on a node the plan uses are dropped (the plan stays valid without them). Stop when the
   next domain's counted cost is no better, or past the budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from solver.device import FULL_SHARE
from solver.fit import eligible, node_fit
from solver.mig import MigSlot
from solver.model import (
    ClusterSnapshot,
    DeviceAssignment,
    GangPlan,
    GangRequest,
    GpuDevice,
    MigSlice,
    Node,
    NodeName,
    Outcome,
    Resources,
)
from solver.params import SolverParams
from solver.plan import plan
from solver.queues import mig_amounts
from solver.topology import TopologyIndex

FITS_NOW = "fits without evictions"
NOT_EVEN_ALL = "does not fit even with every candidate evicted"
ONLY_SPANNING = "fits only by evicting units that span more than one {level} domain"
NO_SET_FOUND = "no victim set found within the time budget"
INNER_LIMIT_S = 0.2  # CP-SAT time limit of each solve inside the search (the caller's, if lower)

Cost = tuple[int, int, int, int]
DEFAULT_PARAMS = SolverParams()


@dataclass(frozen=True, slots=True)
class RunningPod:
    """A running pod: where it is, its scalar requests (pods=1 included) and its devices."""

    uid: str
    node: NodeName
    requests: Resources
    devices: tuple[DeviceAssignment, ...] = ()


@dataclass(frozen=True, slots=True)
class VictimUnit:
    """A whole gang or a single pod, evicted whole or not at all."""

    name: str
    queue: str
    priority: int
    pods: tuple[RunningPod, ...]
    borrowed: bool = False  # over-quota usage of its queue

    @property
    def gpu_milli(self) -> int:
        """GPU share the unit holds: 1000 per whole device, a share's milli, a MIG slice's compute."""
        return sum(_device_milli(a) for p in self.pods for a in p.devices)


@dataclass(frozen=True, slots=True)
class Preemption:
    """The chosen victims and the preemptor's plan with them gone; `plan` None: none works."""

    victims: tuple[str, ...]
    plan: GangPlan | None
    domain: tuple[str, ...] = ()  # topology path of the required-level domain used
    cost: tuple[int, ...] = ()  # (highest priority, victims not borrowed, units, milli-GPUs freed)
    explanation: str = ""

    @property
    def found(self) -> bool:
        return self.plan is not None and self.plan.outcome is Outcome.PLACED


Feasible = Callable[[Sequence[VictimUnit]], bool]


def _device_milli(a: DeviceAssignment) -> int:
    return mig_amounts(a.mig_profile)[0] if a.mig_profile else min(a.milli, FULL_SHARE)


# ---------------------------------------------------------------------------- freeing


def free(node: Node, pods: Iterable[RunningPod]) -> Node:
    """The node with those of `pods` that run on it gone: their requests and devices back
    (shares capped at the device's size; a dynamic MIG slice's cut removed)."""
    mine = [p for p in pods if p.node == node.name]
    if not mine:
        return node
    used = node.used
    devices = {d.index: d for d in node.gpus}
    for p in mine:
        used = used.minus(p.requests)
        for a in p.devices:
            if a.index in devices:
                devices[a.index] = _release(devices[a.index], a)
    return replace(node, used=used, gpus=tuple(devices[d.index] for d in node.gpus))


def _release(d: GpuDevice, a: DeviceAssignment) -> GpuDevice:
    if a.mig_profile and a.mig_start >= 0:
        layout = list(d.mig_layout)
        slot = MigSlot(a.mig_profile, a.mig_start)
        if slot in layout:
            layout.remove(slot)
        return replace(d, mig_layout=tuple(layout))
    if a.mig_profile:
        if any(s.profile == a.mig_profile for s in d.mig):
            mig = tuple(MigSlice(s.profile, s.free + 1) if s.profile == a.mig_profile else s for s in d.mig)
        else:
            mig = (*d.mig, MigSlice(a.mig_profile, 1))
        return replace(d, mig=mig)
    if a.milli >= FULL_SHARE:
        return replace(d, free_milli=FULL_SHARE, free_memory_mib=d.memory_mib, free_tflops=d.tflops)
    return replace(
        d,
        free_milli=min(FULL_SHARE, d.free_milli + a.milli),
        free_memory_mib=min(d.memory_mib, d.free_memory_mib + a.memory_mib),
        free_tflops=min(d.tflops, d.free_tflops + a.tflops),
    )


def freed(snapshot: ClusterSnapshot, units: Iterable[VictimUnit]) -> ClusterSnapshot:
    """The snapshot with every pod of `units` gone."""
    by_node: dict[NodeName, list[RunningPod]] = {}
    for u in units:
        for p in u.pods:
            by_node.setdefault(p.node, []).append(p)
    nodes = tuple(free(n, by_node[n.name]) if n.name in by_node else n for n in snapshot.nodes)
    return replace(snapshot, nodes=nodes)


# ---------------------------------------------------------------------------- counting


class _Tally:
    """Pods of each gang group that fit on a set of nodes with some units freed, kept up to
    date unit by unit. Freeing more never lowers it, so `feasible` is monotone in the set: a
    necessary condition for the gang to fit, exact for one group with only a required level."""

    def __init__(self, nodes: Sequence[Node], request: GangRequest) -> None:
        self.request = request
        self.nodes = {n.name: n for n in nodes}
        self.groups = [
            (g.shape, g.count, frozenset(n.name for n in nodes if eligible(n, g.shape))) for g in request.groups
        ]
        self.freed: dict[NodeName, dict[str, RunningPod]] = {}
        self.on: dict[str, VictimUnit] = {}
        self.fit = {n.name: self._fit(n) for n in nodes}
        self.total = [sum(f[i] for f in self.fit.values()) for i in range(len(self.groups))]

    def _fit(self, node: Node) -> tuple[int, ...]:
        return tuple(min(count, node_fit(node, shape)) if node.name in ok else 0 for shape, count, ok in self.groups)

    def feasible_with(self, units: Sequence[VictimUnit]) -> bool:
        """Feasible with exactly `units` freed (the tally moves there by the difference)."""
        want = {u.name: u for u in units}
        for name in sorted(self.on.keys() - want.keys()):
            self._toggle(self.on.pop(name), on=False)
        for name in sorted(want.keys() - self.on.keys()):
            self.on[name] = want[name]
            self._toggle(want[name], on=True)
        return self.feasible()

    def _toggle(self, unit: VictimUnit, *, on: bool) -> None:
        touched: set[NodeName] = set()
        for p in unit.pods:
            if p.node in self.nodes:
                bucket = self.freed.setdefault(p.node, {})
                if on:
                    bucket[p.uid] = p
                else:
                    bucket.pop(p.uid, None)
                touched.add(p.node)
        for name in sorted(touched):
            new = self._fit(free(self.nodes[name], self.freed[name].values()))
            self.total = [t + n - o for t, n, o in zip(self.total, new, self.fit[name], strict=True)]
            self.fit[name] = new

    def feasible(self) -> bool:
        counts = [c for _, c, _ in self.groups]
        return sum(min(t, c) for t, c in zip(self.total, counts, strict=True)) >= self.request.quorum


def shortest_prefix(pool: Sequence[VictimUnit], feasible: Feasible) -> list[VictimUnit] | None:
    """The shortest feasible prefix of `pool` (binary search: feasibility only grows as units
    are freed); None when the whole pool is not feasible."""
    if not feasible(pool):
        return None
    lo, hi = 0, len(pool)
    while lo < hi:
        mid = (lo + hi) // 2
        if feasible(pool[:mid]):
            hi = mid
        else:
            lo = mid + 1
    return list(pool[:hi])


def prune(chosen: Sequence[VictimUnit], feasible: Feasible, *, until: float = float("inf")) -> list[VictimUnit]:
    """Each unit dropped, most expensive first, when the rest stays feasible; stops trying at
    `until` (perf_counter seconds). The result is minimal: no single unit can go."""
    kept = list(chosen)
    for u in sorted(chosen, key=_most_expensive_first):
        if time.perf_counter() > until:
            break
        rest = [c for c in kept if c is not u]
        if feasible(rest):
            kept = rest
    return kept


def _most_expensive_first(u: VictimUnit) -> tuple[object, ...]:
    return (-u.priority, u.borrowed, -u.gpu_milli, u.name)


def cost_of(units: Iterable[VictimUnit]) -> Cost:
    chosen = list(units)
    return (
        max((u.priority for u in chosen), default=0),
        sum(1 for u in chosen if not u.borrowed),
        len(chosen),
        sum(u.gpu_milli for u in chosen),
    )


def orders(locality: Mapping[str, int]) -> list[Callable[[VictimUnit], tuple[object, ...]]]:
    """The orders phase 4 tries, each cheapest class first (priority, then borrowed), then
    inside a class: node locality (a prefix frees whole nodes soonest), largest units first
    (fewest units), smallest first (fewest GPUs)."""
    return [
        lambda u: (u.priority, not u.borrowed, locality[u.name], u.name),
        lambda u: (u.priority, not u.borrowed, -u.gpu_milli, locality[u.name], u.name),
        lambda u: (u.priority, not u.borrowed, u.gpu_milli, locality[u.name], u.name),
    ]


# ---------------------------------------------------------------------------- the search


def choose_victims(
    snapshot: ClusterSnapshot,
    request: GangRequest,
    units: Sequence[VictimUnit],
    *,
    params: SolverParams = DEFAULT_PARAMS,
    budget_s: float = 1.0,
) -> Preemption:
    """The cheapest set of `units` (already the eligible candidates) whose eviction lets
    `request` be placed, and its plan on the snapshot with them gone (see the module doc)."""
    return _Search(snapshot, request, units, params, budget_s).run()


@dataclass(frozen=True, slots=True)
class _Domain:
    path: tuple[str, ...]
    nodes: tuple[Node, ...]
    pool: tuple[VictimUnit, ...]  # units whose pods all lie on these nodes


class _Search:
    def __init__(
        self,
        snapshot: ClusterSnapshot,
        request: GangRequest,
        units: Sequence[VictimUnit],
        params: SolverParams,
        budget_s: float,
    ) -> None:
        self.until = time.perf_counter() + budget_s
        self.snapshot, self.request = snapshot, request
        self.units = sorted((u for u in units if u.pods), key=lambda u: u.name)
        self.params = replace(params, time_limit_s=min(params.time_limit_s, INNER_LIMIT_S))
        index = {n.name: i for i, n in enumerate(snapshot.nodes)}
        self.locality = {u.name: min(index.get(p.node, len(index)) for p in u.pods) for u in self.units}

    def run(self) -> Preemption:
        nodes = self.snapshot.nodes
        if _Tally(nodes, self.request).feasible():
            now = self._solve(nodes, ())
            if now is not None:
                return Preemption((), now, explanation=FITS_NOW)
        if not _Tally(nodes, self.request).feasible_with(self.units):
            return self._hopeless()
        domains = self._domains()
        if domains is None:
            return self._hopeless()
        counted = [(cost_of(chosen), d, chosen) for d in domains if (chosen := self._count_select(d)) is not None]
        counted.sort(key=lambda c: (c[0], c[1].path))
        best: Preemption | None = None
        for cost, domain, chosen in counted:
            if best is not None and (cost >= best.cost or time.perf_counter() > self.until):
                break
            found = self._confirm(domain, chosen)
            if found is not None and (best is None or found.cost < best.cost):
                best = found
        return best if best is not None else self._hopeless()

    def _domains(self) -> list[_Domain] | None:
        """Domains of the required level with their candidate units; the whole cluster as one
        domain without a required level; None for a level the snapshot does not know."""
        required = self.request.topology.required
        levels = self.snapshot.levels
        if not required:
            return [_Domain((), self.snapshot.nodes, tuple(self.units))]
        if required in levels:
            depth = levels.index(required) + 1
            key: Callable[[Node], tuple[str, ...]] = lambda n: n.topology[:depth]  # noqa: E731
        elif TopologyIndex(self.snapshot).has_level(required):
            key = lambda n: (n.name,)  # noqa: E731
        else:
            return None
        groups: dict[tuple[str, ...], list[Node]] = {}
        for n in self.snapshot.nodes:
            groups.setdefault(key(n), []).append(n)
        return [self._domain(path, nodes) for path, nodes in sorted(groups.items())]

    def _domain(self, path: tuple[str, ...], nodes: list[Node]) -> _Domain:
        names = {n.name for n in nodes}
        pool = tuple(u for u in self.units if all(p.node in names for p in u.pods))
        return _Domain(path, tuple(nodes), pool)

    def _count_select(self, domain: _Domain) -> list[VictimUnit] | None:
        """Phase 4: the cheapest counted set over the orders; None when freeing the whole
        pool leaves too little here."""
        best: list[VictimUnit] | None = None
        for key in orders(self.locality):
            tally = _Tally(domain.nodes, self.request)
            chosen = shortest_prefix(sorted(domain.pool, key=key), tally.feasible_with)
            if chosen is None:
                return None
            chosen = prune(chosen, tally.feasible_with)
            if best is None or cost_of(chosen) < cost_of(best):
                best = chosen
        return best

    def _confirm(self, domain: _Domain, chosen: list[VictimUnit]) -> Preemption | None:
        """Phase 5: solve with the counted set; when the solve disagrees, search with solves."""
        placed = self._solve(domain.nodes, chosen)
        if placed is None:
            pool = sorted(domain.pool, key=orders(self.locality)[0])
            by_solve = shortest_prefix(pool, lambda units: self._solve(domain.nodes, units) is not None)
            if by_solve is None:
                return None
            chosen = prune(by_solve, lambda units: self._solve(domain.nodes, units) is not None, until=self.until)
            placed = self._solve(domain.nodes, chosen)
            if placed is None:  # a time-limited solve may disagree with itself; never guess
                return None
        used = {a.node for a in placed.assignments}
        kept = sorted((u for u in chosen if any(p.node in used for p in u.pods)), key=lambda u: u.name)
        cost = cost_of(kept)
        where = f" in {self.request.topology.required} {'/'.join(domain.path)}" if domain.path else ""
        why = (
            f"evict {len(kept)} unit(s){where}: highest priority {cost[0]}, {cost[1]} within quota, "
            f"{cost[3] / FULL_SHARE:g} GPUs"
        )
        return Preemption(tuple(u.name for u in kept), placed, domain.path, cost, why)

    def _solve(self, nodes: Sequence[Node], victims: Sequence[VictimUnit]) -> GangPlan | None:
        """The gang's plan on `nodes` with `victims` freed, or None when it is not placed."""
        gone = [p for u in victims for p in u.pods]
        sub = ClusterSnapshot(tuple(free(n, gone) for n in nodes), self.snapshot.levels, self.snapshot.generation)
        result = plan(sub, [self.request], params=self.params)
        gang = result.gangs[0]
        return gang if gang.outcome is Outcome.PLACED else None

    def _hopeless(self) -> Preemption:
        """No set found: say whether even evicting every candidate would do."""
        everything = freed(self.snapshot, self.units)
        result = plan(everything, [self.request], params=self.params).gangs[0]
        if result.outcome is not Outcome.PLACED:
            return Preemption((), None, explanation=f"{NOT_EVEN_ALL}: {result.explanation}")
        required = self.request.topology.required
        return Preemption((), None, explanation=ONLY_SPANNING.format(level=required) if required else NO_SET_FOUND)
