"""The gang cycle: quorum, one plan per gang, reservations, permit at bind, timeout.

kube-scheduler has no Permit verb for extenders, so Phalanx does it in three steps:
1. Filter of the first member once `minCount` members exist: plan the whole gang in one
   solve against the cache (which already counts every other gang's reservations), and
   reserve each member's node and devices in the cache ("assumed"), so nothing else takes
   them. Every member's filter is then answered from the plan in constant time; a member whose
   planned node is no longer a candidate makes the gang re-plan.
2. Bind of a member waits until every planned member has reached bind (the permit gate).
   Then each bind proceeds with its reserved devices; none is bound before all are there.
3. If the gate does not close within `scheduleTimeoutSeconds` of the plan, the reservation
   is released and the waiting binds fail, so kube-scheduler requeues them all.
A reservation is whole-gang or nothing, so competing gangs never hold capacity piecemeal and
never deadlock. Nothing here survives a restart, by design: the waiting binds' connections
break, kube-scheduler requeues the members, and the new process plans again from the cluster
(members already bound stay where they are and anchor the rest of their gang).

States (`GangPhase`): Pending -> Planned (reserved) -> Binding (gate open) -> Scheduled; a
release (timeout, a member deleted, its planned node gone) goes back to Pending.

This module is past 400 lines on purpose: the cycle's transitions (plan, reserve, permit,
release, retry, the preemption question) share one lock and one state record per gang; what
is pure lives beside it (requests.py: members to a solver request; membership.py: the index).

Locks: `lock` guards the gang states and is held only briefly (never across a solve), so a
gang's filter never waits for another gang's solve. Solves are serialised by `_solving`:
each sees the reservations of the one before (no double booking), and results are applied
only to gangs not released meanwhile. Order: `_solving` -> `lock` -> the cache's lock.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import structlog

import solver
from extender.cache import Cache
from extender.config import QueuesConfig
from extender.gangs import holds as held
from extender.gangs import requests
from extender.gangs.membership import Membership, Nudge, no_nudge
from extender.gangs.requests import Entry, Members
from extender.gangs.ri_source import PREFIX as RI_PREFIX
from extender.gangs.ri_source import WAITING_PREFIX as RI_WAITING
from extender.gangs.ri_source import RISource
from extender.gangs.sources import DEFINITION_PREFIXES, GangObjects, GangSpec, Resolution, resolve
from extender.objects import JSON, PodInfo
from extender.outcomes import Fit, GangPhase, Verdict
from extender.preemption import Claimant, Decision, Preemptor
from extender.queues import Admitted
from solver import (
    ClusterSnapshot,
    DeviceAssignment,
    GangPlan,
    GangRequest,
    Outcome,
    PlanResult,
    RunningPod,
    SolverParams,
    SolveStatus,
)

log = structlog.get_logger("phalanx.gangs")

GANG_TIMEOUT = "gang timed out at bind"
NO_RESERVATION = "no reservation for this member"
INVALID_GANG = "invalid gang request"
CAPACITY_MOVED = "capacity changed while planning; planning again"
# A plan's nominations: one parked member's after every 8 queued members' (`_nomination_order`).
# kube-scheduler took a queued member every 2.7 ms of a 512-member plan at 5,000 nodes while 16
# writers nominated one every 2.2 ms (2026-11-26, 2 cores): one write in 8 more keeps ahead.
PARKED_STRIDE = 8
BINDING_GRACE_S = 120.0  # once the gate opened, binds finish long before this; then the plan is dropped
PREEMPT_MEMO_S = 5.0  # how long the answer to "would evictions place this gang?" is reused
PREEMPT_TIME_LIMIT_S = 0.25  # the what-if solve runs in kube-scheduler's PostFilter: keep it short
MIN_ABOVE_COUNT = "minCount exceeds the members the gang declares"
AWAITING_VICTIMS = "waiting for preempted pods to leave"
NOT_OFFERED = "planned node not among the nodes offered"
PREEMPT_RETRY_S = 3.0  # a gang that could not preempt asks the solver again at most this often
PREEMPT_SOLVE_S = 0.5  # inner solves of the victim search
HOLD_RETRY_S = 10.0  # a starving gang that got no hold (it fits nowhere even empty) asks again after this
WAITING_QUORUM = requests.WAITING_QUORUM

Notify = Callable[[GangSpec, str, str, str], None]  # (spec, reason, message, type)


def _level_name(level: str) -> str:
    """A topology level as a summary names it: "rack" for topology.phalanx.io/rack, "hosts" for
    kubernetes.io/hostname (the node itself)."""
    return "hosts" if level == "kubernetes.io/hostname" else level.rsplit("/", 1)[-1]


def _in_process(snapshot: ClusterSnapshot, requests: Sequence[GangRequest], *, params: SolverParams) -> PlanResult:
    return solver.plan(snapshot, requests, params=params)


class Planner(Protocol):
    """`solver.plan`'s signature: the in-process solver, or solverd's RemoteSolver.plan."""

    def __call__(
        self, snapshot: ClusterSnapshot, requests: Sequence[GangRequest], *, params: SolverParams
    ) -> PlanResult: ...


class GangStats(Protocol):
    """What /metrics counts of the gang cycle (`extender/metrics.py`)."""

    def planned(self, again: bool) -> None: ...
    def scheduled(self, quorum_to_bound_s: float) -> None: ...
    def timed_out(self) -> None: ...


class Admission(Protocol):
    """Queues and quotas (`extender/queues.py`): may a gang take capacity now?"""

    def check_gang(self, pods: list[PodInfo], extra: dict[str, dict[str, int]]) -> Admitted: ...
    def check_limit(self, queue: str, need: dict[str, int], extra: dict[str, dict[str, int]], what: str) -> str: ...
    def queue_of(self, pod: PodInfo) -> str: ...
    def guard(self) -> AbstractContextManager[Any]: ...


class AdmitAll:
    def queue_of(self, pod: PodInfo) -> str:
        return ""

    def guard(self) -> AbstractContextManager[Any]:
        return nullcontext()

    def check_gang(self, pods: list[PodInfo], extra: dict[str, dict[str, int]]) -> Admitted:
        return Admitted("", {})

    def check_limit(self, queue: str, need: dict[str, int], extra: dict[str, dict[str, int]], what: str) -> str:
        return ""


class NoStats:
    def planned(self, again: bool) -> None:
        pass

    def scheduled(self, quorum_to_bound_s: float) -> None:
        pass

    def timed_out(self) -> None:
        pass


@dataclass(slots=True)
class Reservation:
    node: str
    devices: tuple[DeviceAssignment, ...]


@dataclass
class GangState:
    key: str
    spec: GangSpec | None = None
    plan: dict[str, Reservation] = field(default_factory=dict)  # uid -> reservation
    deadline: float = 0.0
    arrived: set[str] = field(default_factory=set)
    released: int = 0  # bumps whenever the plan is dropped; waiting binds notice
    reason: str = ""
    outcome: Fit = Fit.UNSCHEDULABLE  # what `reason` causes while there is no plan
    phase: GangPhase = GangPhase.PENDING
    solve_ms: float = 0.0
    summary: str = ""
    plans: int = 0  # plans made so far, written on members to wake them
    failed_attempt: tuple[int, int] = (-1, -1)  # (cache generation, members) of the last failed plan
    bound_uids: set[str] = field(default_factory=set)  # members this process bound
    parked: set[str] = field(default_factory=set)  # members told "not yet": kube-scheduler parked them
    preemption: tuple[tuple[int, int], bool, float] | None = None  # ((members, priority), helps, until)
    quorum_noted: str = ""  # the last "waiting for gang quorum n/m" written to the gang's status
    quorum_at: float = 0.0  # monotonic time quorum was first seen (for quorum-to-bound time)
    victims: set[str] = field(default_factory=set)  # pods evicted for this plan, not gone yet: the gate waits
    preempt_tried: float = -PREEMPT_RETRY_S  # monotonic time of the last victim search
    swept: float = -PREEMPT_RETRY_S  # monotonic time the sweep last planned it unasked
    preempt_generation: int = -1  # the cache generation of the last victim search
    hold_tried: float = -HOLD_RETRY_S  # monotonic time a starvation hold was last looked for


WHAT_IFS = 2  # what-if plans (the allocation API's dry runs) solving at once


class PlannerBusy(Exception):
    """Too many what-if plans at once: the caller retries."""


@dataclass(frozen=True, slots=True)
class WhatIf:
    """`GangManager.what_if`'s answer."""

    placed: bool
    placement: dict[str, str] = field(default_factory=dict)  # member name -> node
    status: str = ""  # the solver's (optimal, feasible)
    reason: str = ""  # why not now
    never: bool = False  # it cannot fit even on the empty cluster
    proof: str = ""  # the solver's explanation on the empty cluster
    error: str = ""  # the request is invalid (the solver's words)
    preempts: tuple[str, ...] = ()  # pods it would evict to be placed (with `placement` then)
    preemption: str = ""  # the victim search's summary: who, why, where


