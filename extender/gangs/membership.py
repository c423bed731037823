"""The membership index: which pods count toward which gang.

Kept current by a cache listener (called under the cache's lock, so it takes only its own
leaf lock). A pod's gang key comes from its labels (Workload, PodGroup, other schedulers'
labels), computed at once, or, for pods owned by a workload CRD, from a Resource Interface:
user-supplied jq, never run under the cache's lock. Such pods wait in `_unkeyed` and are keyed
(`settle`) with no lock held, before any read of the index and on the periodic sweep.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Protocol

from extender.cache import Cache
from extender.gangs.ri_source import RISource
from extender.gangs.sources import gang_key, stated_topology
from extender.objects import PodInfo
from solver import TopologyRequest


class Nudge(Protocol):
    """Wake a parked pod by writing `value` into its plan annotation (None: no wake-up);
    `nominate` (a node, or "" to clear) is written first as its status.nominatedNodeName
    (extender/gangs/notify.py)."""

    def __call__(self, namespace: str, name: str, value: str | None, nominate: str | None = None) -> None: ...


def no_nudge(namespace: str, name: str, value: str | None, nominate: str | None = None) -> None:
    return None


class Membership:
    def __init__(self, cache: Cache, ri: RISource | None = None, nudge: Nudge | None = None) -> None:
        self.cache = cache
        self.ri = ri
        self.nudge: Nudge = nudge or no_nudge
        self._lock = threading.Lock()
        self._members: dict[str, set[str]] = defaultdict(set)  # gang key -> pod uids
        self._key_of: dict[str, str] = {}  # pod uid -> gang key it is counted under
        # gang key -> how often its members changed, and the KAI topology they stated at a version:
        # filter asks for it per call, and only a change of the members recomputes it
        self._versions: dict[str, int] = defaultdict(int)
        self._stated: dict[str, tuple[int, TopologyRequest]] = {}
        self._unkeyed: dict[str, PodInfo] = {}  # owned pods whose Resource Interface key is due
        self._settling = threading.Lock()  # one settler: the others wait for its result
        if ri is not None:
            ri.on_rekey = self.rekey
        cache.on_pod_change(self._pod_changed)

    def _pod_changed(self, old: PodInfo | None, new: PodInfo | None) -> None:
        either = new if new is not None else old
        if either is None:
            return
        active = new is not None and new.active
        key = gang_key(new.namespace, new.labels, new.scheduling_group, new.annotations) if new and active else ""
        deferred = new is not None and active and not key and self.ri is not None and self.ri.may_key(new)
        with self._lock:
            self._unkeyed.pop(either.uid, None)
            if deferred:
                assert new is not None
                self._unkeyed[either.uid] = new  # keeps its current key until settled
            else:
                self._index(either.uid, key)

    def _index(self, uid: str, key: str) -> None:
        """Count `uid` under `key` ("" : under none). Under `_lock`."""
        previous = self._key_of.pop(uid, "")
        if previous:
            self._members[previous].discard(uid)
            self._versions[previous] += 1
            if not self._members[previous]:
                del self._members[previous], self._versions[previous]
                self._stated.pop(previous, None)
        if key:
            self._members[key].add(uid)
            self._key_of[uid] = key
            self._versions[key] += 1

    def settle(self) -> None:
        """Key the owned pods that changed since the last call (Resource Interface jq), with no
        lock held while jq runs, one settler at a time. A pod that changed again meanwhile, or
        left the cache, is not indexed from the stale read."""
        if not self._unkeyed or self.ri is None:
            return
        with self._settling:
            with self._lock:
                batch = dict(self._unkeyed)
            keys = {uid: self.ri.key(pod) for uid, pod in batch.items()}
            with self._lock:
                for uid, pod in batch.items():
                    if self._unkeyed.get(uid) is not pod:
                        continue  # changed again: the newer entry is keyed next time
                    del self._unkeyed[uid]
                    # The cache may hold a newer reading of an unchanged pod (a status-only
                    # change keeps the reading, at a new version, with no change event): equal
                    # readings key alike.
                    current = self.cache.pod(uid)
                    self._index(uid, keys[uid] if current is pod or current == pod else "")

    def key(self, pod: PodInfo) -> str:
        """The pod's gang key from its own fields ("" for a pod of no gang)."""
        key = gang_key(pod.namespace, pod.labels, pod.scheduling_group, pod.annotations)
        if not key and self.ri is not None:
            key = self.ri.key(pod)
        return key

    def gang_of(self, pod: PodInfo) -> str:
        self.settle()
        with self._lock:
            known = self._key_of.get(pod.uid)
        return known if known is not None else self.key(pod)

    def gangs_of(self, pods: list[PodInfo]) -> list[str]:
        """`gang_of` for many pods: one settle, one lock."""
        self.settle()
        with self._lock:
            known = [self._key_of.get(p.uid) for p in pods]
        return [k if k is not None else self.key(p) for k, p in zip(known, pods, strict=True)]

    def rekey(self, uids: set[str]) -> None:
        """Pods whose RI owner just appeared: compute their gang again, and wake them."""
        pods = self.cache.pods(uids)
        for pod in pods:
            self._pod_changed(pod, pod)
        self.settle()
        for pod in pods:
            if not pod.node:
                self.nudge(pod.namespace, pod.name, f"owner:{time.time():.0f}")

    def member_pods(self, key: str) -> list[PodInfo]:
        """The gang's active members, oldest first."""
        self.settle()
        with self._lock:
            uids = list(self._members.get(key, ()))
        return sorted((p for p in self.cache.pods(uids) if p.active), key=lambda p: (p.created, p.name))

    def stated_topology(self, key: str) -> TopologyRequest:
        """The KAI topology the gang's members state (`sources.stated_topology`), recomputed only
        when its members changed (a pod's update re-indexes it)."""
        with self._lock:
            version = self._versions.get(key, 0)
            cached = self._stated.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        topology = stated_topology(self.member_pods(key))
        with self._lock:
            if key in self._members and self._versions.get(key, 0) == version:
                self._stated[key] = (version, topology)
        return topology

    def gang_keys(self) -> set[str]:
        """Every gang key with a member."""
        self.settle()
        with self._lock:
            return set(self._members)

    def has_members(self, key: str) -> bool:
        self.settle()
        with self._lock:
            return bool(self._members.get(key))
