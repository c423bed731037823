"""Quotas, nodes and monitoring: `/api/v1/namespaces/{ns}/resourcequotas`, `/api/v1/nodes/{name}`
(cordon, drain, eviction notices) and `/api/v1/metrics/...`.

A quota is a Phalanx Queue named like it (hard: its limit, soft: its deserved share); creating
one also labels the namespace `phalanx.io/queue=<name>`, so the namespace's pods use it.
A drain cordons the node and evicts what runs there through the Eviction API with the caller's
token (budgets hold), gang by gang: a gang member on the node takes its whole gang with it
(`EvictGang`), or the drain leaves that gang and reports it waiting (`Wait`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import structlog

from extender.api import convert, models
from extender.api.context import Context, call, merge_patch
from extender.api.core import ApiError, Slotted, dry_run, int_param, ok, read_body
from extender.api.monitor import EvictionLog, Latencies, UsageHistory, percentile, period_seconds, rfc3339
from extender.auth import Access
from extender.kube import Kube
from extender.objects import PodInfo
from extender.queues import NAMESPACE_LABEL, view_json
from extender.server import Reply, Request

log = structlog.get_logger("phalanx.api")

JSON = dict[str, Any]
QUEUES = "/apis/phalanx.io/v1alpha1/queues"
DAEMONSET = "DaemonSet"
REPORT_S = 1.0  # how long a cluster or queue report serves
REQUEUE_TRIES = 5  # a job whose pods the API server keeps refusing is given up (and reported)


def _pct(used: int, limit: int) -> str:
    return f"{round(100 * used / limit)}%" if limit else "-"


class Quotas:
    def __init__(self, ctx: Context, usage: UsageHistory) -> None:
        self.ctx = ctx
        self.usage = usage

    def _view(self, name: str, obj: JSON, ns: str) -> JSON:
        spec = obj.get("spec") or {}
        views = {v.name: v for v in self.ctx.queues.views()}
        view = views.get(name)
        shown = view_json(view) if view is not None else {}
        used = {convert.QUEUE_NAMES.get(k, k): v for k, v in (shown.get("allocated") or {}).items()}
        hard = {convert.QUEUE_NAMES.get(k, k): str(v) for k, v in (spec.get("limit") or {}).items()}
        soft = {convert.QUEUE_NAMES.get(k, k): str(v) for k, v in (spec.get("deserved") or {}).items()}
        utilization = {}
        if view is not None:
            for k, limit in view.spec.limit.items():
                utilization[convert.QUEUE_NAMES.get(k, k)] = _pct(view.allocated.get(k, 0), limit)
        meta = obj.get("metadata") or {}
        return {
            "apiVersion": convert.API_VERSION,
            "kind": "ResourceQuota",
            "metadata": {
                "name": name,
                "namespace": ns,
                "resourceVersion": meta.get("resourceVersion"),
                "uid": meta.get("uid"),
                "creationTimestamp": meta.get("creationTimestamp"),
            },
            "spec": {"hard": hard, "soft": soft, **({"parent": spec["parent"]} if spec.get("parent") else {})},
            "status": {
                "hard": hard,
                "used": used,
                "utilization": utilization,
                "pendingPods": shown.get("pendingPods", 0),
                "pendingGangs": shown.get("pendingGangs", 0),
                "problems": shown.get("problems", []),
            },
        }

    def create(self, req: Request, ns: str) -> Reply:
        body = read_body(models.Quota, req.body, f"quota in {ns}")
        _known_resources(body.metadata.name, body.spec.hard, body.spec.soft)
        dry = dry_run(req.param("dryRun"))
        self.ctx.authorize(req, Access("create", "queues", body.metadata.name))
        kube = self.ctx.as_caller(req)
        queue = convert.queue_of_quota(body)
        queue["metadata"]["labels"]["phalanx.io/namespace"] = ns
        query = {"dryRun": "All"} if dry else None
        r = call(kube, "POST", QUEUES, f"quota {body.metadata.name}", body=queue, query=query)
        label = {"metadata": {"labels": {NAMESPACE_LABEL: body.metadata.name}}}
        try:
            merge_patch(kube, f"/api/v1/namespaces/{ns}", f"namespace {ns}", label, dry=dry)
        except ApiError:
            if not dry:  # no half-made quota
                call(kube, "DELETE", f"{QUEUES}/{body.metadata.name}", f"quota {body.metadata.name}")
            raise
        return ok(200 if dry else 201, self._view(body.metadata.name, r.body, ns))

    def get(self, req: Request, ns: str, name: str) -> Reply:
        self.ctx.authorize(req, Access("get", "queues", name))
        obj = self._owned(req, name, ns)
        return ok(200, self._view(name, obj, ns))

    def status(self, req: Request, ns: str, name: str) -> Reply:
        self.ctx.authorize(req, Access("get", "queues", name))
        obj = self._owned(req, name, ns)
        out = self._view(name, obj, ns)
        trend = {}
        now = time.time()
        held = self.usage.held(self.ctx.pods(ns)).get(ns, {})
        for k, past in self.usage.trend(ns, 24 * 3600, now).items():
            current = held.get(k, 0.0)
            if past > 0:
                trend["nvidia.com/gpu" if k == "gpu" else k] = f"{100 * (current - past) / past:+.0f}% over 24h"
        out["status"]["trend"] = trend
        return ok(200, out)

    def patch(self, req: Request, ns: str, name: str) -> Reply:
        body = read_body(models.QuotaPatch, req.body, f"patch of quota {name}")
        _known_resources(name, body.spec.hard, body.spec.soft)
        dry = dry_run(req.param("dryRun"))
        self.ctx.authorize(req, Access("patch", "queues", name))
        self._owned(req, name, ns)
        spec: JSON = {}
        for part, amounts in (("limit", body.spec.hard), ("deserved", body.spec.soft)):
            if amounts:
                spec[part] = {
                    convert.QUEUE_RESOURCES[k]: (str(v) if v is not None else None) for k, v in amounts.items()
                }
        if body.spec.weight is not None:
            spec["weight"] = body.spec.weight
        patch: JSON = {"spec": spec}
        if body.metadata.resourceVersion:
            patch["metadata"] = {"resourceVersion": body.metadata.resourceVersion}  # 409 when stale
        r = merge_patch(self.ctx.as_caller(req), f"{QUEUES}/{name}", f"quota {name}", patch, dry=dry)
        return ok(200, self._view(name, r.body, ns))

    def _owned(self, req: Request, name: str, ns: str) -> JSON:
        """The Queue behind the namespace's quota, read with the caller's token (its
        resourceVersion is what a patch's optimistic concurrency compares)."""
        obj = self._queue_object_or_none(req, name)
        labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
        if obj is None or labels.get("phalanx.io/namespace") != ns:
            raise ApiError(404, f'resourcequotas "{name}" not found in namespace {ns!r}', details={"name": name})
        return obj

    def _queue_object_or_none(self, req: Request, name: str) -> JSON | None:
        try:
            r = call(self.ctx.as_caller(req), "GET", f"{QUEUES}/{name}", f"quota {name}")
            return r.body if isinstance(r.body, dict) else None
        except ApiError as e:
            if e.code == 404:
                return None
            raise


@dataclass
class DrainState:
    node: str
    reason: str
    grace_s: int | None
    policy: str
    started: float
    deadline: float
    evicted: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)  # pod -> last refusal
    waiting_gangs: set[str] = field(default_factory=set)
    # API jobs whose gang was evicted: "ns/name" -> (the uids to see gone, the pods as they were)
    requeue: dict[str, tuple[set[str], list[JSON]]] = field(default_factory=dict)
    requeued: dict[str, list[str]] = field(default_factory=dict)  # "ns/name" -> the pods made again
    requeue_tries: dict[str, int] = field(default_factory=dict)
    done: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def json(self, remaining: list[PodInfo], waiting: int) -> JSON:
        """`waiting`: how many of `remaining` are members of gangs the drain leaves (`Wait`)."""
        with self.lock:
            return self._json(remaining, waiting)

    def _json(self, remaining: list[PodInfo], waiting: int) -> JSON:
        pending = len(remaining)
        if not pending and not self.requeue:
            status = "Drained"
        elif time.monotonic() > self.deadline:
            status = "TimedOut"
        elif waiting == pending:
            status = "WaitingForGangs"
        else:
            status = "Draining"
        return {
            "node": self.node,
            "status": status,
            "reason": self.reason,
            "gangPolicy": self.policy,
            "allocationsToEvict": pending,
            "progress": {"evicted": len(self.evicted), "pending": pending, "failed": len(self.failed)},
            "failures": dict(list(self.failed.items())[:20]),
            "waitingGangs": sorted(self.waiting_gangs),
            "requeued": {job: sorted(pods) for job, pods in self.requeued.items()},
            "requeuePending": sorted(self.requeue),
            "startedAt": rfc3339(time.time() - (time.monotonic() - self.started)),
        }


