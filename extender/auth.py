"""Who may read or change what through the extender's REST API: Kubernetes tokens and RBAC.

Every `/api/v1` call carries `Authorization: Bearer <token>`, a token the API server issued (a
service account's, a user's). The API server says who it is (TokenReview) and whether RBAC lets
that user make the call (SubjectAccessReview: `create`/`delete` for writes, `get` for one object
and `list` for a collection for reads, on a `phalanx.io` resource such as `workloadtypes` or
`gangs`, namespaced for gangs, or on core `nodes` for the node view), so operators grant it with
ordinary ClusterRoles (deploy/kubernetes ships `phalanx-viewer` and `phalanx-operator`):

    rules:
      - apiGroups: [phalanx.io]
        resources: [workloadtypes, stats]
        verbs: [create, delete]

Answers are cached for `ttl_s` (a token under attack costs the API server one review per
`ttl_s`, not one per request), at most `max_entries` of them; a refused or unknown token is
cached as well. The extender's own credentials need `create` on `tokenreviews` and
`subjectaccessreviews` (the built-in ClusterRole `system:auth-delegator`).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from extender.kube import Kube

log = structlog.get_logger("phalanx.auth")

GROUP = "phalanx.io"
#: The RBAC verb of each HTTP method that changes something.
WRITE_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
READ_METHODS = ("GET", "HEAD")


@dataclass(frozen=True, slots=True)
class Access:
    """One call as RBAC sees it: `verb` on `<group>/<resource>` (named `name`, or all; in
    `namespace`, or cluster-wide). Phalanx's own resources are in `phalanx.io`; a read of what
    the API server holds too (nodes) is checked against the API server's own resource."""

    verb: str
    resource: str
    name: str = ""
    group: str = GROUP
    namespace: str = ""
    subresource: str = ""  # e.g. "eviction" of pods

    def __str__(self) -> str:
        what = f"{self.verb} {self.group + '/' if self.group else ''}{self.resource}"
        what += f"/{self.subresource}" if self.subresource else ""
        return what + (f" {self.name!r}" if self.name else "") + (f" in {self.namespace!r}" if self.namespace else "")


@dataclass(frozen=True, slots=True)
class Denied:
    """Why a request is refused: 401 (who are you?), 403 (not you), 503 (cannot tell now)."""

    status: int
    message: str


class Authorizer(Protocol):
    def check(self, authorization: str | None, access: Access) -> Denied | None:
        """None when the request may go on."""
        ...


@dataclass(frozen=True, slots=True)
class User:
    name: str
    uid: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...]


class KubeAuthorizer:
    """TokenReview and SubjectAccessReview against the API server, with a bounded cache."""

    def __init__(self, kube: Kube, *, ttl_s: float = 10.0, max_entries: int = 4096) -> None:
        self.kube = kube
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._cache: OrderedDict[tuple[str, ...], tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def identify(self, authorization: str | None) -> User | Denied:
        """Who the token is (TokenReview, cached), or why not."""
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return Denied(401, "authentication required: send 'Authorization: Bearer <token>'")
        digest = hashlib.sha256(token.encode()).hexdigest()
        try:
            user = self._cached(("user", digest), lambda: self._review(token))
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("credentials not verified", error=str(e))
            return Denied(503, f"cannot verify credentials now: {e}")
        return user if user is not None else Denied(401, "the API server did not authenticate this token")

    def check(self, authorization: str | None, access: Access) -> Denied | None:
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return Denied(401, f"authentication required to {access}: send 'Authorization: Bearer <token>'")
        digest = hashlib.sha256(token.encode()).hexdigest()
        try:
            user = self._cached(("user", digest), lambda: self._review(token))
            if user is None:
                return Denied(401, "the API server did not authenticate this token")
            key = (
                "sar",
                digest,
                access.verb,
                access.group,
                access.resource,
                access.subresource,
                access.namespace,
                access.name,
            )
            allowed, reason = self._cached(key, lambda: self._allowed(user, access))
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("credentials not verified", error=str(e))
            return Denied(503, f"cannot verify credentials now: {e}")
        if not allowed:
            return Denied(403, f"user {user.name!r} may not {access}" + (f": {reason}" if reason else ""))
        return None

    def _cached(self, key: tuple[str, ...], compute: Any) -> Any:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] > now:
                return hit[1]
        value = compute()
        with self._lock:
            self._cache[key] = (now + self.ttl_s, value)
            self._cache.move_to_end(key)
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return value

    def _review(self, token: str) -> User | None:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        r = self.kube.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", body=body)
        if r.status not in (200, 201):
            raise OSError(f"TokenReview answered {r.status}: {_message(r.body)}")
        status = (r.body or {}).get("status") or {}
        if not status.get("authenticated"):
            return None
        u = status.get("user") or {}
        extra = tuple(sorted((str(k), tuple(map(str, v or ()))) for k, v in (u.get("extra") or {}).items()))
        return User(str(u.get("username", "")), str(u.get("uid", "")), tuple(map(str, u.get("groups") or ())), extra)

    def _allowed(self, user: User, access: Access) -> tuple[bool, str]:
        attributes = {"group": access.group, "resource": access.resource, "verb": access.verb}
        if access.name:
            attributes["name"] = access.name
        if access.namespace:
            attributes["namespace"] = access.namespace
        if access.subresource:
            attributes["subresource"] = access.subresource
        spec = {
            "user": user.name,
            "uid": user.uid,
            "groups": list(user.groups),
            "extra": {k: list(v) for k, v in user.extra},
            "resourceAttributes": attributes,
        }
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        r = self.kube.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=body)
        if r.status not in (200, 201):
            raise OSError(f"SubjectAccessReview answered {r.status}: {_message(r.body)}")
        status = (r.body or {}).get("status") or {}
        return bool(status.get("allowed")), str(status.get("reason") or "")


def _message(body: Any) -> str:
    return str(body.get("message", "")) if isinstance(body, dict) else str(body)[:200]
