"""What the allocation API's handlers share: the cache, the gang manager, the queues, the API
server (as Phalanx and as each caller), authorisation and the API's own configuration."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from extender.api.core import ApiError
from extender.auth import Access, Authorizer
from extender.cache import Cache
from extender.config import ApiConfig
from extender.gangs.manager import GangManager
from extender.kube import Kube, Response, Unreachable
from extender.objects import PodInfo
from extender.queues import QueueBook
from extender.server import Request

JSON = dict[str, Any]


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

    def authorize(self, req: Request, access: Access) -> None:
        denied = self.authorizer.check(req.headers.get("authorization"), access)
        if denied is not None:
            raise ApiError(denied.status, denied.message)

    def as_caller(self, req: Request) -> Kube:
        return self.caller(req.headers.get("authorization", ""))

    def pods(self, namespace: str = "") -> list[PodInfo]:
        """Active or finished pods a Phalanx scheduler places, in `namespace` ("" for all)."""
        scheduler = self.config().scheduler_name
        pods = self.cache.pods(self.cache.pod_uids())
        return [p for p in pods if p.scheduler == scheduler and (not namespace or p.namespace == namespace)]

    def pod(self, namespace: str, name: str) -> PodInfo | None:
        return next((p for p in self.pods(namespace) if p.name == name), None)


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