class Nodes:
    def __init__(
        self,
        ctx: Context,
        evictions: EvictionLog,
        requeue: Callable[[Kube, str, str, list[JSON]], list[str]] | None = None,
        watchers: threading.BoundedSemaphore | None = None,
    ) -> None:
        self.ctx = ctx
        self.evictions = evictions
        self.requeue = requeue or (lambda kube, ns, name, pods: [])  # an API job's pods made again
        self.watchers = watchers or threading.BoundedSemaphore(ctx.config().max_watchers)
        self.drains: dict[str, DrainState] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def patch(self, req: Request, name: str) -> Reply:
        body = read_body(models.NodePatch, req.body, f"patch of node {name}")
        dry = dry_run(req.param("dryRun"))
        self.ctx.authorize(req, Access("patch", "nodes", name, ""))
        r = self._cordon(self.ctx.as_caller(req), name, body.spec.unschedulable, dry=dry)
        meta = r.get("metadata") or {}
        return ok(
            200,
            {
                "metadata": {"name": name, "resourceVersion": meta.get("resourceVersion")},
                "spec": {"unschedulable": bool((r.get("spec") or {}).get("unschedulable"))},
            },
        )

    def _cordon(self, kube: Kube, name: str, on: bool, *, dry: bool = False) -> JSON:
        body = {"spec": {"unschedulable": True if on else None}}
        r = merge_patch(kube, f"/api/v1/nodes/{name}", f"node {name}", body, dry=dry)
        return r.body if isinstance(r.body, dict) else {}

    def _on_node(self, name: str) -> list[PodInfo]:
        return [p for p in self.ctx.cache.pods(self.ctx.cache.pod_uids()) if p.node == name and p.active]

    def drain(self, req: Request, name: str) -> Reply:
        body = read_body(models.Drain, req.body, f"drain of node {name}", empty_ok=True)
        self.ctx.authorize(req, Access("patch", "nodes", name, ""))
        if self.ctx.cache.node_model(name) is None:
            raise ApiError(404, f'nodes "{name}" not found', details={"name": name, "kind": "nodes"})
        dry = dry_run(req.param("dryRun"))
        kube = self.ctx.as_caller(req)
        self._cordon(kube, name, True, dry=dry)
        policy = body.gangPolicy or self.ctx.config().drain_gang_policy
        if dry:
            return ok(200, self._would_evict(name, policy, body))
        state = DrainState(
            name, body.reason, body.gracePeriodSeconds, policy, time.monotonic(), time.monotonic() + body.timeoutSeconds
        )
        with self.lock:
            old = self.drains.get(name)
            if old is not None:  # asked again: the earlier drain stops, its pending requeues carry over
                old.stop.set()
                with old.lock:
                    state.requeue.update(old.requeue)
            self.drains[name] = state
        self._pass(kube, state, body)
        threading.Thread(target=self._run, args=(kube, state, body), name=f"drain-{name}", daemon=True).start()
        return ok(200, self._json(state, body))

    def _json(self, state: DrainState, body: models.Drain) -> JSON:
        remaining = self._remaining(state, body)
        waiting = sum(1 for p in remaining if self.ctx.gangs.gang_of(p) in state.waiting_gangs)
        return state.json(remaining, waiting)

    def _would_evict(self, name: str, policy: str, body: models.Drain) -> JSON:
        """A drain in dry run: what it would evict now, gang by gang, and which gangs it
        would wait for (`Wait`)."""
        state = DrainState(name, body.reason, body.gracePeriodSeconds, policy, time.monotonic(), time.monotonic())
        evict: dict[str, list[str]] = {}
        requeue: set[str] = set()
        for pod in self._remaining(state, body):
            key = self.ctx.gangs.gang_of(pod)
            if key and policy == "Wait":
                state.waiting_gangs.add(key)
                continue
            members = [m for m in self.ctx.gangs.membership.member_pods(key) if m.active] if key else []
            evict[key or pod.key] = sorted({m.key for m in members} | {pod.key})
            if key and _api_job(pod):
                requeue.add(_api_job(pod))
        return {
            "node": name,
            "status": "DryRun",
            "gangPolicy": policy,
            "wouldEvict": evict,
            "allocationsToEvict": sum(len(v) for v in evict.values()),
            "waitingGangs": sorted(state.waiting_gangs),
            "wouldRequeue": sorted(requeue),
        }

    def drain_status(self, req: Request, name: str) -> Reply:
        self.ctx.authorize(req, Access("get", "nodes", name, ""))
        with self.lock:
            state = self.drains.get(name)
        if state is None:
            raise ApiError(404, f"node {name!r} has no drain in progress or finished since this extender started")
        return ok(200, self._json(state, models.Drain()))

    def _remaining(self, state: DrainState, body: models.Drain) -> list[PodInfo]:
        return [p for p in self._on_node(state.node) if not (body.ignoreDaemonSets and _daemon(p))]

    def _run(self, kube: Kube, state: DrainState, body: models.Drain) -> None:
        while not state.stop.wait(2.0) and not self.stopping.is_set():
            if time.monotonic() > state.deadline:
                return
            try:
                if not self._pass(kube, state, body):
                    state.done = True
                    return
            except Exception:
                log.exception("drain pass failed", node=state.node)

    def _pass(self, kube: Kube, state: DrainState, body: models.Drain) -> bool:
        """One round of evictions, and the requeue of API jobs whose gang is gone; True while
        pods remain or a requeue waits. The state's fields change under its lock (a status
        read may come at any time)."""
        self._requeue(kube, state)
        remaining = self._remaining(state, body)
        with state.lock:
            if not remaining and not state.requeue:
                state.done = True
                return False
        gangs = self.ctx.gangs
        for pod in remaining:
            key = gangs.gang_of(pod)
            victims = [pod]
            job = ""
            if key:
                if state.policy == "Wait":
                    with state.lock:
                        state.waiting_gangs.add(key)
                    continue
                victims = [m for m in gangs.membership.member_pods(key) if m.active] or [pod]
                job = _api_job(pod)
            for victim in victims:
                if victim.key in state.evicted:
                    continue
                template = None
                if job:  # an API job's member is read first: not evicted unless it can be made again
                    template, why = self._template(kube, victim)
                    if template is None:
                        with state.lock:
                            state.failed[victim.key] = f"not evicted: cannot read it to requeue its job: {why}"
                        continue
                refusal = self._evict(kube, victim, state)
                with state.lock:
                    if refusal:
                        state.failed[victim.key] = refusal
                        continue
                    state.failed.pop(victim.key, None)
                    state.evicted.add(victim.key)
                    if job and template is not None:  # made again once the evicted members are gone
                        uids, pods = state.requeue.setdefault(job, (set(), []))
                        uids.add(victim.uid)
                        pods.append(template)
                self.evictions.add(
                    victim.namespace,
                    victim.name,
                    victim.node,
                    f"Node {state.node} drained: {state.reason}"[:512]
                    if victim.node == state.node
                    else f"Gang member on node {state.node} drained: {state.reason}"[:512],
                    state.grace_s if state.grace_s is not None else 30,
                )
        return True

    def _template(self, kube: Kube, pod: PodInfo) -> tuple[JSON | None, str]:
        """The pod as it is, read with the caller's token before it is evicted: what its
        requeue makes again (None and why: it cannot be read)."""
        try:
            r = call(kube, "GET", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}", f"pod {pod.key}")
        except ApiError as e:
            return None, e.message
        return (r.body, "") if isinstance(r.body, dict) else (None, "not a pod")

    def _requeue(self, kube: Kube, state: DrainState) -> None:
        with state.lock:
            pending = list(state.requeue.items())
        for job, (uids, pods) in pending:
            if any((p := self.ctx.cache.pod(uid)) is not None and p.active for uid in uids):
                continue
            ns, name = job.split("/", 1)
            try:
                made = self.requeue(kube, ns, name, pods)
            except Exception as e:  # never the drain's end: the job is reported, the drain goes on
                if not isinstance(e, ApiError):
                    log.exception("requeue failed", job=job)
                why = e.message if isinstance(e, ApiError) else f"{type(e).__name__}: {e}"[:512]
                with state.lock:
                    tries = state.requeue_tries[job] = state.requeue_tries.get(job, 0) + 1
                    state.failed[f"requeue {job}"] = f"{why} (try {tries} of {REQUEUE_TRIES})"
                    if tries >= REQUEUE_TRIES:  # given up: reported, and the drain can end
                        state.requeue.pop(job, None)
                continue
            with state.lock:
                state.requeued.setdefault(job, []).extend(made)
                state.requeue.pop(job, None)
                state.failed.pop(f"requeue {job}", None)

    def _evict(self, kube: Kube, pod: PodInfo, state: DrainState) -> str:
        body: JSON = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
            "deleteOptions": {"preconditions": {"uid": pod.uid}},
        }
        if state.grace_s is not None:
            body["deleteOptions"]["gracePeriodSeconds"] = state.grace_s
        try:
            call(
                kube,
                "POST",
                f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/eviction",
                f"eviction of {pod.key}",
                body=body,
            )
        except ApiError as e:
            return "" if e.code == 404 else e.message
        return ""

    def evictions_stream(self, req: Request, name: str) -> Reply:
        self.ctx.authorize(req, Access("get", "nodes", name, ""))
        after = int_param(
            req.param("resourceVersion") or req.headers.get("last-event-id", ""),
            "resourceVersion",
            low=0,
            high=10**15,
            default=0,
        )
        if req.param("watch") not in ("true", "1"):
            notices = [n.json() for n in self.evictions.since(after, name)]
            return ok(
                200,
                {
                    "kind": "EvictionNoticeList",
                    "metadata": {"resourceVersion": str(self.evictions.last())},
                    "items": notices,
                },
            )
        timeout = int_param(req.param("timeoutSeconds"), "timeoutSeconds", low=1, high=3600, default=1800)
        stream = Slotted.take(self._notices(name, after, timeout), self.watchers)
        return Reply(200, b"", content_type="text/event-stream", stream=stream)

    def _notices(self, node: str, after: int, timeout: int) -> Iterator[bytes]:
        yield b": watching\n\n"
        for n in self.evictions.follow(node, after, time.monotonic() + timeout, self.stopping):
            if n is None:
                yield b": keep-alive\n\n"
            else:
                yield b"id: %d\ndata: %s\n\n" % (n.seq, orjson.dumps(n.json()))