class GangManager:
    def __init__(
        self,
        cache: Cache,
        objects: GangObjects,
        params: Callable[[], SolverParams],
        notify: Notify,
        nudge: Nudge | None = None,
        *,
        bind_wait_cap_s: float = 25.0,
        ri: RISource | None = None,
        stats: GangStats | None = None,
        admission: Admission | None = None,
        planner: Planner | None = None,
    ) -> None:
        self.cache = cache
        # the in-process solver (looked up per call), or a remote one with its signature (solverd)
        self.planner: Planner = planner or _in_process
        self.objects = objects
        self.params = params
        self.notify = notify
        self.stats: GangStats = stats or NoStats()
        self.admission: Admission = admission or AdmitAll()
        self.preemptor: Preemptor | None = None  # gang-aware preemption (set by the app)
        self.queue_config: Callable[[], QueuesConfig] = QueuesConfig
        self.ours: Callable[[PodInfo], bool] = lambda pod: True  # pods of a scheduler that calls us
        self.holds = held.Holds()  # starvation holds (extender/gangs/holds.py)
        self.nudge: Nudge = nudge or no_nudge
        self.bind_wait_cap_s = bind_wait_cap_s
        self.ri = ri
        self.membership = Membership(cache, ri, self.nudge)
        self.gangs: dict[str, GangState] = {}
        self._last_retry = 0.0
        self._last_starving = 0.0
        # uid -> planned node, for the planned members not bound yet: kube-scheduler clears a
        # pod's nominated node after every failed cycle, and the watch puts it back (`renominate`).
        self.nominations: dict[str, str] = {}
        self.lock = threading.Condition(threading.RLock())
        self._solving = threading.Lock()
        self._what_ifs = threading.BoundedSemaphore(WHAT_IFS)  # previews solve beside the scheduler

    def gang_of(self, pod: PodInfo) -> str:
        return self.membership.gang_of(pod)

    def gangs_of(self, pods: list[PodInfo]) -> list[str]:
        return self.membership.gangs_of(pods)

    def spec_priority(self, key: str) -> int:
        """The priority a gang's definition gives it (0: none)."""
        state = self.gangs.get(key) if key else None
        return state.spec.priority if state is not None and state.spec is not None else 0

    def _resolve(self, pod: PodInfo) -> tuple[str, Resolution] | None:
        """The pod's gang key and definition, or None when it is scheduled as a single pod."""
        key = self.gang_of(pod)
        if not key:
            return None
        if key.startswith((RI_PREFIX, RI_WAITING)) and self.ri is not None:
            res: Resolution | None = self.ri.resolve(pod, key, self.membership.member_pods(key))
        else:
            res = resolve(self.objects, pod.namespace, pod.labels, pod.annotations, pod.scheduling_group)
            if res is not None and res.spec is not None and not res.spec.topology.any:
                stated = self.membership.stated_topology(key)  # another member's KAI annotations
                if stated.any:
                    res = replace(res, spec=replace(res.spec, topology=stated))
        if res is None or (res.spec is not None and not res.spec.enabled):
            return None
        return key, res

    def _members(self, state: GangState, pods: list[PodInfo]) -> Members:
        return requests.split(pods, planned=state.plan, bound_here=state.bound_uids)

    # ------------------------------------------------------------------ filter

    def filter(self, pod: PodInfo, names: list[str]) -> Verdict | None:
        """The answer for a gang member, or None when the pod is scheduled as a single pod."""
        resolved = self._resolve(pod)
        if resolved is None:
            return None
        key, res = resolved
        with self.lock:
            state = self.gangs.setdefault(key, GangState(key))
            if res.spec is None:  # no definition yet: its arrival wakes the members
                state.reason = res.reason
                state.parked.add(pod.uid)
                return Verdict.unresolvable(res.reason)
            state.spec = spec = res.spec
            self._expire(state)
            reservation = state.plan.get(pod.uid)
            if reservation is not None and reservation.node in names:
                return Verdict.fits([reservation.node])
            if reservation is not None and state.victims:
                # kube-scheduler counts the evicted pods until they are gone: the node is no
                # candidate yet, and the reservation holds until then (or its deadline).
                state.parked.add(pod.uid)
                return Verdict.unschedulable(f"{AWAITING_VICTIMS}: {len(state.victims)} on the planned nodes")
            if reservation is not None and pod.nominated != reservation.node:
                # kube-scheduler filters a share of the nodes (percentageOfNodesToScore) unless
                # the pod names a nominated node, which it checks alone first. This member was
                # taken up before its nomination reached kube-scheduler: the node was not
                # offered, not refused. The nomination's arrival requeues it; should this
                # failed cycle clear it, the watch writes it again (`renominate`).
                state.parked.add(pod.uid)
                return Verdict.unresolvable(f"{NOT_OFFERED}: {reservation.node} (nominated; retried)")
            if reservation is not None:
                # Nominated and still not offered: kube-scheduler's own plugins refused the node.
                self._release(state, "planned node is no longer a candidate")
            if spec.declared and spec.min_count > spec.declared:
                reason = f"{MIN_ABOVE_COUNT}: minCount {spec.min_count}, {spec.declared} members"
                if state.reason != reason:
                    state.reason = reason
                    self.notify(spec, "Invalid", reason, "Warning")
                state.parked.add(pod.uid)
                return Verdict.unresolvable(reason)
            pods = self.membership.member_pods(key)
            shortfall = requests.quorum_shortfall(spec, pods)
            if shortfall:  # no eviction helps: the members do not exist yet
                self._note_quorum(state, spec, shortfall)
                state.reason = shortfall
                state.parked.add(pod.uid)
                return Verdict.unresolvable(state.reason)
            if not state.quorum_at:
                state.quorum_at = time.monotonic()
            # A gang that did not fit is solved again only once the cluster or its members changed:
            # kube-scheduler retries each of its members, and each retry must stay cheap.
            generation, members = state.failed_attempt
            stale = generation != self.cache.generation or members not in (-1, len(pods))  # -1: any
            must_plan = stale and bool(self._members(state, pods).pending)
        if must_plan:
            self._plan(state)
        with self.lock:
            return self._answer(state, pod, names)

    def _answer(self, state: GangState, pod: PodInfo, names: list[str]) -> Verdict:
        reservation = state.plan.get(pod.uid)
        if reservation is None:
            state.parked.add(pod.uid)
            return Verdict(state.outcome, message=state.reason or NO_RESERVATION)
        if reservation.node not in names:
            # Just planned while kube-scheduler offered this member a share of the nodes: its
            # nomination (written by the plan) brings it back to that node alone.
            state.parked.add(pod.uid)
            return Verdict.unresolvable(f"{NOT_OFFERED}: {reservation.node} (nominated; retried)")
        return Verdict.fits([reservation.node])

    # ------------------------------------------------------------------ planning

    def _plan(self, trigger: GangState, *, preempt: bool = False) -> None:
        """One solve for this gang's unplanned members and every other gang that has quorum
        but no plan yet (joint placement packs better than first come, first served); each
        gang is reserved all or nothing. The solve runs without `lock`. With `preempt` (the
        sweep only: a victim search and its dry-run evictions never run inside a verb), a
        gang that does not fit, or that its quota refuses, may preempt."""
        with self._solving:
            with self.lock:
                entries = self._entries(trigger)
                if not entries:
                    return
                entries, admitted, refused = self._admit(entries)
                snapshot = self.cache.snapshot()
                hardware = self.cache.hardware
                # Gangs their quota refuses: preemption inside their queue may make room.
                now = time.monotonic()
                blocked = [
                    (
                        st,
                        e,
                        requests.request(snapshot, e, hardware=hardware, pool_models=self.cache.pool_models),
                        st.released,
                    )
                    for e in refused
                    if preempt
                    and (st := self.gangs.get(e.key)) is not None
                    and now - st.preempt_tried >= PREEMPT_RETRY_S
                ]
                asks = [
                    held.fence(
                        requests.request(snapshot, e, hardware=hardware, pool_models=self.cache.pool_models),
                        snapshot,
                        self._held_against(e, admitted[e.key].queue),
                    )
                    for e in entries
                ]
                epochs = [st.released if (st := self.gangs.get(e.key)) is not None else -1 for e in entries]
            if not entries:
                if blocked:
                    self._preempt_for(blocked, snapshot, admitted)
                return
            started = time.perf_counter()
            result, invalid = self._solve(snapshot, asks)
            elapsed_ms = (time.perf_counter() - started) * 1000
            unplaced: list[tuple[GangState, Entry, GangRequest, int]] = []
            with self.lock:
                for entry, epoch, ask in zip(entries, epochs, asks, strict=True):
                    state = self.gangs.get(entry.key)
                    if state is not None and state.released == epoch and ask.name in invalid:
                        self._invalid(state, entry.spec, f"{INVALID_GANG}: {invalid[ask.name]}")
                for entry, epoch, gang in zip(
                    [e for e, a in zip(entries, asks, strict=True) if a.name not in invalid],
                    [ep for ep, a in zip(epochs, asks, strict=True) if a.name not in invalid],
                    result.gangs if result is not None else (),
                    strict=True,
                ):
                    state = self.gangs.get(entry.key)
                    if state is None or state.released != epoch:
                        continue  # released while solving: its next filter plans it again
                    state.solve_ms = elapsed_ms
                    if gang.outcome is Outcome.PLACED:
                        assert result is not None
                        ask = next(a for a in asks if a.name == gang.gang)
                        with self.admission.guard():  # no single pod's bind passes the limit meanwhile
                            over = self.admission.check_limit(
                                admitted[entry.key].queue, _placed_need(ask, gang, snapshot), {}, "gang"
                            )
                            if over:  # a per-model limit the placement crosses (or usage moved meanwhile)
                                self._wait(state, entry, over, snapshot.generation)
                            else:
                                self._reserve(state, entry, gang, ask, result, snapshot)
                    elif gang.explanation.startswith(solver.INVALID_REQUEST):  # the solver's admission
                        self._invalid(state, entry.spec, gang.explanation)
                    else:
                        self._not_placed(state, entry, gang, snapshot.generation)
                        if gang.outcome is Outcome.UNSCHEDULABLE:
                            ask = next(a for a in asks if a.name == gang.gang)
                            unplaced.append((state, entry, ask, epoch))
            if preempt:
                self._preempt_for(unplaced + blocked, snapshot, admitted)

    def _preempt_for(
        self,
        unplaced: list[tuple[GangState, Entry, GangRequest, int]],
        snapshot: ClusterSnapshot,
        admitted: dict[str, Admitted],
    ) -> None:
        """Gang-aware preemption for the highest-priority gang of this solve that did not fit
        (it has quorum and a definition: only such gangs are solved): the solver picks whole
        victim units, the plan they make possible is reserved first (nothing else takes the
        freed capacity), then the victims are evicted; the gate opens once they are gone.
        Runs under `_solving`, so no other solve sees the capacity before it is reserved."""
        now = time.monotonic()
        due = [u for u in unplaced if self.preemptor is not None and now - u[0].preempt_tried >= PREEMPT_RETRY_S]
        if not due or self.preemptor is None:
            return
        state, entry, ask, epoch = max(due, key=lambda u: (self._priority(u[0]), -len(u[0].key)))
        state.preempt_tried, state.preempt_generation = now, snapshot.generation
        verdict = admitted[entry.key]
        who = Claimant(entry.key, verdict.queue, self._priority(state), ask, verdict.need, verdict.excess)
        params = self.params()
        params = replace(params, time_limit_s=min(params.time_limit_s, PREEMPT_SOLVE_S))
        with self.lock:
            claimed = frozenset(uid for st in self.gangs.values() for uid in st.victims)
        decision = self.preemptor.decide(snapshot, who, params, claimed=claimed)
        if isinstance(decision, str):
            log.info("no preemption for the gang", gang=entry.key, reason=decision)
            return
        with self.lock, self.admission.guard():
            if state.released != epoch or state.plan:
                return
            # What the victims hold comes off their queues' usage (they are still counted).
            need = _placed_need(ask, decision.plan, snapshot)
            over = self.admission.check_limit(verdict.queue, need, decision.freed, "gang")
            if over:
                self._wait(state, entry, over, snapshot.generation)
                return
            result = PlanResult(SolveStatus.FEASIBLE, (decision.plan,))
            if not self._reserve(state, entry, decision.plan, ask, result, snapshot, victims=decision.running):
                return
            state.victims = {p.uid for p in decision.victims}
            state.deadline = time.monotonic() + self.queue_config().reservation_seconds
            epoch = state.released
            self.notify(entry.spec, "Preempting", decision.summary, "Normal")
        # The evictions are API calls: on their own thread, never holding `_solving`.
        threading.Thread(target=self._evict, args=(state, epoch, decision, who), name="evict", daemon=True).start()

    def _evict(self, state: GangState, epoch: int, decision: Decision, who: Claimant) -> None:
        """Carry out the evictions; one refused after its dry run (a budget changed, this
        replica stopped leading) drops the reservation at once rather than holding it for
        nothing until its deadline."""
        assert self.preemptor is not None
        refused = self.preemptor.execute(decision, who)
        if refused:
            with self.lock:
                if state.released == epoch:
                    self._release(state, f"preemption stopped: {refused}")

    def _held_against(self, entry: Entry, queue: str) -> frozenset[str]:
        state = self.gangs.get(entry.key)
        priority = self._priority(state) if state is not None else entry.spec.priority
        return self.holds.blocked(gang=entry.key, queue=queue, priority=priority, backfill=self.queue_config().backfill)

    def held_against(self, pod: PodInfo) -> frozenset[str]:
        """Nodes a single pod may not use now: held for a starving gang (see holds.py)."""
        if not self.holds.by_gang:
            return frozenset()
        with self.lock:
            queue = self.admission.queue_of(pod)
            return self.holds.blocked(
                gang="", queue=queue, priority=pod.priority, backfill=self.queue_config().backfill
            )

    def _starving(self) -> tuple[GangState, Entry, str] | None:
        """The head of a queue (highest priority, then oldest) that has had quorum for
        `starvationSeconds` without a plan, and whose queue holds nothing yet."""
        now = time.monotonic()
        if now - self._last_starving < HOLD_RETRY_S / 2:
            return None
        self._last_starving = now
        wait_s = self.queue_config().starvation_seconds
        heads: dict[str, tuple[tuple[int, str, str], GangState, Entry]] = {}
        for state in self.gangs.values():
            if state.plan or state.spec is None or not state.spec.enabled or state.key in self.holds.by_gang:
                continue
            if state.phase is GangPhase.SCHEDULED or not state.quorum_at or now - state.quorum_at < wait_s:
                continue  # cheap tests first: the entry reads every member
            entry = self._entry(state)
            if entry is None:
                continue
            queue = self.admission.queue_of(entry.members.pending[0])
            rank = (-self._priority(state), min(p.created for p in entry.members.pending), state.key)
            if queue not in heads or rank < heads[queue][0]:
                heads[queue] = (rank, state, entry)
        for queue, (_, state, entry) in sorted(heads.items()):
            waited = now - state.quorum_at if state.quorum_at else 0.0
            if waited >= wait_s and now - state.hold_tried >= HOLD_RETRY_S and self.holds.of_queue(queue) is None:
                state.hold_tried = now
                return state, entry, queue
        return None

    def _hold(self, state: GangState, entry: Entry, queue: str) -> None:
        """Hold capacity for a starving gang (the solve runs without `lock`)."""
        snapshot = self.cache.snapshot()
        ask = requests.request(snapshot, entry, hardware=self.cache.hardware, pool_models=self.cache.pool_models)
        nodes = held.choose(snapshot, ask, self.params())
        if nodes is None:
            return
        with self.lock:
            if state.plan or state.spec is None:
                return
            until = time.monotonic() + self.queue_config().reservation_seconds
            self.holds.by_gang[state.key] = held.Hold(state.key, queue, self._priority(state), nodes, until)
            waited = time.monotonic() - state.quorum_at
            message = (
                f"capacity held on {len(nodes)} nodes for {self.queue_config().reservation_seconds} s: "
                f"waited {waited:.0f} s at the head of queue {queue or '-'}"
            )
            self.notify(state.spec, "Held", message, "Normal")
            log.info("starvation hold", gang=state.key, nodes=len(nodes), queue=queue)

    def _wake_planned(self, state: GangState) -> None:
        """The evicted pods are gone: wake the planned members kube-scheduler parked meanwhile."""
        for uid, reservation in state.plan.items():
            pod = self.cache.pod(uid)
            if pod is not None and not pod.node and uid in state.parked:
                self.nudge(pod.namespace, pod.name, f"{state.plans}:room", nominate=reservation.node)
        state.parked.difference_update(state.plan)

    def _priority(self, state: GangState) -> int:
        """A gang's priority: its definition's, its members' (PriorityClass) or their GPU-pool
        QoS level's, the highest, plus `agingPerMinute` for each minute since quorum."""
        members = self.membership.member_pods(state.key)
        hardware = self.cache.hardware
        base = max(
            [
                state.spec.priority if state.spec is not None else 0,
                *(p.priority for p in members),
                *(requests.qos_priority(p, hardware) for p in members),
            ]
        )
        rate = self.queue_config().aging_per_minute
        if not rate or not state.quorum_at:
            return base
        return base + int(rate * (time.monotonic() - state.quorum_at) / 60)

    def _admit(self, entries: list[Entry]) -> tuple[list[Entry], dict[str, Admitted], list[Entry]]:
        """The entries their queues let take capacity now (each admitted one's need counted
        for the next, as the solve may place them all), every entry's admission, and the
        entries a limit refused (preemption inside the limited queue may make room for them).
        A refused gang waits with its queue's message; it is retried when the cluster changes."""
        admitted: list[Entry] = []
        refused: list[Entry] = []
        queues: dict[str, Admitted] = {}
        extra: dict[str, dict[str, int]] = {}
        for entry in entries:
            state = self.gangs.get(entry.key)
            verdict = self.admission.check_gang(_quorum_pods(entry), extra)
            queues[entry.key] = verdict
            if verdict.refusal:
                if state is not None:
                    self._wait(state, entry, verdict.refusal, self.cache.generation)
                if verdict.excess:
                    refused.append(entry)
                continue
            admitted.append(entry)
            queues[entry.key] = verdict
            total = extra.setdefault(verdict.queue, {})
            for k, v in verdict.need.items():
                total[k] = total.get(k, 0) + v
        return admitted, queues, refused

    def _wait(self, state: GangState, entry: Entry, reason: str, generation: int) -> None:
        """Not placed for a reason outside the solver (its queue): Unschedulable, retried when
        the cluster changes."""
        members = len(entry.members.pending) + len(entry.members.bound) + len(state.plan)
        state.failed_attempt = (generation, members)
        state.outcome = Fit.UNSCHEDULABLE
        if state.reason != reason:
            state.reason = reason
            state.phase = GangPhase.PENDING
            self.notify(entry.spec, "Unschedulable", reason, "Warning")
            log.info("gang waits for its queue", gang=state.key, reason=reason)

    def _solve(self, snapshot: ClusterSnapshot, asks: list[GangRequest]) -> tuple[PlanResult | None, dict[str, str]]:
        """The joint solve. The solver answers an invalid request (an unknown topology level, a
        slice it cannot honour) with that gang's own UNRESOLVABLE plan; should it raise all the
        same (a defect), the raising request is found by solving each alone, gets its own error,
        and the others are solved together without it. (plans of the valid gangs, in order;
        name -> error)."""
        params = self.params()
        try:
            return self.planner(snapshot, asks, params=params), {}
        except (ValueError, KeyError, IndexError) as e:
            if len(asks) == 1:
                return None, {asks[0].name: f"{type(e).__name__}: {e}"}
        invalid: dict[str, str] = {}
        for ask in asks:
            try:
                self.planner(snapshot, [ask], params=params)
            except (ValueError, KeyError, IndexError) as e:
                invalid[ask.name] = f"{type(e).__name__}: {e}"
        valid = [a for a in asks if a.name not in invalid]
        if not valid:
            return None, invalid
        try:
            return self.planner(snapshot, valid, params=params), invalid
        except (ValueError, KeyError, IndexError) as e:  # only together: fail them all, plainly
            return None, {a.name: f"{type(e).__name__}: {e}" for a in asks}

    def what_if(self, spec: GangSpec, pods: list[PodInfo], *, queue: str = "") -> WhatIf:
        """Where a gang that is not submitted yet would be placed now, as its first plan would
        place it on an unchanged cluster (the same request, snapshot and solver), reserving and
        writing nothing; and when it does not fit now, whether it ever could: the same request
        on the cluster with every pod gone (not fitting there is the proof it never will)."""
        if not self._what_ifs.acquire(blocking=False):
            raise PlannerBusy(f"{WHAT_IFS} what-if plans are running; retry in a second")
        try:
            return self._what_if(spec, pods, queue)
        finally:
            self._what_ifs.release()

    def _what_if(self, spec: GangSpec, pods: list[PodInfo], queue: str) -> WhatIf:
        pods = sorted(pods, key=lambda p: (p.created, p.name))
        entry = Entry(spec.key, spec, Members(pods, []))
        snapshot = self.cache.snapshot()
        hardware = self.cache.hardware
        with self.lock:
            ask = requests.request(snapshot, entry, hardware=hardware, pool_models=self.cache.pool_models)
            ask = held.fence(ask, snapshot, self._held_against(entry, queue))
        result, invalid = self._solve(snapshot, [ask])
        if result is None:
            return WhatIf(False, error=invalid.get(ask.name, "the solver refused the request"), never=True)
        gang = result.gang(ask.name)
        if gang.explanation.startswith(solver.INVALID_REQUEST):
            return WhatIf(False, error=gang.explanation, never=True)
        if gang.outcome is Outcome.PLACED:
            taken: dict[str, int] = {}
            placement: dict[str, str] = {}
            for a in sorted(gang.assignments, key=lambda a: a.rank):
                member = entry.groups[a.group][taken.setdefault(a.group, 0)]
                taken[a.group] += 1
                placement[member.name] = a.node
            return WhatIf(True, placement=placement, status=result.status.value)
        preemption = self._what_if_preemption(spec, pods, ask, entry, snapshot)
        if preemption is not None:
            return replace(preemption, reason=gang.explanation)
        empty = self.cache.snapshot_without(lambda p: True)
        alone = requests.request(
            empty, Entry(spec.key, spec, Members(pods, [])), hardware=hardware, pool_models=self.cache.pool_models
        )
        ever, _ = self._solve(empty, [alone])
        never = ever is not None and ever.gang(alone.name).outcome is not Outcome.PLACED
        proof = ever.gang(alone.name).explanation if never and ever is not None else ""
        return WhatIf(False, reason=gang.explanation, never=never, proof=proof)

    def _what_if_preemption(
        self, spec: GangSpec, pods: list[PodInfo], ask: GangRequest, entry: Entry, snapshot: ClusterSnapshot
    ) -> WhatIf | None:
        """Whom the gang would preempt now, and where it would then go (None: no one). The
        victim search's evictions are dry runs: nothing is evicted or reserved."""
        config = self.queue_config()
        if self.preemptor is None or not (config.preemption or config.reclaim):
            return None
        verdict = self.admission.check_gang(pods, {})
        who = Claimant(spec.key, verdict.queue, ask.priority, ask, verdict.need, verdict.excess)
        params = self.params()
        params = replace(params, time_limit_s=min(params.time_limit_s, PREEMPT_SOLVE_S))
        # Budgets are not asked (dry-run evictions are the scheduler's to send, not a preview's).
        decision = self.preemptor.decide(snapshot, who, params, check_budgets=False)
        if isinstance(decision, str):
            return None
        taken: dict[str, int] = {}
        placement: dict[str, str] = {}
        for a in sorted(decision.plan.assignments, key=lambda a: a.rank):
            member = entry.groups[a.group][taken.setdefault(a.group, 0)]
            taken[a.group] += 1
            placement[member.name] = a.node
        return WhatIf(
            False,
            placement=placement,
            preempts=tuple(sorted(p.key for p in decision.victims)),
            preemption=decision.summary,
        )

    def _invalid(self, state: GangState, spec: GangSpec, error: str) -> None:
        """A gang the solver cannot take as requested: its own error, status and event."""
        reason = error[:1024]
        state.outcome = Fit.UNRESOLVABLE
        state.failed_attempt = (self.cache.generation, -1)  # until the cluster or its definition changes
        if state.reason != reason:
            state.reason = reason
            state.phase = GangPhase.PENDING
            self.notify(spec, "Invalid", reason, "Warning")
            log.warning("gang request rejected by the solver", gang=state.key, error=error)

    def _entries(self, trigger: GangState, most: int = 8) -> list[Entry]:
        """The trigger gang (if it still needs a plan), then up to `most` other gangs with
        quorum, no plan and pending members, highest priority first."""
        out: list[Entry] = []
        mine = self._entry(trigger)
        if mine is not None:
            out.append(mine)
        others = []
        for key, state in self.gangs.items():
            if key == trigger.key or state.plan or state.spec is None or not state.spec.enabled:
                continue
            entry = self._entry(state)
            if entry is not None:
                others.append(entry)
        # Inside a queue (and across): priority, then age (the oldest member's creation).
        others.sort(
            key=lambda e: (
                -self._priority(self.gangs[e.key]),
                min((p.created for p in e.members.pending), default=""),
                e.key,
            )
        )
        return out + others[:most] if out else []

    def _entry(self, state: GangState) -> Entry | None:
        spec = state.spec
        if spec is None:
            return None
        pods = self.membership.member_pods(state.key)
        members = self._members(state, pods)
        if not members.pending or requests.quorum_shortfall(spec, pods):
            return None
        if not state.quorum_at:
            state.quorum_at = time.monotonic()
        planned = {p.uid: p for p in pods}
        return Entry(state.key, spec, members, [(planned.get(uid), r.node) for uid, r in state.plan.items()])

    def _not_placed(self, state: GangState, entry: Entry, gang: GangPlan, generation: int) -> None:
        members = len(entry.members.pending) + len(entry.members.bound) + len(state.plan)
        state.failed_attempt = (generation, members)
        state.outcome = Fit.UNRESOLVABLE if gang.outcome is Outcome.UNRESOLVABLE else Fit.UNSCHEDULABLE
        if state.reason != gang.explanation:
            state.reason = gang.explanation
            state.phase = GangPhase.PENDING
            self.notify(entry.spec, "Unschedulable", gang.explanation, "Warning")
            log.info("gang not placed", gang=state.key, reason=gang.explanation, solve_ms=round(state.solve_ms, 1))

    def _reserve(
        self,
        state: GangState,
        entry: Entry,
        gang: GangPlan,
        ask: GangRequest,
        result: PlanResult,
        snapshot: ClusterSnapshot,
        *,
        victims: tuple[RunningPod, ...] = (),
    ) -> bool:
        """Reserve a placed gang (with `victims`: a plan that holds once those pods are gone)."""
        spec = entry.spec
        status = result.status.value
        taken: dict[str, int] = {}
        placements: list[tuple[str, str, tuple[DeviceAssignment, ...]]] = []
        for a in sorted(gang.assignments, key=lambda a: a.rank):
            member = entry.groups[a.group][taken.setdefault(a.group, 0)]
            taken[a.group] += 1
            placements.append((member.uid, a.node, a.devices))
        # The solve ran without locks: a single pod may have taken a planned device meanwhile.
        # Re-check the plan against the nodes as they are now and reserve it, atomically.
        one = replace(result, gangs=(gang,))

        def valid(nodes: ClusterSnapshot) -> bool:
            # Victims that left meanwhile are free already: freeing them again would double-book.
            present = tuple(v for v in victims if self.cache.placement(v.uid)[1] == v.node)
            return not solver.validate_plan(_freed(nodes, present), [ask], one)

        if not self.cache.assume_all(placements, valid):
            state.failed_attempt = (-1, -1)  # not a failure: the next filter or sweep plans again
            state.reason = CAPACITY_MOVED
            log.info("gang plan outdated before it was reserved; planning again", gang=state.key)
            return False
        state.plans += 1
        self.holds.by_gang.pop(state.key, None)  # planned: whatever was held for it is its plan now
        self.stats.planned(state.plans > 1)
        state.deadline = time.monotonic() + spec.timeout_s
        for uid, node, devices in placements:
            state.plan[uid] = Reservation(node, devices)
            self.nominations[uid] = node
        # Every planned member gets its node as its nominated node (kube-scheduler then checks
        # that node alone); only members kube-scheduler has parked need waking (in the same
        # write), the others are still queued and come with the nomination.
        for uid, reservation in _nomination_order(list(state.plan.items()), state.parked):
            planned = self.cache.pod(uid)
            if planned is not None and not planned.node:
                wake = f"{state.plans}:{reservation.node}" if uid in state.parked else None
                self.nudge(planned.namespace, planned.name, wake, nominate=reservation.node)
        state.parked.difference_update(state.plan)
        state.reason = ""
        state.phase = GangPhase.PLANNED
        levels = snapshot.levels if len(snapshot.levels) == len(gang.domains_used) else (*snapshot.levels, "hosts")
        where = ", ".join(
            f"{count} {_level_name(level)}" for level, count in zip(levels, gang.domains_used, strict=True)
        )
        state.summary = (
            f"planned {len(gang.assignments)} of {len(entry.members.pending)} pending members on {where} "
            f"({status}, {state.solve_ms:.0f} ms)"
        )
        self.notify(spec, "Planned", state.summary, "Normal")
        log.info(
            "gang planned",
            gang=state.key,
            members=len(gang.assignments),
            status=status,
            domains=gang.domains_used,
            solve_ms=round(state.solve_ms, 1),
        )
        return True

    def renominate(self, kind: str, obj: JSON) -> None:
        """A pod event from the watch: a planned member whose nominated node is not its planned
        node gets it written again. kube-scheduler clears the nomination after every failed
        cycle (its preemption finds nothing to evict), also when the nomination arrived during
        that cycle; without it the member would be filtered on a sample of the nodes that may
        not hold its planned one. O(1) per event; members leave the index once bound or gone."""
        if not self.nominations:
            return
        meta = obj.get("metadata") or {}
        uid = meta.get("uid")
        if not isinstance(uid, str) or uid not in self.nominations:
            return
        with self.lock:  # a release between the read and the write would leave a stale nomination
            node = self.nominations.get(uid)
            if node is None:
                return
            if kind == "DELETED" or (obj.get("spec") or {}).get("nodeName"):
                del self.nominations[uid]
                return
            if (obj.get("status") or {}).get("nominatedNodeName") != node:
                self.nudge(str(meta.get("namespace") or ""), str(meta.get("name") or ""), None, nominate=node)

    def _expire(self, state: GangState) -> None:
        if state.plan and state.deadline and time.monotonic() > state.deadline:
            self.stats.timed_out()
            self._release(state, f"{GANG_TIMEOUT}: {len(state.arrived)}/{len(state.plan)} members arrived")

    def _release(self, state: GangState, reason: str) -> None:
        nominated = set(state.plan)
        for uid in nominated:
            self.nominations.pop(uid, None)
        self.cache.forget_unbound(list(state.plan))
        state.plan.clear()
        state.arrived.clear()
        state.victims.clear()
        state.deadline = 0.0
        state.released += 1
        state.reason = reason
        state.outcome = Fit.UNSCHEDULABLE
        state.phase = GangPhase.PENDING
        if state.spec is not None:
            self.notify(state.spec, "Released", reason, "Warning")
        for pod in self.membership.member_pods(state.key):
            # Nominations cleared: kube-scheduler would otherwise keep the released nodes for
            # these members when it places other pods.
            if not pod.node and (pod.uid in state.parked or pod.uid in nominated):
                wake = f"{state.plans}:released" if pod.uid in state.parked else None
                self.nudge(pod.namespace, pod.name, wake, nominate="" if pod.uid in nominated else None)
        log.info("gang reservation released", gang=state.key, reason=reason)
        self.lock.notify_all()

    # ------------------------------------------------------------------ preemption

    def preemption_helps(self, pod: PodInfo) -> bool | None:
        """Whether evicting pods could let this member's gang be placed: False without
        quorum or definition, with a plan already, or when the gang does not fit even with
        every pod of lower priority than `pod` gone; None for a pod of no gang."""
        resolved = self._resolve(pod)
        if resolved is None:
            return None
        key, res = resolved
        if res.spec is None:
            return False
        with self.lock:
            state = self.gangs.setdefault(key, GangState(key))
            state.spec = res.spec
            if state.plan:
                return False
            pods = self.membership.member_pods(key)
            entry = self._entry(state)
            if entry is None:
                return False
            # kube-scheduler asks once per member and attempt; the cluster-wide what-if is reused
            # for a few seconds (per member count and priority) instead of per cache generation.
            memo = (len(pods), pod.priority)
            now = time.monotonic()
            if state.preemption is not None and state.preemption[0] == memo and now < state.preemption[2]:
                return state.preemption[1]
        snapshot = self.cache.snapshot_without(lambda p: p.priority < pod.priority)
        ask = requests.request(snapshot, entry, hardware=self.cache.hardware, pool_models=self.cache.pool_models)
        params = self.params()
        params = replace(params, time_limit_s=min(params.time_limit_s, PREEMPT_TIME_LIMIT_S))
        try:
            helps = self.planner(snapshot, [ask], params=params).gangs[0].outcome is Outcome.PLACED
        except (ValueError, KeyError, IndexError):  # a request the solver rejects: no eviction helps
            helps = False
        with self.lock:
            state.preemption = (memo, helps, now + PREEMPT_MEMO_S)
        if not helps:
            log.info("preemption cannot place the gang", gang=key, pod=pod.key, priority=pod.priority)
        return helps

    def splits_a_gang(self, victims: set[str]) -> str:
        """Why evicting `victims` (pod uids) would break a gang, or "": a gang disrupted only
        whole (a PodGroup with `disruptionMode: all`) whose members are not all among them, or
        any gang left running below its minCount."""
        for pod in self.cache.pods(victims):
            resolved = self._resolve(pod)
            if resolved is None or resolved[1].spec is None:
                continue
            key, spec = resolved[0], resolved[1].spec
            spared = [p.name for p in self.membership.member_pods(key) if p.uid not in victims and p.node]
            if spared and spec.disrupt_together:
                return f"gang {key} is disrupted only whole; {len(spared)} member(s) would stay, e.g. {spared[0]}"
            if spared and len(spared) < spec.min_count:
                return f"gang {key} would keep {len(spared)} running member(s), below its minCount {spec.min_count}"
        return ""

    # ------------------------------------------------------------------ permit at bind

    def permit(self, pod: PodInfo, node: str) -> str | None:
        """Wait at the gate; "" when this member may bind now, an error to return otherwise,
        None when the pod is no gang member (bind it as a single pod). A member binds only
        through its gang's plan, whoever calls bind."""
        resolved = self._resolve(pod)
        if resolved is None:
            return None
        key, res = resolved
        if res.spec is None:
            return f"{res.reason}: a gang member binds only with its gang"
        with self.lock:
            state = self.gangs.get(key)
            if state is None or pod.uid not in state.plan:
                return NO_RESERVATION
            if state.plan[pod.uid].node != node:
                return f"member planned on {state.plan[pod.uid].node}, not {node}"
            epoch = state.released
            state.arrived.add(pod.uid)
            if self._gate_open(state):
                self.lock.notify_all()  # the last member: open the gate for everyone waiting
            give_up = min(state.deadline, time.monotonic() + self.bind_wait_cap_s)
            while True:
                # O(1) per wake-up: a 512-member gang has 511 binds waiting here.
                if state.released != epoch:
                    return state.reason or "gang reservation released"
                if self._gate_open(state):
                    if state.phase is not GangPhase.BINDING:
                        # The timeout ends here: a release now would forget devices binds are using.
                        state.phase = GangPhase.BINDING
                        state.deadline = time.monotonic() + BINDING_GRACE_S
                    return ""
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    missing = len(state.plan) - len(state.arrived)
                    if time.monotonic() >= state.deadline:
                        self._release(state, f"{GANG_TIMEOUT}: {len(state.arrived)}/{len(state.plan)} members arrived")
                        return state.reason
                    state.arrived.discard(pod.uid)  # kube-scheduler will retry this member
                    return f"waiting for gang members at bind: {missing} of {len(state.plan)} missing"
                self.lock.wait(remaining)

    @staticmethod
    def _gate_open(state: GangState) -> bool:
        """Every planned member still unbound has reached bind (bound ones leave the plan),
        and every pod evicted to make room is gone."""
        return len(state.arrived) >= len(state.plan) and not state.victims

    def bound(self, pod: PodInfo) -> None:
        """A member's binding succeeded: once all are bound, the gang is Scheduled."""
        key = self.gang_of(pod)
        with self.lock:
            state = self.gangs.get(key)
            if state is None or pod.uid not in state.plan:
                return
            state.arrived.discard(pod.uid)
            del state.plan[pod.uid]
            state.bound_uids.add(pod.uid)
            if not state.plan and state.spec is not None:
                state.phase = GangPhase.SCHEDULED
                state.deadline = 0.0
                if state.quorum_at:
                    self.stats.scheduled(time.monotonic() - state.quorum_at)
                    state.quorum_at = 0.0
                self.notify(state.spec, "Scheduled", state.summary.replace("planned", "bound", 1), "Normal")

    def release_all(self, reason: str) -> None:
        """Drop every reservation (this replica stopped leading): members waiting at the gate
        are answered at once, and whoever leads next plans them again."""
        with self.lock:
            for state in list(self.gangs.values()):
                if state.plan:
                    self._release(state, reason)

    def seen(self, spec: GangSpec) -> None:
        """A gang's definition appeared (a Workload, a PodGroup): its status says at once how
        many members it waits for, before any member reaches kube-scheduler."""
        shortfall = requests.quorum_shortfall(spec, self.membership.member_pods(spec.key))
        if shortfall:
            with self.lock:
                state = self.gangs.setdefault(spec.key, GangState(spec.key))
                self._note_quorum(state, spec, shortfall)

    def _note_quorum(self, state: GangState, spec: GangSpec, shortfall: str) -> None:
        """Status (no Event: one per arriving member would flood) whenever n/m changes."""
        if state.quorum_noted != shortfall:
            state.quorum_noted = shortfall
            self.notify(spec, "WaitingForQuorum", shortfall, "Normal")

    # ------------------------------------------------------------------ housekeeping

    def definition_changed(self, namespace: str, name: str) -> None:
        """A Workload or PodGroup changed: its waiting members are re-evaluated now (they may
        have been parked by kube-scheduler for lack of quorum or of a definition)."""
        self.definitions_changed({f"{namespace}/{name}"})

    def definitions_changed(self, names: set[str]) -> None:
        """`definition_changed` for many "namespace/name" at once: one pass over the gang keys."""
        keys = []
        for key in self.membership.gang_keys():
            kind, _, body = key.partition(":")
            if kind not in DEFINITION_PREFIXES:
                continue
            parts = body.split("/")
            if len(parts) >= 2 and f"{parts[0]}/{parts[1]}" in names:
                keys.append(key)
        for key in keys:
            for pod in self.membership.member_pods(key):
                if not pod.node:
                    self.nudge(pod.namespace, pod.name, f"definition:{time.time():.0f}")

    def retry_waiting(self) -> None:
        """Queues changed (a limit raised, a queue created): every gang that waits is planned
        again by the sweep, whatever the cache generation (a Queue is not in the cache)."""
        with self.lock:
            for state in self.gangs.values():
                if not state.plan and state.failed_attempt != (-1, -1):
                    state.failed_attempt = (-2, -1)

    def wake_all(self) -> None:
        """Wake every unbound gang member (once, after a start): members parked before a
        restart, or whose definition was listed before the pods were, have no other event
        coming that kube-scheduler would link to them."""
        for key in self.membership.gang_keys():
            for pod in self.membership.member_pods(key):
                if not pod.node:
                    self.nudge(pod.namespace, pod.name, f"start:{time.time():.0f}")

    def shutdown(self) -> None:
        """Fail every waiting bind so kube-scheduler requeues those members at once."""
        with self.lock:
            for state in self.gangs.values():
                if state.plan:
                    self._release(state, "extender shutting down")

    def sweep(self) -> None:
        """Release reservations past their deadline even if no member comes back to ask, and
        those of gangs that lost a planned member (deleted: the gate could never close)."""
        self.membership.settle()
        with self.lock:
            for state in list(self.gangs.values()):
                self._expire(state)
                if state.victims:
                    state.victims = {uid for uid in state.victims if self.cache.placement(uid)[1]}
                    if not state.victims:
                        self.lock.notify_all()  # the gate may open now
                        self._wake_planned(state)
                gone = [uid for uid in state.plan if self.cache.pod(uid) is None]
                if gone:
                    self._release(state, f"{len(gone)} planned members were deleted")
            retry, scan = self._due_for_retry()
            finished = [k for k, st in self.gangs.items() if not st.plan and not self.membership.has_members(k)]
            for key in finished:  # every member gone: forget the gang
                del self.gangs[key]
                self.holds.by_gang.pop(key, None)
            for hold in self.holds.expire():
                log.info("starvation hold ended", gang=hold.gang, nodes=len(hold.nodes))
            starving = self._starving()
            unplanned = any(st.phase is GangPhase.PENDING and st.spec is not None for st in self.gangs.values())
        if unplanned:
            # A gang waits (for quorum, most often): bring the solver's view of the nodes up to
            # date now, so its plan rebuilds only the nodes that change from here on, not all
            # of them (150 ms at 5,000 nodes on the first plan after a start).
            self.cache.snapshot()
        if scan:
            retry = self._unasked()  # reads every gang's members: not under `lock`
        if retry is not None:
            self._plan(retry, preempt=True)
        if starving is not None:
            self._hold(*starving)

    def _due_for_retry(self, every_s: float = 2.0) -> tuple[GangState | None, bool]:
        """A gang that did not fit, to plan again in the background when the cluster has
        changed since. kube-scheduler only retries a parked member on an event it links to
        the rejection; capacity our own cache frees a moment later (a watch lags the API) may
        come with no such event. A plan found here wakes the members through their annotation.
        One solve per round: it plans every other waiting gang too. (gang, whether to look
        for one with `_unasked` instead, outside the lock.)"""
        now = time.monotonic()
        if now - self._last_retry < every_s:
            return None, False
        self._last_retry = now
        generation = self.cache.generation
        waiting = [
            st
            for st in self.gangs.values()
            if not st.plan and st.spec is not None and st.spec.enabled and st.failed_attempt[0] not in (-1, generation)
        ]
        waiting.sort(key=lambda st: (-st.spec.priority if st.spec else 0, st.key))
        if waiting:
            return waiting[0], False
        return None, True

    def _unasked(self) -> GangState | None:
        """A gang with quorum that kube-scheduler never brought to filter (its own filters
        found every node full, and with no lower-priority pod to preempt it never calls the
        preempt verb either): planned here, so preemption and reclaim can act for it. Once
        per gang every PREEMPT_RETRY_S. Runs without `lock` (membership and the cache have
        their own); it takes `lock` only to record its choice."""
        now = time.monotonic()
        for key in sorted(self.membership.gang_keys()):
            known = self.gangs.get(key)
            if known is not None and (
                known.plan or known.failed_attempt != (-1, -1) or now - known.swept < PREEMPT_RETRY_S
            ):
                continue  # planned, or attempted (the retry path and the loop below take it), or just now
            pods = [p for p in self.membership.member_pods(key) if not p.node]
            if not pods or not self.ours(pods[0]):
                continue
            resolved = self._resolve(pods[0])
            if resolved is None or resolved[1].spec is None:
                continue
            if requests.quorum_shortfall(resolved[1].spec, self.membership.member_pods(key)):
                continue
            with self.lock:
                state = self.gangs.setdefault(key, GangState(key))
                state.spec = resolved[1].spec
                state.swept = now
            return state
        if self.preemptor is None:
            return None
        generation = self.cache.generation
        with self.lock:
            due = [  # asked before, not placed, no victim search since the cluster last changed
                st
                for st in self.gangs.values()
                if not st.plan
                and st.spec is not None
                and st.failed_attempt[0] != -1
                and st.preempt_generation != generation
                and now - st.preempt_tried >= PREEMPT_RETRY_S
                and now - st.swept >= PREEMPT_RETRY_S
            ]
            if not due:
                return None
            state = min(due, key=lambda st: (st.swept, st.key))
            state.swept = now
        return state

    def is_member(self, pod: PodInfo) -> bool:
        """Whether the pod is scheduled as a gang member (a definition it can use)."""
        return self._resolve(pod) is not None

    def preempt_for(self, pod: PodInfo) -> None:
        """kube-scheduler's preemption asked for a gang member (its filters found no node):
        the gang is recorded, and the sweep plans it and searches for victims within a couple
        of seconds (a victim search never runs inside kube-scheduler's scheduling cycle)."""
        resolved = self._resolve(pod)
        if resolved is None or resolved[1].spec is None:
            return
        key, spec = resolved[0], resolved[1].spec
        with self.lock:
            state = self.gangs.setdefault(key, GangState(key))
            state.spec = spec

    # ------------------------------------------------------------------ read view

    def describe(self) -> list[dict[str, Any]]:
        with self.lock:
            keys = sorted(set(self.gangs) | self.membership.gang_keys())
            return [self._describe(k) for k in keys]

    def _describe(self, key: str) -> dict[str, Any]:
        state = self.gangs.get(key) or GangState(key)
        pods = self.membership.member_pods(key)
        spec = state.spec
        planned = {p.uid: p.key for p in self.cache.pods(state.plan)}
        return {
            "key": key,
            "source": "/".join(spec.source) if spec else "",
            "minCount": spec.min_count if spec else None,
            "members": len(pods),
            "bound": sum(1 for p in pods if p.node),
            "phase": GangPhase.SCHEDULED.value if pods and all(p.node for p in pods) else state.phase.value,
            "pendingReason": state.reason,
            "solveMs": round(state.solve_ms, 2),
            "plan": {planned[u]: r.node for u, r in state.plan.items() if u in planned},
            "nodes": {p.key: p.node for p in pods if p.node},
            "pods": sorted(p.key for p in pods),
            "held": sorted(self.holds.by_gang[key].nodes) if key in self.holds.by_gang else [],
        }


