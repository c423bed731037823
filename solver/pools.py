"""GPU model pools: keep the capacity of scarce models for the pods that can only use them.

A pod with a `gpu_spec` (allowed GPU models) can only use some nodes; a pod without one can use
any. Fragmentation scoring (solver.frag) judges one node at a time, so it lets unconstrained
pods fill the models that constrained pods are waiting for: on the openb trace with 33 % of GPU
pods pinned to models, T4-only pods alone ask for more than the 842 T4 GPUs, yet the measure
sends CPU-heavy unconstrained pods to the CPU-rich T4 nodes; at arrived 100 % Phalanx skipped
~300 GPUs of T4-only pods against FGD's ~200 (seed 42), and allocated 87.7 % against FGD's 90.7.

1. `PoolPlan.build`: a pool is the nodes of one GPU model; a group is the set of models a
   class of the target workload allows (None: any). A linear program (GLOP) spreads one
   cluster's worth of demand (the workload's GPU request scaled to the cluster's GPUs) over the
   pools each group may use, with each pool's GPU, CPU and memory as capacities, maximizing
   the GPU placed, a group's GPU weighted up by `_SCARCITY` times the share of the cluster it
   may not use (a pod that can only use T4 counts up to 1.3 times one that can go anywhere).
   Its answer, per constrained group and pool, is what that group is expected to need there.
   The weight is more than a tie-break: pinned classes are often CPU-heavy, and counting GPUs
   alone, the plan gave the P100 pool to unpinned pods that feed its GPUs with less CPU, which
   is optimal for the relaxation but not online, where unpinned pods have other pools and the
   pinned ones do not (gpuspec25, 2 seeds: 94.6 % at weight 0.01, 95.7 % at 0.3 and 1.0;
   gpuspec10 -0.05 points; through the extender on gpuspec33, seed 42: 90.8 % -> 92.8 %).
   CPU and memory make the plan honest about pools whose nodes run out of CPU before GPUs:
   counting GPUs alone, the plan held P100 GPUs for P100-only share pods of 12 cores on 16-core
   nodes (one per node), and lost 0.2 points on gpuspec10 to unconstrained pods skipped;
   weighing each pod by its dominant resource instead (no complementarity) reserved too little
   (-1.3 points at arrived 100 % on gpuspec33). The multi-resource relaxation sits between.
2. `PoolLedger`, online: what each constrained group still has to claim of its plan (its plan
   less what it placed, and less its skipped pods, which show the pool could not serve them).
   A pod *trespasses* on a pool when the pool's free GPU share, less what other groups still
   have to claim there, cannot take it; the caller prefers pools where the pod does not (the
   trace replay keeps such pods to the other pools when it can; the extender ranks the nodes
   of those pools last, extender/sharing.py).

With the ledger, Phalanx allocates 94.4 % at arrived 100 % on that trace (FGD 90.6); keeping one
packing plan for the whole cluster or one per pool made no difference (within 0.05 points on
gpuspec20, 25 and 33), so there is one.

Pure: no Kubernetes, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ortools.linear_solver import pywraplp

from solver.frag import WorkloadClass

Models = frozenset[str] | None  # a group: the allowed GPU models, None for any

_SCARCITY = 0.3  # objective weight per GPU-milli on the share of the cluster a group may not use
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class ModelPool:
    """Alike nodes taken together: their GPU model and their summed capacity."""

    model: str  # also the pool's key
    gpu_milli: int
    cpu_milli: int
    memory_mib: int

    def allows(self, models: Models) -> bool:
        return models is None or self.model in models


@dataclass(frozen=True)
class PoolPlan:
    """Expected GPU demand (milli) of each group on each pool it may use, for one cluster's
    worth of demand, and each group's whole demand. Empty when no class names a model."""

    pools: tuple[ModelPool, ...] = ()
    expected: dict[tuple[Models, str], float] = field(default_factory=dict)
    demand: dict[Models, float] = field(default_factory=dict)

    @staticmethod
    def build(classes: Sequence[WorkloadClass], pools: Sequence[ModelPool]) -> PoolPlan:
        """The LP of the module docstring over the GPU classes of `classes`."""
        gpu = [c for c in classes if c.uses_gpu]
        if not pools or not any(c.models is not None for c in gpu):
            return PoolPlan(tuple(pools))
        scale = sum(p.gpu_milli for p in pools) / sum(c.probability * c.num_gpu * c.gpu_milli for c in gpu)
        cpu_only = scale * sum(c.probability * c.cpu_milli for c in classes if not c.uses_gpu)
        mem_only = scale * sum(c.probability * c.memory_mib for c in classes if not c.uses_gpu)
        groups = _groups(gpu, scale)
        x = _solve(groups, pools, cpu_only=cpu_only, mem_only=mem_only)
        expected = {k: v for k, v in x.items() if v > _EPS}
        return PoolPlan(tuple(pools), expected, {g: group.demand for g, group in groups.items()})


