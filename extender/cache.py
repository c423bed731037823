"""The watch cache: nodes and pods as the solver sees them, with assumed placements.

Mutable and locked behind a narrow interface: callers use the methods below, never the
dictionaries or the lock. Every change bumps `generation`; every change that touches a node
bumps that node's version, so derived values (the solver `Node` with its usage, per-shape
fits in the verbs) are rebuilt only for nodes that moved.

A pod's life in the cache, as kube-scheduler's own cache interface writes it down:

    initial --assume--> assumed --watch shows it bound--> added --watch DELETED--> deleted
                 |                                  ^
                 +--forget (bind failed, gang released)--> initial
    initial --watch shows it bound (bound elsewhere)--> added

- *assumed*: counted on its node at once, before the API server and the watch confirm it, so
  nothing is double-booked between a decision and the watch event (`assume`, `assume_chosen`).
- *added*: the watch shows the pod on a node; its devices come from its annotation, or from
  the assumption while the annotation is not seen yet. Bound elsewhere than assumed: the
  assumed node stops counting it.
- *forget*: an assumed pod whose bind failed, or whose gang reservation was released, is no
  longer counted where it was assumed (unless the watch has meanwhile shown it there).
- *deleted*: the watch's DELETED, or a re-list without it, drops it wherever it was counted.

Device usage comes from each pod's `phalanx.io/gpu-devices` annotation; a GPU pod bound
without one (bound by another scheduler) is given devices deterministically when its node is
rebuilt, so accounting stays whole after any restart.

This module is past 400 lines on purpose: the pod state machine, the indexes it keeps and the
node models derived from them share one lock and one set of dictionaries; split, the lock
would be handed out again.

Listeners (`on_pod_change`) are called with (old, new) under the cache's lock; they must only
update their own state (taking only their own leaf lock), never call back into the cache.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

import structlog

from extender.config import GpuConfig
from extender.objects import JSON, NodeInfo, PodInfo, bound_pod_info, node_info, pod_info, spec_hash
from extender.pools import Hardware, Pool
from solver import (
    FULL_SHARE,
    ClusterSnapshot,
    DeviceAssignment,
    DeviceState,
    GpuDevice,
    GpuKind,
    Node,
    NodeName,
    NodeState,
    PodShape,
    Resources,
)

log = structlog.get_logger("phalanx.cache")

PodListener = Callable[[PodInfo | None, PodInfo | None], None]
#: Chooses a pod's devices on a node's current model (None: it does not fit there).
Chooser = Callable[[Node], tuple[DeviceAssignment, ...] | None]


@dataclass(frozen=True, slots=True)
class Assumed:
    """A placement the cache counts before the watch confirms it."""

    node: str
    devices: tuple[DeviceAssignment, ...]


@dataclass(frozen=True, slots=True)
class Counted:
    """One pod a node counts, for the read API."""

    uid: str
    key: str | None  # namespace/name; None for a pod assumed but not seen by the watch
    assumed: bool
    devices: tuple[DeviceAssignment, ...] = ()


@dataclass(frozen=True, slots=True)
class Changes:
    """Nodes touched since a reader's cursor; `nodes` is None when the log was trimmed in
    between (the reader starts over)."""

    nodes: list[str] | None
    epoch: int
    cursor: int


class Cache:
    def __init__(self, levels: tuple[str, ...], hardware: Hardware | None = None) -> None:
        self._lock = threading.RLock()
        self.levels = levels
        self.hardware = hardware if hardware is not None else Hardware(GpuConfig())
        self.generation = 0
        self._nodes: dict[str, NodeInfo] = {}
        self._raw_nodes: dict[str, JSON] = {}  # kept to re-derive paths when levels change
        self._pods: dict[str, PodInfo] = {}  # uid -> pod
        self._assumed: dict[str, Assumed] = {}  # uid -> placement counted before the watch shows it
        self._on_node: dict[str, set[str]] = {}  # node -> uids counted there
        self._version: dict[str, int] = {}
        self._models: dict[str, tuple[int, Node]] = {}
        # Every node touch, in order: readers remember how far they have read and re-check
        # only the nodes touched since. Trimmed by starting a new epoch.
        self._changes: list[str] = []
        self._epoch = 0
        self._listeners: list[PodListener] = []
        self._count_listeners: list[Callable[[str], None]] = []
        self.nodes_version = 0  # bumps when a node is added, changed or removed (not on pod changes)
        self._invalid_node: list[Callable[[JSON, str], None]] = []
        self._snapshot: tuple[int, ClusterSnapshot] | None = None
        self._models_seen: set[str] = set()

    def on_pod_change(self, listener: PodListener) -> None:
        """Call `listener(old, new)` under the lock on every pod change (None for absent)."""
        self._listeners.append(listener)

    def on_count(self, listener: Callable[[str], None]) -> None:
        """Call `listener(uid)` (under the lock; it must only record) whenever what the cache
        counts of that pod may have changed: bound, assumed, forgotten, changed or deleted."""
        self._count_listeners.append(listener)

    def _counted(self, uid: str) -> None:
        for listener in self._count_listeners:
            listener(uid)

    def on_invalid_node(self, report: Callable[[JSON, str], None]) -> None:
        """Call `report(node object, why)` (under the lock) for a Node the cache cannot parse."""
        self._invalid_node.append(report)

    # ------------------------------------------------------------------ watch events

    def replace_nodes(self, items: Iterable[JSON]) -> None:
        with self._lock:
            fresh = {(obj.get("metadata") or {}).get("name", ""): obj for obj in items}
            for name in set(self._nodes) - set(fresh):
                self._drop_node(name)
            for obj in fresh.values():
                self._set_raw_node(obj)

    def node_event(self, kind: str, obj: JSON) -> None:
        with self._lock:
            if kind == "DELETED":
                self._drop_node((obj.get("metadata") or {}).get("name", ""))
            else:
                self._set_raw_node(obj)

    def configure(self, levels: tuple[str, ...], hardware: Hardware) -> None:
        """New topology levels, GPU ratings or pools: re-derive every node from its object."""
        with self._lock:
            if (levels, hardware) == (self.levels, self.hardware):
                return
            self.levels, self.hardware = levels, hardware
            for obj in list(self._raw_nodes.values()):
                self._set_raw_node(obj)

    def replace_pods(self, items: Iterable[JSON]) -> None:
        self.replace_pod_infos(map(pod_info, items))

    def replace_pod_infos(self, infos: Iterable[PodInfo]) -> None:
        """The pods of a list (parsed by the reflector page by page, outside the lock: the raw
        list is never held whole)."""
        fresh = {p.uid: p for p in infos}
        with self._lock:
            for uid in set(self._pods) - set(fresh):
                self._drop_pod(uid)
            for pod in fresh.values():
                self._set_pod(pod)

    def pod_event(self, kind: str, obj: JSON) -> None:
        meta = obj.get("metadata") or {}
        if kind == "DELETED":
            with self._lock:
                self._drop_pod(meta.get("uid", ""))
            return
        old = self._pods.get(meta.get("uid", ""))
        if old is not None and _same_but_status(old, obj) and self._apply_status(old, obj):
            return
        bound = bound_pod_info(old, obj) if old is not None else None  # its bind's event: a few fields
        info = bound or pod_info(obj)  # parsed outside the lock
        with self._lock:
            self._set_pod(info)

    def _apply_status(self, old: PodInfo, obj: JSON) -> bool:
        """A change of the pod's status only (conditions, IPs, a nomination, the phase): the rest
        of the cache's reading stands, kept at the new version, so a verb's pod at this very
        version is the cache's reading, not parsed again (a gang member's filter after its
        nomination). False when the pod must be parsed instead."""
        status = obj.get("status") or {}
        version, phase = (obj.get("metadata") or {}).get("resourceVersion"), status.get("phase", "Pending")
        nominated = status.get("nominatedNodeName") or ""
        if not (isinstance(version, str) and isinstance(phase, str) and isinstance(nominated, str)):
            return False
        if (version, phase, nominated) == (old.resource_version, old.phase, old.nominated):
            return True
        new = replace(old, phase=phase, resource_version=version, nominated=nominated)
        with self._lock:
            if self._pods.get(old.uid) is not old:
                return False  # changed meanwhile: read it whole
            if phase == old.phase:
                self._pods[old.uid] = new  # nothing the solver or a listener reads moved
            else:  # a finished pod frees its node; Resource Interface keys may read the status
                self._set_pod(replace(new, obj=obj) if old.obj else new)
        return True

    def _set_raw_node(self, obj: JSON) -> None:
        try:
            info = node_info(obj, self.levels, self.hardware)
        except Exception as e:  # a hostile or broken Node: keep what we had, report it, go on
            name = str((obj.get("metadata") or {}).get("name", ""))[:253]
            log.warning("node skipped: cannot parse it", node=name, error=str(e)[:512])
            for report in self._invalid_node:
                report(obj, f"{type(e).__name__}: {e}"[:512])
            return
        self._raw_nodes[info.name] = _what_nodes_need(obj)
        if self._nodes.get(info.name) == info:
            return
        self._nodes[info.name] = info
        self._models_seen.update(d.model for d in info.devices)
        self.nodes_version += 1
        self._touch(info.name)

    def _drop_node(self, name: str) -> None:
        self._raw_nodes.pop(name, None)
        if self._nodes.pop(name, None) is not None:
            self.nodes_version += 1
            self._touch(name)

    def _set_pod(self, pod: PodInfo) -> None:
        old = self._pods.get(pod.uid)
        if old == pod:
            return
        self._pods[pod.uid] = pod
        assumed = self._assumed.get(pod.uid) if pod.node else None
        if assumed is not None:  # assumed -> added
            del self._assumed[pod.uid]
            if assumed.node != pod.node:
                # Bound elsewhere than assumed: the assumed node must not keep counting it.
                self._uncount(pod.uid, assumed.node)
            elif pod.devices is None:
                self._pods[pod.uid] = pod = replace(pod, devices=assumed.devices)
        if not _counts_alike(old, assumed, pod) or pod.uid not in self._on_node.get(pod.node, ()):
            self._place(pod.uid, old.node if old else "", pod.node if pod.active else "")
        self._counted(pod.uid)
        for listener in self._listeners:
            listener(old, pod)

    def _drop_pod(self, uid: str) -> None:
        pod = self._pods.pop(uid, None)
        assumed = self._assumed.pop(uid, None)
        if assumed is not None and (pod is None or pod.node != assumed.node):
            # A reserved (assumed, not yet bound) pod was deleted: its node's model must be
            # rebuilt, or the reservation would stay counted there for good.
            self._uncount(uid, assumed.node)
        self._counted(uid)
        if pod is not None:
            self._place(uid, pod.node, "")
            for listener in self._listeners:
                listener(pod, None)

    def _place(self, uid: str, old: str, new: str) -> None:
        if old and old != new:
            self._uncount(uid, old)
        if new:
            self._on_node.setdefault(new, set()).add(uid)
            self._touch(new)
        else:
            self.generation += 1

    def _uncount(self, uid: str, node: str) -> None:
        self._on_node.get(node, set()).discard(uid)
        self._touch(node)

    def _touch(self, node: str) -> None:
        self.generation += 1
        self._version[node] = self._version.get(node, 0) + 1
        self._changes.append(node)
        if len(self._changes) > 200_000:
            self._changes = []
            self._epoch += 1

    # ------------------------------------------------------------------ assume / forget

    def assume(self, uid: str, node: str, devices: tuple[DeviceAssignment, ...]) -> None:
        """initial -> assumed: count a pod on `node` now, before the API server and the watch
        confirm it (binds use `assume_chosen`, gang reservations `assume_all`)."""
        with self._lock:
            self._assume(uid, node, devices)

    def _assume(self, uid: str, node: str, devices: tuple[DeviceAssignment, ...]) -> None:
        previous = self._assumed.get(uid)
        if previous is not None and previous.node != node:
            pod = self._pods.get(uid)
            if pod is None or pod.node != previous.node:  # assumed elsewhere before: count it once
                self._uncount(uid, previous.node)
        self._assumed[uid] = Assumed(node, devices)
        self._on_node.setdefault(node, set()).add(uid)
        self._touch(node)
        self._counted(uid)

    def assume_all(
        self,
        placements: Iterable[tuple[str, str, tuple[DeviceAssignment, ...]]],
        still_valid: Callable[[ClusterSnapshot], bool],
    ) -> bool:
        """Count a whole gang's placements (uid, node, devices) at once, if `still_valid` holds
        for the nodes they use as they are now; nothing otherwise. Pods the watch no longer
        shows (deleted while solving) are not assumed."""
        placements = list(placements)
        with self._lock:
            names = sorted({node for _, node, _ in placements})
            nodes = tuple(m for name in names if (m := self.node_model(name)) is not None)
            if len(nodes) != len(names) or not still_valid(ClusterSnapshot(nodes, self.levels, self.generation)):
                return False
            for uid, node, devices in placements:
                if uid in self._pods:
                    self._assume(uid, node, devices)
            return True

    def assume_chosen(self, uid: str, node: str, choose: Chooser) -> tuple[DeviceAssignment, ...] | None:
        """Choose a pod's devices on `node` and count them at once, atomically (two binds to
        one node never pick the same device; no lock is held across API calls). A pod already
        assumed on `node` keeps its devices (a retried bind). None: not on this node."""
        with self._lock:
            assumed = self._assumed.get(uid)
            if assumed is not None and assumed.node == node:
                return assumed.devices
            model = self.node_model(node)
            devices = choose(model) if model is not None else None
            if devices is not None:
                self._assume(uid, node, devices)
            return devices

    def forget(self, uid: str, *, only: Assumed | None = None) -> bool:
        """assumed -> initial: the bind failed or the reservation was released. With `only`,
        just that assumption (a bind forgets what it assumed, never a newer one). True if an
        assumption was forgotten."""
        with self._lock:
            if only is not None and self._assumed.get(uid) is not only:
                return False
            entry = self._assumed.pop(uid, None)
            if entry is None:
                return False
            pod = self._pods.get(uid)
            if pod is None or pod.node != entry.node:
                self._on_node.get(entry.node, set()).discard(uid)
            self._touch(entry.node)
            self._counted(uid)
            return True

    def forget_unbound(self, uids: Iterable[str]) -> None:
        """Forget the assumptions of those pods the watch does not show bound."""
        with self._lock:
            for uid in uids:
                pod = self._pods.get(uid)
                if pod is None or not pod.node:
                    self.forget(uid)

    def assumed(self, uid: str) -> Assumed | None:
        with self._lock:
            return self._assumed.get(uid)

    def assumed_uids(self) -> set[str]:
        with self._lock:
            return set(self._assumed)

    # ------------------------------------------------------------------ reads

    def placement(self, uid: str) -> tuple[PodInfo | None, str, tuple[DeviceAssignment, ...]]:
        """A pod as the cache counts it: (pod, node it is counted on or "", its devices). A pod
        is counted where it is bound (while active) or, before that, where it is assumed."""
        with self._lock:
            pod = self._pods.get(uid)
            assumed = self._assumed.get(uid)
            if pod is not None and pod.node and pod.active:
                devices = pod.devices if pod.devices is not None else (assumed.devices if assumed else ())
                return pod, pod.node, devices
            if pod is not None and assumed is not None and pod.active:
                return pod, assumed.node, assumed.devices
            return pod, "", ()

    def inferred_devices(self, node: str) -> dict[str, tuple[DeviceAssignment, ...]]:
        """The devices the node's GPU pods without a device record are counted on (as the
        node's model infers them: best fit, oldest first), by pod uid."""
        with self._lock:
            info = self._nodes.get(node)
            if info is None:
                return {}
            unrecorded = []
            recorded = []
            for uid in self._on_node.get(node, set()):
                pod = self._pods.get(uid)
                if pod is None or not pod.active:
                    continue
                devices = self._assigned(uid)
                if devices is None and pod.demand.kind is not GpuKind.NONE:
                    unrecorded.append(pod)
                elif devices:
                    recorded.append(devices)
            if not unrecorded:
                return {}
            states = {d.index: DeviceState.of(d) for d in info.devices}
            for devices in recorded:
                for d in devices:
                    if d.index in states:
                        states[d.index].consume(d)
            base = Node(info.name, info.allocatable, gpus=tuple(d.freeze() for d in states.values()))
            return _inferred(base, unrecorded)[1]

    def pod_uids(self) -> list[str]:
        with self._lock:
            return list(self._pods)

    def node_infos(self) -> list[NodeInfo]:
        with self._lock:
            return list(self._nodes.values())

    def node_annotation(self, name: str, key: str) -> str:
        """One annotation of a Node as last seen ("" when absent or the node is unknown)."""
        raw = self._raw_nodes.get(name)
        annotations = ((raw or {}).get("metadata") or {}).get("annotations") or {}
        return str(annotations.get(key, ""))

    def pod(self, uid: str) -> PodInfo | None:
        return self._pods.get(uid)

    def pods(self, uids: Iterable[str]) -> list[PodInfo]:
        """The known pods among `uids` (one consistent read)."""
        with self._lock:
            return [p for u in uids if (p := self._pods.get(u)) is not None]

    def active_shapes(self) -> list[tuple[str, PodShape]]:
        """(node, shape) of every running or pending pod with a valid request (the workload;
        node "" while pending), the shape with the GPU models the pod may use."""
        with self._lock:
            return [
                (p.node, PodShape(p.requests, p.demand, gpu_models=self._models_of(p)))
                for p in self._pods.values()
                if p.active and not p.error
            ]

    def models_of(self, pod: PodInfo) -> frozenset[str] | None:
        """The GPU models `pod` may use: those its node selection names (PodInfo.gpu_models)
        and its GPU pool allows; None for any."""
        with self._lock:
            return self._models_of(pod)

    def _models_of(self, pod: PodInfo) -> frozenset[str] | None:
        pool = self.hardware.by_name.get(pod.pool) if pod.pool else None
        allowed = pool.models(self._models_seen) if pool is not None else None
        if allowed is None:
            return pod.gpu_models
        return allowed if pod.gpu_models is None else allowed & pod.gpu_models

    def counts(self) -> tuple[int, int]:
        """(nodes, pods) the cache holds."""
        with self._lock:
            return len(self._nodes), len(self._pods)

    def node_labels(self) -> list[Mapping[str, str]]:
        """Every node's labels (to check the configured topology levels against)."""
        with self._lock:
            return [info.labels for info in self._nodes.values()]

    def labels_of(self, names: list[str]) -> list[Mapping[str, str] | None]:
        """The labels of each named node, None for a node the cache lacks (one lock for all)."""
        with self._lock:
            nodes = self._nodes
            return [info.labels if (info := nodes.get(n)) is not None else None for n in names]

    def counted(self, node: str) -> list[Counted]:
        """The pods `node` counts, for the read API."""
        with self._lock:
            out = []
            for uid in sorted(self._on_node.get(node, set())):
                pod = self._pods.get(uid)
                assumed = self._assumed.get(uid)
                if pod is not None or assumed is not None:
                    devices = pod.devices if pod is not None and pod.devices is not None else ()
                    if assumed is not None and not devices:
                        devices = assumed.devices
                    out.append(Counted(uid, pod.key if pod is not None else None, assumed is not None, devices))
            return out

    def changes_since(self, epoch: int, cursor: int) -> Changes:
        """Nodes touched since (epoch, cursor), with the new cursor."""
        with self._lock:
            if epoch != self._epoch:
                return Changes(None, self._epoch, len(self._changes))
            return Changes(self._changes[cursor:], epoch, len(self._changes))

    def pool_models(self, pool: Pool) -> frozenset[str] | None:
        """The GPU models of the cluster `pool` allows (its filters match substrings of the
        models nodes have shown); None when it allows every model."""
        if not pool.model_filters:
            return None
        with self._lock:
            return pool.models(self._models_seen)

    # ------------------------------------------------------------------ models

    def node_model(self, name: str) -> Node | None:
        """The solver's view of one node, rebuilt only when its version moved."""
        with self._lock:
            info = self._nodes.get(name)
            if info is None:
                return None
            version = self._version.get(name, 0)
            cached = self._models.get(name)
            if cached is not None and cached[0] == version:
                return cached[1]
            model = self._build(info)
            self._models[name] = (version, model)
            return model

    def snapshot(self) -> ClusterSnapshot:
        """Every node, for a gang solve; rebuilt only when the generation moved."""
        with self._lock:
            if self._snapshot is not None and self._snapshot[0] == self.generation:
                return self._snapshot[1]
            nodes = tuple(m for name in sorted(self._nodes) if (m := self.node_model(name)) is not None)
            snap = ClusterSnapshot(nodes, self.levels, self.generation)
            self._snapshot = (self.generation, snap)
            return snap

    def snapshot_without(self, gone: Callable[[PodInfo], bool]) -> ClusterSnapshot:
        """Every node as it would be with the pods `gone` selects evicted (a what-if for
        preemption; never memoised)."""
        with self._lock:
            uids = {u for u, p in self._pods.items() if p.node and gone(p)}
            nodes = tuple(self._build(self._nodes[name], exclude=uids) for name in sorted(self._nodes))
            return ClusterSnapshot(nodes, self.levels, self.generation)

    def node_model_without(self, name: str, uids: set[str]) -> Node | None:
        """The node as it would be with the given pods gone (preemption victims)."""
        with self._lock:
            info = self._nodes.get(name)
            return None if info is None else self._build(info, exclude=uids)

    def _build(self, info: NodeInfo, exclude: set[str] | frozenset[str] = frozenset()) -> Node:
        used_cpu = used_mem = used_pods = 0
        used_ext: dict[str, int] = {}
        gpus = {g.index: g for g in info.devices}  # one device per index, the last, as read
        devices: dict[int, DeviceState] = {}  # those some pod takes from; the others stay as read
        unplaced: list[PodInfo] = []
        for uid in sorted(self._on_node.get(info.name, set()) - exclude):
            pod = self._pods.get(uid)
            if pod is None and uid not in self._assumed:
                continue
            if pod is not None and not pod.active:
                continue
            if pod is not None:
                req = pod.requests
                used_cpu += req.cpu_milli
                used_mem += req.memory_mib
                used_pods += req.pods
                for k, v in req.extended:
                    used_ext[k] = used_ext.get(k, 0) + v
            assigned = self._assigned(uid)
            if assigned is not None:
                for d in assigned:
                    state = devices.get(d.index)
                    if state is None:
                        if d.index not in gpus:
                            continue  # a record naming a device the node does not have
                        state = devices[d.index] = DeviceState.of(gpus[d.index])
                    state.consume(d)
            elif pod is not None and pod.demand.kind is not GpuKind.NONE:
                unplaced.append(pod)
        node = Node(
            info.name,
            info.allocatable,
            Resources(used_cpu, used_mem, used_pods, tuple(sorted(used_ext.items()))),
            labels=info.labels,
            taints=info.taints,
            topology=info.topology,
            gpus=tuple(
                devices[i].freeze() if i in devices else g if _settled(g) else DeviceState.of(g).freeze()
                for i, g in gpus.items()
            ),
            unschedulable=info.unschedulable,
        )
        return _infer_devices(node, unplaced) if unplaced else node

    def share_contents(self, node: str) -> dict[int, list[int]]:
        """Per device index of `node`, the shares (milli, below a whole GPU) its pods hold, for
        the packer (solver.packing)."""
        with self._lock:
            out: dict[int, list[int]] = {}
            for uid in self._on_node.get(node, ()):
                pod = self._pods.get(uid)
                if pod is not None and not pod.active:
                    continue  # as _build: a finished pod holds nothing
                for a in self._assigned(uid) or ():
                    if 0 < a.milli < FULL_SHARE and not a.mig_profile:
                        out.setdefault(a.index, []).append(a.milli)
            return out

    def all_share_contents(self) -> dict[str, dict[int, list[int]]]:
        """`share_contents` of every node that counts pods, in one consistent read."""
        with self._lock:
            return {node: contents for node in list(self._on_node) if (contents := self.share_contents(node))}

    def _assigned(self, uid: str) -> tuple[DeviceAssignment, ...] | None:
        """The devices a counted pod holds: its assumed ones while a bind is in flight, else
        its annotation's (None: not known yet)."""
        assumed = self._assumed.get(uid)
        if assumed is not None:
            return assumed.devices
        pod = self._pods.get(uid)
        return pod.devices if pod is not None else None


