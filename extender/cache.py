"""The watch cache: nodes and pods as the solver sees them, with assumed placements.

Mutable and locked. Every change bumps `generation`; every change that touches a node bumps
that node's version, so derived values (the solver `Node` with its usage, per-shape fits in
the verbs) are rebuilt only for nodes that moved. Pods the extender has bound but the watch
has not yet shown on their node are *assumed*: they count on their node at once, so nothing
is double-booked between bind and the watch event, and are forgotten if the bind fails.

Device usage comes from each pod's `phalanx.io/gpu-devices` annotation; a GPU pod bound
without one (bound by another scheduler) is given devices deterministically when its node is
rebuilt, so accounting stays whole after any restart.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import replace

import structlog

from extender.config import GpuConfig
from extender.objects import JSON, NodeInfo, PodInfo, node_info, pod_info
from extender.pools import Hardware, Pool
from solver import (
    FULL_SHARE,
    ClusterSnapshot,
    DeviceAssignment,
    DeviceState,
    GpuKind,
    Node,
    NodeName,
    NodeState,
    PodShape,
    Resources,
)

log = structlog.get_logger("phalanx.cache")


class Cache:
    def __init__(self, levels: tuple[str, ...], hardware: Hardware | None = None) -> None:
        self.lock = threading.RLock()
        self.levels = levels
        self.hardware = hardware if hardware is not None else Hardware(GpuConfig())
        self.generation = 0
        self.nodes: dict[str, NodeInfo] = {}
        self.raw_nodes: dict[str, JSON] = {}  # kept to re-derive paths when levels change
        self.pods: dict[str, PodInfo] = {}  # uid -> pod
        self.assumed: dict[str, tuple[str, tuple[DeviceAssignment, ...]]] = {}  # uid -> (node, devices)
        self.on_node: dict[str, set[str]] = {}  # node -> uids counted there
        self.version: dict[str, int] = {}
        self._models: dict[str, tuple[int, Node]] = {}
        # Every node touch, in order: readers remember how far they have read and re-check
        # only the nodes touched since. Trimmed by starting a new epoch.
        self._changes: list[str] = []
        self.epoch = 0
        # Called under the lock with (old, new) on every pod change; None for absent.
        self.pod_listeners: list[Callable[[PodInfo | None, PodInfo | None], None]] = []
        self._snapshot: tuple[int, ClusterSnapshot] | None = None
        self._models_seen: set[str] = set()

    # ------------------------------------------------------------------ events

    def replace_nodes(self, items: Iterable[JSON]) -> None:
        with self.lock:
            fresh = {(obj.get("metadata") or {}).get("name", ""): obj for obj in items}
            for name in set(self.nodes) - set(fresh):
                self._drop_node(name)
            for obj in fresh.values():
                self._set_raw_node(obj)

    def node_event(self, kind: str, obj: JSON) -> None:
        with self.lock:
            if kind == "DELETED":
                self._drop_node((obj.get("metadata") or {}).get("name", ""))
            else:
                self._set_raw_node(obj)

    def configure(self, levels: tuple[str, ...], hardware: Hardware) -> None:
        """New topology levels, GPU ratings or pools: re-derive every node from its object."""
        with self.lock:
            if (levels, hardware) == (self.levels, self.hardware):
                return
            self.levels, self.hardware = levels, hardware
            for obj in list(self.raw_nodes.values()):
                self._set_raw_node(obj)

    def _set_raw_node(self, obj: JSON) -> None:
        info = node_info(obj, self.levels, self.hardware)
        self.raw_nodes[info.name] = obj
        self._set_node(info)

    def replace_pods(self, items: Iterable[JSON]) -> None:
        with self.lock:
            fresh = {p.uid: p for p in map(pod_info, items)}
            for uid in set(self.pods) - set(fresh):
                self._drop_pod(uid)
            for pod in fresh.values():
                self._set_pod(pod)

    def pod_event(self, kind: str, obj: JSON) -> None:
        meta = obj.get("metadata") or {}
        if kind == "DELETED":
            with self.lock:
                self._drop_pod(meta.get("uid", ""))
            return
        old = self.pods.get(meta.get("uid", ""))
        if old is not None and _same_placement(old, obj):
            return  # status chatter (conditions, IPs): nothing the solver sees changed
        info = pod_info(obj)  # parsed outside the lock
        with self.lock:
            self._set_pod(info)

    def _set_node(self, info: NodeInfo) -> None:
        if self.nodes.get(info.name) == info:
            return
        self.nodes[info.name] = info
        self._models_seen.update(d.model for d in info.devices)
        self._touch(info.name)

    def _drop_node(self, name: str) -> None:
        self.raw_nodes.pop(name, None)
        if self.nodes.pop(name, None) is not None:
            self._touch(name)

    def _set_pod(self, pod: PodInfo) -> None:
        old = self.pods.get(pod.uid)
        if old == pod:
            return
        self.pods[pod.uid] = pod
        if pod.node and pod.uid in self.assumed:
            node, devices = self.assumed.pop(pod.uid)
            if node != pod.node:
                # Bound elsewhere than assumed: the assumed node must not keep counting it.
                self.on_node.get(node, set()).discard(pod.uid)
                self._touch(node)
            elif pod.devices is None:
                self.pods[pod.uid] = pod = replace(pod, devices=devices)
        self._place(pod.uid, old.node if old else "", pod.node if pod.active else "")
        for listener in self.pod_listeners:
            listener(old, pod)

    def _drop_pod(self, uid: str) -> None:
        pod = self.pods.pop(uid, None)
        assumed = self.assumed.pop(uid, None)
        if assumed is not None and (pod is None or pod.node != assumed[0]):
            # A reserved (assumed, not yet bound) pod was deleted: its node's model must be
            # rebuilt, or the reservation would stay counted there for good.
            self.on_node.get(assumed[0], set()).discard(uid)
            self._touch(assumed[0])
        if pod is not None:
            self._place(uid, pod.node, "")
            for listener in self.pod_listeners:
                listener(pod, None)

    def _place(self, uid: str, old: str, new: str) -> None:
        if old and old != new:
            self.on_node.get(old, set()).discard(uid)
            self._touch(old)
        if new:
            self.on_node.setdefault(new, set()).add(uid)
            self._touch(new)
        else:
            self.generation += 1

    def _touch(self, node: str) -> None:
        self.generation += 1
        self.version[node] = self.version.get(node, 0) + 1
        self._changes.append(node)
        if len(self._changes) > 200_000:
            self._changes = []
            self.epoch += 1

    def changes_since(self, epoch: int, cursor: int) -> tuple[list[str] | None, int, int]:
        """Nodes touched since (epoch, cursor), or None when the log was trimmed in between
        (the reader starts over); with the new (epoch, cursor)."""
        with self.lock:
            if epoch != self.epoch:
                return None, self.epoch, len(self._changes)
            return self._changes[cursor:], epoch, len(self._changes)

    def pool_models(self, pool: Pool) -> frozenset[str] | None:
        """The GPU models of the cluster `pool` allows (its filters match substrings of the
        models nodes have shown); None when it allows every model."""
        if not pool.model_filters:
            return None
        with self.lock:
            return pool.models(self._models_seen)

    # ------------------------------------------------------------------ assume

    def assume(self, uid: str, node: str, devices: tuple[DeviceAssignment, ...]) -> None:
        """Count a pod on `node` now, before the API server and the watch confirm it."""
        with self.lock:
            self.assumed[uid] = (node, devices)
            self.on_node.setdefault(node, set()).add(uid)
            self._touch(node)

    def forget(self, uid: str) -> None:
        with self.lock:
            entry = self.assumed.pop(uid, None)
            if entry is not None:
                pod = self.pods.get(uid)
                if pod is None or pod.node != entry[0]:
                    self.on_node.get(entry[0], set()).discard(uid)
                self._touch(entry[0])

    # ------------------------------------------------------------------ models

    def node_model(self, name: str) -> Node | None:
        """The solver's view of one node, rebuilt only when its version moved."""
        with self.lock:
            info = self.nodes.get(name)
            if info is None:
                return None
            version = self.version.get(name, 0)
            cached = self._models.get(name)
            if cached is not None and cached[0] == version:
                return cached[1]
            model = self._build(info)
            self._models[name] = (version, model)
            return model

    def snapshot(self) -> ClusterSnapshot:
        """Every node, for a gang solve; rebuilt only when the generation moved."""
        with self.lock:
            if self._snapshot is not None and self._snapshot[0] == self.generation:
                return self._snapshot[1]
            nodes = tuple(m for name in sorted(self.nodes) if (m := self.node_model(name)) is not None)
            snap = ClusterSnapshot(nodes, self.levels, self.generation)
            self._snapshot = (self.generation, snap)
            return snap

    def node_model_without(self, name: str, uids: set[str]) -> Node | None:
        """The node as it would be with the given pods gone (preemption victims)."""
        with self.lock:
            info = self.nodes.get(name)
            return None if info is None else self._build(info, exclude=uids)

    def _build(self, info: NodeInfo, exclude: set[str] | frozenset[str] = frozenset()) -> Node:
        used_cpu = used_mem = used_pods = 0
        used_ext: dict[str, int] = {}
        devices = {d.index: DeviceState.of(d) for d in info.devices}
        unplaced: list[PodInfo] = []
        for uid in sorted(self.on_node.get(info.name, set()) - exclude):
            pod, assumed = self.pods.get(uid), self.assumed.get(uid)
            if pod is None and assumed is None:
                continue
            if pod is not None and not pod.active:
                continue
            req = pod.requests if pod is not None else None
            if req is not None:
                used_cpu += req.cpu_milli
                used_mem += req.memory_mib
                used_pods += req.pods
                for k, v in req.extended:
                    used_ext[k] = used_ext.get(k, 0) + v
            assigned = self._assigned(uid)
            if assigned is not None:
                for d in assigned:
                    if d.index in devices:
                        devices[d.index].consume(d)
            elif pod is not None and pod.demand.kind is not GpuKind.NONE:
                unplaced.append(pod)
        node = Node(
            info.name,
            info.allocatable,
            Resources(used_cpu, used_mem, used_pods, tuple(sorted(used_ext.items()))),
            labels=info.labels,
            taints=info.taints,
            topology=info.topology,
            gpus=tuple(d.freeze() for d in devices.values()),
            unschedulable=info.unschedulable,
        )
        return _infer_devices(node, unplaced) if unplaced else node

    def share_contents(self, node: str) -> dict[int, list[int]]:
        """Per device index of `node`, the shares (milli, below a whole GPU) its pods hold, for
        the packer (solver.packing). Call under the lock."""
        out: dict[int, list[int]] = {}
        for uid in self.on_node.get(node, ()):
            pod = self.pods.get(uid)
            if pod is not None and not pod.active:
                continue  # as _build: a finished pod holds nothing
            for a in self._assigned(uid) or ():
                if 0 < a.milli < FULL_SHARE and not a.mig_profile:
                    out.setdefault(a.index, []).append(a.milli)
        return out

    def _assigned(self, uid: str) -> tuple[DeviceAssignment, ...] | None:
        """The devices a counted pod holds: its assumed ones while a bind is in flight, else
        its annotation's (None: not known yet)."""
        assumed = self.assumed.get(uid)
        if assumed is not None:
            return assumed[1]
        pod = self.pods.get(uid)
        return pod.devices if pod is not None else None

    def assumed_usage(self, uid: str) -> tuple[str, tuple[DeviceAssignment, ...]] | None:
        with self.lock:
            return self.assumed.get(uid)


def _same_placement(old: PodInfo, obj: JSON) -> bool:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    return (
        old.node == (spec.get("nodeName") or "")
        and old.phase == status.get("phase", "Pending")
        and old.annotations == (meta.get("annotations") or {})
        and old.labels == (meta.get("labels") or {})
    )


def _infer_devices(node: Node, pods: list[PodInfo]) -> Node:
    """GPU pods on the node without a device record take devices best-fit, oldest first."""
    state = NodeState(Node(node.name, node.allocatable, Resources(), gpus=node.gpus))
    for pod in sorted(pods, key=lambda p: (p.created, p.uid)):
        if state.take(PodShape(Resources(), pod.demand)) is None:
            log.warning("GPU pod does not fit its node's devices", pod=pod.key, node=node.name)
    return replace(node, gpus=tuple(d.freeze() for d in state.devices))


__all__ = ["Cache", "NodeName"]
