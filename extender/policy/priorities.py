"""The cluster's PriorityClasses as admission needs them: a defaulted `priorityClass` is written
with its value and preemption policy (the API server's Priority admission ran before the
webhooks), and the globalDefault class a pod got from that admission counts as no class.

Listed at most every `TTL_S` seconds, on demand (admission of a pod whose priorityClass is
defaulted); a failed list keeps the last one.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import structlog

from extender.kube import Kube

log = structlog.get_logger("phalanx.policy.priorities")

PATH = "/apis/scheduling.k8s.io/v1/priorityclasses"
TTL_S = 30.0


@dataclass(frozen=True, slots=True)
class PriorityClass:
    value: int
    preemption_policy: str = "PreemptLowerPriority"


@dataclass(frozen=True, slots=True)
class Index:
    classes: dict[str, PriorityClass] = field(default_factory=dict)
    global_default: str = ""


class PriorityClasses:
    def __init__(self, kube: Kube, ttl_s: float = TTL_S) -> None:
        self.kube = kube
        self.ttl_s = ttl_s
        self._index = Index()
        self._at = float("-inf")
        self._lock = threading.Lock()

    def __call__(self) -> Index:
        with self._lock:
            if time.monotonic() - self._at < self.ttl_s:
                return self._index
            self._at = time.monotonic()
            try:
                r = self.kube.request("GET", PATH)
            except Exception as e:  # the API server unreachable: the last list stands
                log.warning("priority classes not listed", error=str(e))
                return self._index
            if r.status == 200 and isinstance(r.body, dict):
                self._index = index(r.body.get("items") or [])
            return self._index


def index(items: list[dict[str, object]]) -> Index:
    classes: dict[str, PriorityClass] = {}
    default = ""
    for item in items:
        meta = item.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        value = item.get("value")
        if not isinstance(name, str) or not isinstance(value, int):
            continue
        policy = item.get("preemptionPolicy")
        classes[name] = PriorityClass(value, policy if isinstance(policy, str) else "PreemptLowerPriority")
        if item.get("globalDefault") is True:
            default = name
    return Index(classes, default)
