"""Gang-aware preemption and reclaim: who may be evicted for a gang, and the evictions.

The choice of victims is the solver's (`solver.choose_victims`: the cheapest set of whole units,
lowest priority first, borrowed over-quota usage first, fewest units, fewest GPUs, such that the
whole gang then fits its required topology); this module decides who is a candidate and carries
the choice out:

- A unit is a running gang (every counted member of one gang key) or a single pod; it is evicted
  whole or not at all, so no victim gang is left below its minCount. Units with a member not
  bound yet (a reservation) or in a system priority class are never candidates.
- Preemption: units of lower priority than the gang (its priority plus aging), of the gang's own
  queue or borrowed by their queue (usage over its deserved quota); a queue's in-quota usage is
  never taken by another queue's priority (KAI-Scheduler's and Volcano's rule).
- Reclaim: a gang whose queue stays within its deserved quota with the gang placed takes back
  borrowed units of other queues, whatever their priority.
- Evictions go through the Eviction API (PodDisruptionBudgets hold): a dry run of every victim pod
  first; a unit any budget refuses is dropped and the solver asked again without it.
- Events: one on each victim pod (who, why) and one on the preemptor's definition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from extender.binder import Binder
from extender.cache import Cache
from extender.config import QueuesConfig
from extender.objects import PodInfo
from extender.queues import QueueBook
from solver import (
    GPU_RESOURCES,
    ClusterSnapshot,
    DeviceAssignment,
    GangPlan,
    GangRequest,
    NodeName,
    Preemption,
    RunningPod,
    SolverParams,
    VictimUnit,
    borrowed,
    choose_victims,
    freed,
)

log = structlog.get_logger("phalanx.preemption")

SYSTEM_PRIORITY = 1_000_000_000  # system-cluster-critical and above (kube-scheduler's own line)
PREEMPTION, RECLAIM = "preemption", "reclaim"


@dataclass(frozen=True, slots=True)
class Decision:
    """Victims chosen for one gang: the evictions to make and the plan they make possible."""

    plan: GangPlan
    victims: tuple[PodInfo, ...]  # every pod of every victim unit
    units: tuple[str, ...]
    kind: str  # PREEMPTION or RECLAIM
    summary: str
    running: tuple[RunningPod, ...]  # the victims as the solver freed them
    freed: dict[str, dict[str, int]] = field(default_factory=dict)  # queue -> what the victims hold, negated


@dataclass(frozen=True, slots=True)
class Claimant:
    """The gang asking for evictions: its key, queue, priority (aging included), request and
    what it needs (the queue's units)."""

    key: str
    queue: str
    priority: int
    request: GangRequest
    need: dict[str, int]
    # A gang its quota refuses: queue -> resource -> what evicting work inside that queue (its
    # own, or its children's) must free first (`solver.limit_excess`). Empty: capacity alone.
    must_free: dict[str, dict[str, int]] = field(default_factory=dict)


class Preemptor:
    def __init__(
        self,
        cache: Cache,
        binder: Binder,
        queues: QueueBook,
        *,
        gang_of: Callable[[PodInfo], str],
        config: Callable[[], QueuesConfig],
        report: Callable[[dict[str, Any], str, str], None],
        counted: Callable[[str, str, int], None] = lambda queue, kind, pods: None,
    ) -> None:
        self.cache = cache
        self.binder = binder
        self.queues = queues
        self.gang_of = gang_of
        self.config = config
        self.report = report  # (object, reason, message): a Warning Event, queued
        self.counted = counted  # (preemptor's queue, kind, pods evicted): /metrics
        self._counts: dict[str, list[int]] = {}  # queue -> [preemptions, reclaims] it made

    def counts_of(self, queue: str) -> tuple[int, int]:
        """(preemptions, reclaims) made for gangs of `queue` since start (Queue status)."""
        made = self._counts.get(queue, [0, 0])
        return made[0], made[1]

    def decide(
        self,
        snapshot: ClusterSnapshot,
        who: Claimant,
        params: SolverParams,
        *,
        claimed: frozenset[str] = frozenset(),
        check_budgets: bool = True,
    ) -> Decision | str:
        """The victims for `who`, or why there are none. `claimed`: pods already evicted for
        another gang's reservation (still counted until gone): never a candidate again, or two
        gangs would be planned into the same freed devices."""
        fenced = self.binder.fence() if self.binder.fence is not None else ""
        if fenced:
            return f"not preempting: {fenced}"
        units, pods, held = self._units(who, claimed)
        if not units:
            return "no lower-priority or borrowed workload to preempt"
        for _ in range(3):
            # First what the gang's quota needs gone (cheapest inside the limited queues), then
            # the solver's cheapest set for room, on the cluster with those already freed.
            forced = self._quota_victims(units, who, held)
            if isinstance(forced, str):
                return forced
            rest = [u for n, u in units.items() if n not in forced]
            try:
                room = freed(snapshot, [units[n] for n in forced])
                choice = choose_victims(room, who.request, rest, params=params)
            except (ValueError, KeyError, IndexError) as e:  # a request the solver rejects
                return f"victim search failed: {type(e).__name__}: {str(e)[:256]}"
            if not choice.found or choice.plan is None:
                return choice.explanation or "preemption cannot place the gang"
            if not forced and not choice.victims:
                return "fits without evictions"
            choice = replace(choice, victims=(*forced, *choice.victims))
            refused = self._dry_run(choice, pods) if check_budgets else []
            if not refused:
                return self._decision(choice, units, pods, who, held)
            for name in refused:
                units.pop(name, None)
        return "disruption budgets refuse the evictions"

    def _quota_victims(
        self, units: dict[str, VictimUnit], who: Claimant, held: dict[str, dict[str, int]]
    ) -> list[str] | str:
        """The cheapest candidates (lowest priority, borrowed first) inside each queue whose
        limit refuses the gang, until they free what `who.must_free` says; why not, if every
        candidate there is not enough. Empty when only capacity stands in the way."""
        chosen: list[str] = []
        for queue, amounts in sorted(who.must_free.items()):
            inside = [n for n, u in units.items() if queue in {q.name for q in self.queues.tree.chain(u.queue)}]
            inside.sort(key=lambda n: (units[n].priority, not units[n].borrowed, n))
            for r, amount in sorted(amounts.items()):
                freed = sum(held[n].get(r, 0) for n in chosen if n in inside)
                for name in (n for n in inside if n not in chosen):
                    if freed >= amount:
                        break
                    chosen.append(name)
                    freed += held[name].get(r, 0)
                if freed < amount:
                    return f"queue {queue}: evicting every candidate frees {freed} of the {amount} {r} over its limit"
        return chosen

    def _units(
        self, who: Claimant, claimed: frozenset[str]
    ) -> tuple[dict[str, VictimUnit], dict[str, list[PodInfo]], dict[str, dict[str, int]]]:
        """The candidate units (name -> unit), their pods, and what each unit's queue counts
        it holding (per search: a what-if may search beside the scheduler's own)."""
        holding: dict[str, dict[str, int]] = {}
        groups: dict[str, list[tuple[PodInfo, RunningPod]]] = {}
        inferred: dict[str, dict[str, tuple[DeviceAssignment, ...]]] = {}
        for uid in self.cache.pod_uids():
            pod, node, devices = self.cache.placement(uid)
            if pod is None or not node:
                continue
            if not devices and pod.demand.count:  # bound without a device record (another scheduler)
                if node not in inferred:
                    inferred[node] = self.cache.inferred_devices(node)
                devices = inferred[node].get(uid, ())
            name = self.gang_of(pod) or f"pod:{pod.key}"
            groups.setdefault(name, []).append((pod, RunningPod(uid, NodeName(node), pod.requests, devices)))
        groups.pop(who.key, None)
        tree = self.queues.tree
        reclaiming = self.config().reclaim and self._within_deserved(who)
        by_queue: dict[str, list[tuple[str, int, str, dict[str, int]]]] = {}
        units: dict[str, VictimUnit] = {}
        pods: dict[str, list[PodInfo]] = {}
        for name, members in groups.items():
            if any(not p.node or p.priority >= SYSTEM_PRIORITY or p.uid in claimed for p, _ in members):
                continue  # a reservation not bound yet, system-critical, or evicted for another gang already
            queue = self.queues.queue_of(members[0][0])
            priority = max(p.priority for p, _ in members)
            oldest = min(p.created for p, _ in members)
            held: dict[str, int] = {}
            for p, _ in members:
                for k, v in self.queues.held(p.uid).items():
                    held[k] = held.get(k, 0) + v
            by_queue.setdefault(queue, []).append((name, priority, oldest, held))
            holding[name] = held
            units[name] = VictimUnit(name, queue, priority, tuple(r for _, r in members))
            pods[name] = [p for p, _ in members]
        over = set()
        for queue, entries in by_queue.items():
            spec = tree.get(queue)
            if spec is None or not self.queues.active:
                continue
            entries.sort(key=lambda e: (-e[1], e[2], e[0]))  # keep order: priority, then age
            # GPUs always compare (nothing deserved: all of it borrowed); other kinds where the
            # queue has a quota for them, or every pod would be borrowed for its CPU.
            compared = {*GPU_RESOURCES, *spec.deserved}
            over |= borrowed(spec.deserved, [(n, h) for n, _, _, h in entries], resources=compared)
        eligible = {}
        for name, unit in units.items():
            unit = VictimUnit(unit.name, unit.queue, unit.priority, unit.pods, borrowed=name in over)
            lower = unit.priority < who.priority and (unit.queue == who.queue or unit.borrowed)
            if (self.config().preemption and lower) or (reclaiming and unit.borrowed and unit.queue != who.queue):
                eligible[name] = unit
        return eligible, {n: pods[n] for n in eligible}, holding

    def _within_deserved(self, who: Claimant) -> bool:
        """Whether `who`'s queue stays within its deserved quota with the gang placed (every
        resource the gang needs that the queue has a quota for, and at least one)."""
        if not self.queues.active:
            return False
        spec = self.queues.tree.get(who.queue)
        if spec is None:
            return False
        used = self.queues.used(who.queue)
        kinds = [k for k, v in who.need.items() if v > 0 and spec.deserved.get(k, 0) > 0]
        return bool(kinds) and all(used.get(k, 0) + who.need[k] <= spec.deserved[k] for k in kinds)

    def _dry_run(self, choice: Preemption, pods: dict[str, list[PodInfo]]) -> list[str]:
        """The chosen units a disruption budget (or anything else) would refuse to evict."""
        refused = []
        for name in choice.victims:
            for pod in pods[name]:
                why = self.binder.evict(pod.namespace, pod.name, pod.uid, dry_run=True)
                if why:
                    log.info("victim unit kept: eviction refused", unit=name, reason=why)
                    refused.append(name)
                    break
        return refused

    def _decision(
        self,
        choice: Preemption,
        units: dict[str, VictimUnit],
        pods: dict[str, list[PodInfo]],
        who: Claimant,
        held: dict[str, dict[str, int]],
    ) -> Decision:
        assert choice.plan is not None
        chosen = [units[n] for n in choice.victims]
        kind = (
            RECLAIM
            if all(u.queue != who.queue and u.borrowed for u in chosen)
            and any(u.priority >= who.priority for u in chosen)
            else PREEMPTION
        )
        where = f" in {'/'.join(choice.domain)}" if choice.domain else ""
        summary = (
            f"evicting {len(chosen)} unit(s) ({', '.join(sorted(choice.victims)[:5])}"
            f"{', ...' if len(chosen) > 5 else ''}) for {kind} of gang {who.key} "
            f"(queue {who.queue}, priority {who.priority}){where}"
        )
        victims = tuple(p for n in choice.victims for p in pods[n])
        running = tuple(r for u in chosen for r in u.pods)
        freed: dict[str, dict[str, int]] = {}
        for u in chosen:
            total = freed.setdefault(u.queue, {})
            for k, v in held.get(u.name, {}).items():
                total[k] = total.get(k, 0) - v
        return Decision(choice.plan, victims, choice.victims, kind, summary, running, freed)

    def execute(self, decision: Decision, who: Claimant) -> str:
        """Evict every victim pod: "" when all went, else the first refusal. A refusal now (a
        budget changed since the dry run) is logged and the rest still go: the unit is already
        broken, and its other pods must not keep capacity the gang cannot use."""
        evicted = 0
        refused = ""
        for pod in decision.victims:
            why = self.binder.evict(pod.namespace, pod.name, pod.uid, node=pod.node)
            if why:
                log.warning("eviction refused after its dry run", pod=pod.key, reason=why)
                refused = refused or why
                continue
            evicted += 1
            ref = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod.name, "namespace": pod.namespace}}
            reason = "Reclaimed" if decision.kind == RECLAIM else "Preempted"
            self.report(ref, reason, _victim_message(decision, who, pod, self.queues.queue_of(pod)))
        log.info("evicted", summary=decision.summary, pods=evicted)
        queue = who.queue if who.queue in self.queues.tree else "-"  # bounded metric labels
        made = self._counts.setdefault(queue, [0, 0])
        made[1 if decision.kind == RECLAIM else 0] += 1
        self.counted(queue, decision.kind, evicted)
        return refused


def _victim_message(decision: Decision, who: Claimant, pod: PodInfo, queue: str) -> str:
    if decision.kind == RECLAIM:
        why = f"queue {who.queue} is below its deserved quota and queue {queue} borrowed over its own"
    else:
        why = f"gang priority {who.priority} is above this pod's {pod.priority}"
    return f"pod {pod.key} evicted by Phalanx for gang {who.key} (queue {who.queue}): {why}; its whole unit goes"