@dataclass(frozen=True, slots=True)
class _Group:
    demand: float  # GPU milli, one cluster's worth
    cpu: float  # milli per GPU-milli
    memory: float  # MiB per GPU-milli


def _groups(gpu: Sequence[WorkloadClass], scale: float) -> dict[Models, _Group]:
    sums: dict[Models, list[float]] = {}
    for c in gpu:
        s = sums.setdefault(c.models, [0.0, 0.0, 0.0])
        s[0] += c.probability * c.num_gpu * c.gpu_milli
        s[1] += c.probability * c.cpu_milli
        s[2] += c.probability * c.memory_mib
    return {g: _Group(scale * d, cpu / d, mem / d) for g, (d, cpu, mem) in sums.items()}


def _solve(
    groups: dict[Models, _Group], pools: Sequence[ModelPool], *, cpu_only: float, mem_only: float
) -> dict[tuple[Models, str], float]:
    """max sum (1 + bonus_g) x[g, p] s.t. each group's demand, each pool's GPU, CPU and memory
    (CPU-only pods' CPU and memory taken from every pool in proportion to its size)."""
    total_gpu = sum(p.gpu_milli for p in pools)
    total_cpu = sum(p.cpu_milli for p in pools) or 1
    total_mem = sum(p.memory_mib for p in pools) or 1
    lp = pywraplp.Solver.CreateSolver("GLOP")
    x: dict[tuple[Models, str], pywraplp.Variable] = {}
    objective = []
    for n, (g, group) in enumerate(sorted(groups.items(), key=lambda kv: sorted(kv[0] or ()))):
        usable = [p for p in pools if p.allows(g)]
        reach = sum(p.gpu_milli for p in usable) / total_gpu
        for p in usable:
            x[g, p.model] = lp.NumVar(0.0, lp.infinity(), f"x_g{n}_{p.model}")
            objective.append((1.0 + _SCARCITY * (1.0 - reach)) * x[g, p.model])
        lp.Add(sum(x[g, p.model] for p in usable) <= group.demand)
    for p in pools:
        on = [(g, x[g, p.model]) for g in groups if (g, p.model) in x]
        lp.Add(sum(v for _, v in on) <= p.gpu_milli)
        lp.Add(sum(groups[g].cpu * v for g, v in on) <= p.cpu_milli * (1 - cpu_only / total_cpu))
        lp.Add(sum(groups[g].memory * v for g, v in on) <= p.memory_mib * (1 - mem_only / total_mem))
    lp.Maximize(sum(objective))
    if lp.Solve() != pywraplp.Solver.OPTIMAL:
        raise RuntimeError("pool LP did not solve")  # x = 0 is feasible: a solver fault
    return {k: v.solution_value() for k, v in x.items()}


@dataclass
class PoolLedger:
    """Online: what each constrained group still has to claim of its plan, per pool."""

    plan: PoolPlan
    _left: dict[tuple[Models, str], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._left = {k: v for k, v in self.plan.expected.items() if k[0] is not None}

    def left(self, models: Models, pool: str) -> float:
        return self._left.get((models, pool), 0.0)

    def held_for_others(self, models: Models, pool: str) -> float:
        """GPU milli of `pool` that groups other than `models` still have to claim."""
        return sum(v for (g, p), v in self._left.items() if p == pool and g != models)

    def trespasses(self, models: Models, pool: str, *, free_milli: float, gpu_milli: int) -> bool:
        """A pod of group `models` asking `gpu_milli` would take share the pool holds for others."""
        return free_milli - self.held_for_others(models, pool) < gpu_milli

    def placed(self, models: Models, pool: str, gpu_milli: int) -> None:
        """A pod of group `models` went to `pool`: its claim there shrinks first, then the rest
        of its claims in proportion."""
        if models is None:
            return
        here = min(gpu_milli, self.left(models, pool))
        if here > 0:
            self._left[models, pool] -= here
        self._spread(models, gpu_milli - here)

    def skipped(self, models: Models, gpu_milli: int) -> None:
        """A pod of group `models` fit nowhere: its claims shrink in proportion."""
        if models is not None:
            self._spread(models, gpu_milli)

    def _spread(self, models: Models, amount: float) -> None:
        mine = [k for k, v in self._left.items() if k[0] == models and v > 0]
        total = sum(self._left[k] for k in mine)
        if amount <= 0 or total <= 0:
            return
        for k in mine:
            self._left[k] = max(0.0, self._left[k] - amount * self._left[k] / total)
