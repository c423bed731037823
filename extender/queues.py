"""Queues on the Kubernetes side: Queue objects, which queue a pod is in, and what each uses.

The decisions (limits, fair shares, which usage is borrowed) are the solver's pure functions
(solver/queues.py); this module feeds them. It keeps, per pod, the queue and the amounts the pod
holds (counted: bound, or assumed by a bind or a gang reservation) or wants (pending pods of a
scheduler that calls this extender), and per queue their sums, updated incrementally: the cache
reports each pod whose counting may have changed (`Cache.on_count`) and the book re-reads only
those, so a filter call pays for what changed since the last, never for every pod.

A pod's queue: its label `phalanx.io/queue` (or KAI's `kai.scheduler/queue`, or Volcano's
`scheduling.volcano.sh/queue-name`), else its namespace's `phalanx.io/queue` label, else the
configured default queue. Queues are off until the first Queue object exists: then every check
below is one dictionary test. A pod naming a queue that has no Queue object waits (a typo must
not escape its team's quota) with a message naming the queue.

Limits are hard: the filter refuses a pod or gang that would take its queue (or an ancestor)
past one, and bind checks again, atomically with the device assumption (`bind_lock`), because
kube-scheduler filters the next pod before the previous one's bind arrives.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from extender import quantity
from extender.cache import Cache
from extender.config import QueuesConfig
from extender.objects import PodInfo
from solver import (
    GPU_RESOURCES,
    RESOURCES,
    NodeName,
    PodShape,
    QueueSpec,
    QueueTree,
    fair_share_check,
    fair_shares,
    format_amount,
    limit_check,
    limit_excess,
    rollup,
    usage_of,
)

log = structlog.get_logger("phalanx.queues")

QUEUE_LABELS = ("phalanx.io/queue", "kai.scheduler/queue", "scheduling.volcano.sh/queue-name")
NAMESPACE_LABEL = "phalanx.io/queue"
NO_SUCH_QUEUE = "no such Queue"
DIRTY_MOST = 100_000
Vector = dict[str, int]


@dataclass(slots=True)
class _Entry:
    """One pod as the book counts it."""

    queue: str
    used: Vector  # what it holds (bound or assumed); empty otherwise
    pending: Vector  # what it wants (pending, of one of our schedulers); empty otherwise
    since: float  # creation time (epoch s) while pending, for the oldest wait


@dataclass(frozen=True, slots=True)
class Admitted:
    """A gang's or pod's admission: its queue, what it needs, and why not ("" when admitted)."""

    queue: str
    need: dict[str, int]
    refusal: str = ""
    excess: dict[str, dict[str, int]] = field(default_factory=dict)  # a limit refusal: what is over, where


@dataclass(slots=True)
class _Derived:
    key: tuple[int, int, int, str]
    capacity: Vector
    used: dict[str, Vector]  # rolled up
    demand: dict[str, Vector]  # rolled up: used + pending
    shares: dict[str, Vector]


@dataclass(slots=True)
class QueueView:
    """One queue as the read API, the status writer and /metrics show it."""

    name: str
    spec: QueueSpec
    allocated: Vector
    demand: Vector
    fair_share: Vector
    pending_pods: int = 0
    pending_gangs: int = 0
    oldest_wait_s: float = 0.0
    problems: list[str] = field(default_factory=list)


def parse_queue(obj: Mapping[str, Any]) -> tuple[QueueSpec, list[str]]:
    """A Queue object as the solver's QueueSpec, and the problems with its spec (each naming
    the queue and the field). A bad amount is left out (that resource unlimited, or nothing
    deserved), never the whole queue."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    name = str(meta.get("name", ""))
    problems: list[str] = []
    if not isinstance(spec, Mapping):  # the CRD's schema says object; a hostile store may not
        problems.append(f"queue {name}: spec: expected an object, got {type(spec).__name__}")
        spec = {}
    amounts: dict[str, Vector] = {}
    for part in ("deserved", "limit"):
        raw = spec.get(part) or {}
        if not isinstance(raw, Mapping):
            problems.append(f"queue {name}: spec.{part}: expected a mapping of resource to quantity")
            raw = {}
        amounts[part] = {}
        for key, value in raw.items():
            amount = _amount(str(key), value)
            if isinstance(amount, str):
                problems.append(f"queue {name}: spec.{part}.{key}: {amount}")
            else:
                amounts[part][str(key)] = amount
    weight = spec.get("weight", 1)
    if not isinstance(weight, int) or isinstance(weight, bool) or weight < 0:
        problems.append(f"queue {name}: spec.weight: expected an integer >= 0, got {weight!r}; using 1")
        weight = 1
    parent = spec.get("parent") or ""
    if not isinstance(parent, str):
        problems.append(f"queue {name}: spec.parent: expected a queue name, got {parent!r}")
        parent = ""
    return QueueSpec(name, parent, amounts["deserved"], amounts["limit"], weight), problems


