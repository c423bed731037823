"""The extender verbs: filter, prioritize, bind, preempt (kube-scheduler extender v1).

Handlers stay short: parse, look up, call, map. Pods that request nothing Phalanx manages pass
through filter and prioritize untouched. GPU pods are checked node by node against the
cache's device accounting; each node's answer is memoised per pod shape and node version, so
a stream of identical pods costs a dictionary lookup per node. Gang members are answered by
the gang manager. Every answer is a typed `Verdict` (extender/outcomes.py) mapped to one reply
field: `FailedNodes` where a change (or preemption) may help, `FailedAndUnresolvableNodes`
where nothing can; internal faults go to `Error`. Sharing state (target workload, packer)
lives in extender/sharing.py.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import structlog

from extender.binder import Binder
from extender.cache import Cache
from extender.config import PhalanxConfig
from extender.gangs.manager import GangManager
from extender.metrics import Metrics
from extender.objects import PodInfo, pod_info
from extender.outcomes import Fit, Verdict
from extender.pools import NOT_IN_POOL, UNKNOWN_POOL, Pool
from extender.sharing import Sharing
from solver import (
    DeviceAssignment,
    GpuKind,
    PlacementMode,
    PodShape,
    WorkloadClass,
    fits,
    node_score,
    placement_delta,
    unfit_reason,
)

log = structlog.get_logger("phalanx.verbs")

INVALID_REQUEST = "invalid GPU request"
NOT_IN_CACHE = "node unknown to phalanx"


class BadRequest(ValueError):
    """A malformed extender request: answered with HTTP 400 and this message."""


@dataclass
class _Memo:
    """Per pod shape: which nodes were checked, why the failing ones fail, and scores. Synced
    from the cache's change log, so each call re-checks only nodes touched since the last."""

    epoch: int = -1
    cursor: int = 0
    checked: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)
    scores: dict[str, int] = field(default_factory=dict)
    deltas: dict[str, float] = field(default_factory=dict)  # fragmentation growth per node
    workload_generation: int = -1  # the target workload `deltas` were measured against
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sync(self, cache: Cache) -> None:
        changes = cache.changes_since(self.epoch, self.cursor)
        changed, self.epoch, self.cursor = changes.nodes, changes.epoch, changes.cursor
        if changed is None:
            self.checked.clear()
            self.failed.clear()
            self.scores.clear()
            self.deltas.clear()
            return
        for name in changed:
            self.checked.discard(name)
            self.failed.pop(name, None)
            self.scores.pop(name, None)
            self.deltas.pop(name, None)


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
    ) -> None:
        self.cache = cache
        self.gangs = gangs
        self.binder = binder
        self.metrics = metrics
        self.sharing = sharing if sharing is not None else Sharing(cache)
        self.config = config
        self._memo: dict[tuple[Any, ...], _Memo] = {}
        self._memo_lock = threading.Lock()
        self._parsed: dict[tuple[str, str], PodInfo] = {}  # (uid, resourceVersion) -> parsed pod
        self._fragments: dict[tuple[str, int], orjson.Fragment] = {}

    @property
    def config(self) -> PhalanxConfig:
        return self._config

    @config.setter
    def config(self, config: PhalanxConfig) -> None:
        self._config = config
        self.sharing.enabled = config.gpu.fragmentation_scoring

    # ------------------------------------------------------------------ filter

    def _pod(self, args: dict[str, Any]) -> PodInfo:
        """The request's pod, parsed once per (uid, resourceVersion): filter and prioritize of
        one scheduling cycle carry the same pod."""
        obj = args.get("Pod")
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
            raise BadRequest("missing or malformed field Pod")
        meta = obj["metadata"]
        key = (str(meta.get("uid", "")), str(meta.get("resourceVersion", "")))
        pod = self._parsed.get(key)
        if pod is None:
            if len(self._parsed) > 4096:
                self._parsed.clear()
            pod = self._parsed[key] = pod_info(obj)
        return pod

    def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        pod, names = self._pod(args), _node_names(args)
        return self._filter_reply(self._verdict(pod, names), names, pod)

    def _verdict(self, pod: PodInfo, names: list[str]) -> Verdict:
        if pod.error:
            return Verdict.unresolvable(f"{INVALID_REQUEST}: {pod.error}")
        if self.gangs is not None:
            answer = self.gangs.filter(pod, names)
            if answer is not None:
                return answer
        ask = self._ask(pod)
        if ask.error:
            return Verdict.unresolvable(ask.error)
        if pod.demand.kind is GpuKind.NONE and ask.pool is None:
            return Verdict(Fit.PASSTHROUGH, names)
        memo = self._memo_for(ask)
        with memo.lock:
            memo.sync(self.cache)
            for name in names:
                if name not in memo.checked:
                    self._check(memo, name, ask)
            failing = memo.failed
            passed = [n for n in names if n not in failing]
            failed = {n: failing[n] for n in names if n in failing} if len(passed) < len(names) else {}
        return Verdict(Fit.FITS if passed else Fit.UNSCHEDULABLE, passed, failed=failed)

    def _ask(self, pod: PodInfo) -> _Ask:
        """The pod's shape as the solver sees it, with its GPU pool and placement mode."""
        hardware = self.cache.hardware
        mode = PlacementMode(self.config.gpu.placement_mode)
        if not pod.pool:
            return _Ask(PodShape(pod.requests, pod.demand), None, mode)
        pool = hardware.by_name.get(pod.pool)
        if pool is None:
            return _Ask(PodShape(pod.requests, pod.demand), None, mode, f"{UNKNOWN_POOL}: {pod.pool!r}")
        models = self.cache.pool_models(pool)
        return _Ask(PodShape(pod.requests, pod.demand, gpu_models=models), pool, pool.mode)

    def _check(self, memo: _Memo, name: str, ask: _Ask) -> None:
        node = self.cache.node_model(name)
        memo.checked.add(name)
        if node is None:
            memo.failed[name] = NOT_IN_CACHE
        elif ask.pool is not None and not ask.pool.contains(name, node.labels):
            memo.failed[name] = f"{NOT_IN_POOL} {ask.pool.name}"
        elif not fits(node, ask.shape):
            memo.failed[name] = unfit_reason(node, ask.shape)

    def _filter_reply(self, verdict: Verdict, names: list[str], pod: PodInfo) -> dict[str, Any]:
        """The verdict as kube-scheduler reads it: failing nodes under the field that says
        whether preemption may help."""
        passed = set(verdict.passed)
        failed = verdict.failed or {n: verdict.message for n in names if n not in passed}
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
        fragmentation measure (`_prioritize_cpu_only`)."""
        pod, names = self._pod(args), _node_names(args)
        if pod.error:
            return []
        if pod.demand.kind is GpuKind.NONE:
            return self._prioritize_cpu_only(pod, names)
        ask = self._ask(pod)
        if ask.error:
            return []
        memo = self._memo_for(ask)
        shape, mode = ask.shape, ask.mode
        workload = self.sharing.workload()
        if workload and mode is PlacementMode.COMPACT_FIRST and shape.gpu.kind in (GpuKind.SHARE, GpuKind.WHOLE):
            return self._prioritize_by_fragmentation(memo, names, shape, workload)
        with memo.lock:
            memo.sync(self.cache)
            known = memo.scores
            for name in names:
                if name not in known:
                    node = self.cache.node_model(name)
                    known[name] = node_score(node, shape, mode) if node is not None else 0
            scores = [known[n] for n in names]
        low = min(scores, default=0)
        return [self._host_score(n, s - low) for n, s in zip(names, scores, strict=True) if s > low]

    def _prioritize_cpu_only(self, pod: PodInfo, names: list[str]) -> list[Any]:
        """A pod without GPUs: no opinion, except where the fragmentation measure tells nodes
        apart. A CPU-heavy pod on a GPU node can strand GPUs whose pods need that CPU (Phalanx's
        measure counts it), and it should not eat CPU reserved for awaited share pods. Every
        node of least growth gets 10, with no tie-break by name: kube-scheduler's own scores
        choose among them, as they do for all pods on clusters without GPUs."""
        workload = self.sharing.workload()
        if not any(c.uses_gpu for c in workload):  # nothing to strand: not worth a pass over the nodes
            return []
        ask = self._ask(pod)
        if ask.error or ask.mode is not PlacementMode.COMPACT_FIRST:
            return []
        return self._prioritize_by_fragmentation(self._memo_for(ask), names, ask.shape, workload, by_name=False)

    def _prioritize_by_fragmentation(
        self,
        memo: _Memo,
        names: list[str],
        shape: PodShape,
        workload: tuple[WorkloadClass, ...],
        *,
        by_name: bool = True,
    ) -> list[Any]:
        """FGD-style: the node where the target workload's fragmentation grows least scores 10,
        ties broken by node name (a fixed order packs; kube-scheduler's random tie-break among
        equal scores would scatter pods, which costs several points of allocation); the others
        scale down with their growth. With a packing plan, nodes rank by tier first
        (`Sharing.tiers`): the best tier's nodes take 5..10, the rest 0..4. Without `by_name`,
        every node equal to the best gets 10, and no node stands out: no scores at all."""
        with memo.lock:
            memo.sync(self.cache)
            if memo.workload_generation != self.sharing.workload_generation:
                memo.deltas.clear()
                memo.workload_generation = self.sharing.workload_generation
            known = memo.deltas
            for name in names:
                if name not in known:
                    node = self.cache.node_model(name)
                    verdict = placement_delta(node, shape, workload) if node is not None else None
                    known[name] = verdict.delta if verdict is not None and verdict.fits else math.inf
            deltas = dict(zip(names, map(known.__getitem__, names), strict=True))
        if math.inf in deltas.values():  # keep the nodes it fits
            deltas = {n: d for n, d in deltas.items() if d != math.inf}
        if not deltas:
            return []
        tiers = self.sharing.tiers([m for n in deltas if (m := self.cache.node_model(n)) is not None], shape)
        tier = tiers.get
        if tiers:
            lead = min(deltas, key=lambda n: (-tier(n, 0), deltas[n], n))  # O(n): no sort
        else:  # the common case (no packing preference here), in C-speed passes
            least = min(deltas.values())
            lead = min([n for n, d in deltas.items() if d == least])
        top, first = tier(lead, 0), deltas[lead]
        if by_name:
            leaders = [lead]
        else:
            leaders = [n for n, d in deltas.items() if d == first and tier(n, 0) == top]
            if len(leaders) == len(deltas):
                return []
        if tiers:
            upper = {n: d for n, d in deltas.items() if tier(n, 0) == top}
            lower = {n: d for n, d in deltas.items() if tier(n, 0) != top}
        else:
            upper, lower = deltas, {}
        scores: dict[str, int] = {}
        for (low, high), members in (((5, 9), upper), ((0, 4), lower)):
            if members:
                band = _band(set(members.values()), low, high)  # few distinct deltas: score each once
                scores.update({n: band[d] for n, d in members.items()})
        for n in leaders:
            scores[n] = 10
        floor = min(scores.values())  # the same shift as the other path: the reply stays small
        return [self._host_score(n, v - floor) for n, v in scores.items() if v > floor]

    def _host_score(self, host: str, score: int) -> orjson.Fragment:
        """One pre-serialized {"Host", "Score"} entry; the same pairs recur on every call."""
        key = (host, score)
        fragment = self._fragments.get(key)
        if fragment is None:
            if len(self._fragments) > 200_000:
                self._fragments.clear()
            fragment = self._fragments[key] = orjson.Fragment(orjson.dumps({"Host": host, "Score": score}))
        return fragment

    def _memo_for(self, ask: _Ask) -> _Memo:
        pool = ask.pool.name if ask.pool is not None else ""
        key = (ask.shape.requests, ask.shape.gpu, ask.shape.gpu_models, ask.mode, pool)
        with self._memo_lock:
            memo = self._memo.get(key)
            if memo is None:
                if len(self._memo) > 1024:
                    self._memo.clear()  # many distinct shapes: start over rather than grow
                memo = self._memo[key] = _Memo()
            return memo

    # ------------------------------------------------------------------ bind

    def bind(self, args: dict[str, Any]) -> dict[str, Any]:
        try:
            namespace, name = str(args["PodNamespace"]), str(args["PodName"])
            uid, node = str(args["PodUID"]), str(args["Node"])
        except KeyError as e:
            raise BadRequest(f"bind: missing field {e.args[0]}") from None
        pod = self._pod_by_uid(uid, namespace, name)
        if pod is None:
            return {"Error": f"pod {namespace}/{name} not found"}
        if pod.node:
            return {"Error": "" if pod.node == node else f"pod {pod.key} is already bound to {pod.node}"}
        gate = self.gangs.permit(pod, node) if self.gangs is not None else None
        if gate:
            self.metrics.outcomes.labels("bind", "gang-wait-failed").inc()
            return {"Error": gate}
        devices = self._choose_devices(pod, node)
        if devices is None:
            self.metrics.outcomes.labels("bind", "no-longer-fits").inc()
            return {"Error": f"pod {pod.key} no longer fits node {node}"}
        started = time.perf_counter()
        try:
            self.binder.bind(namespace, name, uid, node, devices)
        except Exception as e:  # ApiError, OSError, urllib3's MaxRetryError: never keep it assumed
            self.cache.forget(uid)
            self.sharing.bind_failed(node, devices)  # the packer counted this pod in
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

    def _choose_devices(self, pod: PodInfo, node: str) -> tuple[DeviceAssignment, ...] | None:
        """Pick devices and count them on the node at once (the cache's atomic
        choose-and-assume; no lock is held across API calls)."""
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

    def preempt(self, args: dict[str, Any]) -> dict[str, Any]:
        """Keep the candidate nodes where evicting the proposed victims frees devices that fit
        the preemptor; drop the others (kube-scheduler then skips them). A gang member gets
        no candidates at all when no eviction can place its gang (no quorum, no definition,
        a plan already, or no fit even with every lower-priority pod gone)."""
        pod = self._pod(args)
        victims = args.get("NodeNameToMetaVictims") or {}
        if not isinstance(victims, dict):
            raise BadRequest("preempt: NodeNameToMetaVictims must be an object")
        if self.gangs is not None and self.gangs.preemption_helps(pod) is False:
            self.metrics.outcomes.labels("preempt", "gang-unhelped").inc()
            return {"NodeNameToMetaVictims": {}}
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


def _node_names(args: dict[str, Any]) -> list[str]:
    names = args.get("NodeNames")
    if names is None:
        nodes = args.get("Nodes") or {}
        items = nodes.get("items") if isinstance(nodes, dict) else None
        if items is None:
            raise BadRequest("missing field NodeNames (is nodeCacheCapable set?)")
        names = [(n.get("metadata") or {}).get("name", "") for n in items]
    if not isinstance(names, list) or not set(map(type, names)) <= {str}:
        raise BadRequest("NodeNames must be a list of strings")
    return names


def _band(values: set[float], low: int, high: int) -> dict[float, int]:
    """Scores low..high for fragmentation deltas, the least growth highest, linear between."""
    best, worst = min(values), max(values)
    span = worst - best
    if span <= 0:
        return {d: high for d in values}
    return {d: low + round((high - low) * (1 - (d - best) / span)) for d in values}
