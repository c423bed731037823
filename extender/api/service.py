"""The allocation API's routes: one table of (method, path pattern) -> handler, the per-tenant
rate limit, the in-flight limit (503 past it) and the OpenAPI document (`/openapi.json`, made
from the request models).

Every handler answers JSON or a Status; nothing a client sends ends in a 500 that is not a
defect (each such is logged with its request and counted).
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote

import orjson
import structlog
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from extender.api import models
from extender.api.admin import Monitoring, Nodes, Quotas
from extender.api.allocations import Allocations
from extender.api.context import Context
from extender.api.core import ApiError, RateLimiter
from extender.api.monitor import SAMPLE_S, EvictionLog, Latencies, UsageHistory
from extender.auth import Access, Denied
from extender.objects import PodInfo
from extender.server import Reply, Request, Route, _no_handler

log = structlog.get_logger("phalanx.api")

Handler = Callable[..., Reply]
CLIENT_FACTOR = 10  # a client address may make this many callers' worth of requests
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class Endpoint:
    method: str
    pattern: str  # below /api/v1, {name} segments
    handler: Handler
    summary: str
    body: type[BaseModel] | None = None
    stream: bool = False  # may answer a server-sent event stream (watch=true)

    def match(self, segments: list[str]) -> dict[str, str] | None:
        pattern = self.pattern.split("/")
        if len(pattern) != len(segments):
            return None
        args = {}
        for want, got in zip(pattern, segments, strict=True):
            if want.startswith("{"):
                if not _NAME.match(got):
                    return None
                args[want[1:-1]] = got
            elif want != got:
                return None
        return args


class AllocationApi:
    def __init__(self, ctx: Context, node_view: Callable[[str], tuple[int, Any]] | None = None) -> None:
        self.ctx = ctx
        self.node_view = node_view  # the read API's node view (GET /api/v1/nodes/{name})
        self.evictions = EvictionLog()
        self.usage = UsageHistory()
        self.latencies = Latencies()
        self.allocations = Allocations(ctx, self.evictions)
        self.quotas = Quotas(ctx, self.usage)
        self.nodes = Nodes(
            ctx, self.evictions, requeue=self.allocations.requeue_job, watchers=self.allocations.watchers
        )
        self.monitoring = Monitoring(ctx, self.usage, self.latencies, self.evictions)
        config = ctx.config()
        self.limiter = RateLimiter(config.requests_per_minute, config.burst)
        self.clients = RateLimiter(CLIENT_FACTOR * config.requests_per_minute, CLIENT_FACTOR * config.burst)
        self._limits = (config.requests_per_minute, config.burst, config.max_in_flight)
        self.in_flight = threading.BoundedSemaphore(config.max_in_flight)
        self._last_sample = 0.0
        self._openapi: bytes | None = None
        self._applying = threading.local()
        self._last_expiry = 0.0
        a, q, n, m = self.allocations, self.quotas, self.nodes, self.monitoring
        ns = "namespaces/{namespace}"
        self.endpoints = [
            Endpoint(
                "POST",
                f"{ns}/allocations",
                a.create,
                "Submit an allocation (a pod; a gang with gangScheduling.groupId)",
                models.Allocation,
            ),
            Endpoint(
                "GET",
                f"{ns}/allocations",
                a.list_or_watch,
                "List allocations (labelSelector, fieldSelector, limit, continue) or watch them (watch=true)",
                stream=True,
            ),
            Endpoint(
                "POST",
                f"{ns}/allocations/bulk-release",
                a.bulk_release,
                "Release every allocation a label selector picks",
                models.BulkRelease,
            ),
            Endpoint("GET", f"{ns}/allocations/{{name}}", a.get, "An allocation's status"),
            Endpoint(
                "DELETE",
                f"{ns}/allocations/{{name}}",
                a.delete,
                "Release an allocation (graceful)",
                models.DeleteOptions,
            ),
            Endpoint(
                "POST", f"{ns}/jobs", a.submit_job, "Submit a job: a Workload gang of parallelism pods", models.Job
            ),
            Endpoint("GET", f"{ns}/jobs/{{name}}", a.job_status, "A job's status with its pods' placement"),
            Endpoint("GET", f"{ns}/jobs/{{name}}/status", a.job_status, "A job's status with its pods' placement"),
            Endpoint(
                "POST",
                f"{ns}/jobs/{{name}}/cancel",
                a.cancel_job,
                "Cancel a job (its pods and Workload)",
                models.Cancel,
            ),
            Endpoint(
                "POST", f"{ns}/jobs/{{name}}/boost", a.boost_job, "Raise a job's priority for a while", models.Boost
            ),
            Endpoint(
                "POST",
                f"{ns}/preemptions",
                a.preempt,
                "Preempt an allocation's or job's whole gang (admin)",
                models.Preemption,
            ),
            Endpoint(
                "POST",
                f"{ns}/resourcequotas",
                q.create,
                "Create a quota (a Phalanx Queue for the namespace)",
                models.Quota,
            ),
            Endpoint("GET", f"{ns}/resourcequotas/{{name}}", q.get, "A quota"),
            Endpoint("GET", f"{ns}/resourcequotas/{{name}}/status", q.status, "A quota's usage, utilisation and trend"),
            Endpoint(
                "PATCH",
                f"{ns}/resourcequotas/{{name}}",
                q.patch,
                "Change a quota (merge patch; metadata.resourceVersion for optimistic concurrency)",
                models.QuotaPatch,
            ),
            Endpoint("GET", "nodes/{name}", self._node, "The extender's view of a node: free capacity, GPUs, holders"),
            Endpoint("PATCH", "nodes/{name}", n.patch, "Cordon or uncordon a node", models.NodePatch),
            Endpoint("POST", "nodes/{name}/drain", n.drain, "Drain a node, gang by gang", models.Drain),
            Endpoint("GET", "nodes/{name}/drain", n.drain_status, "A drain's progress"),
            Endpoint(
                "GET",
                "nodes/{name}/evictions",
                n.evictions_stream,
                "Eviction notices for a node (watch=true: a stream)",
                stream=True,
            ),
            Endpoint(
                "GET", "metrics/cluster/utilization", m.cluster, "Cluster utilisation and scheduling rate and latency"
            ),
            Endpoint(
                "GET", "metrics/tenants/{tenant}/usage", m.tenant, "A tenant's usage: current, peak, average, cost"
            ),
            Endpoint("GET", "metrics/queues", m.queues, "Queue depth and waits"),
        ]

    def routes(self) -> list[Route]:
        any_ = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
        prefixes = ("namespaces", "nodes", "metrics")
        return [
            Route(frozenset({"GET"}), "/openapi.json", lambda m, p, b: Reply(200, self.openapi())),
            *(
                Route(any_, f"/api/v1/{base}", _no_handler, prefix=True, max_body=2**20, on_request=self._under(base))
                for base in prefixes
            ),
        ]

    # ------------------------------------------------------------------ dispatch

    def _under(self, base: str) -> Callable[[Request], Reply]:
        return lambda req: self.handle(req, base + req.path)

    def handle(self, req: Request, path: str) -> Reply:
        """`path`: below /api/v1."""
        started = time.perf_counter()
        try:
            endpoint, args = self._match(req.method, path)
            in_flight = self.in_flight  # the ConfigMap may replace it meanwhile
            if not in_flight.acquire(blocking=False):
                raise ApiError(
                    503,
                    "the API is serving as many requests as it may; retry in a second",
                    headers=(("Retry-After", "1"),),
                )
            try:
                # Per client address first (what a flood of made-up tokens meets before any
                # TokenReview), then who (a cached review): the caller's own budget per
                # namespace, so no one spends another tenant's requests.
                self.clients.take(f"client {req.client}")
                user = self._identify(req)
                headers = self.limiter.take(f"{args.get('namespace') or args.get('tenant') or '-'}/{user}")
                reply = endpoint.handler(req, *args.values())
            finally:
                in_flight.release()
            if headers and reply.stream is None:
                reply = Reply(reply.status, reply.body, reply.content_type, headers=reply.headers + headers)
            return reply
        except ApiError as e:
            return e.reply()
        except Exception as e:
            log.exception("allocation API call failed", method=req.method, path=path[:200])
            return ApiError(500, f"internal error serving {req.method} {path[:200]}: {type(e).__name__}: {e}").reply()
        finally:
            log.debug(
                "api call", method=req.method, path=path[:200], ms=round(1000 * (time.perf_counter() - started), 2)
            )

    def _node(self, req: Request, name: str) -> Reply:
        self.ctx.authorize(req, Access("get", "nodes", name, ""))
        if self.node_view is None:
            raise ApiError(404, f"no node view here ({name!r})")
        status, body = self.node_view(name)
        if status != 200:
            message = body.get("error") if isinstance(body, dict) else None
            raise ApiError(status, str(message or f"node {name!r}: HTTP {status}"), details={"name": name})
        return Reply(status, orjson.dumps(body))

    def _identify(self, req: Request) -> str:
        identify = getattr(self.ctx.authorizer, "identify", None)
        if identify is None or not req.headers.get("authorization"):
            return _caller(req)  # no token: the handler's check answers 401 naming what was asked
        who = identify(req.headers.get("authorization"))
        if isinstance(who, Denied):
            raise ApiError(who.status, who.message)
        return str(who.name)

    def _match(self, method: str, path: str) -> tuple[Endpoint, dict[str, str]]:
        segments = [unquote(p) for p in path.strip("/").split("/")]
        allowed = []
        for endpoint in self.endpoints:
            args = endpoint.match(segments)
            if args is None:
                continue
            if endpoint.method == method:
                return endpoint, args
            allowed.append(endpoint.method)
        if allowed:
            raise ApiError(
                405, f"{method} is not allowed on /api/v1/{path[:200]}; allowed: {', '.join(sorted(set(allowed)))}"
            )
        raise ApiError(404, f"no such API path: /api/v1/{path[:200]}")

    # ------------------------------------------------------------------ background

    def tick(self, *, leading: bool = True) -> None:
        """Every second from the extender's sweep: usage samples once a minute; boosts that
        ran out are put back (by the leader only: a standby writes nothing)."""
        now = time.time()
        if now - self._last_sample >= SAMPLE_S:
            self._last_sample = now
            self.usage.sample(self.ctx.pods())
        if leading and now - self._last_expiry >= 2.0:
            self._last_expiry = now
            self.allocations.expire_boosts()
        config = self.ctx.config()
        limits = (config.requests_per_minute, config.burst, config.max_in_flight)
        if limits != self._limits:  # the ConfigMap changed them
            self._limits = limits
            self.limiter = RateLimiter(config.requests_per_minute, config.burst)
            self.clients = RateLimiter(CLIENT_FACTOR * config.requests_per_minute, CLIENT_FACTOR * config.burst)
            self.in_flight = threading.BoundedSemaphore(config.max_in_flight)

    @contextmanager
    def applying(self, resource_version: str) -> Iterator[None]:
        """Around the cache's application of one pod event of the extender's pod watch (the
        app's): the changes it makes go into the watch history at that version."""
        with self.ctx.events.lock:
            self._applying.rv = resource_version
            try:
                yield
            finally:
                self._applying.rv = ""

    def relisted(self, resource_version: str) -> None:
        self.ctx.events.reset(resource_version)

    def pod_changed(self, old: PodInfo | None, new: PodInfo | None) -> None:
        """The cache's listener (under its lock: record only), for every real change of a pod
        (status chatter the cache skips is no change of an allocation either)."""
        scheduler = self.ctx.config().scheduler_name
        if new is not None and new.node and (old is None or not old.node) and new.scheduler == scheduler:
            self.latencies.bound(new, new.labels.get("phalanx.io/queue", ""))
        rv = getattr(self._applying, "rv", "")
        pod = new if new is not None else old
        if not rv or pod is None or pod.scheduler != scheduler:
            return  # a relist (the history restarts) or another scheduler's pod
        if new is None:
            self.ctx.events.add("DELETED", replace(pod, resource_version=rv), rv)
        else:
            self.ctx.events.add("ADDED" if old is None else "MODIFIED", new, rv)

    def stop(self) -> None:
        self.allocations.stopping.set()
        self.nodes.stopping.set()

    # ------------------------------------------------------------------ OpenAPI

    def openapi(self) -> bytes:
        """The document, made once (the route table does not change)."""
        if self._openapi is None:
            self._openapi = self._make_openapi()
        return self._openapi

    def _make_openapi(self) -> bytes:
        bodies = sorted({e.body for e in self.endpoints if e.body is not None}, key=lambda m: m.__name__)
        _, defs = models_json_schema([(m, "validation") for m in bodies], ref_template="#/components/schemas/{model}")
        status = {"$ref": "#/components/schemas/Status"}
        schemas = {**defs.get("$defs", {}), "Status": _STATUS}
        paths: dict[str, dict[str, Any]] = {}
        for e in self.endpoints:
            op: dict[str, Any] = {
                "summary": e.summary,
                "operationId": e.method.lower() + "_" + re.sub(r"[^a-z0-9]+", "_", re.sub(r"[{}]", "", e.pattern)),
                "security": [{"bearer": []}],
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": {}}},
                    **{
                        str(c): {"description": d, "content": {"application/json": {"schema": status}}}
                        for c, d in _ERRORS
                    },
                },
            }
            if e.stream:
                op["responses"]["200"]["content"]["text/event-stream"] = {}
            if e.body is not None:
                op["requestBody"] = {
                    "required": e.method == "POST"
                    and e.body not in (models.Cancel, models.Drain, models.DeleteOptions),
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{e.body.__name__}"}}},
                }
            if e.method in ("POST", "PATCH", "DELETE"):
                op["parameters"] = [{"name": "dryRun", "in": "query", "schema": {"type": "string", "enum": ["All"]}}]
            paths.setdefault("/api/v1/" + e.pattern, {})[e.method.lower()] = op
        doc = {
            "openapi": "3.1.0",
            "info": {"title": "Phalanx allocation API", "version": "v1"},
            "paths": paths,
            "components": {"schemas": schemas, "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        }
        return orjson.dumps(doc)


_ERRORS = (
    (400, "invalid request: every invalid field named in details.causes"),
    (401, "no token, or one the API server does not accept"),
    (403, "RBAC refuses it, or a quota's hard limit"),
    (404, "not found"),
    (409, "conflict: stale resourceVersion or exists already"),
    (422, "can never be placed on this cluster: the solver's explanation"),
    (429, "rate limit (X-RateLimit-*, Retry-After)"),
    (503, "overloaded or the API server unreachable (Retry-After)"),
)
_STATUS = {
    "type": "object",
    "properties": {
        "kind": {"const": "Status"},
        "apiVersion": {"type": "string"},
        "status": {"const": "Failure"},
        "code": {"type": "integer"},
        "reason": {"type": "string"},
        "message": {"type": "string"},
        "details": {"type": "object"},
    },
    "required": ["kind", "code", "reason", "message"],
}


def _caller(req: Request) -> str:
    token = req.headers.get("authorization", "")
    return "caller-" + hashlib.sha256(token.encode()).hexdigest()[:12] if token else "anonymous"
