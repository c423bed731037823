"""Allocations and jobs: `/api/v1/namespaces/{ns}/allocations`, `.../jobs`, `.../preemptions`.

An allocation is a Pod that a Phalanx scheduler places; one with `gangScheduling.groupId`
joins the Workload of that name (created with the first member). A job is a Workload and its
`parallelism` pods. Reads come from the extender's cache; every write is the caller's own
request to the API server (their token: their RBAC), so the API never lets anyone do more than
kubectl would. Before a write, the request is planned against the cluster as it is: a gang that
could not fit even an empty cluster is refused with 422 and the solver's explanation, and with
`?dryRun=All` nothing is written: the answer says where it would be placed now.
"""

from __future__ import annotations

import bisect
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import structlog

from extender.api import convert, models
from extender.api.context import Context, Reading, call, merge_patch
from extender.api.core import (
    ApiError,
    FieldRequirement,
    Slotted,
    decode_continue,
    dry_run,
    encode_continue,
    field_selector,
    int_param,
    ok,
    read_body,
    selector,
)
from extender.api.monitor import EvictionLog
from extender.auth import Access
from extender.gangs.manager import PlannerBusy
from extender.gangs.sources import WORKLOAD, GangObjects, GangSpec, definition_spec
from extender.kube import Kube
from extender.objects import PodInfo, pod_info
from extender.selectors import Selector
from extender.server import Reply, Request
from solver import GangName, TopologyRequest

log = structlog.get_logger("phalanx.api")

JSON = dict[str, Any]
WORKLOADS = "/apis/phalanx.io/v1alpha1/namespaces/{ns}/workloads"
FIELDS = {
    "metadata.name": "the allocation's name",
    "metadata.namespace": "its namespace",
    "status.phase": "Pending, Scheduled, Running, Succeeded, Failed",
    "status.nodeName": "the node it is on",
}
WATCH_FIELDS = {"metadata.name": "metadata.name", "status.phase": "status.phase", "status.nodeName": "spec.nodeName"}
MAX_LIST = 5000


@dataclass(frozen=True, slots=True)
class _Order:
    units: dict[str, tuple[tuple[int, str, str], str]]  # unit -> (sort key, queue)
    by_queue: dict[str, list[tuple[int, str, str]]]  # queue -> sorted keys

    def position(self, queue: str, key: tuple[int, str, str], ignore: str = "") -> int:
        keys = self.by_queue.get(queue, [])
        ahead = bisect.bisect_left(keys, key)
        if ignore and ignore in self.units and self.units[ignore][0] < key:
            ahead -= 1  # its own entry, at its old priority
        return ahead + 1