def _amount(key: str, value: Any) -> int | str:
    """One quota amount in the solver's unit, or why it cannot be read."""
    kind, _, model = key.partition("/")
    if kind not in RESOURCES or (model and kind not in GPU_RESOURCES):
        known = ", ".join(RESOURCES)
        return f"unknown resource (use {known}, or gpu, gpuShare, gpuMemory followed by /<GPU model>)"
    if isinstance(value, bool) or not isinstance(value, int | str | float):
        return f"expected a quantity, got {value!r}"
    try:
        if kind in ("memory", "gpuMemory"):
            amount = quantity.mib(value)
        elif kind in ("cpu", "gpuShare"):
            amount = quantity.milli(value)
        else:
            amount = quantity.count(value)
    except (ValueError, ArithmeticError) as e:
        return f"{value!r} is not a quantity: {e}"
    return amount if amount >= 0 else f"{value!r} is negative"


def _add(into: dict[str, Vector], queue: str, amounts: Mapping[str, int], sign: int) -> None:
    if not amounts:
        return
    total = into.setdefault(queue, {})
    for k, v in amounts.items():
        left = total.get(k, 0) + sign * v
        if left:
            total[k] = left
        else:
            total.pop(k, None)


class QueueBook:
    def __init__(self, cache: Cache, config: QueuesConfig, *, gang_of: Callable[[PodInfo], str]) -> None:
        self.cache = cache
        self.config = config
        self.gang_of = gang_of
        self.lock = threading.RLock()
        self.bind_lock = threading.Lock()  # a single pod's bind: limit check and assume, atomically
        self._dirty: list[str] = []  # appended by the cache's listener, taken by `_settle`
        self._all_dirty = True
        self._entries: dict[str, _Entry] = {}
        self._own_used: dict[str, Vector] = {}
        self._own_pending: dict[str, Vector] = {}
        self._objects: dict[str, QueueSpec] = {}
        self._problems: dict[str, list[str]] = {}
        self._namespaces: dict[str, str] = {}
        self._schedulers: set[str] = set()
        self._version = 0
        self._tree_version = 0
        self.tree, self.tree_problems = QueueTree.build((), default=config.default_queue)
        self._derived: _Derived | None = None
        self.waits: Callable[[str, float], None] = lambda queue, seconds: None  # /metrics hook
        self.changed: Callable[[], None] = lambda: None  # Queues changed: waiting gangs try again
        cache.on_count(self._mark)

    # ------------------------------------------------------------------ inputs

    def _mark(self, uid: str) -> None:
        """The cache's listener (under its lock: record only). A list's append and a prefix
        `del` are atomic; with no Queue objects, or past DIRTY_MOST unread (a standby nobody
        asks), one full re-read later replaces the list."""
        if not self._objects or len(self._dirty) > DIRTY_MOST:
            self._all_dirty = True
            if self._dirty:
                del self._dirty[:]
            return
        self._dirty.append(uid)

    @property
    def active(self) -> bool:
        """Queues are in use once a Queue object exists."""
        return bool(self._objects)

    def configure(self, config: QueuesConfig) -> None:
        with self.lock:
            default_moved = config.default_queue != self.config.default_queue
            self.config = config
            if default_moved:
                self._rebuild_tree()
                self._all_dirty = True
        if default_moved:
            self.changed()  # outside the lock: the gang manager's lock comes before this one

    def replace_queues(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A (re-)list: the new set is built aside and swapped in whole, so a check that reads
        without the lock never sees it half filled."""
        objects: dict[str, QueueSpec] = {}
        problems: dict[str, list[str]] = {}
        for obj in items:
            spec, found = parse_queue(obj)
            if spec.name:
                if self._objects.get(spec.name) != spec:
                    for problem in found:
                        log.warning("queue spec problem", problem=problem)
                objects[spec.name], problems[spec.name] = spec, found
        with self.lock:
            if objects == self._objects and self._tree_version:
                return  # a re-list that changed no spec
            if objects and not self._objects:
                self._all_dirty = True  # nothing was recorded while queues were off
            self._objects, self._problems = objects, problems
            self._rebuild_tree()
        self.changed()

    def queue_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        with self.lock:
            name = str((obj.get("metadata") or {}).get("name", ""))
            before = self._objects.get(name)
            if kind == "DELETED":
                self._objects.pop(name, None)
                self._problems.pop(name, None)
            else:
                if not self._objects:
                    self._all_dirty = True  # nothing was recorded while queues were off
                self._set_queue(obj)
            if self._objects.get(name) == before:
                return  # a status write (ours), or a change of nothing Phalanx reads
            self._rebuild_tree()
        self.changed()

    def _set_queue(self, obj: Mapping[str, Any]) -> None:
        spec, problems = parse_queue(obj)
        if spec.name:
            if self._objects.get(spec.name) != spec:
                for problem in problems:
                    log.warning("queue spec problem", problem=problem)
            self._objects[spec.name] = spec
            self._problems[spec.name] = problems

    def has_object(self, name: str) -> bool:
        return name in self._objects

    def _rebuild_tree(self) -> None:
        known = set(self.tree_problems)
        self.tree, self.tree_problems = QueueTree.build(self._objects.values(), default=self.config.default_queue)
        for problem in self.tree_problems:
            if problem not in known:
                log.warning("queue hierarchy problem", problem=problem)
        self._tree_version += 1

    def replace_namespaces(self, items: Iterable[Mapping[str, Any]]) -> None:
        fresh: dict[str, str] = {}
        for obj in items:
            meta = obj.get("metadata") or {}
            label = (meta.get("labels") or {}).get(NAMESPACE_LABEL, "")
            if label:
                fresh[str(meta.get("name", ""))] = str(label)
        with self.lock:
            if fresh != self._namespaces:
                self._namespaces = fresh  # swapped whole: readers never see it half filled
                self._all_dirty = True

    def namespace_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        before = self._namespaces.get(name, "")
        with self.lock:
            if kind == "DELETED":
                self._namespaces.pop(name, None)
            else:
                self._set_namespace(obj)
            if self._namespaces.get(name, "") != before:
                self._all_dirty = True

    def _set_namespace(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        label = (meta.get("labels") or {}).get(NAMESPACE_LABEL, "")
        if label:
            self._namespaces[str(meta.get("name", ""))] = str(label)
        else:
            self._namespaces.pop(str(meta.get("name", "")), None)

    def note_scheduler(self, name: str) -> None:
        """A scheduler name seen calling the extender: its pending pods are demand."""
        if name not in self._schedulers:
            with self.lock:
                self._schedulers.add(name)
                self._all_dirty = True

    def ours(self, pod: PodInfo) -> bool:
        """Whether a scheduler that calls this extender schedules the pod (names seen)."""
        return pod.scheduler in self._schedulers

    def queue_of(self, pod: PodInfo) -> str:
        return self.queue_for(pod.namespace, pod.labels)

    def queue_for(self, namespace: str, labels: Mapping[str, str]) -> str:
        """The queue of an object with these labels in this namespace (a pod, or a workload
        object at admission, whose pods will carry its labels)."""
        for label in QUEUE_LABELS:
            value = labels.get(label)
            if value:
                return str(value)
        return self._namespaces.get(namespace) or self.config.default_queue

    # ------------------------------------------------------------------ accounting

    def _settle(self) -> None:
        """Re-read the pods whose counting changed since the last call (all, after a change
        of namespaces, schedulers or the default queue)."""
        taken = len(self._dirty)
        if not taken and not self._all_dirty:
            return
        uids: Iterable[str] = set(self._dirty[:taken])
        del self._dirty[:taken]
        if self._all_dirty:
            self._all_dirty = False
            uids = set(self.cache.pod_uids()) | set(self._entries)
        for uid in uids:
            self._reread(uid)
        self._version += 1

    def _reread(self, uid: str) -> None:
        old = self._entries.pop(uid, None)
        if old is not None:
            _add(self._own_used, old.queue, old.used, -1)
            _add(self._own_pending, old.queue, old.pending, -1)
        pod, node, devices = self.cache.placement(uid)
        if pod is None or not pod.active:
            return
        if node:
            entry = _Entry(self.queue_of(pod), self._held(pod, node, devices), {}, 0.0)
            if old is not None and old.pending and not old.used and entry.queue in self.tree:
                # Known queues only: a pod's label is anyone's to write, a metric label set is not.
                self.waits(entry.queue, max(0.0, time.time() - old.since))
        elif pod.scheduler in self._schedulers and not pod.node:
            entry = _Entry(self.queue_of(pod), {}, usage_of(_shape(pod)), _epoch(pod.created))
        else:
            return
        self._entries[uid] = entry
        _add(self._own_used, entry.queue, entry.used, 1)
        _add(self._own_pending, entry.queue, entry.pending, 1)

    def _held(self, pod: PodInfo, node: str, devices: Sequence[Any]) -> Vector:
        """What a counted pod holds, by GPU model where its devices say which (or its node has
        GPUs of one model only: a pod bound without a device record, e.g. by another scheduler)."""
        model, memory = "", 0
        info = self.cache.node_model(NodeName(node)) if pod.demand.count else None
        if info is not None and info.gpus:
            by_index = {d.index: d for d in info.gpus}
            device = by_index.get(devices[0].index) if devices else None
            if device is None and len({d.model for d in info.gpus}) == 1:
                device = info.gpus[0]
            if device is not None:
                model, memory = device.model, device.memory_mib
        return usage_of(_shape(pod), model=model, device_memory_mib=memory)

    def _state(self) -> _Derived:
        """Capacity, rolled-up usage and demand, fair shares: rebuilt only when something moved."""
        self._settle()
        key = (self._version, self.cache.nodes_version, self._tree_version, self.config.fair_share)
        if self._derived is not None and self._derived.key == key:
            return self._derived
        capacity = (
            self._derived.capacity if self._derived is not None and self._derived.key[1] == key[1] else self._capacity()
        )
        used = rollup(self.tree, self._own_used)
        own_demand: dict[str, Vector] = {}
        for part in (self._own_used, self._own_pending):
            for queue, amounts in part.items():
                _add(own_demand, queue, amounts, 1)
        demand = rollup(self.tree, own_demand)
        shares = fair_shares(self.tree, capacity, demand) if self.config.fair_share == "PerResource" else {}
        self._derived = _Derived(key, capacity, used, demand, shares)
        return self._derived

    def _capacity(self) -> Vector:
        total: dict[str, int] = {}
        for info in self.cache.node_infos():
            if info.unschedulable:
                continue
            amounts = {"cpu": info.allocatable.cpu_milli, "memory": info.allocatable.memory_mib}
            for d in info.devices:
                for key, value in (("gpu", 1), ("gpuShare", 1000), ("gpuMemory", d.memory_mib)):
                    amounts[key] = amounts.get(key, 0) + value
                    amounts[f"{key}/{d.model}"] = amounts.get(f"{key}/{d.model}", 0) + value
            for k, v in amounts.items():
                total[k] = total.get(k, 0) + v
        return total

    # ------------------------------------------------------------------ admission

    def check_pod(self, pod: PodInfo) -> str:
        """Filter's question for a single pod: "" when its queue lets it take capacity now."""
        if not self._objects:
            return ""
        with self.lock:
            return self._check(self.queue_of(pod), usage_of(_shape(pod)), {}, what="pod").refusal

    def check_gang(self, pods: Sequence[PodInfo], extra: Mapping[str, Vector]) -> Admitted:
        """The admission of a gang's members about to be planned (`extra`: what gangs admitted
        earlier in the same solve need, per queue)."""
        queue = self.queue_of(pods[0]) if pods else self.config.default_queue
        need: Vector = {}
        for pod in pods:
            for k, v in usage_of(_shape(pod)).items():
                need[k] = need.get(k, 0) + v
        if not self._objects:
            return Admitted(queue, need)
        with self.lock:
            return self._check(queue, need, extra, what="gang")

    def check_limit(self, queue: str, need: Mapping[str, int], extra: Mapping[str, Vector], what: str) -> str:
        """Limits only (the hard rule), e.g. a planned gang's usage per GPU model."""
        if not self._objects:
            return ""
        with self.lock:
            state = self._state()
            used = _with_extra(self.tree, state.used, extra)
            return limit_check(self.tree, used, queue, need, what=what)

    def _check(self, queue: str, need: Vector, extra: Mapping[str, Vector], *, what: str) -> Admitted:
        if queue not in self.tree:
            why = f"queue {queue}: {NO_SUCH_QUEUE} (create it, or label the pod with an existing queue)"
            return Admitted(queue, need, why)
        state = self._state()
        used = _with_extra(self.tree, state.used, extra)
        refusal = limit_check(self.tree, used, queue, need, what=what)
        if refusal:
            return Admitted(queue, need, refusal, limit_excess(self.tree, used, queue, need))
        if state.shares:
            refusal = fair_share_check(
                self.tree,
                capacity=state.capacity,
                used=used,
                demand=state.demand,
                shares=state.shares,
                queue=queue,
                need=need,
                what=what,
            )
        return Admitted(queue, need, refusal)

    def guard(self) -> AbstractContextManager[Any]:
        """Held across a limit check and the assumption it allows (single binds, gang
        reservations), so two never pass a limit together."""
        return self.bind_lock if self._objects else nullcontext()

    def bind_check(self, pod: PodInfo) -> str:
        """Bind's limit check for a single pod (hold `bind_lock` across it and the assume)."""
        if not self._objects:
            return ""
        return self.check_limit(self.queue_of(pod), usage_of(_shape(pod)), {}, "pod")

    def held(self, uid: str) -> Vector:
        """What a counted pod holds, as its queue counts it (empty for others)."""
        with self.lock:
            self._settle()
            entry = self._entries.get(uid)
            return dict(entry.used) if entry is not None else {}

    def used(self, queue: str) -> Vector:
        """What a queue and its children hold now."""
        with self.lock:
            return dict(self._state().used.get(queue, {}))

    # ------------------------------------------------------------------ views

    def views(self) -> list[QueueView]:
        with self.lock:
            state = self._state()
            waiting = [(uid, e.queue, e.since) for uid, e in self._entries.items() if e.pending]
        pending = self._pending_by_queue(waiting)  # gang keys may run jq: not under the lock
        with self.lock:
            now = time.time()
            out = []
            for name in self.tree.names:
                spec = self.tree.get(name)
                assert spec is not None
                pods, gangs, oldest = pending.get(name, (0, 0, now))
                view = QueueView(
                    name,
                    spec,
                    dict(state.used.get(name, {})),
                    dict(state.demand.get(name, {})),
                    dict(state.shares.get(name, {})),
                    pods,
                    gangs,
                    max(0.0, now - oldest) if pods else 0.0,
                    [*self._problems.get(name, []), *(p for p in self.tree_problems if f"queue {name}:" in p)],
                )
                out.append(view)
            return out

    def _pending_by_queue(self, waiting: list[tuple[str, str, float]]) -> dict[str, tuple[int, int, float]]:
        """Per queue: pending pods, pending gangs (distinct gang keys; a single pod counts as
        none) and the oldest pending pod's creation time."""
        pods: dict[str, int] = {}
        gangs: dict[str, set[str]] = {}
        oldest: dict[str, float] = {}
        for uid, queue, since in waiting:
            pods[queue] = pods.get(queue, 0) + 1
            oldest[queue] = min(oldest.get(queue, since), since)
            pod = self.cache.pod(uid)
            key = self.gang_of(pod) if pod is not None else ""
            if key:
                gangs.setdefault(queue, set()).add(key)
        return {q: (n, len(gangs.get(q, ())), oldest[q]) for q, n in pods.items()}


def view_json(view: QueueView) -> dict[str, Any]:
    """A queue for the read API and the Queue status: amounts as readable quantities."""

    def shown(amounts: Mapping[str, int]) -> dict[str, str]:
        return {k: format_amount(k, v) for k, v in sorted(amounts.items())}

    summary = {
        kind: {
            "allocated": format_amount(kind, view.allocated.get(kind, 0)),
            "deserved": format_amount(kind, view.spec.deserved.get(kind, 0)),
            "fairShare": format_amount(kind, view.fair_share.get(kind, 0)),
            "limit": format_amount(kind, view.spec.limit[kind]) if kind in view.spec.limit else "-",
        }
        for kind in RESOURCES
    }
    return {
        "name": view.name,
        "parent": view.spec.parent,
        "weight": view.spec.weight,
        "allocated": shown(view.allocated),
        "deserved": shown(view.spec.deserved),
        "fairShare": shown(view.fair_share),
        "limit": shown(view.spec.limit),
        "demand": shown(view.demand),
        "summary": summary,
        "pendingPods": view.pending_pods,
        "pendingGangs": view.pending_gangs,
        "oldestWait": duration(view.oldest_wait_s),
        "problems": view.problems,
    }


def duration(seconds: float) -> str:
    """4m10s, 2h3m, 12s: the wait as kubectl shows ages."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s"
    return f"{s // 3600}h{s % 3600 // 60}m"


def _with_extra(tree: QueueTree, used: Mapping[str, Vector], extra: Mapping[str, Vector]) -> Mapping[str, Vector]:
    """Rolled-up usage plus what was admitted earlier in the same solve (rolled up too)."""
    if not extra:
        return used
    rolled = rollup(tree, extra)
    out = {q: dict(v) for q, v in used.items()}
    for queue, amounts in rolled.items():
        _add(out, queue, amounts, 1)
    return out


def _shape(pod: PodInfo) -> PodShape:
    return PodShape(pod.requests, pod.demand, gpu_models=pod.gpu_models)


def _epoch(created: str) -> float:
    try:
        return datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return time.time()