def _known_resources(name: str, hard: Mapping[str, object], soft: Mapping[str, object]) -> None:
    """400 naming every resource a quota cannot hold."""
    causes = convert.unknown_quota_resources(hard, "hard") + convert.unknown_quota_resources(soft, "soft")
    if causes:
        text = "; ".join(f"{c['field']}: {c['message']}" for c in causes)
        raise ApiError(400, f"quota {name}: {text}", causes=causes)


def _api_job(pod: PodInfo) -> str:
    """ "ns/name" of the API job the pod belongs to ("" for none)."""
    if pod.labels.get(convert.KIND_LABEL) != "job" or not pod.labels.get(convert.JOB_LABEL):
        return ""
    return f"{pod.namespace}/{pod.labels[convert.JOB_LABEL]}"


def _daemon(pod: PodInfo) -> bool:
    return any(o.kind == DAEMONSET and o.controller for o in pod.owners)


class Monitoring:
    def __init__(self, ctx: Context, usage: UsageHistory, latencies: Latencies, evictions: EvictionLog) -> None:
        self.ctx = ctx
        self.usage = usage
        self.latencies = latencies
        self.evictions = evictions
        self._memo: dict[str, tuple[float, Reply]] = {}
        self._lock = threading.Lock()

    def _recent(self, key: str, build: Callable[[], Reply]) -> Reply:
        """A report built at most once a second, however many ask (each caller authorised)."""
        now = time.monotonic()
        with self._lock:
            hit = self._memo.get(key)
            if hit is not None and now - hit[0] < REPORT_S:
                return hit[1]
        reply = build()
        with self._lock:
            self._memo[key] = (time.monotonic(), reply)
        return reply

    def cluster(self, req: Request) -> Reply:
        self.ctx.authorize(req, Access("list", "nodes", "", ""))
        return self._recent("cluster", self._cluster)

    def _cluster(self) -> Reply:
        infos = self.ctx.cache.node_infos()
        snapshot = self.ctx.cache.snapshot()
        free = {n.name: n for n in snapshot.nodes}
        cap = {"cpu": 0, "memory": 0, "gpu": 0}
        req_ = {"cpu": 0, "memory": 0, "gpu": 0.0}
        for info in infos:
            cap["cpu"] += info.allocatable.cpu_milli
            cap["memory"] += info.allocatable.memory_mib
            cap["gpu"] += len(info.devices)
            node = free.get(info.name)
            if node is not None:
                req_["cpu"] += info.allocatable.cpu_milli - node.free.cpu_milli
                req_["memory"] += info.allocatable.memory_mib - node.free.memory_mib
                req_["gpu"] += sum((1000 - d.free_milli) / 1000 for d in node.gpus)
        pods = self.ctx.pods()
        pending = sum(1 for p in pods if not p.node and p.active)
        last_min = self.latencies.window(60)
        last_hour = self.latencies.window(3600)
        cordoned = sum(1 for i in infos if i.unschedulable)
        return ok(
            200,
            {
                "timestamp": rfc3339(time.time()),
                "cluster": {
                    "nodes": {"total": len(infos), "cordoned": cordoned, "schedulable": len(infos) - cordoned},
                    "cpu": {
                        "allocatable": f"{cap['cpu']}m",
                        "requested": f"{req_['cpu']}m",
                        "utilization": round(req_["cpu"] / cap["cpu"], 4) if cap["cpu"] else 0.0,
                    },
                    "memory": {
                        "allocatable": f"{cap['memory']}Mi",
                        "requested": f"{req_['memory']}Mi",
                        "utilization": round(req_["memory"] / cap["memory"], 4) if cap["memory"] else 0.0,
                    },
                    "gpu": {
                        "allocatable": cap["gpu"],
                        "requested": round(req_["gpu"], 3),
                        "utilization": round(req_["gpu"] / cap["gpu"], 4) if cap["gpu"] else 0.0,
                    },
                    "source": "requests of the pods Phalanx counts (no usage metrics are read)",
                },
                "scheduling": {
                    "pendingAllocations": pending,
                    "schedulingRate": f"{len(last_min) / 60:.2f}/sec",
                    "avgSchedulingLatencyMs": round(1000 * sum(last_hour) / len(last_hour)) if last_hour else 0,
                    "p50SchedulingLatencyMs": round(1000 * percentile(last_hour, 50)),
                    "p99SchedulingLatencyMs": round(1000 * percentile(last_hour, 99)),
                    "latencySamples": len(last_hour),
                    "preemptionsLast1h": self.evictions.count_since(time.time() - 3600),
                },
            },
        )

    def _default_queue(self) -> Reply:
        pending = [p for p in self.ctx.pods() if not p.node and p.active]
        keys = {k for k in self.ctx.gangs.gangs_of(pending) if k}
        oldest = min((p.created for p in pending), default="")
        name = self.ctx.queues.config.default_queue
        waits = self.latencies.window(3600)
        queue = {
            "name": name,
            "depth": len(pending),
            "pendingGangs": len(keys),
            "oldestItem": oldest or None,
            "avgWaitTime": f"{sum(waits) / len(waits):.0f}s" if waits else "0s",
            "p99WaitTime": f"{percentile(waits, 99):.0f}s",
            "samples": len(waits),
        }
        return ok(200, {"queues": [queue]})

    def tenant(self, req: Request, tenant: str) -> Reply:
        self.ctx.authorize(req, Access("list", "pods", "", "", tenant))
        try:
            period = period_seconds(req.param("period") or "24h")
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        if period > 7 * 86400:
            raise ApiError(400, "period: at most 7d")
        current = self.usage.held(self.ctx.pods(tenant)).get(tenant, {"cpu": 0.0, "memory": 0.0, "gpu": 0.0})
        report = self.usage.report(tenant, period, current)
        queue = self.ctx.queues.queue_for(tenant, {})
        limits = next((v.spec.limit for v in self.ctx.queues.views() if v.name == queue), {})
        quota = {
            "cpu": limits.get("cpu", 0) / 1000,
            "memory": limits.get("memory", 0) / 1024,
            "gpu": limits.get("gpu", 0) / 1000,
        }
        prices = self.ctx.config().prices
        currency = self.ctx.config().currency
        resources, costs = {}, {}
        hours = report["coveredSeconds"] / 3600
        for k, name in (("cpu", "cpu"), ("memory", "memory"), ("gpu", "nvidia.com/gpu")):
            r = report["resources"][k]
            q = quota[k]
            resources[name] = {
                "quota": f"{q:g}" if q else None,
                "currentUsage": f"{current[k]:g}",
                "peakUsage": f"{r['peak']:g}",
                "avgUsage": f"{r['avg']:.3g}",
                "utilizationOfQuota": round(current[k] / q, 4) if q else None,
            }
            costs[k] = r["avg"] * hours * prices.get(k, 0.0)  # type: ignore[call-overload]
        return ok(
            200,
            {
                "tenant": tenant,
                "queue": queue,
                "period": req.param("period") or "24h",
                "coveredSeconds": report["coveredSeconds"],
                "resources": resources,
                "cost": {
                    "period": req.param("period") or "24h",
                    "total": f"{currency}{sum(costs.values()):,.2f}",
                    "breakdown": {k: f"{currency}{v:,.2f}" for k, v in costs.items()},
                    "pricesPerHour": {k: v for k, v in prices.items()},
                },
            },
        )

    def queues(self, req: Request) -> Reply:
        self.ctx.authorize(req, Access("list", "queues", ""))
        return self._recent("queues", self._queues)

    def _queues(self) -> Reply:
        if not self.ctx.queues.active:  # no Queue objects: one queue, counted from a reading
            return self._default_queue()
        out = []
        for v in self.ctx.queues.views():
            waits = self.latencies.window(3600, queue=v.name)
            out.append(
                {
                    "name": v.name,
                    "depth": v.pending_pods,
                    "pendingGangs": v.pending_gangs,
                    "oldestItem": rfc3339(time.time() - v.oldest_wait_s) if v.pending_pods else None,
                    "avgWaitTime": f"{sum(waits) / len(waits):.0f}s" if waits else "0s",
                    "p99WaitTime": f"{percentile(waits, 99):.0f}s",
                    "samples": len(waits),
                }
            )
        return ok(200, {"queues": out})
