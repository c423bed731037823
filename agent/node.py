"""The agent's node loop: the pods on this node, the inventory it publishes, health.

- Pods: list then watch the pods bound to this node (field selector `spec.nodeName`). A pod with
  a device record is admitted to the ledger (this rebuilds the ledger after a restart: the pods
  are the record; only static-slice pins are kept on disk, agent/ledger.py); one whose record
  the ledger refuses gets a Warning Event naming the device and the reason, and its containers
  will not start (PreStartContainer fails), never with other devices. A pod that ends
  (Succeeded, Failed, deleted) is released: its dynamic MIG slices are destroyed.
- Allocations bound over gRPC (`BindAllocation`, before the extender's Binding) are *pending*
  until their pod shows up here; one whose pod does not within `pending_grace_s` (its Binding
  failed, or went elsewhere) is released.
- Inventory: the backend is polled every `interval_s`; each change (health, slices) is written
  to the Node's `phalanx.io/gpu-inventory` annotation (the extender drops unhealthy GPUs and
  reads real MIG layouts from it) and pushed to the device plugins. Pods holding a GPU that
  turned unhealthy are evicted (`evict_unhealthy`), so their workload's controller recreates
  them and the scheduler places them on healthy devices.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from agent.contract import DEVICES_ANNOTATION, ENDPOINT_ANNOTATION, INVENTORY_ANNOTATION, RecordError, decode
from agent.inventory import Inventory
from agent.kube import ApiError, Kube
from agent.ledger import BindRefused, ContainerEdits, Ledger
from agent.mps import MpsControl, MpsError

log = structlog.get_logger("phalanx.agent")

COMPONENT = "phalanx-agent"
TERMINAL = ("Succeeded", "Failed")
HOUSEKEEPING_S = 30.0
JSON = dict[str, Any]


class PodUnknown(LookupError):
    """PreStartContainer for a pod the agent cannot serve; the message says why."""


class NodeLoop:
    def __init__(
        self,
        kube: Kube,
        node: str,
        ledger: Ledger,
        *,
        endpoint: str = "",
        interval_s: float = 1.0,
        pending_grace_s: float = 60.0,
        evict_unhealthy: bool = True,
        on_inventory: Callable[[Inventory], None] | None = None,
        follow_node: Callable[[JSON], None] | None = None,
        mps: MpsControl | None = None,
    ) -> None:
        self.kube = kube
        self.node = node
        self.ledger = ledger
        self.endpoint = endpoint
        self.interval_s = interval_s
        self.pending_grace_s = pending_grace_s
        self.evict_unhealthy = evict_unhealthy
        self.on_inventory = on_inventory
        self.follow_node = follow_node  # the fake backend follows the Node object
        self.mps = mps  # the MPS control daemon share containers need (None: not managed here)
        self._lock = threading.Lock()
        self._pods: dict[str, JSON] = {}  # key -> pod on this node, as last seen
        self._pending: dict[str, float] = {}  # key -> when BindAllocation admitted it
        self._refused: dict[str, str] = {}  # key -> why its record was refused
        self._stop = threading.Event()
        self._listed = threading.Event()
        self._published = ""
        self._evicted: set[str] = set()
        self.housekeeping: Callable[[], object] | None = None  # e.g. stale CDI specs, every HOUSEKEEPING_S
        self._swept = 0.0  # the first sweep right after the first list (orphans of a restart)
        self._pushed: Inventory | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        for target, name in ((self._watch_pods, "agent-pods"), (self._poll, "agent-inventory")):
            threading.Thread(target=target, name=name, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def ready(self) -> bool:
        return self._listed.is_set() and bool(self._published)

    # -- what the gRPC service and the device plugins ask ----------------------------------------

    def pending(self, key: str) -> None:
        """BindAllocation is admitting `key` before its pod is bound here (marked before the
        ledger admits it, so a relist in between keeps it)."""
        with self._lock:
            if key not in self._pods:
                self._pending[key] = time.monotonic()

    def listed(self) -> bool:
        """The pods of this node are known: binds can be judged against them."""
        return self._listed.is_set()

    def is_pending(self, key: str) -> bool:
        with self._lock:
            return key in self._pending

    def pods(self) -> dict[str, JSON]:
        with self._lock:
            return dict(self._pods)

    def resolve(self, namespace: str, name: str, *, wait_s: float = 5.0) -> ContainerEdits:
        """The container edits of a pod on this node (the device plugin's PreStartContainer).
        The kubelet may start a container a moment before the pod watch shows the pod here:
        wait for it (a GET would race the watch's DELETED)."""
        key = f"{namespace}/{name}"
        deadline = time.monotonic() + wait_s
        alloc = self.ledger.get(key)
        while alloc is None and key not in self._refused and time.monotonic() < deadline:
            self._stop.wait(0.05)
            alloc = self.ledger.get(key)
        if alloc is None:
            why = self._refused.get(key) or f"pod {key} has no {DEVICES_ANNOTATION} record"
            raise PodUnknown(why)
        edits = self.ledger.edits(alloc)
        if edits.mps and self.mps is not None:
            try:
                self.mps.ensure()
            except MpsError as e:  # its limits would not hold: the container must not start
                raise PodUnknown(f"pod {key} shares a GPU, but {e}") from None
        return edits

    # -- pods -------------------------------------------------------------------------------------

    def _watch_pods(self) -> None:
        path, query = "/api/v1/pods", {"fieldSelector": f"spec.nodeName={self.node}"}
        while not self._stop.is_set():
            try:
                listed = self.kube.ok("GET", path, query=query)
                self._relist(listed.get("items") or [])
                rv = (listed.get("metadata") or {}).get("resourceVersion", "")
                self._listed.set()
                while not self._stop.is_set():
                    for event in self.kube.watch(path, {**query, "resourceVersion": rv}):
                        kind, obj = event.get("type"), event.get("object") or {}
                        if kind == "ERROR":
                            raise ApiError(int(obj.get("code", 500)), obj, "watch pods")
                        rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                        if kind == "DELETED":
                            self._gone(obj)
                        elif kind in ("ADDED", "MODIFIED"):
                            self._seen(obj)
            except Exception as e:  # a 410, a dropped connection, the API server away: re-list
                log.warning("pod watch restarts", node=self.node, error=str(e))
                self._stop.wait(1.0)

    def _relist(self, items: list[JSON]) -> None:
        keys = set()
        for pod in items:
            keys.add(_key(pod))
            self._seen(pod)
        with self._lock:
            stale = [k for k in self._pods if k not in keys]
        for key in stale:
            self._release(key)
        for alloc in self.ledger.allocations():
            if alloc.key not in keys and not self.is_pending(alloc.key):
                self._release(alloc.key)

    def _seen(self, pod: JSON) -> None:
        key = _key(pod)
        status = pod.get("status") or {}
        if status.get("phase") in TERMINAL or (pod.get("spec") or {}).get("nodeName") != self.node:
            self._gone(pod)
            return
        with self._lock:
            self._pods[key] = pod
            was_pending = self._pending.pop(key, None) is not None
        meta = pod.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(DEVICES_ANNOTATION)
        try:
            grants = decode(text)
        except RecordError as e:
            self._refuse(pod, f"pod {key}: {DEVICES_ANNOTATION}: {e}", "InvalidRecord")
            return
        if grants is None:
            return
        held = self.ledger.get(key)
        uid = str(meta.get("uid", ""))
        if held is not None and held.uid and uid and held.uid != uid:
            self._release(key, keep_pod=True)  # a new pod of the same name: its predecessor is gone
            held = None
        if held is not None and held.grants != grants:
            if not was_pending:  # the record of a pod the node serves was edited: keep serving the first
                self._refuse(pod, f"pod {key}: {DEVICES_ANNOTATION} changed after the pod was bound", "Conflict")
                return
            self.ledger.release(key)  # a BindAllocation whose Binding then carried other devices
        try:
            self.ledger.bind(key, uid, grants)
            self._refused.pop(key, None)
        except BindRefused as e:
            self._refuse(pod, e.message, e.reason)

    def _refuse(self, pod: JSON, message: str, reason: str) -> None:
        key = _key(pod)
        if self._refused.get(key) == message:
            return
        self._refused[key] = message
        log.warning("device record refused", pod=key, reason=reason, message=message)
        try:
            self.kube.event(pod=pod, reason=f"Device{reason}", message=message, component=COMPONENT)
        except Exception as e:
            log.warning("event not posted", pod=key, error=str(e))

    def _gone(self, pod: JSON) -> None:
        self._release(_key(pod))

    def _release(self, key: str, *, keep_pod: bool = False) -> None:
        with self._lock:
            if not keep_pod:
                self._pods.pop(key, None)
            self._pending.pop(key, None)
        self._refused.pop(key, None)
        self._evicted.discard(key)
        if self.ledger.release(key) is not None:
            log.info("allocation released", pod=key)

    # -- inventory and health --------------------------------------------------------------------

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as e:
                log.warning("inventory poll failed", node=self.node, error=str(e))
            self._stop.wait(self.interval_s)

    def _tick(self) -> None:
        """One poll; each step on its own, so one failing (the API server away) never stops the
        others (the device plugins' health, evictions)."""
        if self.follow_node is not None:
            _step("follow the node", lambda: self.follow_node(self.kube.node(self.node)))  # type: ignore[misc]
        self.ledger.refresh()
        inventory = self.ledger.inventory
        if self.on_inventory is not None and inventory != self._pushed:
            _step("update the device plugins", lambda: self.on_inventory(inventory))  # type: ignore[misc]
            self._pushed = inventory
        _step("expire pending binds", self._expire_pending)
        if self._listed.is_set() and time.monotonic() - self._swept > HOUSEKEEPING_S:
            self._swept = time.monotonic()
            _step("reap orphan slices", self._reap)
            if self.housekeeping is not None:
                _step("housekeeping", self.housekeeping)
        if self.evict_unhealthy:
            _step("evict from unhealthy GPUs", lambda: self._evict_unhealthy(inventory))
        _step("publish the inventory", lambda: self._publish(inventory))

    def _publish(self, inventory: Inventory) -> None:
        text = json.dumps(inventory.to_json(), separators=(",", ":"), sort_keys=True)
        if text == self._published:
            return
        annotations = {INVENTORY_ANNOTATION: text}
        if self.endpoint:
            annotations[ENDPOINT_ANNOTATION] = self.endpoint
        self.kube.annotate_node(self.node, annotations)
        log.info(
            "inventory published",
            node=self.node,
            gpus=len(inventory.gpus),
            unhealthy=[g.index for g in inventory.gpus if not g.healthy],
        )
        self._published = text

    def _reap(self) -> None:
        reaped = self.ledger.reap()
        if reaped:
            log.warning("orphan MIG slices destroyed", node=self.node, slices=reaped)

    def _expire_pending(self) -> None:
        now = time.monotonic()
        with self._lock:  # popped under the lock: a pod arriving now is not released after it
            expired = [k for k, t in self._pending.items() if now - t > self.pending_grace_s and k not in self._pods]
            for key in expired:
                del self._pending[key]
        for key in expired:
            log.info("pending allocation expired: its pod was not bound here", pod=key)
            if self.ledger.release(key) is not None:
                log.info("allocation released", pod=key)

    def _evict_unhealthy(self, inventory: Inventory) -> None:
        sick = {g.index: g.health_reason for g in inventory.gpus if not g.healthy}
        if not sick:
            return
        for alloc in self.ledger.allocations():
            hit = [d.grant.index for d in alloc.devices if d.grant.index in sick]
            if not hit or alloc.key in self._evicted or self.is_pending(alloc.key):
                continue
            namespace, name = alloc.key.split("/", 1)
            reason = f"GPU {hit[0]} on {self.node} is unhealthy: {sick[hit[0]]}"
            r = self.kube.evict(namespace, name, grace_s=None, uid=alloc.uid)
            if r.status in (200, 201, 404):
                self._evicted.add(alloc.key)
                log.warning("pod evicted from an unhealthy GPU", pod=alloc.key, reason=reason)
                pod = self.pods().get(alloc.key)
                if pod is not None:
                    self.kube.event(pod=pod, reason="DeviceUnhealthy", message=reason, component=COMPONENT)
            else:
                log.warning("eviction refused", pod=alloc.key, status=r.status, reason=reason)


def _step(what: str, step: Callable[[], object]) -> None:
    try:
        step()
    except Exception as e:
        log.warning("agent step failed; retried next poll", step=what, error=str(e))


def _key(pod: JSON) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