class Allocations:
    def __init__(self, ctx: Context, evictions: EvictionLog) -> None:
        self.ctx = ctx
        self.evictions = evictions
        self.watchers = threading.BoundedSemaphore(ctx.config().max_watchers)
        self.stopping = threading.Event()
        self._order: tuple[Reading, _Order] | None = None
        self._order_lock = threading.Lock()

    # ------------------------------------------------------------------ shared

    def _queue(self, pod: PodInfo) -> str:
        return self.ctx.queues.queue_of(pod)

    def order(self) -> _Order:
        """Every queue's pending units (a gang counts once, by its oldest member) in the order
        they are served: higher priority first, then older. One pass over a reading of the
        allocations, kept with it."""
        reading = self.ctx.read()
        memo = self._order
        if memo is not None and memo[0] is reading:
            return memo[1]
        with self._order_lock:  # one computation per reading, however many requests wait for it
            memo = self._order
            if memo is not None and memo[0] is reading:
                return memo[1]
            order = self._compute_order(reading)
            self._order = (reading, order)
            return order

    def _compute_order(self, reading: Reading) -> _Order:
        units: dict[str, tuple[tuple[int, str, str], str]] = {}
        pending = [p for p in reading.pods if not p.node and p.active]
        priorities: dict[str, int] = {}
        for p, key in zip(pending, self.ctx.gangs.gangs_of(pending), strict=True):
            unit = key or p.key
            if key and key not in priorities:
                priorities[key] = self.ctx.gangs.spec_priority(key)
            mine = (-(priorities.get(key) or p.priority), p.created, unit)
            have = units.get(unit)
            if have is None or mine < have[0]:
                units[unit] = (mine, have[1] if have is not None else self._queue(p))
        by_queue: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
        for sort_key, queue in units.values():
            by_queue[queue].append(sort_key)
        for keys in by_queue.values():
            keys.sort()
        return _Order(units, by_queue)

    def position(self, pod: PodInfo, order: _Order | None = None) -> int | None:
        """1 + the pending units of its queue ahead of it; None once it is placed."""
        if pod.node or not pod.active:
            return None
        order = order or self.order()
        unit = self.ctx.gangs.gang_of(pod) or pod.key
        key, queue = order.units.get(unit, ((-self._priority(pod), pod.created, unit), self._queue(pod)))
        return order.position(queue, key)

    def _priority(self, pod: PodInfo) -> int:
        key = self.ctx.gangs.gang_of(pod)
        state = self.ctx.gangs.gangs.get(key) if key else None
        if state is not None and state.spec is not None and state.spec.priority:
            return state.spec.priority
        return pod.priority

    def view(self, pod: PodInfo, order: _Order | None = None) -> JSON:
        reason = ""
        if not pod.node:
            key = self.ctx.gangs.gang_of(pod)
            state = self.ctx.gangs.gangs.get(key) if key else None
            reason = state.reason if state is not None else ""
        return convert.allocation(pod, queue=self._queue(pod), position=self.position(pod, order), reason=reason)

    def _quota(self, pods: list[PodInfo], queue: str) -> None:
        """403 when the pods would take their queue past a hard limit."""
        admitted = self.ctx.queues.check_gang(pods, {})
        refusal = self.ctx.queues.check_limit(queue or admitted.queue, admitted.need, {}, "request")
        if refusal:
            raise ApiError(403, f"exceeded quota: {refusal}", details={"queue": queue or admitted.queue})

    def _plan(self, spec: GangSpec, pods: list[PodInfo], *, queue: str) -> JSON:
        """What the solver makes of the pods now: placed (where), waiting (why), or never (422)."""
        try:
            answer = self.ctx.gangs.what_if(spec, pods, queue=queue)
        except PlannerBusy as e:
            raise ApiError(503, str(e), headers=(("Retry-After", "1"),)) from None
        if answer.error:
            raise ApiError(400, f"the request cannot be planned: {answer.error}", reason="Invalid")
        if answer.never:
            raise ApiError(
                422,
                f"can never be placed on this cluster: {answer.proof}",
                details={"explanation": answer.proof, "provedOn": "the cluster with every pod removed"},
            )
        if answer.placed:
            return {"placeable": True, "placement": answer.placement, "solverStatus": answer.status}
        if answer.preempts:
            # Only the caller's own namespace is named: other tenants' pods are counted.
            ns = pods[0].namespace if pods else ""
            mine = [k for k in answer.preempts if k.startswith(f"{ns}/")]
            out: JSON = {
                "placeable": False,
                "reason": answer.reason,
                "wouldPreempt": mine,
                "wouldPreemptElsewhere": len(answer.preempts) - len(mine),
                "placementAfterPreemption": answer.placement,
                "note": "disruption budgets are checked when the preemption is made",
            }
            if len(mine) == len(answer.preempts):
                out["preemption"] = answer.preemption
            return out
        return {"placeable": False, "reason": answer.reason}

    # ------------------------------------------------------------------ allocations

    def create(self, req: Request, ns: str) -> Reply:
        body = read_body(models.Allocation, req.body, f"allocation in {ns}")
        if body.metadata.namespace not in (None, ns):
            raise ApiError(400, f"metadata.namespace {body.metadata.namespace!r} is not the path's {ns!r}")
        dry = dry_run(req.param("dryRun"))
        self.ctx.authorize(req, Access("create", "pods", body.metadata.name, "", ns))
        try:
            pod = convert.allocation_pod(body, ns, self.ctx.config().scheduler_name)
        except ValueError as e:
            raise ApiError(400, f"allocation {ns}/{body.metadata.name}: spec.scheduling: {e}") from None
        gang = body.spec.gangScheduling or body.spec.scheduling.gangScheduling
        kube = self.ctx.as_caller(req)
        workload = None
        if gang is not None and gang.groupId:
            workload = convert.workload(
                ns,
                gang.groupId,
                gang,
                members=0,
                priority=body.spec.priority,
                scheduling=body.spec.scheduling,
                labels={convert.KIND_LABEL: "allocation"},
            )
            del workload["spec"]["gangGroups"][0]["maxCount"]
        info = _pod_info(pod)
        queue = self._queue(info)
        self._quota([info], queue)
        # A gang of several is planned once its members exist; each member alone must still be
        # placeable on the empty cluster (else 422 now, not a gang that waits forever).
        alone = gang is None or gang.minMembers <= 1
        spec = _spec(workload, ns) if workload is not None and alone else _single(info)
        plan = self._plan(spec, [info], queue=queue)
        if not alone:
            plan = {"placeable": None, "reason": "a gang is planned once its members exist"}
        query = {"dryRun": "All"} if dry else None
        if workload is not None:
            try:
                call(
                    kube,
                    "POST",
                    WORKLOADS.format(ns=ns),
                    f"Workload {ns}/{workload['metadata']['name']}",
                    body=workload,
                    query=query,
                )
            except ApiError as e:
                if e.code != 409:  # the gang's Workload exists: its first member made it
                    raise
        r = call(
            kube,
            "POST",
            f"/api/v1/namespaces/{ns}/pods",
            f"allocation {ns}/{body.metadata.name}",
            body=pod,
            query=query,
        )
        created = pod_info(r.body)
        out = convert.allocation(created, queue=queue, position=None if dry else self.position(created))
        if dry:
            out["status"]["dryRun"] = plan
        elif plan.get("placeable") is False:
            out["status"]["conditions"][0]["message"] = plan["reason"]
        return ok(200 if dry else 201, out)

    def get(self, req: Request, ns: str, name: str) -> Reply:
        self.ctx.authorize(req, Access("get", "pods", name, "", ns))
        pod = self.ctx.pod(ns, name)
        if pod is None:
            raise ApiError(
                404,
                f'allocations "{name}" not found in namespace {ns!r}',
                details={"name": name, "kind": "allocations"},
            )
        return ok(200, self.view(pod))

    def list_or_watch(self, req: Request, ns: str) -> Reply:
        if req.param("watch") in ("true", "1"):
            return self.watch(req, ns)
        self.ctx.authorize(req, Access("list", "pods", "", "", ns))
        labels = selector(req.param("labelSelector"), "labelSelector")
        fields = field_selector(req.param("fieldSelector"), FIELDS)
        limit = int_param(req.param("limit"), "limit", low=1, high=MAX_LIST, default=MAX_LIST)
        after = ""
        if req.param("continue"):  # later pages come from the first page's reading
            number, after = decode_continue(req.param("continue"))
            kept = self.ctx.reading_at(number)
            if kept is None:
                raise ApiError(
                    410,
                    "continue: the list this token continues is too old (kept about a minute); list again",
                    reason="Expired",
                )
            reading = kept
        else:
            reading = self.ctx.read()
        rv = reading.rv
        pods = [  # the reading is in (namespace, name) order: so is every page
            p
            for p in reading.by_ns.get(ns, ())
            if (labels is None or labels.matches(p.labels))
            and _fields_match(p, fields)
            and (not after or p.key > after)
        ]
        page, rest = pods[:limit], pods[limit:]
        order = self.order()
        meta: JSON = {"resourceVersion": rv}
        if rest:
            self.ctx.keep(reading)
            meta["continue"] = encode_continue(str(reading.id), f"{page[-1].namespace}/{page[-1].name}")
            meta["remainingItemCount"] = len(rest)
        return ok(
            200,
            {
                "apiVersion": convert.API_VERSION,
                "kind": "AllocationList",
                "metadata": meta,
                "items": [self.view(p, order) for p in page],
            },
        )

    def watch(self, req: Request, ns: str) -> Reply:
        """Server-sent events of the namespace's allocations from `resourceVersion` (or the
        `Last-Event-ID` a reconnecting EventSource sends; none: every current allocation as
        ADDED, then the changes). Served from the event history of the extender's own pod
        watch (`events.py`: one upstream watch for every watcher) when it covers that version;
        from an older one (before this process started), by the API server's own watch of the
        pods with the caller's token. Either way a watch resumed from a version misses nothing
        and repeats nothing, as far back as the API server keeps history (past it, an ERROR
        event with 410: list again)."""
        labels = req.param("labelSelector")
        selector(labels, "labelSelector")
        fields = field_selector(req.param("fieldSelector"), WATCH_FIELDS)
        timeout = int_param(req.param("timeoutSeconds"), "timeoutSeconds", low=1, high=3600, default=1800)
        rv = req.param("resourceVersion") or req.headers.get("last-event-id", "")
        if rv and not (rv.isascii() and rv.isdigit() and len(rv) <= 20):
            raise ApiError(400, f"resourceVersion: {rv[:32]!r} is not a resource version")
        scheduler = self.ctx.config().scheduler_name
        server_fields = [f"spec.schedulerName={scheduler}"] + [
            f"{WATCH_FIELDS[f.path]}{'=' if f.equal else '!='}{f.value}" for f in fields if f.path != "status.phase"
        ]
        query = {
            "watch": "1",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout),
            "fieldSelector": ",".join(server_fields),
        }
        if labels:
            query["labelSelector"] = labels
        if rv:
            query["resourceVersion"] = rv
        self.ctx.authorize(req, Access("watch", "pods", "", "", ns))
        history = self.ctx.events
        wanted = selector(labels, "labelSelector")
        until = time.monotonic() + timeout
        source: Iterator[bytes]
        if not rv and (reading := self.ctx.read()).rv.isdigit() and history.covers(int(reading.rv)):
            source = self._served(list(reading.by_ns.get(ns, ())), int(reading.rv), ns, wanted, fields, until)
        elif rv and history.covers(int(rv)):
            source = self._served([], int(rv), ns, wanted, fields, until)
        else:
            source = self._events(self.ctx.as_caller(req).stream(f"/api/v1/namespaces/{ns}/pods", query), fields, ns)
        return Reply(200, b"", content_type="text/event-stream", stream=Slotted.take(source, self.watchers))

    def _frame(self, kind: str, pod: PodInfo, rv: int) -> bytes:
        payload = {"type": kind, "object": convert.allocation(pod, queue=self._queue(pod))}
        return b"id: %d\ndata: %s\n\n" % (rv, orjson.dumps(payload))

    def _served(
        self,
        current: list[PodInfo],
        rv: int,
        ns: str,
        wanted: Selector | None,
        fields: list[FieldRequirement],
        until: float,
    ) -> Iterator[bytes]:
        """A watch served from the event history: `current` as ADDED at version `rv`, then
        every event after it, each frame encoded once for all its watchers."""
        scheduler = self.ctx.config().scheduler_name

        def matches(pod: PodInfo) -> bool:
            return (
                pod.namespace == ns
                and pod.scheduler == scheduler
                and (wanted is None or wanted.matches(pod.labels))
                and _fields_match(pod, fields)
            )

        yield b": watching\n\n" + b"".join(self._frame("ADDED", p, rv) for p in current if matches(p))
        for batch, at in self.ctx.events.follow(rv, self.stopping, until):
            if not batch:
                bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": str(at)}}}
                yield b"id: %d\ndata: %s\n\n" % (at, orjson.dumps(bookmark))
            frames = []
            for event in batch:
                if matches(event.pod):
                    if not event.encoded:  # the first watcher to send it encodes it
                        event.encoded = self._frame(event.kind, event.pod, event.rv)
                    frames.append(event.encoded)
            if frames:
                yield b"".join(frames)  # one write per batch

    def _events(self, events: Iterator[JSON], fields: list[FieldRequirement], ns: str) -> Iterator[bytes]:
        """The stream's events; a failure of the API server's watch (an expired version: 410)
        is the last event, an ERROR with its Status, as the API server's own watch ends."""
        try:
            yield b": watching\n\n"
            for event in events:
                if self.stopping.is_set():
                    return
                kind = str(event.get("type", ""))
                obj = event.get("object") or {}
                rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
                if kind == "BOOKMARK":
                    payload: JSON = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": rv}}}
                elif kind == "ERROR":
                    status = {k: obj.get(k) for k in ("code", "reason", "message")}
                    payload = {"type": "ERROR", "object": {"kind": "Status", **status}}
                else:
                    pod = pod_info(obj)
                    if not _fields_match(pod, fields):
                        continue
                    payload = {"type": kind, "object": convert.allocation(pod, queue=self._queue(pod))}
                yield b"id: %s\ndata: %s\n\n" % (rv.encode(), orjson.dumps(payload))
        except Exception as e:
            error = _watch_error(e, ns)
            yield b"data: %s\n\n" % orjson.dumps({"type": "ERROR", "object": error.status()})
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()

    def delete(self, req: Request, ns: str, name: str) -> Reply:
        options = read_body(models.DeleteOptions, req.body, f"delete of allocation {ns}/{name}", empty_ok=True)
        grace = req.param("gracePeriodSeconds")
        if grace:
            options.gracePeriodSeconds = int_param(grace, "gracePeriodSeconds", low=0, high=86_400, default=30)
        dry = dry_run(req.param("dryRun"))
        self.ctx.authorize(req, Access("delete", "pods", name, "", ns))
        target = next((p for p in self.ctx.fresh_pods(ns) if p.name == name), None)
        if target is None:  # only an allocation: never another scheduler's pod of that name
            raise ApiError(404, f'allocations "{name}" not found in namespace {ns!r}', details={"name": name})
        options.preconditions = {"uid": target.uid, **options.preconditions}
        body: JSON = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if options.gracePeriodSeconds is not None:
            body["gracePeriodSeconds"] = options.gracePeriodSeconds
        if options.propagationPolicy:
            body["propagationPolicy"] = options.propagationPolicy
        if options.preconditions:
            body["preconditions"] = dict(options.preconditions)
        if dry:
            body["dryRun"] = ["All"]
        r = call(
            self.ctx.as_caller(req),
            "DELETE",
            f"/api/v1/namespaces/{ns}/pods/{name}",
            f"allocation {ns}/{name}",
            body=body,
        )
        pod = pod_info(r.body) if isinstance(r.body, dict) and r.body.get("kind") == "Pod" else self.ctx.pod(ns, name)
        out: JSON = convert.allocation(pod, queue=self._queue(pod)) if pod is not None else {"metadata": {"name": name}}
        meta: JSON = (r.body.get("metadata") or {}) if isinstance(r.body, dict) else {}
        out["metadata"]["deletionTimestamp"] = meta.get("deletionTimestamp")
        out["metadata"]["deletionGracePeriodSeconds"] = meta.get("deletionGracePeriodSeconds")
        out.setdefault("status", {})["phase"] = "Terminating"
        out["status"]["conditions"] = [
            {
                "type": "Terminating",
                "status": "True",
                "reason": "UserRequested",
                "message": "Graceful termination in progress",
            }
        ]
        return ok(200, out)

    def bulk_release(self, req: Request, ns: str) -> Reply:
        body = read_body(models.BulkRelease, req.body, f"bulk release in {ns}")
        dry = body.dryRun or dry_run(req.param("dryRun"))
        self.ctx.authorize(req, Access("delete", "pods", "", "", ns))
        labels = selector(body.labelSelector, "labelSelector")
        assert labels is not None
        chosen = [p for p in self.ctx.fresh_pods(ns) if p.active and labels.matches(p.labels)]
        kube = self.ctx.as_caller(req)
        released, failed, errors = 0, 0, []
        freed: dict[str, float] = {}
        for pod in chosen:
            options: JSON = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": pod.uid}}
            if body.gracePeriodSeconds is not None:
                options["gracePeriodSeconds"] = body.gracePeriodSeconds
            if dry:
                options["dryRun"] = ["All"]
            try:
                call(kube, "DELETE", f"/api/v1/namespaces/{ns}/pods/{pod.name}", f"allocation {pod.key}", body=options)
            except ApiError as e:
                if e.code == 404:
                    continue
                failed += 1
                errors.append(e.message)
                continue
            released += 1
            if pod.node:
                for k, v in _amounts(pod).items():
                    freed[k] = freed.get(k, 0.0) + v
        return ok(
            200,
            {
                "released": released,
                "failed": failed,
                "dryRun": dry,
                "errors": errors[:20],
                "totalResourcesFreed": _shown(freed),
            },
        )

    # ------------------------------------------------------------------ jobs

    def submit_job(self, req: Request, ns: str) -> Reply:
        body = read_body(models.Job, req.body, f"job in {ns}")
        if body.metadata.namespace not in (None, ns):
            raise ApiError(400, f"metadata.namespace {body.metadata.namespace!r} is not the path's {ns!r}")
        name = body.metadata.name
        if len(name) > 45:
            raise ApiError(
                400,
                f"job {ns}/{name}: metadata.name: at most 45 characters (its pods are <name>-<index>, "
                "and <name>-<index>-<suffix> when requeued)",
                causes=[{"field": "metadata.name", "message": "at most 45 characters"}],
            )
        dry = dry_run(req.param("dryRun"))
        self.ctx.authorize(req, Access("create", "workloads", name, "phalanx.io", ns))
        spec = body.spec
        gang = spec.template.spec.scheduling.gangScheduling
        labels = {**body.metadata.labels, convert.KIND_LABEL: "job"}
        workload = convert.workload(
            ns,
            name,
            gang,
            members=spec.parallelism,
            priority=spec.priority,
            scheduling=spec.template.spec.scheduling,
            labels=labels,
        )
        workload["metadata"]["annotations"] = dict(body.metadata.annotations)
        try:
            pods = convert.job_pods(name, ns, spec, body.metadata.labels, self.ctx.config().scheduler_name)
        except ValueError as e:
            raise ApiError(400, f"job {ns}/{name}: spec.template.spec.scheduling: {e}") from None
        infos = [_pod_info(p) for p in pods]
        queue = self._queue(infos[0])
        self._quota(infos, queue)
        plan = self._plan(_spec(workload, ns), infos, queue=queue)
        kube = self.ctx.as_caller(req)
        query = {"dryRun": "All"} if dry else None
        r = call(kube, "POST", WORKLOADS.format(ns=ns), f"job {ns}/{name}", body=workload, query=query)
        owner = r.body.get("metadata") or {} if isinstance(r.body, dict) else {}
        made = 0
        try:
            for pod in pods:
                if not dry:
                    pod["metadata"]["ownerReferences"] = [_owner(name, owner)]
                call(
                    kube,
                    "POST",
                    f"/api/v1/namespaces/{ns}/pods",
                    f"job {ns}/{name}: pod {pod['metadata']['name']}",
                    body=pod,
                    query=query,
                )
                made += 1
        except ApiError as e:
            if not dry:  # no half-made job: what was made goes
                self._remove_job(kube, ns, name, grace=0)
            raise ApiError(
                e.code,
                f"{e.message} (the job's Workload and pods were removed again)",
                reason=e.reason,
                causes=e.causes,
                headers=e.headers,
            ) from None
        status: JSON = {
            "phase": "Queued",
            "members": made,
            "queue": queue,
            "conditions": [{"type": "Queued", "status": "True", "reason": "WaitingForResources"}],
        }
        if dry:
            status["dryRun"] = plan
        else:
            status["queuePosition"] = self._job_position(ns, name, infos, spec.priority, queue)
            if not plan.get("placeable"):
                status["conditions"][0]["message"] = plan.get("reason", "")
        meta = {
            "name": name,
            "namespace": ns,
            "uid": owner.get("uid", ""),
            "resourceVersion": owner.get("resourceVersion", ""),
        }
        return ok(
            200 if dry else 201, {"apiVersion": convert.API_VERSION, "kind": "Job", "metadata": meta, "status": status}
        )

    def _job_position(self, ns: str, name: str, infos: list[PodInfo], priority: int, queue: str) -> int:
        """Where the job's gang stands in its queue (with `priority`, e.g. a boost's)."""
        unit = f"wl:{ns}/{name}/{convert.GANG_GROUP}"
        order = self.order()
        oldest = min((p.created for p in infos), default="")
        return order.position(queue, (-priority, oldest, unit), ignore=unit)

    def requeue_job(self, kube: Kube, ns: str, name: str, pods: list[JSON]) -> list[str]:
        """Make again the pods of an API job whose gang a drain evicted, from those pods as
        they were (read before the eviction: what the tenant made and admission admitted),
        with the drain's caller's credentials; only indexes without an active pod. The names
        made ([] when the job was cancelled meanwhile)."""
        obj = self.ctx.gangs.objects.get(WORKLOAD, ns, name)
        meta = (obj or {}).get("metadata") or {}
        if obj is None or meta.get("deletionTimestamp"):
            return []
        have = {
            p.labels.get(convert.INDEX_LABEL)
            for p in self.ctx.fresh_pods(ns)
            if p.active and p.labels.get(convert.JOB_LABEL) == name
        }
        made = []
        suffix = uuid.uuid4().hex[:5]
        for old in pods:
            pod = convert.replayable(old, suffix)
            if pod["metadata"].get("labels", {}).get(convert.INDEX_LABEL) in have:
                continue
            pod["metadata"]["ownerReferences"] = [_owner(name, meta)]
            call(kube, "POST", f"/api/v1/namespaces/{ns}/pods", f"requeue of job {ns}/{name}", body=pod)
            made.append(pod["metadata"]["name"])
        return made

    def _job_pods(self, ns: str, name: str) -> list[PodInfo]:
        return sorted(
            (p for p in self.ctx.pods(ns) if p.labels.get(convert.JOB_LABEL) == name),
            key=lambda p: (
                int(p.labels.get(convert.INDEX_LABEL, "0")) if p.labels.get(convert.INDEX_LABEL, "").isdigit() else 0
            ),
        )

    def _workload(self, ns: str, name: str) -> JSON:
        obj = self.ctx.gangs.objects.get(WORKLOAD, ns, name)
        if obj is None or (obj.get("metadata") or {}).get("labels", {}).get(convert.KIND_LABEL) != "job":
            raise ApiError(404, f'jobs "{name}" not found in namespace {ns!r}', details={"name": name, "kind": "jobs"})
        return obj

    def job_status(self, req: Request, ns: str, name: str) -> Reply:
        self.ctx.authorize(req, Access("get", "workloads", name, "phalanx.io", ns))
        obj = self._workload(ns, name)
        pods = self._job_pods(ns, name)
        bound = [p for p in pods if p.node]
        phases = [p.phase for p in pods]
        meta = obj.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            phase = "Cancelling"
        elif pods and all(ph == "Succeeded" for ph in phases):
            phase = "Succeeded"
        elif any(ph == "Failed" for ph in phases):
            phase = "Failed"
        elif pods and len(bound) == len(pods):
            phase = "Running"
        else:
            phase = "Queued"
        group = ((obj.get("spec") or {}).get("gangGroups") or [{}])[0]
        key = next((self.ctx.gangs.gang_of(p) for p in pods), "")
        state = self.ctx.gangs.gangs.get(key) if key else None
        status: JSON = {
            "phase": phase,
            "active": sum(1 for p in pods if p.active and p.node),
            "pending": sum(1 for p in pods if not p.node and p.active),
            "succeeded": phases.count("Succeeded"),
            "failed": phases.count("Failed"),
            "priority": group.get("priority", 0),
            "allocations": [{"name": p.name, "node": p.node or None, "phase": convert.phase(p)} for p in pods],
        }
        boost = _boost(meta)
        if boost:
            status["boost"] = boost
        if state is not None and state.reason and phase == "Queued":
            status["message"] = state.reason
        if phase == "Queued" and pods:
            status["queuePosition"] = self._job_position(
                ns, name, pods, int(group.get("priority") or 0), self._queue(pods[0])
            )
        body = {
            "apiVersion": convert.API_VERSION,
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": ns,
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "status": status,
        }
        return ok(200, body)

    def cancel_job(self, req: Request, ns: str, name: str) -> Reply:
        body = read_body(models.Cancel, req.body, f"cancel of job {ns}/{name}", empty_ok=True)
        dry = dry_run(req.param("dryRun"))
        self.ctx.authorize(req, Access("delete", "workloads", name, "phalanx.io", ns))
        self._workload(ns, name)
        grace = body.gracePeriodSeconds
        self._remove_job(self.ctx.as_caller(req), ns, name, grace=grace, dry=dry)
        if dry:
            pods = [p.name for p in self._job_pods(ns, name) if p.active]
            return ok(200, {"status": {"phase": "DryRun", "wouldDelete": pods, "reason": body.reason}})
        message = "Graceful cancellation initiated" + (f", {grace}s grace period" if grace is not None else "")
        return ok(200, {"status": {"phase": "Cancelling", "message": message, "reason": body.reason}})

    def _remove_job(self, kube: Any, ns: str, name: str, *, grace: int | None, dry: bool = False) -> None:
        options: JSON = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if grace is not None:
            options["gracePeriodSeconds"] = grace
        query = {"labelSelector": f"{convert.JOB_LABEL}={name}"}
        if grace is not None:
            query["gracePeriodSeconds"] = str(grace)
        if dry:
            options["dryRun"] = ["All"]
            query["dryRun"] = "All"
        call(kube, "DELETE", f"/api/v1/namespaces/{ns}/pods", f"job {ns}/{name}: pods", query=query)
        try:
            call(kube, "DELETE", f"{WORKLOADS.format(ns=ns)}/{name}", f"job {ns}/{name}", body=options)
        except ApiError as e:
            if e.code != 404:
                raise

    def boost_job(self, req: Request, ns: str, name: str) -> Reply:
        """Raise the job's gang priority until the boost expires (then `expire_boosts` puts
        the priority it had back). Read fresh and written with its resourceVersion, so a
        concurrent change of the Workload is never overwritten (retried on conflict)."""
        body = read_body(models.Boost, req.body, f"boost of job {ns}/{name}")
        dry = dry_run(req.param("dryRun"))
        self.ctx.authorize(req, Access("patch", "workloads", name, "phalanx.io", ns))
        self._workload(ns, name)
        kube = self.ctx.as_caller(req)
        path = f"{WORKLOADS.format(ns=ns)}/{name}"
        for attempt in range(3):
            obj = call(kube, "GET", path, f"job {ns}/{name}").body
            meta = obj.get("metadata") or {}
            groups = (obj.get("spec") or {}).get("gangGroups") or []
            current = int((groups[:1] or [{}])[0].get("priority") or 0)
            extending = bool(_boost(meta)) and body.newPriority == current  # a running boost, longer
            if body.newPriority <= current and not extending:
                raise ApiError(
                    400,
                    f"job {ns}/{name}: newPriority {body.newPriority} does not raise its priority {current}",
                    causes=[{"field": "newPriority", "message": f"must be above the job's priority {current}"}],
                )
            record = _boost(meta)
            previous = record["previousPriority"] if isinstance(record.get("previousPriority"), int) else current
            expires = datetime.now(UTC) + timedelta(seconds=models.seconds(body.duration))
            record = {
                "previousPriority": previous,
                "newPriority": body.newPriority,
                "expires": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "reason": body.reason,
                "approvedBy": body.approvedBy,
            }
            patch = {
                "metadata": {
                    "resourceVersion": meta.get("resourceVersion"),
                    "annotations": {convert.BOOST_ANNOTATION: orjson.dumps(record).decode()},
                },
                "spec": {"gangGroups": [{**g, "priority": body.newPriority} for g in groups]},
            }
            try:
                merge_patch(kube, path, f"job {ns}/{name}", patch, dry=dry)
                break
            except ApiError as e:
                if e.code != 409 or attempt == 2:
                    raise
        pods = [p for p in self._job_pods(ns, name) if p.active]
        position = self._job_position(ns, name, pods, body.newPriority, self._queue(pods[0])) if pods else None
        if pods and all(p.node for p in pods):
            position = None  # running: in no queue
        return ok(
            200,
            {
                "previousPriority": previous,
                "newPriority": body.newPriority,
                "boostExpires": record["expires"],
                "newQueuePosition": position,
                "dryRun": dry,
            },
        )

    def expire_boosts(self, now: datetime | None = None) -> int:
        """Put back the priority of API jobs whose boost ran out, with Phalanx's own
        credentials (the caller who boosted was allowed to, for that long). The record is on
        the Workload, where whoever may patch it may write it too: so this write only ever
        lowers a priority (to the record's previous one, never above the current), and a
        record that does not parse is ignored. The count reverted."""
        now_text = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
        done = 0
        with self.ctx.gangs.objects.lock:
            workloads = list(self.ctx.gangs.objects.objects.get(WORKLOAD, {}).values())
        for obj in workloads:
            meta = obj.get("metadata") or {}
            boost = _boost(meta)
            if not boost or (meta.get("labels") or {}).get(convert.KIND_LABEL) != "job":
                continue
            expires, previous = boost.get("expires"), boost.get("previousPriority")
            if not isinstance(expires, str) or not isinstance(previous, int) or isinstance(previous, bool):
                continue
            if expires > now_text:
                continue
            groups = [g for g in (obj.get("spec") or {}).get("gangGroups") or [] if isinstance(g, dict)]
            current = [int(g["priority"]) if isinstance(g.get("priority"), int) else 0 for g in groups]
            patch = {
                "metadata": {
                    "resourceVersion": meta.get("resourceVersion"),
                    "annotations": {convert.BOOST_ANNOTATION: None},
                },
                "spec": {
                    "gangGroups": [{**g, "priority": min(previous, c)} for g, c in zip(groups, current, strict=True)]
                },
            }
            path = f"{WORKLOADS.format(ns=meta.get('namespace', ''))}/{meta.get('name', '')}"
            try:
                merge_patch(self.ctx.kube, path, "boost expiry", patch)
                done += 1
                log.info("job boost expired", job=f"{meta.get('namespace')}/{meta.get('name')}")
            except ApiError as e:  # a conflict (the cache lags): the next tick tries again
                log.warning("boost expiry not written", job=meta.get("name"), error=e.message)
        return done

    # ------------------------------------------------------------------ preemption

    def preempt(self, req: Request, ns: str) -> Reply:
        """An administrator's preemption of an allocation or job: its whole gang, through the
        Eviction API with the caller's token (budgets hold); all members are first evicted in
        dry run, so a refusal evicts nobody."""
        body = read_body(models.Preemption, req.body, f"preemption in {ns}")
        dry = dry_run(req.param("dryRun"))
        self.ctx.authorize(req, Access("create", "pods", "", "", ns, subresource="eviction"))
        target = self.ctx.pod(ns, body.targetAllocation)
        members: list[PodInfo]
        if target is not None:
            key = self.ctx.gangs.gang_of(target)
            members = self.ctx.gangs.membership.member_pods(key) if key else [target]
        else:
            members = [p for p in self._job_pods(ns, body.targetAllocation) if p.active]
        members = [p for p in members if p.active]
        if not members:
            raise ApiError(404, f"no allocation or job {body.targetAllocation!r} in namespace {ns!r}")
        kube = self.ctx.as_caller(req)
        grace = body.gracePeriodSeconds if body.gracePeriodSeconds is not None else 30
        for final in (False, True) if not dry else (False,):
            for pod in members:
                evict: JSON = {
                    "apiVersion": "policy/v1",
                    "kind": "Eviction",
                    "metadata": {"name": pod.name, "namespace": ns},
                    "deleteOptions": {"gracePeriodSeconds": grace, "preconditions": {"uid": pod.uid}},
                }
                if not final:
                    evict["deleteOptions"]["dryRun"] = ["All"]
                try:
                    call(
                        kube,
                        "POST",
                        f"/api/v1/namespaces/{ns}/pods/{pod.name}/eviction",
                        f"eviction of {pod.key}",
                        body=evict,
                    )
                except ApiError as e:
                    if e.code == 404:
                        continue
                    if final:
                        log.warning("preemption: eviction refused after its dry run", pod=pod.key, reason=e.message)
                        continue
                    raise
                if final:
                    self.evictions.add(
                        ns, pod.name, pod.node, f"Preempted by an administrator: {body.reason}"[:512], grace
                    )
        freed: dict[str, float] = {}
        for pod in members:
            if pod.node:
                for k, v in _amounts(pod).items():
                    freed[k] = freed.get(k, 0.0) + v
        now = time.time()
        return ok(
            200 if dry else 201,
            {
                "preemptionId": f"preempt-{uuid.uuid4().hex[:12]}",
                "targetAllocation": body.targetAllocation,
                "status": "DryRun" if dry else "Initiated",
                "evicted": [p.name for p in members],
                "gracePeriodEnds": datetime.fromtimestamp(now + grace, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "resourcesFreed": _shown(freed),
                "initiatedBy": body.initiatedBy,
            },
        )


def _owner(name: str, meta: JSON) -> JSON:
    """The job's pods belong to its Workload (deleting it deletes them)."""
    return {
        "apiVersion": convert.WORKLOAD_API,
        "kind": "Workload",
        "name": name,
        "uid": meta.get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _spec(workload: JSON, ns: str) -> GangSpec:
    objects = GangObjects()
    obj = {**workload, "metadata": {**workload["metadata"], "namespace": ns}}
    objects.replace(WORKLOAD, [obj])
    spec = definition_spec(objects, WORKLOAD, obj)
    if spec is None:
        raise ApiError(400, "the gang's Workload cannot be read")
    if not spec.enabled:  # gangMode Off: each member alone; plan them together all the same
        return GangSpec(
            spec.key,
            ns,
            WORKLOAD,
            spec.owner,
            min_count=1,
            count=spec.count,
            timeout_s=spec.timeout_s,
            topology=spec.topology,
            priority=spec.priority,
        )
    return spec


def _single(pod: PodInfo) -> GangSpec:
    return GangSpec(
        GangName(f"api:{pod.key}"),
        pod.namespace,
        ("", "Pod"),
        {},
        min_count=1,
        count=1,
        timeout_s=60,
        topology=TopologyRequest(),
    )


def _pod_info(pod: JSON) -> PodInfo:
    """A pod not created yet, as the cache would keep it (a made-up uid and this second)."""
    meta = pod["metadata"]
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return pod_info({**pod, "metadata": {**meta, "uid": f"dry-run-{uuid.uuid4()}", "creationTimestamp": now}})


def _fields_match(pod: PodInfo, fields: list[FieldRequirement]) -> bool:
    for f in fields:
        value = {
            "metadata.name": pod.name,
            "metadata.namespace": pod.namespace,
            "status.phase": convert.phase(pod),
            "status.nodeName": pod.node,
        }[f.path]
        if (value == f.value) != f.equal:
            return False
    return True


def _watch_error(e: Exception, ns: str) -> ApiError:
    from extender.kube import ApiError as KubeError
    from extender.kube import Expired

    if isinstance(e, Expired):
        return ApiError(410, "resourceVersion too old: list again and watch from the list's resourceVersion")
    if isinstance(e, KubeError):
        body = e.body
        text = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
        code = e.status if e.status in (400, 401, 403, 404) else 503
        return ApiError(code, f"watch of allocations in {ns}: {text[:512]}")
    return ApiError(
        503, f"watch of allocations in {ns}: the API server is unreachable: {e}", headers=(("Retry-After", "1"),)
    )


def _amounts(pod: PodInfo) -> dict[str, float]:
    d = pod.demand
    gpus = d.count * (1.0 if not d.memory_mib and d.milli >= 1000 else d.milli / 1000)
    return {"cpu": pod.requests.cpu_milli / 1000, "memory": pod.requests.memory_mib / 1024, "nvidia.com/gpu": gpus}


def _shown(amounts: dict[str, float]) -> dict[str, str]:
    out = {}
    for k, v in amounts.items():
        if k == "cpu":
            out[k] = f"{round(v * 1000)}m"
        elif k == "memory":
            out[k] = f"{v:g}Gi"
        else:
            out[k] = f"{v:g}"
    return out


def _boost(meta: JSON) -> JSON:
    text = (meta.get("annotations") or {}).get(convert.BOOST_ANNOTATION)
    if not text:
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
