"""A discrete-event queue simulator: gangs arrive, wait, run, finish or are evicted; no cluster.

Events (arrivals, finishes, restarts) are replayed in simulated time; after each batch of
events at one instant a scheduling pass runs, then the state is held constant until the next
event, which is how the time averages are integrated. Placement is `solver.plan` for both
policies, so placement quality is equal and only the queueing and preemption rules differ.

Policies:
- "phalanx": per queue, priority then age; queues take turns, the one furthest below its
  entitlement first. A gang is admitted by `limit_check` and `fair_share_check` (GPU quotas),
  then placed. One that does not fit may evict whole units via `choose_victims`: lower-priority
  gangs of its own queue (priority preemption) and, while its queue stays within its deserved
  quota, borrowed gangs of other queues (reclaim). Victims go back to their queue whole.
- "priority-greedy": one global queue by priority then age, a gang placed when it fits.
  Preemption is kube-scheduler's, pod by pod without gang awareness: for each pod of the
  preemptor, the node whose lowest-priority victims let it fit (fewest, lowest first, then
  reprieved highest priority first), victims evicted at once. A gang that loses a pod is
  broken: its other pods keep their GPUs, doing nothing, for `restart_s` (the collective
  timeout after which a training job's controller restarts the whole job), then it goes back
  to the queue whole. The preemptor is then planned; if it still does not fit (evictions
  ignore its topology), the evictions were wasted.
An evicted or broken gang restarts from scratch (no checkpoint), under either policy.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from solver import (
    Assignment,
    ClusterSnapshot,
    DeviceAssignment,
    EqGroup,
    GangName,
    GangPlan,
    GangRequest,
    GpuDemand,
    Node,
    NodeName,
    Outcome,
    PlanResult,
    PodShape,
    Resources,
    SolverParams,
    SolveStatus,
    TopologyRequest,
    plan,
    validate_plan,
)
from solver.fit import node_fit
from solver.preempt import RunningPod, VictimUnit, choose_victims, free
from solver.queues import QueueSpec, QueueTree, borrowed, fair_share_check, fair_shares, limit_check, rollup

POLICIES = ("phalanx", "priority-greedy")
GPU = "gpu"  # the simulated quotas are GPU quotas
SIM_PARAMS = SolverParams(time_limit_s=0.2, workers=1)  # short solves: one gang at a time


@dataclass(frozen=True, slots=True)
class Job:
    name: str
    queue: str
    priority: int
    pods: int
    gpus_per_pod: int
    duration_s: float
    arrival_s: float
    required: str = ""  # a topology level every pod must share, or ""

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod


@dataclass(slots=True)
class Run:
    """A job on the cluster: its pods, and whether it is broken (lost a pod, still holding the rest)."""

    job: Job
    pods: dict[str, RunningPod]
    started_s: float
    epoch: int
    broken: bool = False


@dataclass(slots=True)
class Stats:
    """What a run measured; time integrals are GPU-seconds."""

    seconds: float = 0.0
    allocated: float = 0.0  # GPUs held, broken gangs included
    useful: float = 0.0  # GPUs held by whole gangs
    share_ratio: dict[str, float] = field(default_factory=dict)  # integral of useful / fair share
    demand_time: dict[str, float] = field(default_factory=dict)  # seconds with demand and a share
    waits: dict[str, list[float]] = field(default_factory=dict)
    evicted_pods: int = 0
    evicted_gangs: int = 0
    broken_gangs: int = 0
    wasted_evictions: int = 0  # pods evicted for a preemptor that was then not placed
    preemptions: int = 0
    finished: int = 0
    invariant_errors: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Config:
    tree: tuple[QueueSpec, ...]
    rates_per_h: Mapping[str, float]  # arrivals per hour per queue
    hours: float = 4.0
    seed: int = 0
    gang_gpus: tuple[tuple[int, float], ...] = ((1, 0.25), (2, 0.2), (4, 0.2), (8, 0.15), (16, 0.12), (32, 0.08))
    priorities: tuple[tuple[int, float], ...] = ((0, 0.6), (1, 0.3), (2, 0.1))
    mean_duration_s: float = 1800.0
    big_required: str = ""  # level required by gangs of 16 GPUs and more
    restart_s: float = 300.0
    preemptions_per_pass: int = 2
    params: SolverParams = SIM_PARAMS


def workload(config: Config) -> list[Job]:
    """Poisson arrivals per queue, sizes and priorities drawn from the config's weights."""
    rnd = random.Random(config.seed)
    jobs: list[Job] = []
    for queue, rate in sorted(config.rates_per_h.items()):
        t = rnd.expovariate(rate / 3600)
        while t < config.hours * 3600:
            gpus = _draw(rnd, config.gang_gpus)
            per_pod = rnd.choice([g for g in (1, 2, 4, 8) if g <= gpus and gpus % g == 0])
            duration = min(4 * 3600.0, max(120.0, rnd.expovariate(1 / config.mean_duration_s)))
            jobs.append(
                Job(
                    f"{queue}-{len(jobs):04d}",
                    queue,
                    _draw(rnd, config.priorities),
                    gpus // per_pod,
                    per_pod,
                    duration,
                    t,
                    config.big_required if gpus >= 16 else "",
                )
            )
            t += rnd.expovariate(rate / 3600)
    return sorted(jobs, key=lambda j: (j.arrival_s, j.name))


