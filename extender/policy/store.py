"""The WorkloadPolicy objects Phalanx enforces: parsed once when they change, the last good
version of each kept when a change is invalid, merged per scope on first use.

A policy whose spec does not parse is reported (an Event on the policy naming every invalid
field) and its previous valid version stays in force; a new policy that never parsed is not
enforced. Deleting a policy removes it. `effective(namespace, queue)` is cached per scope and
the cache is dropped on every change, so admission (which runs on every pod creation) costs a
dict lookup when nothing changed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import structlog

from extender.policy.evaluate import Effective, Policy, PolicyError, merge, parse_policy
from extender.policy.spec import Level

log = structlog.get_logger("phalanx.policy")

POLICIES_PATH = "/apis/phalanx.io/v1alpha1/workloadpolicies"
MAX_MERGED = 4096  # (namespace, queue) merges kept
Report = Callable[[dict[str, Any], str, str], None]  # (object, reason, message): a Warning Event


class PolicyStore:
    def __init__(self, report: Report | None = None) -> None:
        self._lock = threading.Lock()
        self._policies: dict[str, Policy] = {}
        self._merged: dict[tuple[str, str], Effective] = {}
        self._rejected: dict[str, str] = {}  # name -> resourceVersion reported (once per version)
        self.report = report
        self.generation = 0

    def replace(self, items: Iterable[Mapping[str, Any]]) -> None:
        items = list(items)
        names = {str((o.get("metadata") or {}).get("name", "")) for o in items}
        with self._lock:
            for name in [n for n in self._policies if n not in names]:
                del self._policies[name]
            self._changed()
        for obj in items:
            self._put(obj)

    def event(self, kind: str, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if kind == "DELETED":
            with self._lock:
                self._policies.pop(name, None)
                self._rejected.pop(name, None)
                self._changed()
            return
        self._put(obj)

    def _put(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        spec = obj.get("spec")
        try:
            policy = parse_policy(name, spec if isinstance(spec, Mapping) else {})
        except PolicyError as e:
            version = str(meta.get("resourceVersion", ""))
            kept = name in self._policies
            if self._rejected.get(name) != version:
                self._rejected[name] = version
                kept_text = "its previous version stays in force" if kept else "not enforced"
                message = f"WorkloadPolicy {name} is invalid; {kept_text}: {e}"
                log.warning("invalid workload policy", policy=name, error=str(e))
                if self.report is not None:  # list items carry no kind: name it for the Event
                    ref = {"apiVersion": "phalanx.io/v1alpha1", "kind": "WorkloadPolicy", "metadata": dict(meta)}
                    self.report(ref, "InvalidWorkloadPolicy", message[:1024])
            return
        with self._lock:
            self._policies[name] = policy
            self._rejected.pop(name, None)
            self._changed()

    def _changed(self) -> None:
        self._merged = {}
        self.generation += 1

    def namespaces(self) -> frozenset[str] | None:
        """The namespaces some policy covers; None when one covers a queue or the cluster (a
        queue's workloads may be in any namespace). The webhooks are registered for these only:
        namespaces no policy covers never wait on Phalanx."""
        with self._lock:
            scopes = [p.scope for p in self._policies.values()]
        if any(s.level is not Level.NAMESPACE for s in scopes):
            return None
        return frozenset(s.name for s in scopes)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._policies)

    def effective(self, namespace: str, queue: str) -> Effective:
        """The merged policy for a workload in `namespace` and `queue`."""
        key = (namespace, queue)
        merged = self._merged.get(key)
        if merged is not None:
            return merged
        with self._lock:
            if len(self._merged) >= MAX_MERGED:  # queues come from user labels: keep it bounded
                self._merged = {}
            applicable = [p for p in self._policies.values() if p.scope.applies(namespace, queue)]
            merged = merge(applicable)
            self._merged[key] = merged
        return merged

    def __bool__(self) -> bool:
        return bool(self._policies)
