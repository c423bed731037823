"""Who may call the agent: the caller's Kubernetes bearer token (gRPC metadata
`authorization: Bearer <token>`), reviewed by the API server (TokenReview), and RBAC on the
resource `nodeagents.phalanx.io` named after the node (SubjectAccessReview):

    BindAllocation  -> create     EvictAllocation -> delete
    GetResourceSnapshot, Heartbeat -> get

The extender's ClusterRole grants these (deploy/kubernetes, the chart). Answers are cached for
`ttl_s`, refusals included, so a caller hammering with a bad token costs the API server one
review per `ttl_s`.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass

from agent.kube import Kube

GROUP = "phalanx.io"
RESOURCE = "nodeagents"


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    code: str = ""  # "Unauthenticated" or "PermissionDenied" when refused
    message: str = ""


class Reviewer:
    def __init__(self, kube: Kube, node: str, *, ttl_s: float = 10.0, max_entries: int = 1024) -> None:
        self.kube = kube
        self.node = node
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], tuple[float, Verdict]] = {}

    def check(self, authorization: str | None, verb: str) -> Verdict:
        if not authorization or not authorization.startswith("Bearer ") or len(authorization) > 8192:
            return Verdict(False, "Unauthenticated", "a bearer token is required (metadata authorization)")
        token = authorization[len("Bearer ") :].strip()
        key = (hashlib.sha256(token.encode()).hexdigest(), verb)
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and now - hit[0] < self.ttl_s:
                return hit[1]
        verdict = self._review(token, verb)
        if verdict.code == "Unavailable":
            return verdict  # the API server's hiccup is not the caller's answer
        with self._lock:
            if len(self._cache) >= self.max_entries:
                self._cache.clear()
            self._cache[key] = (now, verdict)
        return verdict

    def _review(self, token: str, verb: str) -> Verdict:
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        try:
            status = (self.kube.ok("POST", "/apis/authentication.k8s.io/v1/tokenreviews", body=review) or {}).get(
                "status"
            ) or {}
        except Exception as e:  # the API server unreachable: refuse, do not cache long
            return Verdict(False, "Unavailable", f"token review failed: {e}")
        if not status.get("authenticated"):
            return Verdict(False, "Unauthenticated", "the token is not valid")
        user = status.get("user") or {}
        spec = {
            "user": user.get("username", ""),
            "uid": user.get("uid", ""),
            "groups": user.get("groups") or [],
            "extra": user.get("extra") or {},
            "resourceAttributes": {"group": GROUP, "resource": RESOURCE, "verb": verb, "name": self.node},
        }
        sar = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        try:
            answer = (self.kube.ok("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=sar) or {}).get(
                "status"
            ) or {}
        except Exception as e:
            return Verdict(False, "Unavailable", f"access review failed: {e}")
        if not answer.get("allowed"):
            who = user.get("username", "?")
            return Verdict(False, "PermissionDenied", f"{who} may not {verb} {RESOURCE}.{GROUP} {self.node!r}")
        return Verdict(True)
