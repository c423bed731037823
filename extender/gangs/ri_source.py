"""Gangs from Resource Interface definitions: any workload CRD described with jq paths.

A pod belongs to an RI workload when its ownerReferences lead to an object of a registered
root kind: directly (PyTorchJob → pods), through watched child kinds (JobSet → Job → pods), or
through other pods and implicit intermediates (LeaderWorkerSet → StatefulSet → leader pod →
StatefulSet → workers; Deployment → ReplicaSet → pods). The walk uses only objects the extender
watches, by uid, so it is a few dictionary lookups and can run while the cache lock is held.

Its gang key is `ri:<namespace>/<root name>/<RI gang key>`, where the RI gang key is the pod
group and the values of its `groupByKeyPaths` (one compiled jq program per RI). A pod whose
owner chain stops at a watched kind not seen yet gets a waiting key and is re-keyed as soon as
that owner arrives, so a member is never scheduled alone for a lagging watch.

The gang's size comes from evaluating the root object (`ResourceInterface.evaluate`): members
expected from the spec and the framework's own minimum. Evaluations are memoised per root
version and gang, and redone only when the member count doubles, so a 512-pod gang costs a
handful of evaluations rather than one per member.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from extender.gangs.sources import DEFAULT_TIMEOUT_S, JSON, GangSpec, Resolution, stated_topology
from extender.objects import OwnerRef, PodInfo, owner_refs
from extender.ri.budget import REASON_BUDGET
from extender.ri.interface import ResourceInterface
from extender.ri.model import GVK, ComponentDef
from extender.ri.registry import Registry

PREFIX = "ri:"
WAITING_PREFIX = "ri-wait:"
BUDGET = "budget:"  # after WAITING_PREFIX: the pod's definition is switched off (jq over budget)
#: Kinds whose objects sit between a watched child and its pods without being named by RIs.
IMPLICIT = {GVK("apps", "v1", "Deployment"): GVK("apps", "v1", "ReplicaSet")}
MAX_DEPTH = 8
POD = GVK("", "v1", "Pod")


@dataclass(frozen=True, slots=True)
class _Sizing:
    min_count: int
    expected: int
    pods: int  # members the evaluation saw


class RISource:
    def __init__(self, registry: Registry, pods_by_uid: Callable[[str], PodInfo | None]) -> None:
        self.registry = registry
        self.pods_by_uid = pods_by_uid
        self.lock = threading.Lock()
        self.by_uid: dict[str, JSON] = {}  # every watched RI object (roots, children, intermediates)
        self.roots: dict[tuple[str, str, str], JSON] = {}  # (apiVersion, kind, ns/name) -> root object
        self.waiting: dict[str, set[str]] = defaultdict(set)  # owner uid -> pod uids keyed "waiting"
        self._sizing: dict[tuple[str, str, str], _Sizing] = {}  # (root uid, resourceVersion, key)
        self.on_rekey: Callable[[set[str]], None] = lambda uids: None
        self._watched_cache: tuple[int, frozenset[GVK]] = (-1, frozenset())

    # ------------------------------------------------------------------ objects

    def _watched(self) -> frozenset[GVK]:
        """`watched_kinds()`, recomputed only when the registry changes (the walk is hot)."""
        generation = self.registry.generation
        if self._watched_cache[0] != generation:
            self._watched_cache = (generation, self.watched_kinds())
        return self._watched_cache[1]

    def watched_kinds(self) -> frozenset[GVK]:
        """Root and child component kinds of every RI, plus implicit intermediates. Pods come
        from the cache; `additionalChildKinds` (Services, Secrets, ...) never own pods and are
        not watched, which keeps the extender's read access to workload kinds only."""
        kinds = {_component_gvk(c) for wt in self.registry.list() for ri in wt.interfaces for c in ri.components}
        kinds |= {IMPLICIT[k] for k in kinds if k in IMPLICIT}
        kinds.discard(POD)
        return frozenset(k for k in kinds if k.kind)

    def replace(self, gvk: GVK, items: list[JSON]) -> None:
        with self.lock:
            for uid in [u for u, o in self.by_uid.items() if _gvk_of(o, gvk) == gvk]:
                self._forget(self.by_uid[uid], gvk)
        for obj in items:
            self.event(gvk, "ADDED", obj)

    def event(self, gvk: GVK, kind: str, obj: JSON) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        obj.setdefault("apiVersion", gvk.api_version)
        obj.setdefault("kind", gvk.kind)
        with self.lock:
            if kind == "DELETED":
                self._forget(obj, gvk)
                return
            self.by_uid[uid] = obj
            if self.registry.lookup(gvk.group, gvk.version, gvk.kind) is not None:
                self.roots[(gvk.api_version, gvk.kind, f"{meta.get('namespace', '')}/{meta.get('name', '')}")] = obj
            woken = self.waiting.pop(uid, set())
        if woken:
            self.on_rekey(woken)

    def _forget(self, obj: JSON, gvk: GVK) -> None:
        meta = obj.get("metadata") or {}
        self.by_uid.pop(str(meta.get("uid", "")), None)
        self.roots.pop((gvk.api_version, gvk.kind, f"{meta.get('namespace', '')}/{meta.get('name', '')}"), None)

    # ------------------------------------------------------------------ keys

    def key(self, pod: PodInfo) -> str:
        """The pod's gang key ("" when no RI gang takes it). Runs the definition's jq: never
        call it under the cache's lock (gangs/membership.py keys owned pods outside it)."""
        if not pod.owners:
            return ""
        found = self._walk(pod)
        if found is None:
            return ""
        if isinstance(found, OwnerRef):
            with self.lock:
                self.waiting[found.uid].add(pod.uid)
            return f"{WAITING_PREFIX}{pod.namespace}/{found.kind}/{found.name}"
        ri, root = found
        gang = ri.gang_key(pod.obj)
        if gang is None and ri.breaker.tripped:  # its members must wait, never run as singles
            return f"{WAITING_PREFIX}{BUDGET}{pod.namespace}/{root.kind}/{root.name}"
        return f"{PREFIX}{pod.namespace}/{root.name}/{gang}" if gang else ""

    def may_key(self, pod: PodInfo) -> bool:
        """Whether a Resource Interface could take the pod: its controller owner is a
        registered, watched or pod kind. Cheap (no jq): the rest need no keying at all."""
        if not pod.owners:
            return False
        ref = pod.owners[0]
        group, _, version = ref.api_version.rpartition("/")
        return (
            ref.kind == "Pod"
            or GVK(group, version, ref.kind) in self._watched()
            or self.registry.lookup(group, version, ref.kind) is not None
        )

    def _walk(self, pod: PodInfo) -> tuple[ResourceInterface, OwnerRef] | OwnerRef | None:
        """Follow controller owners to a registered root kind; an OwnerRef when a watched owner
        is not seen yet; None when the chain leaves the watched kinds (not an RI workload)."""
        refs, watched = pod.owners, self._watched()
        for _ in range(MAX_DEPTH):
            if not refs:
                return None
            ref = refs[0]
            group, _, version = ref.api_version.rpartition("/")
            ri = self.registry.lookup(group, version, ref.kind)
            if ri is not None:
                return ri, ref
            with self.lock:
                owner = self.by_uid.get(ref.uid)
            if owner is not None:
                refs = _owners(owner)
                continue
            owner_pod = self.pods_by_uid(ref.uid) if ref.kind == "Pod" else None
            if owner_pod is not None:
                refs = owner_pod.owners
                continue
            return ref if GVK(group, version, ref.kind) in watched or ref.kind == "Pod" else None
        return None

    # ------------------------------------------------------------------ specs

    def resolve(self, pod: PodInfo, key: str, members: list[PodInfo]) -> Resolution:
        if key.startswith(WAITING_PREFIX + BUDGET):
            return Resolution(key, None, f"{key[len(WAITING_PREFIX + BUDGET) :]}: {REASON_BUDGET}")
        if key.startswith(WAITING_PREFIX):
            return Resolution(key, None, f"waiting for owner {key[len(WAITING_PREFIX) :]}")
        found = self._walk(pod)
        if not isinstance(found, tuple):
            return Resolution(key, None, "waiting for the owner chain of the pod")
        ri, ref = found
        with self.lock:
            root = self.roots.get((ref.api_version, ref.kind, f"{pod.namespace}/{ref.name}"))
        if root is None:
            return Resolution(key, None, f"waiting for {ref.kind} {pod.namespace}/{ref.name}")
        sizing = self._size(ri, root, key, members)
        if sizing is None:
            return Resolution(key, None, f"{ref.kind} {pod.namespace}/{ref.name}: no gang for this pod")
        meta = root.get("metadata") or {}
        spec = GangSpec(
            key=key,
            namespace=pod.namespace,
            source=(ri.root.group, ri.root.kind),
            owner={
                "apiVersion": ref.api_version,
                "kind": ref.kind,
                "metadata": {"name": ref.name, "namespace": pod.namespace, "uid": meta.get("uid", "")},
            },
            min_count=sizing.min_count,
            count=sizing.expected,
            timeout_s=DEFAULT_TIMEOUT_S,
            topology=stated_topology([pod, *members]),
        )
        return Resolution(key, spec)

    def _size(self, ri: ResourceInterface, root: JSON, key: str, members: list[PodInfo]) -> _Sizing | None:
        meta = root.get("metadata") or {}
        memo_key = (str(meta.get("uid", "")), str(meta.get("resourceVersion", "")), key)
        with self.lock:
            known = self._sizing.get(memo_key)
        if known is not None and len(members) < 2 * max(1, known.pods):
            return known
        gang_key = key.split("/", 2)[2] if key.count("/") >= 2 else ""
        evaluation = ri.evaluate(root, [m.obj for m in members])
        gang = next((g for g in evaluation.gangs if g.key == gang_key), None)
        if gang is None:
            return None
        sizing = _Sizing(max(1, gang.min_count), max(gang.expected, gang.min_count), len(members))
        with self.lock:
            if len(self._sizing) > 4096:
                self._sizing.clear()
            self._sizing[memo_key] = sizing
        return sizing


def _component_gvk(component: ComponentDef) -> GVK:
    kind = component.kind
    return GVK(kind.group or "", kind.version or "", kind.kind or "") if kind is not None else GVK("", "", "")


def _gvk_of(obj: JSON, default: GVK) -> GVK:
    api, kind = obj.get("apiVersion"), obj.get("kind")
    if not api or not kind:
        return default
    group, _, version = str(api).rpartition("/")
    return GVK(group, version, str(kind))


def _owners(obj: JSON) -> tuple[OwnerRef, ...]:
    return owner_refs(obj.get("metadata") or {})
