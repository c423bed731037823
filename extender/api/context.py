"""What the allocation API's handlers share: the cache, the gang manager, the queues, the API
server (as Phalanx and as each caller), authorisation and the API's own configuration."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from extender.api.core import ApiError
from extender.api.events import Events
from extender.auth import Access, Authorizer
from extender.cache import Cache
from extender.config import ApiConfig
from extender.gangs.manager import GangManager
from extender.kube import Kube, Response, Unreachable
from extender.objects import PodInfo
from extender.queues import QueueBook
from extender.server import Request

JSON = dict[str, Any]


READ_S = 0.25  # how long one reading of the allocations serves reads
KEPT, KEPT_S = 16, 60.0  # readings kept for paged lists: at most these many, this long


@dataclass(frozen=True, slots=True)
class Reading:
    at: float  # monotonic, when built
    rv: str  # the resourceVersion it is at
    pods: tuple[PodInfo, ...]  # a Phalanx scheduler's, by namespace and name
    by_ns: dict[str, list[PodInfo]]
    by_key: dict[str, PodInfo]  # "namespace/name"
    id: int = 0  # its number in this process (a continue token names it)


@dataclass
class Context:
    cache: Cache
    gangs: GangManager
    queues: QueueBook
    kube: Kube  # Phalanx's own credentials: reads and what a caller authorised (boost expiry)
    caller: Callable[[str], Kube]  # the API server with a caller's Authorization header
    authorizer: Authorizer
    config: Callable[[], ApiConfig]
    pods_rv: Callable[[], str]  # the resourceVersion the cache's pods are at (a list's)
    events: Events = field(default_factory=Events)  # the pod events since the last list (watches)
    _reading: Reading | None = None
    _read_lock: threading.Lock = field(default_factory=threading.Lock)
    _kept: OrderedDict[int, Reading] = field(default_factory=OrderedDict)  # readings paged lists continue from
    _readings: int = 0

    def authorize(self, req: Request, access: Access) -> None:
        """RBAC on the underlying object. A named object is first checked without its name:
        allowed on every object of the kind is allowed on this one (RBAC only adds), and that
        answer is cached once per caller and namespace, not once per name."""
        authorization = req.headers.get("authorization")
        if access.name and self.authorizer.check(authorization, replace(access, name="")) is None:
            return
        denied = self.authorizer.check(authorization, access)
        if denied is not None:
            raise ApiError(denied.status, denied.message)

    def as_caller(self, req: Request) -> Kube:
        return self.caller(req.headers.get("authorization", ""))

    def read(self) -> Reading:
        """The allocations as of one resourceVersion, shared by the reads of the next
        `READ_S` (rebuilt once, however many requests come): a list of any page size costs
        the page, not the cluster. Built under the history's lock, so its version is exactly
        the state it holds (a watch from it misses nothing)."""
        now = time.monotonic()
        reading = self._reading
        if reading is not None and now - reading.at < READ_S:
            return reading
        with self._read_lock:
            reading = self._reading
            if reading is not None and time.monotonic() - reading.at < READ_S:
                return reading
            scheduler = self.config().scheduler_name
            rv, pods = self.events.snapshot(lambda: self.cache.pods(self.cache.pod_uids()))
            ours = sorted((p for p in pods if p.scheduler == scheduler), key=lambda p: (p.namespace, p.name))
            by_ns: dict[str, list[PodInfo]] = {}
            for p in ours:
                by_ns.setdefault(p.namespace, []).append(p)
            rv_text = str(rv) if rv else self.pods_rv()
            self._readings += 1
            reading = Reading(time.monotonic(), rv_text, tuple(ours), by_ns, {p.key: p for p in ours}, self._readings)
            self._reading = reading
            return reading

    def keep(self, reading: Reading) -> None:
        """Keep a reading a paged list continues from (about a minute; the newest few)."""
        with self._read_lock:
            self._kept[reading.id] = reading
            now = time.monotonic()
            while self._kept and (len(self._kept) > KEPT or next(iter(self._kept.values())).at < now - KEPT_S):
                self._kept.popitem(last=False)

    def reading_at(self, number: str) -> Reading | None:
        """The kept reading of that number (a paged list's later pages), if still kept."""
        if not (number.isascii() and number.isdigit() and len(number) <= 18):
            return None
        with self._read_lock:
            reading = self._kept.get(int(number))
            return reading if reading is not None and reading.at >= time.monotonic() - KEPT_S else None

    def pods(self, namespace: str = "") -> list[PodInfo]:
        """Active or finished pods a Phalanx scheduler places, in `namespace` ("" for all),
        by namespace and name (`read`)."""
        reading = self.read()
        return list(reading.by_ns.get(namespace, ()) if namespace else reading.pods)

    def fresh_pods(self, namespace: str) -> list[PodInfo]:
        """The namespace's pods as the cache holds them now (for a write that must not act on
        a reading's past)."""
        scheduler = self.config().scheduler_name
        pods = self.cache.pods(self.cache.pod_uids())
        return [p for p in pods if p.namespace == namespace and p.scheduler == scheduler]

    def pod(self, namespace: str, name: str) -> PodInfo | None:
        return self.read().by_key.get(f"{namespace}/{name}")


def call(kube: Kube, method: str, path: str, what: str, **kwargs: Any) -> Response:
    """A call to the API server whose refusal becomes the client's Status: 422 Invalid is a
    400 naming the fields; 409, 403, 404 keep their code; the API server's own trouble is 503."""
    try:
        r = kube.request(method, path, **kwargs)
    except (Unreachable, OSError) as e:
        raise ApiError(503, f"{what}: the API server is unreachable: {e}", headers=(("Retry-After", "1"),)) from None
    if r.status < 300:
        return r
    body = r.body if isinstance(r.body, dict) else {}
    message = str(body.get("message") or r.body)[:1024]
    if r.status == 422:
        causes = [
            {"field": str(c.get("field", "")), "message": str(c.get("message", ""))}
            for c in (body.get("details") or {}).get("causes") or []
            if isinstance(c, dict)
        ]
        raise ApiError(400, f"{what}: {message}", reason="Invalid", causes=causes)
    if r.status in (400, 401, 403, 404, 409, 410, 429):
        headers = (("Retry-After", "1"),) if r.status == 429 else ()
        raise ApiError(r.status, f"{what}: {message}", headers=headers)
    raise ApiError(503, f"{what}: the API server answered {r.status}: {message}", headers=(("Retry-After", "1"),))


def merge_patch(kube: Kube, path: str, what: str, patch: JSON, *, dry: bool = False) -> Response:
    """A JSON merge patch (`call`'s errors), in the API server's dry run when `dry`."""
    query = {"dryRun": "All"} if dry else None
    return call(kube, "PATCH", path, what, body=patch, content_type="application/merge-patch+json", query=query)