def _counts_alike(old: PodInfo | None, assumed: Assumed | None, new: PodInfo) -> bool:
    """Whether `new` counts on its node exactly as the cache counted the pod before (`old`,
    with its assumption when one was just confirmed): the same node, still active, the same
    requests and the same devices. Then the node's model is unchanged and its version stays: a
    bind's confirmation by the watch and a pod's Pending -> Running are the common changes,
    and each used to rebuild the node and re-measure it for every pod shape (a verb's work per
    scheduled pod, done twice more for nothing)."""
    if old is None or not new.node or not (old.active and new.active) or old.requests != new.requests:
        return False
    before = (assumed.node, assumed.devices) if assumed is not None else (old.node, old.devices)
    return before[0] == new.node and before[1] is not None and before[1] == new.devices


def _settled(gpu: GpuDevice) -> bool:
    """Whether `gpu` is as `DeviceState.of(gpu).freeze()` would leave it (nothing free below
    0, as a hostile label can make it; no MIG profile twice): then a device no pod takes is
    used as read, not rebuilt."""
    return (
        gpu.free_milli >= 0
        and gpu.free_memory_mib >= 0
        and gpu.free_tflops >= 0
        and (not gpu.mig or (all(s.free >= 0 for s in gpu.mig) and len({s.profile for s in gpu.mig}) == len(gpu.mig)))
    )


