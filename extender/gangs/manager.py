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
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import structlog

import solver
from extender.cache import Cache
from extender.eligibility import matches
from extender.gangs.ri_source import PREFIX as RI_PREFIX
from extender.gangs.ri_source import WAITING_PREFIX as RI_WAITING
from extender.gangs.ri_source import RISource
from extender.gangs.sources import GangObjects, GangSpec, Resolution, gang_key, resolve
from extender.objects import PodInfo
from solver import (
    ClusterSnapshot,
    DeviceAssignment,
    EqGroup,
    GangName,
    GangPlan,
    GangRequest,
    GpuDemand,
    NodeName,
    Outcome,
    PodShape,
    Resources,
    SolverParams,
)

log = structlog.get_logger("phalanx.gangs")

WAITING_QUORUM = "waiting for gang quorum"
GANG_TIMEOUT = "gang timed out at bind"
NO_RESERVATION = "no reservation for this member"

Notify = Callable[[GangSpec, str, str, str], None]  # (spec, reason, message, type)
Nudge = Callable[[str, str, str], None]  # (namespace, pod name, annotation value)


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
    phase: str = "Pending"
    solve_ms: float = 0.0
    summary: str = ""
    plans: int = 0  # plans made so far, written on members to wake them
    failed_attempt: tuple[int, int] = (-1, -1)  # (cache generation, members) of the last failed plan
    bound_uids: set[str] = field(default_factory=set)  # members this process bound
    parked: set[str] = field(default_factory=set)  # members told "not yet": kube-scheduler parked them


@dataclass
class _Pending:
    """A gang about to be planned: its unplanned members grouped by shape and placement."""

    state: GangState
    spec: GangSpec
    pending: list[PodInfo]
    bound: list[PodInfo]
    groups: dict[tuple[Any, ...], list[PodInfo]] = field(default_factory=lambda: defaultdict(list))