def _draw(rnd: random.Random, weighted: tuple[tuple[int, float], ...]) -> int:
    return rnd.choices([v for v, _ in weighted], [w for _, w in weighted])[0]


def shape_of(job: Job) -> PodShape:
    return PodShape(Resources(4000 * job.gpus_per_pod, 32768 * job.gpus_per_pod, 1), GpuDemand.whole(job.gpus_per_pod))


def request_of(job: Job) -> GangRequest:
    group = EqGroup("worker", shape_of(job), job.pods)
    return GangRequest(
        GangName(job.name), (group,), topology=TopologyRequest(required=job.required), priority=job.priority
    )


def occupy(node: Node, pod: RunningPod) -> Node:
    """The node with `pod` running on it (whole GPUs only: the simulator's pods)."""
    used = node.used.minus(pod.requests.times(-1))
    taken = {a.index for a in pod.devices}
    gpus = tuple(replace(d, free_milli=0, free_memory_mib=0) if d.index in taken else d for d in node.gpus)
    return replace(node, used=used, gpus=gpus)


class Sim:
    """One policy over one workload on one cluster. `check`: verify invariants after every
    event batch (the trial tests), recording failures in `stats.invariant_errors`."""

    def __init__(self, cluster: ClusterSnapshot, config: Config, policy: str, *, check: bool = False) -> None:
        assert policy in POLICIES, policy
        self.base = cluster
        self.config = config
        self.policy = policy
        self.check = check
        self.tree, errors = QueueTree.build(config.tree)
        assert not errors, errors
        self.nodes = {n.name: n for n in cluster.nodes}
        self.capacity = {GPU: sum(len(n.gpus) for n in cluster.nodes)}
        self.pending: dict[str, Job] = {}
        self.running: dict[str, Run] = {}
        self.first_start: dict[str, float] = {}
        self.epochs: dict[str, int] = {}
        self.events: list[tuple[float, int, str, str]] = []
        self.seq = 0  # ties in time go in push order
        self.checked_evictions = 0
        self.jobs: dict[str, Job] = {}
        self.now = 0.0
        self.stats = Stats()

    # ------------------------------------------------------------------ the event loop

    def run(self, jobs: list[Job]) -> Stats:
        for job in jobs:
            self.jobs[job.name] = job
            self._push(job.arrival_s, "arrive", job.name)
        end = self.config.hours * 3600
        while self.events and self.events[0][0] <= end:
            self.now = self.events[0][0]
            while self.events and self.events[0][0] == self.now:
                _, _, kind, name = heapq.heappop(self.events)
                self._handle(kind, name)
            if self.policy == "phalanx":
                self._pass_phalanx()
            else:
                self._pass_greedy()
            if self.check:
                self._verify()
            self._integrate(min(self.events[0][0], end) if self.events else end)
        return self.stats

    def _push(self, at: float, kind: str, name: str) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, name))

    def _handle(self, kind: str, name: str) -> None:
        if kind == "arrive":
            self.pending[name] = self.jobs[name]
            return
        epoch, _, job = name.partition(":")
        run = self.running.get(job)
        if run is None or run.epoch != int(epoch):
            return  # stale: the run was evicted or restarted since
        self._stop(run)
        if kind == "finish":
            self.stats.finished += 1
        else:  # "restart": a broken gang's controller restarts it whole
            self.pending[job] = run.job

    # ------------------------------------------------------------------ the cluster

    def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(tuple(self.nodes[n.name] for n in self.base.nodes), self.base.levels)

    def _start(self, job: Job, gang: GangPlan) -> None:
        shape = shape_of(job)
        epoch = self.epochs.get(job.name, 0) + 1
        self.epochs[job.name] = epoch
        pods = {}
        for a in gang.assignments:
            pod = RunningPod(f"{job.name}/{a.rank}", a.node, shape.requests, a.devices)
            self.nodes[a.node] = occupy(self.nodes[a.node], pod)
            pods[pod.uid] = pod
        self.running[job.name] = Run(job, pods, self.now, epoch)
        self.pending.pop(job.name, None)
        if job.name not in self.first_start:
            self.first_start[job.name] = self.now
            self.stats.waits.setdefault(job.queue, []).append(self.now - job.arrival_s)
        self._push(self.now + job.duration_s, "finish", f"{epoch}:{job.name}")

    def _stop(self, run: Run) -> None:
        for pod in run.pods.values():
            self.nodes[pod.node] = free(self.nodes[pod.node], [pod])
        del self.running[run.job.name]

    def _evict_unit(self, name: str) -> None:
        """Phalanx: a whole gang evicted, back to its queue."""
        run = self.running[name]
        self.stats.evicted_gangs += 1
        self.stats.evicted_pods += len(run.pods)
        self._stop(run)
        self.pending[name] = run.job

    def _try_plan(self, job: Job) -> GangPlan | None:
        if not _counts(self.nodes.values(), job):
            return None
        gang = plan(self.snapshot(), [request_of(job)], params=self.config.params).gangs[0]
        return gang if gang.outcome is Outcome.PLACED else None

    # ------------------------------------------------------------------ queue figures

    def own(self, *, with_pending: bool) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        jobs = [r.job for r in self.running.values() if not r.broken]
        held = {r.job.name: len(r.pods) * r.job.gpus_per_pod for r in self.running.values() if r.broken}
        for job in jobs + (list(self.pending.values()) if with_pending else []):
            out.setdefault(job.queue, {GPU: 0})[GPU] += job.gpus
        for name, gpus in held.items():
            out.setdefault(self.jobs[name].queue, {GPU: 0})[GPU] += gpus
        return out

    # ------------------------------------------------------------------ phalanx

    def _pass_phalanx(self) -> None:
        used = rollup(self.tree, self.own(with_pending=False))
        demand = rollup(self.tree, self.own(with_pending=True))
        shares = fair_shares(self.tree, self.capacity, demand)
        queues: dict[str, list[Job]] = {}
        for job in sorted(self.pending.values(), key=lambda j: (-j.priority, j.arrival_s, j.name)):
            queues.setdefault(job.queue, []).append(job)
        preemptions = self.config.preemptions_per_pass
        while queues:
            q = min(queues, key=lambda q: (self._ratio(q, used, shares), q))
            job = queues[q].pop(0)
            if not queues[q]:
                del queues[q]
            need = {GPU: job.gpus}
            if limit_check(self.tree, used, q, need):
                continue
            if fair_share_check(
                self.tree, capacity=self.capacity, used=used, demand=demand, shares=shares, queue=q, need=need
            ):
                continue
            gang = self._try_plan(job)
            if gang is None and preemptions > 0:
                gang = self._preempt_whole(job, used)
                preemptions -= 1
            if gang is not None:
                self._start(job, gang)
                used = rollup(self.tree, self.own(with_pending=False))

    def _ratio(
        self, queue: str, used: Mapping[str, Mapping[str, int]], shares: Mapping[str, Mapping[str, int]]
    ) -> float:
        spec = self.tree.get(queue)
        entitled = max(spec.deserved.get(GPU, 0) if spec else 0, shares.get(queue, {}).get(GPU, 0))
        return used.get(queue, {}).get(GPU, 0) / max(1, entitled)

    def _preempt_whole(self, job: Job, used: Mapping[str, Mapping[str, int]]) -> GangPlan | None:
        units = self._candidates(job, used)
        if not units:
            return None
        snapshot = self.snapshot()
        request = request_of(job)
        found = choose_victims(snapshot, request, units, params=self.config.params, budget_s=0.5)
        if not found.found or found.plan is None:
            return None
        gone = [u for u in units if u.name in found.victims]
        if self.check:
            after = ClusterSnapshot(
                tuple(free(n, [p for u in gone for p in u.pods]) for n in snapshot.nodes), snapshot.levels
            )
            result = PlanResult(SolveStatus.FEASIBLE, (found.plan,))
            self.stats.invariant_errors.extend(
                f"{self.now:.0f}s victims' plan: {e}" for e in validate_plan(after, [request], result)
            )
        for u in gone:
            self._evict_unit(u.name)
        self.stats.preemptions += 1 if gone else 0
        return found.plan

    def _candidates(self, job: Job, used: Mapping[str, Mapping[str, int]]) -> list[VictimUnit]:
        """Lower-priority gangs of the job's queue; and, while the job keeps its queue (and
        every ancestor) within what it deserves, the borrowed gangs of the other queues."""
        reclaim = all(
            used.get(s.name, {}).get(GPU, 0) + job.gpus <= s.deserved.get(GPU, 0) for s in self.tree.chain(job.queue)
        )
        out = []
        for queue, runs in self._runs_by_queue().items():
            spec = self.tree.get(queue)
            over = borrowed(
                spec.deserved if spec else {}, [(r.job.name, {GPU: r.job.gpus}) for r in runs], resources=(GPU,)
            )
            for r in runs:
                lower = queue == job.queue and r.job.priority < job.priority
                if lower or (reclaim and queue != job.queue and r.job.name in over):
                    out.append(
                        VictimUnit(r.job.name, queue, r.job.priority, tuple(r.pods.values()), r.job.name in over)
                    )
        return out

    def _runs_by_queue(self) -> dict[str, list[Run]]:
        """Whole running gangs per queue in keep order: highest priority first, then oldest."""
        out: dict[str, list[Run]] = {}
        for r in sorted(self.running.values(), key=lambda r: (-r.job.priority, r.started_s, r.job.name)):
            if not r.broken:
                out.setdefault(r.job.queue, []).append(r)
        return out

    # ------------------------------------------------------------------ priority-greedy

    def _pass_greedy(self) -> None:
        preemptions = self.config.preemptions_per_pass
        for job in sorted(self.pending.values(), key=lambda j: (-j.priority, j.arrival_s, j.name)):
            gang = self._try_plan(job)
            if gang is None and preemptions > 0 and self._lower_pods(job):
                preemptions -= 1
                evicted = self._preempt_pods(job)
                gang = self._try_plan(job)
                if gang is None:
                    self.stats.wasted_evictions += evicted
            if gang is not None:
                self._start(job, gang)

    def _lower_pods(self, job: Job) -> list[tuple[Run, RunningPod]]:
        return [(r, p) for r in self.running.values() if r.job.priority < job.priority for p in r.pods.values()]

    def _preempt_pods(self, job: Job) -> int:
        """kube-scheduler's preemption for each pod of the gang in turn, inside the one domain
        of its required level where that needs the cheapest victims (as a topology plugin
        nominating the gang's pods would); nothing is evicted unless every pod finds a node.
        Returns the pods evicted."""
        lower = self._lower_pods(job)
        best: tuple[tuple[int, int, str], list[tuple[Run, RunningPod]]] | None = None
        for domain, names in sorted(self._domains(job.required).items()):
            victims = _kube_gang({n: self.nodes[n] for n in names}, job, lower)
            if victims is None:
                continue
            key = (max((r.job.priority for r, _ in victims), default=-1), len(victims), domain)
            if best is None or key < best[0]:
                best = (key, victims)
        if best is None:
            return 0
        for run, pod in best[1]:
            self._evict_pod(run, pod)
        return len(best[1])

    def _domains(self, level: str) -> dict[str, list[NodeName]]:
        depth = self.base.levels.index(level) + 1 if level else 0
        out: dict[str, list[NodeName]] = {}
        for n in self.base.nodes:
            out.setdefault("/".join(n.topology[:depth]), []).append(n.name)
        return out

    def _evict_pod(self, run: Run, pod: RunningPod) -> None:
        self.nodes[pod.node] = free(self.nodes[pod.node], [pod])
        del run.pods[pod.uid]
        self.stats.evicted_pods += 1
        if not run.broken:
            run.broken = True
            run.epoch = self.epochs[run.job.name] = run.epoch + 1
            self.stats.broken_gangs += 1
            self.stats.evicted_gangs += 1
            self._push(self.now + self.config.restart_s, "restart", f"{run.epoch}:{run.job.name}")
        if not run.pods:
            del self.running[run.job.name]
            self.pending[run.job.name] = run.job

    # ------------------------------------------------------------------ measures and checks

    def _integrate(self, until: float) -> None:
        dt = until - self.now
        if dt <= 0:
            return
        s = self.stats
        s.seconds += dt
        s.allocated += dt * sum(len(r.pods) * r.job.gpus_per_pod for r in self.running.values())
        whole = {q: v[GPU] for q, v in self.own(with_pending=False).items()}
        broken = {r.job.queue: 0 for r in self.running.values() if r.broken}
        for r in self.running.values():
            if r.broken:
                broken[r.job.queue] += len(r.pods) * r.job.gpus_per_pod
        useful = {q: v - broken.get(q, 0) for q, v in whole.items()}
        s.useful += dt * sum(useful.values())
        demand = rollup(self.tree, self.own(with_pending=True))
        shares = fair_shares(self.tree, self.capacity, demand)
        for q in self.tree.names:
            share = shares[q].get(GPU, 0)
            if self.tree.children(q) or share <= 0:
                continue
            s.share_ratio[q] = s.share_ratio.get(q, 0.0) + dt * useful.get(q, 0) / share
            s.demand_time[q] = s.demand_time.get(q, 0.0) + dt

    def _verify(self) -> None:
        """Every whole running gang with all its pods; every device held by at most one pod and
        the node state agreeing with the pods on it; no queue over its limit. After a batch
        with evictions, also every running gang together a valid plan on the empty cluster."""
        errors = self.stats.invariant_errors
        runs = [r for r in self.running.values() if not r.broken]
        for r in runs:
            if len(r.pods) != r.job.pods:
                errors.append(f"{self.now:.0f}s {r.job.name}: {len(r.pods)} of {r.job.pods} pods running (partial)")
        if self.policy == "phalanx" and len(runs) != len(self.running):
            errors.append(f"{self.now:.0f}s a broken gang under phalanx")
        errors.extend(f"{self.now:.0f}s {e}" for e in self._ledger_errors())
        if self.stats.evicted_pods != self.checked_evictions:
            self.checked_evictions = self.stats.evicted_pods
            errors.extend(f"{self.now:.0f}s {e}" for e in self._plan_errors(runs))
        used = rollup(self.tree, self.own(with_pending=False))
        for q in self.tree.names:
            spec = self.tree.get(q)
            limit = spec.limit.get(GPU) if spec else None
            if limit is not None and used[q].get(GPU, 0) > limit:
                errors.append(f"{self.now:.0f}s queue {q}: {used[q][GPU]} GPUs over its limit {limit}")

    def _ledger_errors(self) -> list[str]:
        held: dict[tuple[str, int], int] = {}
        pods: dict[str, int] = {}
        for r in self.running.values():
            for p in r.pods.values():
                pods[p.node] = pods.get(p.node, 0) + 1
                for a in p.devices:
                    held[(p.node, a.index)] = held.get((p.node, a.index), 0) + 1
        errors = [f"GPU {i} of {n} held by {c} pods" for (n, i), c in sorted(held.items()) if c > 1]
        for name, node in sorted(self.nodes.items()):
            busy = {d.index for d in node.gpus if not d.is_idle}
            if busy != {i for n, i in held if n == name} or node.used.pods != pods.get(name, 0):
                errors.append(f"node {name}: state disagrees with its {pods.get(name, 0)} running pods")
        return errors

    def _plan_errors(self, runs: list[Run]) -> list[str]:
        """validate_plan of every whole running gang at once, against the empty cluster."""
        gangs = tuple(
            GangPlan(
                GangName(r.job.name),
                Outcome.PLACED,
                tuple(
                    Assignment(GangName(r.job.name), "worker", int(uid.rsplit("/", 1)[1]), p.node, p.devices)
                    for uid, p in sorted(r.pods.items())
                ),
            )
            for r in runs
        )
        requests = [request_of(r.job) for r in runs]
        return validate_plan(self.base, requests, PlanResult(SolveStatus.FEASIBLE, gangs))


