"""The membership index: which pods count toward which gang.

Kept current by a cache listener (called under the cache's lock, so it takes only its own
leaf lock). A pod's gang key comes from its labels (Workload, PodGroup, other schedulers'
labels) or, for pods owned by a workload CRD, from a Resource Interface.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable

from extender.cache import Cache
from extender.gangs.ri_source import RISource
from extender.gangs.sources import gang_key
from extender.objects import PodInfo

Nudge = Callable[[str, str, str], None]  # (namespace, pod name, annotation value)


class Membership:
    def __init__(self, cache: Cache, ri: RISource | None = None, nudge: Nudge | None = None) -> None:
        self.cache = cache
        self.ri = ri
        self.nudge: Nudge = nudge or (lambda namespace, name, value: None)
        self._lock = threading.Lock()
        self._members: dict[str, set[str]] = defaultdict(set)  # gang key -> pod uids
        self._key_of: dict[str, str] = {}  # pod uid -> gang key it is counted under
        if ri is not None:
            ri.on_rekey = self.rekey
        cache.on_pod_change(self._pod_changed)

    def _pod_changed(self, old: PodInfo | None, new: PodInfo | None) -> None:
        either = new if new is not None else old
        if either is None:
            return
        key = self.key(new) if new is not None and new.active else ""
        with self._lock:
            previous = self._key_of.pop(either.uid, "")
            if previous:
                self._members[previous].discard(either.uid)
                if not self._members[previous]:
                    del self._members[previous]
            if key:
                self._members[key].add(either.uid)
                self._key_of[either.uid] = key

    def key(self, pod: PodInfo) -> str:
        """The pod's gang key from its own fields ("" for a pod of no gang)."""
        key = gang_key(pod.namespace, pod.labels, pod.scheduling_group)
        if not key and self.ri is not None:
            key = self.ri.key(pod)
        return key

    def gang_of(self, pod: PodInfo) -> str:
        with self._lock:
            known = self._key_of.get(pod.uid)
        return known if known is not None else self.key(pod)

    def rekey(self, uids: set[str]) -> None:
        """Pods whose RI owner just appeared: compute their gang again, and wake them."""
        pods = self.cache.pods(uids)
        for pod in pods:
            self._pod_changed(pod, pod)
        for pod in pods:
            if not pod.node:
                self.nudge(pod.namespace, pod.name, f"owner:{time.time():.0f}")

    def member_pods(self, key: str) -> list[PodInfo]:
        """The gang's active members, oldest first."""
        with self._lock:
            uids = list(self._members.get(key, ()))
        return sorted((p for p in self.cache.pods(uids) if p.active), key=lambda p: (p.created, p.name))

    def gang_keys(self) -> set[str]:
        """Every gang key with a member."""
        with self._lock:
            return set(self._members)

    def has_members(self, key: str) -> bool:
        with self._lock:
            return bool(self._members.get(key))
