"""The extender verbs: filter, prioritize, bind, preempt (kube-scheduler extender v1).

Handlers stay short: parse, look up, call, map. Pods that request nothing Phalanx manages pass
through filter and prioritize untouched. GPU pods are checked node by node against the
cache's device accounting; each node's answer is memoised per pod shape and node version, so
a stream of identical pods costs a dictionary lookup per node. Expected rejections go to
`FailedNodes` (or `FailedAndUnresolvableNodes` for an invalid request); internal faults go to
`Error`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import structlog

from extender.binder import Binder
from extender.cache import Cache
from extender.config import PhalanxConfig
from extender.kube import ApiError
from extender.metrics import Metrics
from extender.objects import PodInfo, pod_info
from solver import single
from solver.capacity import NodeState
from solver.model import GpuKind, PodShape
from solver.params import PlacementMode

log = structlog.get_logger("phalanx.verbs")

INVALID_REQUEST = "invalid GPU request"
NOT_IN_CACHE = "node unknown to phalanx"


class BadRequest(ValueError):
    """A malformed extender request: answered with HTTP 400 and this message."""


@dataclass
class _Memo:
    """Per pod shape: node -> (node version, fits, reason or score)."""

    fits: dict[str, tuple[int, bool, str]] = field(default_factory=dict)
    scores: dict[str, tuple[int, int]] = field(default_factory=dict)


class Verbs:
    def __init__(self, cache: Cache, binder: Binder, config: PhalanxConfig, metrics: Metrics) -> None:
        self.cache = cache
        self.binder = binder
        self.config = config
        self.metrics = metrics
        self._memo: dict[tuple[Any, ...], _Memo] = {}
        self._memo_lock = threading.Lock()
        self._parsed: dict[tuple[str, str], PodInfo] = {}  # (uid, resourceVersion) -> parsed pod

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
        if pod.error:
            failed = {n: f"{INVALID_REQUEST}: {pod.error}" for n in names}
            return self._filter_reply([], {}, failed, pod, "invalid")
        if pod.demand.kind is GpuKind.NONE:
            return self._filter_reply(names, {}, {}, pod, "passthrough")
        shape = PodShape(pod.requests, pod.demand)
        memo = self._memo_for(shape)
        passed, failed = [], {}
        for name in names:
            ok, reason = self._fits(memo, name, shape)
            if ok:
                passed.append(name)
            else:
                failed[name] = reason
        return self._filter_reply(passed, failed, {}, pod, "fits" if passed else "unschedulable")

    def _fits(self, memo: _Memo, name: str, shape: PodShape) -> tuple[bool, str]:
        version = self.cache.version.get(name, -1)
        hit = memo.fits.get(name)
        if hit is not None and hit[0] == version:
            return hit[1], hit[2]
        node = self.cache.node_model(name)
        if node is None:
            result = (False, NOT_IN_CACHE)
        elif single.fits(node, shape):
            result = (True, "")
        else:
            result = (False, single.reason(node, shape))
        memo.fits[name] = (version, *result)
        return result

    def _filter_reply(
        self, passed: list[str], failed: dict[str, str], unresolvable: dict[str, str], pod: PodInfo, outcome: str
    ) -> dict[str, Any]:
        self.metrics.outcomes.labels("filter", outcome).inc()
        log.debug(
            "filter",
            pod=pod.key,
            nodes=len(passed) + len(failed) + len(unresolvable),
            passed=len(passed),
            outcome=outcome,
            generation=self.cache.generation,
        )
        return {
            "Nodes": None,
            "NodeNames": passed,
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable,
            "Error": "",
        }

    # ------------------------------------------------------------------ prioritize

    def prioritize(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        """Scores for GPU pods only, shifted so the lowest is 0 and zeros left out: the
        scheduler adds nothing for a missing host, and a shift common to all hosts keeps their
        order, so the reply stays small when most nodes look alike."""
        pod, names = self._pod(args), _node_names(args)
        if pod.error or pod.demand.kind is GpuKind.NONE:
            return []
        shape = PodShape(pod.requests, pod.demand)
        memo = self._memo_for(shape)
        mode = PlacementMode(self.config.gpu.placement_mode)
        scores = []
        for name in names:
            version = self.cache.version.get(name, -1)
            hit = memo.scores.get(name)
            if hit is None or hit[0] != version:
                node = self.cache.node_model(name)
                hit = (version, single.score(node, shape, mode) if node is not None else 0)
                memo.scores[name] = hit
            scores.append(hit[1])
        low = min(scores, default=0)
        return [{"Host": n, "Score": s - low} for n, s in zip(names, scores, strict=True) if s > low]

    def _memo_for(self, shape: PodShape) -> _Memo:
        key = (shape.requests, shape.gpu)
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
        devices = self._choose_devices(pod, node)
        if devices is None:
            self.metrics.outcomes.labels("bind", "no-longer-fits").inc()
            return {"Error": f"pod {pod.key} no longer fits node {node}"}
        started = time.perf_counter()
        try:
            self.binder.bind(namespace, name, uid, node, devices)
        except (ApiError, OSError) as e:
            self.cache.forget(uid)
            self.metrics.errors.labels("bind", "api").inc()
            log.warning("bind failed", pod=pod.key, node=node, error=str(e))
            return {"Error": str(e)}
        log.info(
            "bound",
            pod=pod.key,
            node=node,
            devices=[d.index for d in devices],
            api_ms=round((time.perf_counter() - started) * 1000, 2),
        )
        return {"Error": ""}

    def _choose_devices(self, pod: PodInfo, node: str) -> tuple[Any, ...] | None:
        """Pick devices and count them on the node at once (no per-node lock held across API
        calls: the cache lock covers only this choice)."""
        with self.cache.lock:
            assumed = self.cache.assumed_usage(pod.uid)
            if assumed is not None and assumed[0] == node:
                return assumed[1]  # a retried bind keeps its devices
            model = self.cache.node_model(node)
            if model is None:
                return None
            shape = PodShape(pod.requests, pod.demand)
            if pod.demand.kind is GpuKind.NONE:
                devices: tuple[Any, ...] | None = ()
            else:
                spread = self.config.gpu.placement_mode == PlacementMode.LOW_LOAD_FIRST.value
                devices = NodeState(model).take(shape, spread=spread)
            if devices is not None:
                self.cache.assume(pod.uid, node, devices)
            return devices

    def _pod_by_uid(self, uid: str, namespace: str, name: str) -> PodInfo | None:
        with self.cache.lock:
            pod = self.cache.pods.get(uid)
        if pod is not None:
            return pod
        obj = self.binder.get_pod(namespace, name)  # the watch may lag the scheduler
        if obj is None or (obj.get("metadata") or {}).get("uid") != uid:
            return None
        return pod_info(obj)

    # ------------------------------------------------------------------ preempt

    def preempt(self, args: dict[str, Any]) -> dict[str, Any]:
        """Keep the candidate nodes where evicting the proposed victims frees devices that fit
        the preemptor; drop the others (kube-scheduler then skips them)."""
        pod = self._pod(args)
        victims = args.get("NodeNameToMetaVictims") or {}
        if not isinstance(victims, dict):
            raise BadRequest("preempt: NodeNameToMetaVictims must be an object")
        if pod.demand.kind is GpuKind.NONE or pod.error:
            return {"NodeNameToMetaVictims": victims}
        shape = PodShape(pod.requests, pod.demand)
        kept = {}
        for node, meta in victims.items():
            uids = {str(v.get("UID", "")) for v in (meta or {}).get("Pods") or []}
            model = self.cache.node_model_without(node, uids)
            if model is not None and single.fits(model, shape):
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
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise BadRequest("NodeNames must be a list of strings")
    return names
