"""The extender verbs: filter, prioritize, bind, preempt (kube-scheduler extender v1).

Handlers stay short: parse, look up, call, map. Pods that request nothing Phalanx manages pass
through filter and prioritize untouched, but for their node-pool order (extender/node_pools.py).
GPU pods are checked node by node against the cache's device accounting; each node's answer
is memoised per pod shape and node version, so a stream of identical pods costs a dictionary
lookup per node. Gang members are answered by the gang manager. Every answer is a typed
`Verdict` (extender/outcomes.py) mapped to one reply field: `FailedNodes` where a change (or
preemption) may help, `FailedAndUnresolvableNodes` where nothing can; internal faults go to
`Error`. Sharing state (target workload, packer) lives in extender/sharing.py. About 600
lines: the four verbs share the parsed-pod cache, the shape memo and the reply mapping; the
pure parts live in scoring.py, memo.py, wire.py and node_pools.py.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import compress, filterfalse, repeat
from operator import eq, is_, ne
from typing import Any, cast

import orjson
import structlog

from extender import wire
from extender.agents import AgentRefused
from extender.binder import Binder, Fenced
from extender.cache import Assumed, Cache
from extender.config import PhalanxConfig
from extender.eligibility import matches
from extender.errors import BadRequest, NotReady
from extender.gangs.manager import GangManager
from extender.gangs.requests import taints
from extender.kube import ApiError
from extender.landing import Landing, Landings
from extender.memo import ShapeMemo, catch_up
from extender.metrics import Metrics
from extender.node_pools import TierMemo
from extender.objects import PodInfo, decode_devices, encode_devices, pod_info
from extender.outcomes import Fit, Then, Verdict
from extender.pools import NOT_IN_POOL, UNKNOWN_POOL, Pool
from extender.queues import QueueBook
from extender.scoring import (
    best,
    fragmentation_lead,
    fragmentation_scores,
    untiered_lead,
    untiered_scores,
    untiered_scores_by_name,
)
from extender.sharing import Sharing
from solver import (
    DeviceAssignment,
    GpuKind,
    PlacementMode,
    PodShape,
    WorkloadClass,
    fits,
)

log = structlog.get_logger("phalanx.verbs")

INVALID_REQUEST = "invalid GPU request"
NOT_IN_CACHE = "node unknown to phalanx"
HELD = "capacity held for a gang that has waited long at the head of its queue"
BOUND, NOT_BOUND, UNKNOWN = "bound", "not bound", "unknown"  # what a failed bind did
CORDON = ("node.kubernetes.io/unschedulable", "", "NoSchedule")  # the taint a cordon stands for
PARSED_PODS = 128  # parsed pods kept (watch lag only: the watch's reading comes first): 8 MiB at most
PARSED_POD_BYTES = 64 * 2**10  # larger pods (big annotations) are parsed on every call, never kept
# A single GPU pod's devices, chosen by the filter that offers it one node, are counted until its
# bind; a choice whose bind has not come by then is dropped (kube-scheduler binds in milliseconds,
# PreBind plugins such as volume binding can take longer: such a bind then chooses again).
CHOICE_TTL_S = 30.0
# The sweep's re-measure (`refresh_workload`) gives the GIL up between batches of nodes: a filter
# arriving meanwhile runs after one batch (about 0.3 ms), not in 1 ms slices (the switch interval)
# shared with the pass (20-45 ms at 5,000 nodes) and every other thread that asks.
REMEASURE_BATCH = 64
REMEASURE_PAUSE_S = 0.0005


@dataclass(frozen=True, slots=True)
class _Choice:
    assumed: Assumed  # the cache's own record of it: forgotten only while it is still that one
    deadline: float


@dataclass(frozen=True, slots=True)
class _Ask:
    shape: PodShape
    pool: Pool | None
    mode: PlacementMode
    error: str = ""


class Verbs:
    def __init__(
        self,
        cache: Cache,
        binder: Binder,
        config: PhalanxConfig,
        metrics: Metrics,
        gangs: GangManager | None = None,
        *,
        sharing: Sharing | None = None,
        synced: Callable[[], bool] = lambda: True,
        queues: QueueBook | None = None,
    ) -> None:
        self.cache = cache
        self.queues = queues
        self.synced = synced
        self.gangs = gangs
        self.binder = binder
        self.metrics = metrics
        self.sharing = sharing if sharing is not None else Sharing(cache)
        self.config = config
        self._memo: dict[tuple[Any, ...], ShapeMemo] = {}
        self._memo_lock = threading.Lock()
        self._parsed: dict[tuple[str, str], PodInfo] = {}  # (uid, resourceVersion) -> parsed pod
        # While the sweep re-measures (`refresh_workload`): the target workload before it.
        self._warming_from: tuple[WorkloadClass, ...] | None = None
        self.last_call = 0.0  # monotonic time of the last filter or prioritize (app.py's catch-up)
        self._pool_tiers = TierMemo(cache.labels_of, lambda: self.cache.nodes_version)
        self._choices: dict[str, _Choice] = {}  # uid -> devices filter chose, counted until the bind
        self._binding: set[str] = set()  # uids whose bind is under way: a late choice is theirs
        self._choices_lock = threading.Lock()
        # Single pods' binds answered before their Binding lands (extender/landing.py); None:
        # every bind is answered when it has landed.
        self.landings: Landings | None = None

    @property
    def config(self) -> PhalanxConfig:
        return self._config

    @config.setter
    def config(self, config: PhalanxConfig) -> None:
        self._config = config
        self.sharing.enabled = config.gpu.fragmentation_scoring

    # ------------------------------------------------------------------ filter

    def _pod(self, args: dict[str, Any]) -> PodInfo:
        """The request's pod: the cache's reading when the watch has seen this very version
        (no parse, and nothing a client sends can replace it), else parsed once per (uid,
        resourceVersion): filter and prioritize of one scheduling cycle carry the same pod."""
        self._require_sync()
        raw = args.get("Pod")
        meta = raw.get("metadata") if isinstance(raw, dict) else None
        if isinstance(meta, dict):
            uid, version = meta.get("uid"), meta.get("resourceVersion")
            watched = self.cache.pod(uid) if isinstance(uid, str) and uid else None
            if watched is not None and isinstance(version, str) and version and watched.resource_version == version:
                # The watch's own reading of this very version: nothing else the client sent is
                # read, so it is not checked either (about 20 µs a call, on the serial cycle).
                return watched
        obj = wire.check_pod(raw)
        meta = obj["metadata"]
        key = (meta.get("uid") or "", meta.get("resourceVersion") or "")
        pod = self._parsed.get(key)
        if pod is None:
            try:
                pod = pod_info(obj)
                size = len(orjson.dumps(obj))
            except (TypeError, ValueError, AttributeError, ArithmeticError, RecursionError) as e:
                # pod_info reads hostile pods from the watch without raising; one it cannot
                # read at all (wrong types deep down, nesting past orjson's limit) is malformed.
                raise BadRequest(f"Pod: unreadable: {type(e).__name__}: {str(e)[:256]}") from None
            # A real uid and resourceVersion, and a pod of ordinary size: the cache holds at
            # most PARSED_PODS x PARSED_POD_BYTES (8 MiB), whatever clients send.
            if key[0] and len(key[1]) <= 32 and size <= PARSED_POD_BYTES:
                if len(self._parsed) >= PARSED_PODS:
                    self._parsed.clear()
                self._parsed[key] = pod
        return pod

    def _node_names(self, args: dict[str, Any]) -> list[str]:
        """The request's candidate nodes. kube-scheduler names nodes of the cluster our cache
        mirrors: a list far longer than the cluster (past twice its size and 1,000) is refused,
        so a client cannot make one call cost memory in proportion to what it invents."""
        names = wire.node_names(args)
        nodes, _ = self.cache.counts()
        if len(names) > max(2 * nodes, 1000):
            raise BadRequest(f"NodeNames lists {len(names)} nodes; the cluster has {nodes}")
        return names

    def _require_sync(self) -> None:
        if not self.synced():
            raise NotReady("phalanx cache not synced yet (nodes and pods still listing)")

    def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        """The filter reply, with its choice (if any) counted before returning: for callers in
        this process (tests, trace_replay). The server calls `filter_then`."""
        answer = self.filter_then(args)
        if isinstance(answer, Then):
            answer.after()
            return cast("dict[str, Any]", answer.reply)
        return answer

    def filter_then(self, args: dict[str, Any]) -> dict[str, Any] | Then:
        """The filter reply; for a single GPU pod offered one node, also its device choice
        (`_choose`), which the server makes right after sending the reply."""
        self.last_call = time.monotonic()
        pod, names = self._pod(args), self._node_names(args)
        if self._choices:
            self._drop_choice(pod.uid)  # filtered again: what it chose before no longer stands
        verdict = self._unheld(pod, self._verdict(pod, names))
        if pod.node_pools:
            verdict = self._first_pool(pod, verdict)
        verdict = self._sample(pod, verdict)
        reply = self._filter_reply(verdict, names, pod)
        if verdict.outcome is not Fit.FITS or len(verdict.passed) != 1 or pod.demand.kind is GpuKind.NONE:
            return reply
        if self.gangs is not None and self.gangs.gang_of(pod):
            return reply  # gang members: their plan reserved their devices
        node = verdict.passed[0]
        return Then(reply, lambda: self._choose(pod, node))

    def _choose(self, pod: PodInfo, node: str) -> None:
        """A single GPU pod offered one node has its devices chosen and counted as soon as the
        reply is out, as kube-scheduler assumes a pod on its node before binding it: it filters
        the next pod before this one's bind arrives, and without this the next pod would see
        the devices still free (two half-GPU pods filtered back to back were both scored for the
        same half, and a ReplicaSet's new pods spread over more GPUs than they need). The
        choice is made in the connection's thread after the reply is sent: kube-scheduler's
        cycle before its next filter takes longer than the choice (should a filter come first,
        it sees what a bind would have shown it, as before). The bind keeps these devices; a
        pod filtered again, deleted, refused at bind, or not bound within CHOICE_TTL_S gives
        them back. The queue limit is checked in the same step, as bind does; a pod over it
        gets nothing counted, and its bind refuses it. Pods the watch has not seen are not
        counted, and what is counted is the pod as the watch read it, as bind does (a caller
        cannot reserve for made-up pods, nor more than a real pod asks for)."""
        if self.cache.assumed(pod.uid) is not None:
            return
        watched = self.cache.pod(pod.uid)
        if watched is None or watched.node or not watched.active:
            return
        devices = self._choose_devices(watched, node, gang=False)
        if devices is None or isinstance(devices, str):
            return  # no longer fits, or over its queue's limit: the bind says so
        assumed = self.cache.assumed(pod.uid)
        with self._choices_lock:
            if assumed is not None and pod.uid not in self._binding:  # a bind that came first owns it
                self._choices[pod.uid] = _Choice(assumed, time.monotonic() + CHOICE_TTL_S)

    def _drop_choice(self, uid: str, *, expired_before: float | None = None) -> None:
        """Give back the devices a filter chose for this pod (all of them, or only a choice
        whose deadline passed before `expired_before`)."""
        with self._choices_lock:
            choice = self._choices.get(uid)
            if choice is None or (expired_before is not None and choice.deadline > expired_before):
                return
            del self._choices[uid]
        self._give_back(uid, choice)

    def _give_back(self, uid: str, choice: _Choice | None) -> None:
        """Forget a filter's choice, unless the watch has shown the pod bound or it was
        assumed again since."""
        if choice is not None:
            self._unassume(uid, choice.assumed)

    def _unassume(self, uid: str, assumed: Assumed | None) -> None:
        """Forget exactly this assumption (never a newer one), and tell the packer, which
        counted the pod on that device."""
        if assumed is not None and self.cache.forget(uid, only=assumed):
            self.sharing.bind_failed(assumed.node, assumed.devices)

    def expire_choices(self) -> int:
        """Drop the choices whose bind did not come in time (the sweep calls this); how many."""
        now = time.monotonic()
        with self._choices_lock:
            due = [uid for uid, c in self._choices.items() if c.deadline <= now]
        for uid in due:
            self._drop_choice(uid, expired_before=now)
        return len(due)

    def _take_choice(self, uid: str) -> _Choice | None:
        """The bind has come: what filter chose is the bind's now (kept, or forgotten with it);
        until it ends (`_bind_ended`) a choice made late is not recorded."""
        with self._choices_lock:
            self._binding.add(uid)
            return self._choices.pop(uid, None)

    def _bind_ended(self, uid: str) -> None:
        with self._choices_lock:
            self._binding.discard(uid)

    def _first_pool(self, pod: PodInfo, verdict: Verdict) -> Verdict:
        """A pod with node pools (extender/node_pools.py) keeps, of the nodes that pass, those
        of the first pool any of them is in (nodes in no pool last): the tier rule of a gang's
        plan. Nothing fails for the cut, as for the sample: the other pools' nodes are simply
        not offered while a better pool has a passing node, so none is ever hidden for good."""
        if verdict.outcome not in (Fit.FITS, Fit.PASSTHROUGH) or len(verdict.passed) <= 1:
            return verdict
        kept = self._pool_tiers.first(pod.node_pools, verdict.passed)
        return verdict if kept is verdict.passed else replace(verdict, passed=kept)

    def _unheld(self, pod: PodInfo, verdict: Verdict) -> Verdict:
        """A single pod kept off capacity held for a starving gang (extender/gangs/holds.py)."""
        if self.gangs is None or not self.gangs.holds.by_gang or verdict.outcome not in (Fit.FITS, Fit.PASSTHROUGH):
            return verdict
        if self.gangs.gang_of(pod):
            return verdict  # a gang member: its plan already kept off others' holds
        blocked = self.gangs.held_against(pod)
        kept = [n for n in verdict.passed if n not in blocked]
        if len(kept) == len(verdict.passed):
            return verdict
        failed = {**verdict.failed, **{n: HELD for n in verdict.passed if n in blocked}}
        return Verdict(Fit.FITS if kept else Fit.UNSCHEDULABLE, kept, failed=failed)

    def _verdict(self, pod: PodInfo, names: list[str]) -> Verdict:
        if pod.error:
            return Verdict.unresolvable(f"{INVALID_REQUEST}: {pod.error}")
        if self.queues is not None:
            self.queues.note_scheduler(pod.scheduler)
        if self.gangs is not None:
            answer = self.gangs.filter(pod, names)
            if answer is not None:
                return answer
        ask = self._ask(pod)
        if ask.error:
            return Verdict.unresolvable(ask.error)
        refusal = self.queues.check_pod(pod) if self.queues is not None else ""
        if refusal:
            return Verdict.unschedulable(refusal)
        if pod.demand.kind is GpuKind.NONE and ask.pool is None:
            return Verdict(Fit.PASSTHROUGH, names)
        memo = self._memo_for(ask)
        with memo.lock:
            memo.sync(self.cache)
            # Names the cache does not know are answered, never memoised: a client naming
            # 100,000 made-up nodes must not grow the memo.
            unchecked = list(filterfalse(memo.checked.__contains__, names))  # passes in C, not bytecode
            unknown = {n: NOT_IN_CACHE for n in unchecked if not memo.check(self.cache, n)}
            failing = memo.failed
            if unknown:
                passed = [n for n in names if n not in failing and n not in unknown]
                failed = {n: failing.get(n) or unknown[n] for n in names if n in failing or n in unknown}
            else:  # the common case, in two C-speed passes at most
                passed = list(filterfalse(failing.__contains__, names)) if failing else list(names)
                if len(passed) < len(names):  # full nodes, as a cluster fills: C-speed too
                    bad = list(filter(failing.__contains__, names))
                    failed = dict(zip(bad, map(failing.__getitem__, bad), strict=True))
                else:
                    failed = {}
        return Verdict(Fit.FITS if passed else Fit.UNSCHEDULABLE, passed, failed=failed)

    def _sample(self, pod: PodInfo, verdict: Verdict) -> Verdict:
        """The passing nodes cut to what scoring should see (`filter.sampleNodes`).

        By default a GPU pod gets the one node Phalanx ranks best (prioritize's scores, equals
        in kube-scheduler's order): kube-scheduler then binds it there without running its
        Score plugins or calling prioritize, one extender call fewer per pod.

        A pod without GPUs keeps the nodes Phalanx ranks first, where it strands the fewest
        GPUs (`_cpu_only_scores`: all of them when none stands out), at most 100 (the first in
        kube-scheduler's order: a rotating window measured 0.12 points of allocation lower in
        trace_replay, it spreads CPU pods), and kube-scheduler's scores (spreading a
        Deployment's replicas) choose among them. 100 is the fewest kube-scheduler itself ever
        scores (minFeasibleNodesToFind); its own default, 420 of 1,000 nodes, cost its Score
        plugins about 0.4 ms more per such pod on its serial cycle (2026-11-27). Prioritize
        would score them all alike, so kube-scheduler's configuration asks it only for pods that
        request GPU resources (deploy/local/scheduler_config.py): a pod without GPUs costs one
        extender call, not two. Pods with preferences kube-scheduler scores keep every node.
        Nothing fails for the cut: the nodes left out are simply not offered."""
        if verdict.outcome not in (Fit.FITS, Fit.PASSTHROUGH) or pod.prefers:
            return verdict
        passed = verdict.passed
        if len(passed) <= 1:
            return verdict
        gpu = pod.demand.kind is not GpuKind.NONE
        k = self.config.filter.size(self.cache.counts()[0], gpu=gpu)
        if not gpu:
            scores = self._cpu_only_scores(pod, passed)  # shifted: the first rank holds the highest
            if scores:
                first = set(compress(scores, map(eq, scores.values(), repeat(max(scores.values())))))
                passed = list(filter(first.__contains__, passed))  # C-speed passes, kube-scheduler's order
            return verdict if len(passed) == len(verdict.passed) <= k else replace(verdict, passed=passed[:k])
        if len(passed) <= k:
            return verdict
        return replace(verdict, passed=best(passed, self._scores(pod, passed, lead_only=k == 1), k))

    def _ask(self, pod: PodInfo) -> _Ask:
        """The pod's shape as the solver sees it, with its GPU pool and placement mode."""
        hardware = self.cache.hardware
        mode = PlacementMode(self.config.gpu.placement_mode)
        if not pod.pool:
            return _Ask(PodShape(pod.requests, pod.demand, gpu_models=pod.gpu_models), None, mode)
        pool = hardware.by_name.get(pod.pool)
        if pool is None:
            return _Ask(PodShape(pod.requests, pod.demand), None, mode, f"{UNKNOWN_POOL}: {pod.pool!r}")
        return _Ask(PodShape(pod.requests, pod.demand, gpu_models=self.cache.models_of(pod)), pool, pool.mode)

    def _filter_reply(self, verdict: Verdict, names: list[str], pod: PodInfo) -> dict[str, Any]:
        """The verdict as kube-scheduler reads it: failing nodes under the field that says
        whether preemption may help."""
        if verdict.outcome in (Fit.FITS, Fit.PASSTHROUGH) or verdict.failed:
            failed = verdict.failed  # O(1) for a gang member's one planned node
        else:
            failed = dict.fromkeys(names, verdict.message)  # nothing passed: every node, one reason
        unresolvable = verdict.outcome is Fit.UNRESOLVABLE
        self.metrics.outcomes.labels("filter", verdict.outcome.value).inc()
        log.debug(
            "filter",
            pod=pod.key,
            nodes=len(names),
            passed=len(verdict.passed),
            outcome=verdict.outcome.value,
            generation=self.cache.generation,
        )
        return {
            "Nodes": None,
            "NodeNames": verdict.passed,
            "FailedNodes": {} if unresolvable else failed,
            "FailedAndUnresolvableNodes": failed if unresolvable else {},
            "Error": "",
        }

    # ------------------------------------------------------------------ prioritize

    def prioritize(self, args: dict[str, Any]) -> list[Any]:
        """Scores shifted so the lowest is 0 and zeros left out: the scheduler adds nothing
        for a missing host, and a shift common to all hosts keeps their order, so the reply
        stays small when most nodes look alike. Pods without GPUs get scores only from the
        fragmentation measure (`_cpu_only_scores`)."""
        self.last_call = time.monotonic()
        pod, names = self._pod(args), self._node_names(args)
        scores = self._pool_scores(pod, names) if pod.node_pools else self._scores(pod, names)
        # Plain entries: 500 of them take 0.04-0.08 ms to build and encode. Pre-serialized
        # (host, score) pairs saved 0.02-0.05 ms of that once made, but a call that met hundreds
        # of pairs for the first time (kube-scheduler's sample moving over 5,000 nodes) spent
        # 1-2 ms making them: the paced round's prioritize p99.
        return [{"Host": host, "Score": score} for host, score in scores.items()]

    def _pool_scores(self, pod: PodInfo, names: list[str]) -> dict[str, int]:
        """Prioritize agreeing with filter's pool cut: when `names` span several node pools,
        only the first pool's nodes score, 1..10 by their own scores (s -> 1 + 9s // 10), so any
        of them outranks the others."""
        first = self._pool_tiers.first(pod.node_pools, names)
        if len(first) == len(names):
            return self._scores(pod, names)
        scores = self._scores(pod, first)
        return {n: 1 + scores.get(n, 0) * 9 // 10 for n in first}

    def _scores(self, pod: PodInfo, names: list[str], *, lead_only: bool = False) -> dict[str, int]:
        """Prioritize's scores for `names`, shifted so the lowest is 0 and zeros left out
        (`lead_only`: enough of them to tell the one best node, for filter's cut to one)."""
        if pod.error:
            return {}
        if pod.demand.kind is GpuKind.NONE:
            return self._cpu_only_scores(pod, names)
        ask = self._ask(pod)
        if ask.error:
            return {}
        memo = self._memo_for(ask)
        workload = self.sharing.workload()
        by_fragmentation = memo.by_fragmentation(workload)
        before = self._warming_from
        if before is not None and memo.by_fragmentation(before) != by_fragmentation:
            # The sweep is measuring what ranks this shape from now on (`_remeasure`): until
            # that is in, it is ranked as before, not measured here node by node.
            workload, by_fragmentation = before, not by_fragmentation
        if by_fragmentation:
            return self._fragmentation_scores(memo, names, ask.shape, workload, lead_only=lead_only)
        with memo.lock:
            memo.sync(self.cache)
            known = memo.scores
            for name in filterfalse(known.__contains__, names):
                if (node := self.cache.node_model(name)) is not None:
                    known[name] = memo.score(node)
            scores = [known.get(n, 0) for n in names]
        low = min(scores, default=0)
        return {n: s - low for n, s in zip(names, scores, strict=True) if s > low}

    def _cpu_only_scores(self, pod: PodInfo, names: list[str]) -> dict[str, int]:
        """A pod without GPUs: no opinion, except where the fragmentation measure tells nodes
        apart. A CPU-heavy pod on a GPU node can strand GPUs whose pods need that CPU (Phalanx's
        measure counts it), and it should not eat CPU reserved for awaited share pods. Every
        node of least growth gets 10, with no tie-break by name: kube-scheduler's own scores
        choose among them, as they do for all pods on clusters without GPUs."""
        workload = self.sharing.workload()
        if not any(c.uses_gpu for c in workload):  # nothing to strand: not worth a pass over the nodes
            return {}
        ask = self._ask(pod)
        if ask.error or ask.mode is not PlacementMode.COMPACT_FIRST:  # `ShapeMemo.by_fragmentation`'s test
            return {}
        return self._fragmentation_scores(self._memo_for(ask), names, ask.shape, workload, by_name=False)

    def _fragmentation_scores(
        self,
        memo: ShapeMemo,
        names: list[str],
        shape: PodShape,
        workload: tuple[WorkloadClass, ...],
        *,
        by_name: bool = True,
        lead_only: bool = False,
    ) -> dict[str, int]:
        """Fragmentation growth per node, memoised per shape and node version, ranked by
        extender/scoring.py (with the packing tiers of extender/sharing.py); `lead_only`: the
        node ranked first alone (what a cut to one node keeps), without scoring the rest."""
        with memo.lock:
            memo.sync(self.cache)
            memo.ranked = True
            if memo.workload_generation != self.sharing.workload_generation and self._warming_from is None:
                memo.deltas.clear()
                memo.workload_generation = self.sharing.workload_generation
            known = memo.deltas
            # Each delta in one pass over the names (None: not measured yet), in C-speed passes:
            # a filter's hottest lines. In the cluster the caches are cold at every call (the
            # other processes run between two), so every pass over the names costs.
            found = list(map(known.get, names))
            if None in found:
                for name in compress(names, map(is_, found, repeat(None))):
                    if (node := self.cache.node_model(name)) is not None:
                        known[name] = memo.delta(node, workload)
                values = list(map(known.get, names, repeat(math.inf)))  # inf: not in the cache
            else:
                values = cast("list[float]", found)  # every name measured before
        if not self.sharing.tiered():  # no map of the deltas built: Python's work per node goes
            if lead_only and by_name:
                lead = untiered_lead(names, values)
                return {lead: 1} if lead is not None else {}
            return untiered_scores_by_name(names, values) if by_name else untiered_scores(names, values)
        deltas = dict(compress(zip(names, values, strict=True), map(ne, repeat(math.inf), values)))
        if not deltas:
            return {}
        tiers = self.sharing.tiers(list(deltas), shape, self.cache.node_model)
        if lead_only and by_name:
            return {fragmentation_lead(deltas, tiers): 1}
        return fragmentation_scores(deltas, tiers, by_name=by_name)

    def _memo_for(self, ask: _Ask) -> ShapeMemo:
        pool = ask.pool.name if ask.pool is not None else ""
        key = (ask.shape.requests, ask.shape.gpu, ask.shape.gpu_models, ask.mode, pool)
        with self._memo_lock:
            memo = self._memo.get(key)
            if memo is None:
                if len(self._memo) > 1024:
                    self._memo.clear()  # many distinct shapes: start over rather than grow
                memo = self._memo[key] = ShapeMemo(shape=ask.shape)
            memo.pool = ask.pool  # as configured now (a pool's definition may change)
            memo.mode = ask.mode
            return memo

    def catch_up(self) -> int:
        """Re-check, off the verbs' path, the nodes pods moved on since each shape's last call
        (extender/memo.py `catch_up`); the nodes re-checked."""
        with self._memo_lock:
            memos = list(self._memo.values())
        return catch_up(memos, self.cache, self.sharing.workload(), self.sharing.workload_generation)

    def refresh_workload(self) -> None:
        """The sweep's refresh of the target workload (extender/sharing.py). When it moved far
        enough to make every memoised fragmentation delta stale, they are measured again here,
        off the verbs' path, for the nodes each shape had: otherwise the next filter of each
        shape would measure its whole list (500 nodes: 20-30 ms, the p99 of a steady stream).
        Meanwhile filter keeps ranking by the previous deltas, and measures the nodes that
        moved against the new workload. The pass gives the GIL up between batches of nodes,
        so a call that comes meanwhile waits for a batch, not for the pass."""
        before, previous = self.sharing.workload_generation, self.sharing.workload()
        self._warming_from = previous
        try:
            self.sharing.refresh()
            if self.sharing.workload_generation != before:
                self._remeasure(self.sharing.workload_generation, previous)
        finally:
            self._warming_from = None

    def _remeasure(self, generation: int, previous: tuple[WorkloadClass, ...]) -> None:
        """Measure again, for the nodes each shape knows, what ranks it under the new target
        workload: fragmentation deltas, or for a GPU shape with no workload to measure against
        now (every pod left) the scores it falls back to. Those were not kept while deltas
        ranked it, and the next filters would otherwise score their whole lists (500 nodes: 8-9
        ms each, ten filters in a row at 5,000 nodes). Scores do not depend on the workload: a
        shape ranked by them before and after keeps them."""
        workload = self.sharing.workload()
        with self._memo_lock:
            memos = [m for m in self._memo.values() if (m.deltas or m.scores) and m.shape is not None]
        for memo in memos:
            assert memo.shape is not None
            deltas = memo.by_fragmentation(workload)
            if not deltas and (memo.shape.gpu.kind is GpuKind.NONE or not memo.by_fragmentation(previous)):
                continue  # not ranked (no GPUs, nothing to strand), or ranked by scores already
            with memo.lock:
                memo.sync(self.cache)
                names = [*memo.deltas, *filterfalse(memo.deltas.__contains__, memo.scores)]  # in the calls' order
                epoch, cursor = memo.epoch, memo.cursor
            fresh: dict[str, Any] = {}
            for start in range(0, len(names), REMEASURE_BATCH):  # no lock held: filter goes on meanwhile
                if start:
                    # A pure-Python pass holds the GIL, which another thread gets only at the
                    # next switch interval: a call arriving meanwhile would share it with the pass.
                    time.sleep(REMEASURE_PAUSE_S)
                for name in names[start : start + REMEASURE_BATCH]:
                    if (node := self.cache.node_model(name)) is not None:
                        fresh[name] = memo.delta(node, workload) if deltas else memo.score(node)
            with memo.lock:
                if self.sharing.workload_generation != generation:
                    return  # moved again: the next refresh measures again
                # Synced first, then the changes since the measurement read up to a point at or
                # past the memo's: a node touched in between is dropped from `fresh` here, and
                # one touched later is dropped from the memo by a later sync.
                memo.sync(self.cache)
                moved = self.cache.changes_since(epoch, cursor).nodes
                if moved is None:
                    continue  # the change log restarted: filter measures as it goes
                for name in moved:
                    fresh.pop(name, None)  # measured before the node moved
                if deltas:
                    memo.deltas = fresh
                    memo.workload_generation = generation
                else:
                    memo.scores = fresh  # scores do not depend on the workload: no generation

    # ------------------------------------------------------------------ bind

    def bind(self, args: dict[str, Any]) -> dict[str, Any]:
        self._require_sync()
        checked = wire.bind_args(args)  # the name and namespace go into an API path
        namespace, name, uid, node = checked.namespace, checked.name, checked.uid, checked.node
        pod = self._pod_by_uid(uid, namespace, name)
        if pod is None:
            return {"Error": f"pod {namespace}/{name} not found"}
        if pod.node:
            return {"Error": "" if pod.node == node else f"pod {pod.key} is already bound to {pod.node}"}
        landing = self.landings.node_of(uid) if self.landings is not None else ""
        if landing:  # answered before (a kube-scheduler that restarted asks again): it lands there
            return {"Error": "" if landing == node else f"pod {pod.key}: its bind to {landing} is still landing"}
        choice = self._take_choice(uid)
        try:
            return self._bind(pod, node, choice)
        finally:
            self._bind_ended(uid)

    def _bind(self, pod: PodInfo, node: str, choice: _Choice | None) -> dict[str, Any]:
        namespace, name, uid = pod.namespace, pod.name, pod.uid
        refusal = self.binder.fence() if self.binder.fence is not None else ""
        refusal = refusal or self._may_bind(pod, node)
        if refusal:
            self._give_back(uid, choice)
            self.metrics.outcomes.labels("bind", "refused").inc()
            log.warning("bind refused", pod=pod.key, node=node, reason=refusal)
            return {"Error": refusal}
        gate = self.gangs.permit(pod, node) if self.gangs is not None else None
        if gate:
            self._give_back(uid, choice)
            self.metrics.outcomes.labels("bind", "gang-wait-failed").inc()
            return {"Error": gate}
        devices = self._choose_devices(pod, node, gang=gate is not None)
        if isinstance(devices, str):
            self._give_back(uid, choice)
            self.metrics.outcomes.labels("bind", "queue-limit").inc()
            return {"Error": devices}
        if devices is None:
            self._give_back(uid, choice)  # chosen on another node than this bind names
            self.metrics.outcomes.labels("bind", "no-longer-fits").inc()
            return {"Error": f"pod {pod.key} no longer fits node {node}"}
        if choice is not None and choice.assumed.node != node:
            self.sharing.bind_failed(choice.assumed.node, choice.assumed.devices)  # the packer counted it there
        if gate is None and self._answer_early(pod, node, devices):
            self.metrics.outcomes.labels("bind", "answered-early").inc()
            return {"Error": ""}
        assumed = self.cache.assumed(uid)
        started = time.perf_counter()
        try:
            self.binder.bind(namespace, name, uid, node, devices)
        except Exception as e:  # ApiError, OSError, urllib3's MaxRetryError alike
            outcome = self._after_failed_bind(pod, node, e)
            if outcome == BOUND:  # committed after all: the answer was lost, not the Binding
                if gate is not None and self.gangs is not None:
                    self.gangs.bound(pod)
                log.info("bind answer lost, but the pod is bound", pod=pod.key, node=node)
                return {"Error": ""}
            # A single pod: forget what this bind assumed. So too for a gang member whose devices
            # its node's agent refused (an unhealthy or unknown GPU): it would be refused the same
            # devices at every retry; its next bind chooses again from what the node offers now.
            if outcome == NOT_BOUND and (gate is None or isinstance(e, AgentRefused)):
                self._unassume(uid, assumed)
            # A gang member keeps its reservation (kube-scheduler retries it onto the same node;
            # a release of its gang forgets it), and so does a bind whose outcome is unknown:
            # the API server may have committed it. The watch, a retry or the pod's deletion
            # settles the assumption; until then its devices stay counted.
            self.metrics.errors.labels("bind", "api").inc()
            log.warning("bind failed", pod=pod.key, node=node, error=str(e))
            return {"Error": str(e)}
        if gate is not None and self.gangs is not None:
            self.gangs.bound(pod)
        log.debug(
            "bound",
            pod=pod.key,
            node=node,
            devices=[d.index for d in devices],
            api_ms=round((time.perf_counter() - started) * 1000, 2),
        )
        return {"Error": ""}

    def _answer_early(self, pod: PodInfo, node: str, devices: tuple[DeviceAssignment, ...]) -> bool:
        """Whether this bind is answered now and its Binding landed in the background
        (extender/landing.py): with a journal, for a pod the watch has seen, unless its node's
        agent must admit its devices first (a refusal must reach kube-scheduler)."""
        if self.landings is None or self.cache.pod(pod.uid) is None:
            return False
        agents = self.binder.agents
        if devices and agents is not None and agents.endpoint_of(node):
            return False
        record = encode_devices(devices) if devices else ""
        return self.landings.begin(Landing(pod.uid, pod.namespace, pod.name, node, record))

    def land(self, landing: Landing) -> bool:
        """One try at the Binding of a bind answered early; True once it is settled: landed, or
        the watch shows the pod bound (where the watch says) or gone (its deletion forgot the
        devices). A failure is retried (`Landings`): kube-scheduler will not ask again."""
        pod = self.cache.pod(landing.uid)
        if pod is None or pod.node:
            return True
        devices = decode_devices(landing.record) or ()
        try:
            self.binder.bind(pod.namespace, pod.name, pod.uid, landing.node, devices)
        except Exception as e:  # ApiError, OSError, Fenced: tried again after a pause
            if self._after_failed_bind(pod, landing.node, e) == BOUND:
                return True
            self.metrics.errors.labels("bind", "landing").inc()
            log.warning("bind answered, Binding not landed yet", pod=pod.key, node=landing.node, error=str(e)[:512])
            return False
        log.debug("bound", pod=pod.key, node=landing.node, devices=[d.index for d in devices], early=True)
        return True

    def resume(self, landing: Landing) -> bool:
        """A bind a previous process answered early and did not see land: its devices counted
        again on its node (as that process counted them) unless the pod is bound or gone;
        whether it is still to land. Raises DeviceRecordError for a record that does not read."""
        pod = self.cache.pod(landing.uid)
        if pod is None or pod.node:
            return False
        self.cache.assume(landing.uid, landing.node, decode_devices(landing.record) or ())
        return True

    def _after_failed_bind(self, pod: PodInfo, node: str, error: Exception) -> str:
        """Whether a bind that raised is NOT_BOUND (the API server refused it), BOUND (it was
        committed and only the answer was lost) or UNKNOWN (the server cannot tell us now)."""
        if isinstance(error, Fenced | AgentRefused) or (
            isinstance(error, ApiError) and 400 <= error.status < 500 and error.status != 429
        ):
            return NOT_BOUND
        try:
            current = self.binder.get_pod(pod.namespace, pod.name)
        except Exception:
            return UNKNOWN
        if current is None or (current.get("metadata") or {}).get("uid") != pod.uid:
            return NOT_BOUND  # gone (its deletion forgets it) or another pod of that name
        bound_to = (current.get("spec") or {}).get("nodeName") or ""
        if bound_to == node:
            return BOUND
        return NOT_BOUND if not bound_to else UNKNOWN  # bound elsewhere: the watch will say where

    def _may_bind(self, pod: PodInfo, node: str) -> str:
        """Why `pod` may not go to `node` ("" if it may), whoever asks: bind re-checks what
        filter decided (a caller could name any node), the node rules kube-scheduler's own
        filters apply included (cordon, selector, required affinity, taints)."""
        if pod.error:
            return f"{INVALID_REQUEST}: {pod.error}"
        # The whole model, though only its rules are read here: built now, off kube-scheduler's
        # serial cycle, it is the one the next filter's check of this node finds (the watch's
        # confirmation of this bind leaves the node's version as it is).
        model = self.cache.node_model(node)
        if model is None:
            return f"{NOT_IN_CACHE}: {node}"
        placement = orjson.loads(pod.placement) if pod.placement else {}
        if model.unschedulable and not matches(node, model.labels, [CORDON], placement):
            return f"node {node} is cordoned"  # unless the pod tolerates it, as NodeUnschedulable says
        if not matches(node, model.labels, taints(model.taints), placement):
            return f"node {node} does not match the pod's node selector, required affinity or tolerations"
        ask = self._ask(pod)
        if ask.error:
            return ask.error
        if ask.pool is not None and not ask.pool.contains(node, model.labels):
            return f"{NOT_IN_POOL} {ask.pool.name}"
        return ""

    def _choose_devices(self, pod: PodInfo, node: str, *, gang: bool) -> tuple[DeviceAssignment, ...] | str | None:
        """Pick devices and count them on the node at once (the cache's atomic
        choose-and-assume; no lock is held across API calls). A single pod's queue limit is
        checked in the same step (a string: why not): kube-scheduler filters the next pod
        before this one's bind arrives, so filter's check alone could let two pods past a limit."""
        if gang or self.queues is None or not self.queues.active:
            return self._assume_devices(pod, node)
        with self.queues.bind_lock:
            # Counted already (its filter's choice, or a retried bind): its queue counts it, and
            # checking it again would count it twice.
            if self.cache.assumed(pod.uid) is None:
                refusal = self.queues.bind_check(pod)
                if refusal:
                    return refusal
            return self._assume_devices(pod, node)

    def _assume_devices(self, pod: PodInfo, node: str) -> tuple[DeviceAssignment, ...] | None:
        ask = self._ask(pod)
        if pod.demand.kind is GpuKind.NONE:
            return self.cache.assume_chosen(pod.uid, node, lambda model: ())
        spread = ask.mode is PlacementMode.LOW_LOAD_FIRST
        return self.cache.assume_chosen(
            pod.uid, node, lambda model: self.sharing.choose(model, ask.shape, spread=spread)
        )

    def _pod_by_uid(self, uid: str, namespace: str, name: str) -> PodInfo | None:
        pod = self.cache.pod(uid)
        if pod is not None:
            return pod
        obj = self.binder.get_pod(namespace, name)  # the watch may lag the scheduler
        if obj is None or (obj.get("metadata") or {}).get("uid") != uid:
            return None
        return pod_info(obj)

    # ------------------------------------------------------------------ preempt

    def _splits_a_gang(self, node: str, meta: Any) -> bool:
        assert self.gangs is not None
        uids = {str(v.get("UID", "")) for v in (meta or {}).get("Pods") or []}
        why = self.gangs.splits_a_gang(uids)
        if why:
            log.info("preemption candidate dropped", node=node, reason=why)
            self.metrics.outcomes.labels("preempt", "gang-whole").inc()
        return bool(why)

    def preempt(self, args: dict[str, Any]) -> dict[str, Any]:
        """Keep the candidate nodes where evicting the proposed victims frees devices that fit
        the preemptor; drop the others (kube-scheduler then skips them), and drop a node whose
        victims take part of a gang that is disrupted only whole. A gang member gets
        no candidates at all when no eviction can place its gang (no quorum, no definition,
        a plan already, or no fit even with every lower-priority pod gone)."""
        pod, victims = self._pod(args), wire.victims(args)
        single = self.gangs is None or not self.gangs.is_member(pod)
        if self.queues is not None and single and self.queues.check_pod(pod):
            # Over its queue's limit or fair share: evicting others' pods changes neither.
            self.metrics.outcomes.labels("preempt", "queue").inc()
            return {"NodeNameToMetaVictims": {}}
        if self.gangs is not None and not single and self.gangs.preemptor is not None:
            # Phalanx preempts for gangs itself (whole victim gangs, chosen by the solver, when
            # the gang is planned); kube-scheduler's per-pod victims would break that.
            self.metrics.outcomes.labels("preempt", "gang-own").inc()
            self.gangs.preempt_for(pod)
            return {"NodeNameToMetaVictims": {}}
        if self.gangs is not None and self.gangs.preemption_helps(pod) is False:
            self.metrics.outcomes.labels("preempt", "gang-unhelped").inc()
            return {"NodeNameToMetaVictims": {}}
        if self.gangs is not None:
            held = self.gangs.held_against(pod)  # a starving gang's nodes: no preemption onto them
            victims = {
                node: meta for node, meta in victims.items() if node not in held and not self._splits_a_gang(node, meta)
            }
        if pod.demand.kind is GpuKind.NONE or pod.error:
            return {"NodeNameToMetaVictims": victims}
        shape = self._ask(pod).shape
        kept = {}
        for node, meta in victims.items():
            uids = {str(v.get("UID", "")) for v in (meta or {}).get("Pods") or []}
            model = self.cache.node_model_without(node, uids)
            if model is not None and fits(model, shape):
                kept[node] = meta
        return {"NodeNameToMetaVictims": kept}