@dataclass(frozen=True, slots=True)
class FilterAnswer:
    passed: list[str]
    failed: dict[str, str]


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
    ) -> None:
        self.cache = cache
        self.objects = objects
        self.params = params
        self.notify = notify
        self.nudge: Nudge = nudge or (lambda namespace, name, value: None)
        self.bind_wait_cap_s = bind_wait_cap_s
        self.members: dict[str, set[str]] = defaultdict(set)  # gang key -> pod uids
        self.key_of: dict[str, str] = {}  # pod uid -> gang key it is counted under
        self.ri = ri
        if ri is not None:
            ri.on_rekey = self.rekey
        self.gangs: dict[str, GangState] = {}
        self._last_retry = 0.0
        self.lock = threading.Condition(threading.RLock())
        cache.pod_listeners.append(self._pod_changed)

    # ------------------------------------------------------------------ membership

    def _pod_changed(self, old: PodInfo | None, new: PodInfo | None) -> None:
        either = new if new is not None else old
        if either is None:
            return
        uid = either.uid
        previous = self.key_of.pop(uid, "")
        if previous:
            self.members[previous].discard(uid)
        if new is not None and new.active:
            key = self._key(new)
            if key:
                self.members[key].add(uid)
                self.key_of[uid] = key

    def _key(self, pod: PodInfo) -> str:
        key = gang_key(pod.namespace, pod.labels, pod.scheduling_group)
        if not key and self.ri is not None:
            key = self.ri.key(pod)
        return key

    def rekey(self, uids: set[str]) -> None:
        """Pods whose RI owner just appeared: compute their gang again, and wake them."""
        with self.cache.lock:
            pods = [p for u in uids if (p := self.cache.pods.get(u)) is not None]
            for pod in pods:
                self._pod_changed(pod, pod)
        for pod in pods:
            if not pod.node:
                self.nudge(pod.namespace, pod.name, f"owner:{time.time():.0f}")

    def gang_of(self, pod: PodInfo) -> str:
        with self.cache.lock:
            known = self.key_of.get(pod.uid)
        return known if known is not None else self._key(pod)

    # ------------------------------------------------------------------ filter

    def filter(self, pod: PodInfo, names: list[str]) -> FilterAnswer | None:
        """The answer for a gang member, or None when the pod is scheduled as a single pod."""
        key = self.gang_of(pod)
        if not key:
            return None
        if key.startswith((RI_PREFIX, RI_WAITING)) and self.ri is not None:
            res: Resolution | None = self.ri.resolve(pod, key, self._member_pods(key))
        else:
            res = resolve(self.objects, pod.namespace, pod.labels, pod.annotations, pod.scheduling_group)
        if res is None or (res.spec is not None and not res.spec.enabled):
            return None
        with self.lock:
            state = self.gangs.setdefault(key, GangState(key))
            if res.spec is None:
                state.reason = res.reason
                state.parked.add(pod.uid)
                return FilterAnswer([], dict.fromkeys(names, res.reason))
            state.spec = res.spec
            self._expire(state)
            reservation = state.plan.get(pod.uid)
            if reservation is not None and reservation.node in names:
                return FilterAnswer([reservation.node], {})
            if reservation is not None:
                self._release(state, "planned node is no longer a candidate")
            return self._plan_and_answer(state, res.spec, pod, names)

    def _plan_and_answer(self, state: GangState, spec: GangSpec, pod: PodInfo, names: list[str]) -> FilterAnswer:
        pods = self._member_pods(state.key)
        # Bound by us but not yet shown bound by the watch: not pending (never plan twice).
        bound = [p for p in pods if p.node or p.uid in state.bound_uids]
        pending = [p for p in pods if not p.node and p.uid not in state.plan and p.uid not in state.bound_uids]
        have = len(pods)
        if have < spec.min_count:
            state.reason = f"{WAITING_QUORUM} {have}/{spec.min_count}"
            state.parked.add(pod.uid)
            return FilterAnswer([], dict.fromkeys(names, state.reason))
        # A gang that did not fit is solved again only once the cluster or its members changed:
        # kube-scheduler retries each of its members, and each retry must stay cheap.
        if pending and (self.cache.generation, len(pods)) != state.failed_attempt:
            self._plan(state, spec, pending, bound)
        reservation = state.plan.get(pod.uid)
        if reservation is None:
            state.parked.add(pod.uid)
            return FilterAnswer([], dict.fromkeys(names, state.reason or NO_RESERVATION))
        if reservation.node not in names:
            state.parked.add(pod.uid)
            return FilterAnswer([], dict.fromkeys(names, f"planned node {reservation.node} is not a candidate"))
        return FilterAnswer([reservation.node], {})

    def _member_pods(self, key: str) -> list[PodInfo]:
        with self.cache.lock:
            pods = [self.cache.pods[uid] for uid in self.members.get(key, ()) if uid in self.cache.pods]
        return sorted((p for p in pods if p.active), key=lambda p: (p.created, p.name))

    def _plan(self, state: GangState, spec: GangSpec, pending: list[PodInfo], bound: list[PodInfo]) -> None:
        """One solve for this gang's unplanned members and every other gang that has quorum
        but no plan yet (joint placement packs better than first come, first served);
        each gang is reserved all or nothing."""
        entries = [_Pending(state, spec, pending, bound), *self._other_pending(state.key)]
        snapshot = self.cache.snapshot()
        requests = [self._request(snapshot, e) for e in entries]
        started = time.perf_counter()
        result = solver.plan(snapshot, requests, params=self.params())
        elapsed_ms = (time.perf_counter() - started) * 1000
        for entry, gang in zip(entries, result.gangs, strict=True):
            entry.state.solve_ms = elapsed_ms
            if gang.outcome is Outcome.PLACED:
                self._reserve(entry, gang, snapshot, result.status.value)
                continue
            members = len(entry.pending) + len(entry.bound) + len(entry.state.plan)
            entry.state.failed_attempt = (snapshot.generation, members)
            if entry.state.reason != gang.explanation:
                entry.state.reason = gang.explanation
                entry.state.phase = "Pending"
                self.notify(entry.spec, "Unschedulable", gang.explanation, "Warning")
                log.info(
                    "gang not placed", gang=entry.state.key, reason=gang.explanation, solve_ms=round(elapsed_ms, 1)
                )

    def _other_pending(self, key: str, most: int = 8) -> list[_Pending]:
        out = []
        for other, st in self.gangs.items():
            if other == key or st.plan or st.spec is None or not st.spec.enabled:
                continue
            pods = self._member_pods(other)
            pending = [p for p in pods if not p.node]
            if pending and len(pods) >= st.spec.min_count:
                out.append(_Pending(st, st.spec, pending, [p for p in pods if p.node]))
        out.sort(key=lambda e: (-e.spec.priority, e.state.key))
        return out[:most]

    def _request(self, snapshot: ClusterSnapshot, entry: _Pending) -> GangRequest:
        state, spec = entry.state, entry.spec
        # Members beyond a quorum that is already planned or bound join as they fit (at least one).
        need = max(1, spec.min_count - len(state.plan) - len(entry.bound))
        for p in entry.pending:
            entry.groups[(p.requests, p.demand, p.placement)].append(p)
        anchor = self._anchor(snapshot, spec, [p.node for p in entry.bound] + [r.node for r in state.plan.values()])
        n = len(entry.groups)
        eqs = tuple(
            EqGroup(_group_name(i, n), self._shape(snapshot, req, demand, placement, anchor), len(ms))
            for i, ((req, demand, placement), ms) in enumerate(entry.groups.items())
        )
        priority = spec.priority or max((self._qos_priority(p) for p in entry.pending), default=0)
        return GangRequest(GangName(state.key), eqs, min_count=need, topology=spec.topology, priority=priority)

    def _shape(
        self,
        snapshot: ClusterSnapshot,
        req: Resources,
        demand: GpuDemand,
        placement: str,
        anchor: frozenset[NodeName] | None,
    ) -> PodShape:
        """Members' shape: eligibility (selector, affinity, taints, GPU pool) within the anchor."""
        spec = orjson.loads(placement) if placement else {}
        allowed = self._allowed(snapshot, spec, anchor)
        pool_name = spec.get("gpuPool", "")
        if not pool_name:
            return PodShape(req, demand, allowed_nodes=allowed)
        pool = self.cache.hardware.by_name.get(pool_name)
        if pool is None:  # an undefined pool: no node qualifies, the explanation says why
            return PodShape(req, demand, allowed_nodes=frozenset())
        in_pool = frozenset(
            n.name for n in snapshot.nodes if (allowed is None or n.name in allowed) and pool.contains(n.name, n.labels)
        )
        return PodShape(req, demand, allowed_nodes=in_pool, gpu_models=self.cache.pool_models(pool))

    def _qos_priority(self, pod: PodInfo) -> int:
        pool = self.cache.hardware.by_name.get(pod.pool) if pod.pool else None
        return pool.priority(pod.qos) if pool is not None else 0

    def _reserve(self, entry: _Pending, gang: GangPlan, snapshot: ClusterSnapshot, status: str) -> None:
        state, spec = entry.state, entry.spec
        by_group = {_group_name(i, len(entry.groups)): ms for i, ms in enumerate(entry.groups.values())}
        taken: dict[str, int] = defaultdict(int)
        state.plans += 1
        with self.cache.lock:  # members deleted while solving get no reservation
            for a in sorted(gang.assignments, key=lambda a: a.rank):
                member = by_group[a.group][taken[a.group]]
                taken[a.group] += 1
                state.plan[member.uid] = Reservation(a.node, a.devices)
                if member.uid in self.cache.pods:
                    self.cache.assume(member.uid, a.node, a.devices)
        # Only members kube-scheduler has parked need waking; the others are still queued.
        for uid in [u for u in state.parked if u in state.plan]:
            planned = self.cache.pods.get(uid)
            if planned is not None:
                self.nudge(planned.namespace, planned.name, f"{state.plans}:{state.plan[uid].node}")
        state.parked.difference_update(state.plan)
        state.deadline = time.monotonic() + spec.timeout_s
        state.reason = ""
        state.phase = "Planned"
        levels = snapshot.levels if len(snapshot.levels) == len(gang.domains_used) else (*snapshot.levels, "hosts")
        where = ", ".join(
            f"{count} {level.rsplit('/', 1)[-1]}" for level, count in zip(levels, gang.domains_used, strict=True)
        )
        state.summary = (
            f"planned {len(gang.assignments)} of {len(entry.pending)} pending members on {where} "
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

    @staticmethod
    def _allowed(
        snapshot: ClusterSnapshot, spec: dict[str, Any], anchor: frozenset[NodeName] | None
    ) -> frozenset[NodeName] | None:
        """Nodes the members' nodeSelector, required affinity and tolerations allow, within the
        anchor domain; None for "every node"."""
        if not spec:
            return anchor
        allowed = frozenset(
            n.name
            for n in snapshot.nodes
            if (anchor is None or n.name in anchor) and matches(n.name, n.labels, _taints(n.taints), spec)
        )
        return allowed

    @staticmethod
    def _anchor(snapshot: ClusterSnapshot, spec: GangSpec, nodes: list[str]) -> frozenset[NodeName] | None:
        """Members already bound or planned fix the domain of the required level."""
        required = spec.topology.required
        if not nodes or not required or required not in snapshot.levels:
            return None
        depth = snapshot.levels.index(required)
        paths: dict[str, tuple[str, ...]] = {str(n.name): n.topology for n in snapshot.nodes}
        domains = {paths[n][: depth + 1] for n in nodes if n in paths}
        return frozenset(n.name for n in snapshot.nodes if n.topology[: depth + 1] in domains)

    def _expire(self, state: GangState) -> None:
        if state.plan and state.deadline and time.monotonic() > state.deadline:
            self._release(state, f"{GANG_TIMEOUT}: {len(state.arrived)}/{len(state.plan)} members arrived")

    def _release(self, state: GangState, reason: str) -> None:
        for uid in list(state.plan):
            pod = self.cache.pods.get(uid)
            if pod is None or not pod.node:
                self.cache.forget(uid)
        state.plan.clear()
        state.arrived.clear()
        state.deadline = 0.0
        state.released += 1
        state.reason = reason
        state.phase = "Pending"
        if state.spec is not None:
            self.notify(state.spec, "Released", reason, "Warning")
        for pod in self._member_pods(state.key):
            if not pod.node and pod.uid in state.parked:
                self.nudge(pod.namespace, pod.name, f"{state.plans}:released")
        log.info("gang reservation released", gang=state.key, reason=reason)
        self.lock.notify_all()

    # ------------------------------------------------------------------ permit at bind

    def permit(self, pod: PodInfo, node: str) -> str | None:
        """Wait at the gate; "" when this member may bind now, an error to return otherwise,
        None when the pod is not a planned gang member (bind it as a single pod)."""
        key = self.gang_of(pod)
        if not key:
            return None
        with self.lock:
            state = self.gangs.get(key)
            if state is None or pod.uid not in state.plan:
                return None if state is None or state.spec is None or not state.spec.enabled else NO_RESERVATION
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
                    state.phase = "Binding"
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
        """Every planned member still unbound has reached bind (bound ones leave the plan)."""
        return len(state.arrived) >= len(state.plan)

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
                state.phase = "Scheduled"
                state.deadline = 0.0
                self.notify(state.spec, "Scheduled", state.summary.replace("planned", "bound", 1), "Normal")

    # ------------------------------------------------------------------ read API

    def definition_changed(self, namespace: str, name: str) -> None:
        """A Workload or PodGroup changed: its waiting members are re-evaluated now (they may
        have been parked by kube-scheduler for lack of quorum or of a definition)."""
        prefixes = [f"{kind}:{namespace}/{name}" for kind in ("wl", "pg", "cs", "ri")]
        with self.cache.lock:
            keys = [
                k
                for k, members in self.members.items()
                if members and any(k == p or k.startswith(p + "/") for p in prefixes)
            ]
        for key in keys:
            for pod in self._member_pods(key):
                if not pod.node:
                    self.nudge(pod.namespace, pod.name, f"definition:{time.time():.0f}")

    def shutdown(self) -> None:
        """Fail every waiting bind so kube-scheduler requeues those members at once."""
        with self.lock:
            for state in self.gangs.values():
                if state.plan:
                    self._release(state, "extender shutting down")

    def sweep(self) -> None:
        """Release reservations past their deadline even if no member comes back to ask, and
        those of gangs that lost a planned member (deleted: the gate could never close)."""
        with self.lock:
            for state in list(self.gangs.values()):
                self._expire(state)
                gone = [uid for uid in state.plan if uid not in self.cache.pods]
                if gone:
                    self._release(state, f"{len(gone)} planned members were deleted")
            self._retry_failed()
            with self.cache.lock:
                finished = [k for k, st in self.gangs.items() if not st.plan and not self.members.get(k)]
            for key in finished:  # every member gone: forget the gang
                del self.gangs[key]

    def _retry_failed(self, every_s: float = 2.0) -> None:
        """Plan again, in the background, gangs that did not fit when the cluster has changed
        since. kube-scheduler only retries a parked member on an event it links to the
        rejection; capacity our own cache frees a moment later (a watch lags the API) may come
        with no such event. A plan found here wakes the members through their annotation."""
        now = time.monotonic()
        if now - self._last_retry < every_s:
            return
        self._last_retry = now
        generation = self.cache.generation
        waiting = [
            st
            for st in self.gangs.values()
            if not st.plan and st.spec is not None and st.spec.enabled and st.failed_attempt[0] not in (-1, generation)
        ]
        waiting.sort(key=lambda st: (-st.spec.priority if st.spec else 0, st.key))
        for state in waiting[:1]:  # one solve per round: it plans every other waiting gang too
            assert state.spec is not None
            pods = self._member_pods(state.key)
            bound = [p for p in pods if p.node or p.uid in state.bound_uids]
            pending = [p for p in pods if not p.node and p.uid not in state.bound_uids]
            if pending and len(pods) >= state.spec.min_count:
                self._plan(state, state.spec, pending, bound)

    def describe(self) -> list[dict[str, Any]]:
        with self.lock:
            with self.cache.lock:
                keys = sorted(set(self.gangs) | {k for k, v in self.members.items() if v})
            return [self._describe(k) for k in keys]

    def _describe(self, key: str) -> dict[str, Any]:
        state = self.gangs.get(key) or GangState(key)
        pods = self._member_pods(key)
        spec = state.spec
        return {
            "key": key,
            "source": "/".join(spec.source) if spec else "",
            "minCount": spec.min_count if spec else None,
            "members": len(pods),
            "bound": sum(1 for p in pods if p.node),
            "phase": "Scheduled" if pods and all(p.node for p in pods) else state.phase,
            "pendingReason": state.reason,
            "solveMs": round(state.solve_ms, 2),
            "plan": {self.cache.pods[u].key: r.node for u, r in state.plan.items() if u in self.cache.pods},
            "nodes": {p.key: p.node for p in pods if p.node},
        }


def _taints(taints: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """Taints as the cache writes them ("key=value:effect") back to (key, value, effect)."""
    out = []
    for t in taints:
        key_value, _, effect = t.rpartition(":")
        key, _, value = key_value.partition("=")
        out.append((key, value, effect))
    return out


def _group_name(index: int, groups: int) -> str:
    """Members with one shape and placement; the name appears in explanations."""
    return "members" if groups == 1 else f"members-{index + 1}"