def _counts(nodes: Iterable[Node], job: Job) -> bool:
    """A cheap necessary check before a solve: enough idle GPUs for the gang's pods."""
    shape = shape_of(job)
    return sum(min(job.pods, node_fit(n, shape)) for n in nodes) >= job.pods


def _kube_gang(
    nodes: dict[NodeName, Node], job: Job, lower: list[tuple[Run, RunningPod]]
) -> list[tuple[Run, RunningPod]] | None:
    """Victims of `_kube_node` for each pod of `job` in turn on `nodes` (each pod held on its
    node as it goes); None when some pod finds no node."""
    shape = shape_of(job)
    taken: set[str] = set()
    victims: list[tuple[Run, RunningPod]] = []
    for rank in range(job.pods):
        pick = _kube_node(nodes, shape, [v for v in lower if v[1].uid not in taken])
        if pick is None:
            return None
        node, picked = pick
        for run, pod in picked:
            taken.add(pod.uid)
            victims.append((run, pod))
            nodes[node] = free(nodes[node], [pod])
        devices = tuple(d for d in nodes[node].gpus if d.is_idle)[: job.gpus_per_pod]
        held = RunningPod(
            f"{job.name}/nominated/{rank}", node, shape.requests, tuple(DeviceAssignment(d.index) for d in devices)
        )
        nodes[node] = occupy(nodes[node], held)
    return victims