def _same_but_status(old: PodInfo, obj: JSON) -> bool:
    """Whether the object differs from the cache's reading in its status at most."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    return (
        old.node == (spec.get("nodeName") or "")
        and old.annotations == (meta.get("annotations") or {})
        and old.labels == (meta.get("labels") or {})
        and old.spec_hash != 0
        and old.spec_hash == spec_hash(obj.get("spec"))
    )


def _infer_devices(node: Node, pods: list[PodInfo]) -> Node:
    """GPU pods on the node without a device record take devices best-fit, oldest first."""
    state, _ = _inferred(node, pods)
    return replace(node, gpus=tuple(d.freeze() for d in state.devices))


def _inferred(node: Node, pods: list[PodInfo]) -> tuple[NodeState, dict[str, tuple[DeviceAssignment, ...]]]:
    state = NodeState(Node(node.name, node.allocatable, Resources(), gpus=node.gpus))
    taken: dict[str, tuple[DeviceAssignment, ...]] = {}
    for pod in sorted(pods, key=lambda p: (p.created, p.uid)):
        devices = state.take(PodShape(Resources(), pod.demand))
        if devices is None:
            log.warning("GPU pod does not fit its node's devices", pod=pod.key, node=node.name)
        else:
            taken[pod.uid] = devices
    return state, taken


__all__ = ["Assumed", "Cache", "Changes", "Counted", "NodeName"]


def _what_nodes_need(obj: JSON) -> JSON:
    """The parts of a Node that node_info reads (kept to re-derive it when the levels or the
    GPU configuration change); managedFields, images, conditions and the rest are dropped:
    at 5,000 nodes they are most of the memory the raw objects hold."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    return {
        "metadata": {k: meta[k] for k in ("name", "labels", "annotations") if k in meta},
        "spec": {k: spec[k] for k in ("taints", "unschedulable") if k in spec},
        "status": {"allocatable": status.get("allocatable") or {}},
    }