def _nomination_order(planned: list[tuple[str, Reservation]], parked: set[str]) -> list[tuple[str, Reservation]]:
    """The order a plan's nominations are written in: the members kube-scheduler still has
    queued in plan order, one parked member after every PARKED_STRIDE of them, the rest of the
    parked after. kube-scheduler takes queued members up one after another and offers each a
    sample of the nodes unless its nomination has arrived, so their nominations must stay ahead
    of it; it retries a parked member whenever that member's backoff ends, any time while the
    nominations are written, and a parked member retried before its nomination fails again (a
    full cycle on a sample of the nodes, and a longer backoff)."""
    queued = [item for item in planned if item[0] not in parked]
    waiting = iter([item for item in planned if item[0] in parked])
    order: list[tuple[str, Reservation]] = []
    for i, item in enumerate(queued, 1):
        order.append(item)
        if i % PARKED_STRIDE == 0:
            order.extend(itertools.islice(waiting, 1))
    order.extend(waiting)
    return order


def _quorum_pods(entry: Entry) -> list[PodInfo]:
    """The pending members a plan must place at least (quorum less those bound or planned):
    what the queue is asked to admit. The plan's own placement is checked again, exactly."""
    placed = len(entry.members.bound) + len(entry.planned)
    need = max(1, (entry.spec.min_count or len(entry.members.pending) + placed) - placed)
    return entry.members.pending[:need]


def _placed_need(ask: GangRequest, gang: GangPlan, snapshot: ClusterSnapshot) -> dict[str, int]:
    """What a placed gang takes, per GPU model too (the devices' models are known now)."""
    shapes = {g.name: g.shape for g in ask.groups}
    nodes = {n.name: n for n in snapshot.nodes}
    need: dict[str, int] = {}
    for a in gang.assignments:
        model, memory = "", 0
        node = nodes.get(a.node)
        if node is not None and a.devices:
            device = next((d for d in node.gpus if d.index == a.devices[0].index), None)
            if device is not None:
                model, memory = device.model, device.memory_mib
        for k, v in solver.usage_of(shapes[a.group], model=model, device_memory_mib=memory).items():
            need[k] = need.get(k, 0) + v
    return need


def _freed(nodes: ClusterSnapshot, victims: tuple[RunningPod, ...]) -> ClusterSnapshot:
    """The nodes as they will be once the victims are gone."""
    if not victims:
        return nodes
    by_node: dict[str, list[RunningPod]] = {}
    for v in victims:
        by_node.setdefault(v.node, []).append(v)
    freed = tuple(solver.free(n, by_node[n.name]) if n.name in by_node else n for n in nodes.nodes)
    return replace(nodes, nodes=freed)