def _kube_node(
    nodes: Mapping[NodeName, Node], shape: PodShape, lower: list[tuple[Run, RunningPod]]
) -> tuple[NodeName, list[tuple[Run, RunningPod]]] | None:
    """kube-scheduler's pick for one pod: every node where removing lower-priority pods lets it
    fit, its victims minimal by reprieving the highest priority first; the node whose victims
    have the lowest highest priority, then the fewest, then its name."""
    on: dict[NodeName, list[tuple[Run, RunningPod]]] = {}
    for run, pod in lower:
        on.setdefault(pod.node, []).append((run, pod))
    best: tuple[tuple[int, int, str], NodeName, list[tuple[Run, RunningPod]]] | None = None
    for name, node in sorted(nodes.items()):
        if node_fit(node, shape) > 0:
            return name, []
        mine = sorted(on.get(name, []), key=lambda v: (-v[0].job.priority, v[1].uid))
        if not mine or node_fit(free(node, [p for _, p in mine]), shape) <= 0:
            continue
        victims = list(mine)
        for v in mine:  # reprieve: keep each victim, highest priority first, while the pod still fits
            rest = [w for w in victims if w is not v]
            if node_fit(free(node, [p for _, p in rest]), shape) > 0:
                victims = rest
        key = (max(r.job.priority for r, _ in victims), len(victims), name)
        if best is None or key < best[0]:
            best = (key, name, victims)
    return None if best is None else (best[1], best[2])


def run_policy(cluster: ClusterSnapshot, config: Config, policy: str, *, check: bool = False) -> Stats:
    return Sim(cluster, config, policy, check=check).run(workload(config))
