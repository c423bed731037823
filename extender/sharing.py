"""GPU sharing state: the target workload and the share packer's lifecycle.

The fragmentation measure (solver frag) scores a placement against a *target workload*: the
classes of the pods the cache holds. It drifts slowly, so it is recomputed on the extender's
periodic sweep (`refresh`), never inside a verb. When it changes, a packing plan is built for
it (a small LP, ~20 ms) and a `Packer` adopts what every device holds now.

The packer knows which share sizes each device *awaits* (solver packing). It is told of every
device a bind chooses (`choose`, inside the cache's atomic choose-and-assume), and of every
pod that leaves its node (`pod_changed`, a cache listener: those devices are re-adopted from
their contents before the packer is next read). One rule decides whether a node has room to
open a pattern (`room_to_open`); prioritize's tiers and bind's device order both use it.

Model pools (solver pools): when some pods may only use some GPU models (a nodeSelector or
required affinity on `nvidia.com/gpu.product`, or a GPU pool with model filters), the sweep
also plans how each such group's demand spreads over the pools of nodes of one model, and a
ledger says what each group still has to claim there (its plan less what it holds). A GPU pod
*trespasses* on a pool whose free share, less what other groups still have to claim there,
cannot take it: prioritize ranks those nodes last (`TRESPASSES`), unless every candidate
trespasses. Binds draw the ledger and the pools' free share down between sweeps; the sweep
rebuilds both from the cache.

Locking: this module's lock is a leaf. It may be taken while the cache's lock is held (the
listener and the chooser run there), and it is never held while calling into the cache.
The packer's state is advisory (it orders nodes and devices, it never books capacity), so
what is read without the cache's lock may be a moment stale; decisions that need it exact
(the bind's device choice) settle it under the cache's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from extender.cache import Cache
from extender.objects import PodInfo
from solver import (
    FULL_SHARE,
    DeviceAssignment,
    GpuKind,
    ModelPool,
    Node,
    NodeState,
    Packer,
    PackingPlan,
    PodShape,
    PoolLedger,
    PoolPlan,
    WorkloadClass,
    demand_of,
    workload_classes,
    workload_drift,
)

# The pod mix moves a little with every pod. Fragmentation deltas memoised per node are
# recomputed, with the new target workload, as their nodes change; all of them are dropped at
# once only when the mix has moved this far (total variation distance), since recomputing a
# shape on every node costs 30-60 us per node on the next prioritize.
MEMO_DRIFT = 0.05
CHOSEN_STATES = 4096  # node states whose device choice `Sharing._take` keeps (then starts over)

# Packing tiers of a node for one pod (absent: 0).
JOINS = 2  # a device there awaits this pod's share size
OPENS = 1  # an idle device and room to open the size's pattern there
EATS_RESERVATION = -1  # the pod would eat CPU or memory reserved for pods a device there awaits
TRESPASSES = -4  # the node's model pool holds its free share for pods that can only use it


@dataclass
class Pools:
    """The model pools as the last sweep saw them, drawn down by binds since. Advisory, as
    the packer: a bind racing the sweep may be missed until the next sweep rebuilds them."""

    plan: PoolPlan
    ledger: PoolLedger
    pool_of: dict[str, str]  # node -> its pool (its GPUs' model); GPU nodes only
    free: dict[str, float]  # pool -> free GPU milli


@dataclass(frozen=True, slots=True)
class Choice:
    """Where a bind puts a pod: its devices, and the packing size they were chosen for."""

    devices: tuple[DeviceAssignment, ...]
    size: int = 0


class Sharing:
    def __init__(self, cache: Cache, *, enabled: bool = True) -> None:
        self.cache = cache
        self.enabled = enabled  # gpu.fragmentationScoring
        self._lock = threading.Lock()
        self._workload: tuple[WorkloadClass, ...] = ()
        self.workload_generation = 0  # bumps when memoised fragmentation deltas go stale
        self._packer: Packer | None = None
        self._stale: dict[str, set[int]] = {}  # node -> devices to re-adopt from their contents
        self._events = 0  # bumps on every device the packer is told of and every pod that leaves one
        self._pools: Pools | None = None  # None while no pod is confined to some models
        # `_take`'s choices per node state, for the target workload they were made against:
        # one tuple, read and replaced whole.
        self._chosen: tuple[tuple[WorkloadClass, ...] | None, dict[object, tuple[DeviceAssignment, ...] | None]] = (
            None,
            {},
        )
        cache.on_pod_change(self.pod_changed)

    # ------------------------------------------------------------------ workload

    def workload(self) -> tuple[WorkloadClass, ...]:
        """The target workload for fragmentation (empty when fragmentation scoring is off)."""
        return self._workload if self.enabled else ()

    def refresh(self) -> None:
        """Recompute the target workload from the cache's pods; O(pods), run by the sweep."""
        active = [(node, s) for node, s in self.cache.active_shapes() if s.gpu.kind is not GpuKind.MIG]
        demands = [demand_of(s) for _, s in active]
        workload = workload_classes(demands, multi_gpu=True) if demands else ()
        self._refresh_pools(workload, active)
        if workload != self._workload:
            plan = PackingPlan.build(workload)  # a small LP, ~20 ms; only when the workload changed
            for attempt in range(3):
                seen = self._events
                packer = self._adopt(plan) if plan.patterns else None
                with self._lock:
                    # Installed only if no bind placed a pod and no pod left meanwhile (the new
                    # packer would miss it); after three tries, as is: it is advisory.
                    if seen != self._events and attempt < 2:
                        continue
                    if workload_drift(self._workload, workload) > MEMO_DRIFT:
                        self.workload_generation += 1  # every memoised fragmentation delta is stale
                    self._workload = workload
                    self._packer = packer
                    break
        self.reconcile()

    def _refresh_pools(self, workload: tuple[WorkloadClass, ...], active: list[tuple[str, PodShape]]) -> None:
        """The model pools of the cache's nodes, their plan for `workload` (rebuilt only when
        the workload or the pools changed: a small LP) and a ledger charged with what the
        confined groups hold now."""
        if not any(c.models is not None for c in workload if c.uses_gpu):
            with self._lock:
                self._pools = None
            return
        pool_of: dict[str, str] = {}
        free: dict[str, float] = {}
        sizes: dict[str, list[int]] = {}
        for n in self.cache.snapshot().nodes:
            devices = [d for d in n.gpus if not d.is_mig]
            if not devices:
                continue
            model = devices[0].model
            pool_of[str(n.name)] = model
            free[model] = free.get(model, 0.0) + sum(max(0, d.free_milli) for d in devices)
            size = sizes.setdefault(model, [0, 0, 0])
            size[0] += FULL_SHARE * len(devices)
            size[1] += n.allocatable.cpu_milli
            size[2] += n.allocatable.memory_mib
        pools = tuple(ModelPool(m, *size) for m, size in sorted(sizes.items()))
        old = self._pools
        plan = old.plan if old is not None and old.plan.pools == pools and self._workload == workload else None
        if plan is None:
            plan = PoolPlan.build(workload, pools)
        ledger = PoolLedger(plan)
        for node, shape in active:
            demand = demand_of(shape)
            if node in pool_of and demand.uses_gpu and demand.models is not None:
                ledger.placed(demand.models, pool_of[node], demand.gpu_total)
        with self._lock:
            self._pools = Pools(plan, ledger, pool_of, free)

    def _adopt(self, plan: PackingPlan) -> Packer:
        """A packer for `plan` that knows what every device holds now."""
        packer = Packer(plan)
        for node, contents in self.cache.all_share_contents().items():
            for index, sizes in contents.items():
                packer.adopt(node, index, sizes)
        return packer

    def reconcile(self) -> None:
        """Devices that await pods but hold none any more (the pod that opened them was
        deleted before its bind was seen, or its bind failed) stop waiting."""
        self.settle()
        with self._lock:
            packer, seen = self._packer, self._events
            waiting = packer.waiting_devices() if packer is not None else []
        contents = {name: self.cache.share_contents(name) for name in {str(node) for node, _ in waiting}}
        with self._lock:
            if packer is None or packer is not self._packer or seen != self._events:
                return  # a bind placed a pod meanwhile: the next sweep looks again
            for node, index in waiting:
                if not contents[str(node)].get(index):
                    packer.forget(node, index)

    # ------------------------------------------------------------------ pods leaving

    def pod_changed(self, old: PodInfo | None, new: PodInfo | None) -> None:
        """A pod left its node: its share devices await again what their contents call for
        (re-adopted before the packer is next read). A cache listener: leaf lock only."""
        if old is None or not old.node or not old.devices:
            return
        if new is not None and new.active and new.node == old.node:
            return
        self._mark(old.node, old.devices)

    def _mark(self, node: str, devices: tuple[DeviceAssignment, ...]) -> None:
        shares = {a.index for a in devices if 0 < a.milli < FULL_SHARE}
        if shares and self._packer is not None:
            with self._lock:
                self._stale.setdefault(node, set()).update(shares)
                self._events += 1

    def pools(self) -> Pools | None:
        """The model pools (for reads outside the verbs: the read API, tests)."""
        return self._pools

    def packer(self) -> Packer | None:
        """The packer, settled (for reads outside the verbs: the read API, tests)."""
        self.settle()
        return self._packer

    def settle(self) -> None:
        """Re-adopt the devices pods have left since the last read. The contents are read
        without this module's lock; they are applied only if no pod left and no bind placed one
        meanwhile (else the marks stay for the next reader: a bind settles under the cache's
        lock, where nothing can move)."""
        for _ in range(3):
            if not self._stale:
                return
            with self._lock:
                stale, seen = {node: set(indexes) for node, indexes in self._stale.items()}, self._events
            contents = {node: self.cache.share_contents(node) for node in stale}
            with self._lock:
                if seen != self._events:
                    continue
                if self._packer is not None:
                    for node, indexes in stale.items():
                        for index in sorted(indexes):
                            self._packer.adopt(node, index, contents[node].get(index, []))
                self._stale = {}
                return

    def bind_failed(self, node: str, devices: tuple[DeviceAssignment, ...]) -> None:
        """The packer counted a pod in that did not bind."""
        self._mark(node, devices)

    # ------------------------------------------------------------------ one rule, two users

    def _opening(self, node: str, size: int) -> tuple[tuple[float, float], tuple[float, float]]:
        """(reserved on `node`, needed to open the pattern of `size`), CPU milli and MiB."""
        packer = self._packer
        if packer is None:
            return (0.0, 0.0), (float("inf"), float("inf"))
        with self._lock:
            return packer.reserved(node), packer.opening_need(size)

    def planned_size(self, shape: PodShape) -> int:
        """The pod's share size when the packing plan knows it, else 0."""
        packer = self._packer
        if packer is None or not self.enabled:
            return 0
        demand = demand_of(shape)
        return demand.gpu_milli if demand.is_share and packer.plan.knows(demand.gpu_milli) else 0

    # ------------------------------------------------------------------ prioritize

    def tiered(self) -> bool:
        """Whether `tiers` may rank any node now (a packing plan or model pools exist); when not,
        every node is in tier 0 and callers need not list the nodes for it."""
        return self.enabled and (self._packer is not None or self._pools is not None)

    def tiers(self, names: list[str], shape: PodShape, model_of: Callable[[str], Node | None]) -> dict[str, int]:
        """The packing plan's preference per node (absent: 0): `JOINS`, `OPENS` or
        `EATS_RESERVATION`, and `TRESPASSES` above all for a GPU pod on the nodes of model
        pools held for others. Only a share pod of a planned size can rank up; any other pod
        can only rank down, on nodes holding reservations or in held pools."""
        if not self.enabled:
            return {}
        tiers = self._packing_tiers(names, shape, model_of) if self._packer is not None else {}
        if self._pools is not None:
            for name in self._trespassed(names, shape):
                tiers[name] = TRESPASSES
        return tiers

    def _trespassed(self, names: list[str], shape: PodShape) -> list[str]:
        """The nodes of `names` in pools where a GPU pod of `shape` would take share held for
        other groups, when some candidate is in a pool where it would not (else none)."""
        demand = demand_of(shape)
        if not demand.uses_gpu:
            return []
        with self._lock:
            pools = self._pools
            if pools is None or not pools.plan.expected:
                return []
            candidates = {pools.pool_of.get(n) for n in names} - {None}
            held = {
                p
                for p in candidates
                if p is not None
                and pools.ledger.trespasses(
                    demand.models, p, free_milli=pools.free.get(p, 0.0), gpu_milli=demand.gpu_total
                )
            }
        if not held or held == candidates:
            return []
        return [n for n in names if pools.pool_of.get(n) in held]

    def _packing_tiers(
        self, names: list[str], shape: PodShape, model_of: Callable[[str], Node | None]
    ) -> dict[str, int]:
        self.settle()
        size = self.planned_size(shape)
        demand = demand_of(shape)
        with self._lock:
            packer = self._packer
            if packer is None:
                return {}
            reserved = {str(n): (c, m) for n, c, m in packer.reservations()}
            joins = {str(n) for n, _ in packer.awaiting(size)} if size else set()
            need = packer.opening_need(size) if size else (0.0, 0.0)
        tiers: dict[str, int] = {}
        for name in names if size else [n for n in names if n in reserved]:
            node = model_of(name)
            if node is None:
                continue
            res = reserved.get(node.name, (0.0, 0.0))
            if node.name in joins:
                tiers[node.name] = JOINS
            elif not room_to_open(node, demand.cpu_milli, demand.memory_mib, reserved=res, need=(0, 0), slack=1e-6):
                tiers[node.name] = EATS_RESERVATION
            elif (
                size
                and room_to_open(node, demand.cpu_milli, demand.memory_mib, reserved=res, need=need)
                and _has_idle(node, demand.models)
            ):
                tiers[node.name] = OPENS
        return tiers

    # ------------------------------------------------------------------ bind

    def choose(self, node: Node, shape: PodShape, *, spread: bool) -> tuple[DeviceAssignment, ...] | None:
        """The devices of `node` for one pod, and the packer told of them. Runs inside the
        cache's choose-and-assume (its lock held), so the packer is settled exactly."""
        workload = self.workload()
        lead: tuple[int, ...] = ()
        size = 0
        if workload and not spread:
            self.settle()
            size = self.planned_size(shape)
            lead = self._lead(node, shape, size) if size else ()
        devices = self._take(node, shape, spread, workload, lead)
        if devices and self._pools is not None:
            self._pools_placed(str(node.name), shape, devices)
        if devices and size:
            index = devices[0].index
            fresh = any(d.index == index and d.is_idle for d in node.gpus)
            with self._lock:
                if self._packer is not None:
                    self._packer.placed(node.name, index, size, fresh=fresh)
                    self._events += 1
        return devices

    def _take(
        self,
        node: Node,
        shape: PodShape,
        spread: bool,
        workload: tuple[WorkloadClass, ...],
        lead: tuple[int, ...],
    ) -> tuple[DeviceAssignment, ...] | None:
        """`NodeState.take` on `node`, once per node state: what it chooses depends only on the
        node's free capacity and devices, the shape, the workload and the lead, and most nodes
        of a cluster are in one of a few states (empty, k devices taken by pods alike). The
        measure and the node's rebuild it makes cost more than the lookup (issue 14)."""
        against, table = self._chosen
        if against is not workload:
            table = {}
            self._chosen = (workload, table)
        key = (node.free, node.gpus, shape, spread, lead)
        if key in table:
            return table[key]
        if len(table) >= CHOSEN_STATES:
            table.clear()
        devices = table[key] = NodeState(node).take(shape, spread=spread, workload=workload, lead=lead)
        return devices

    def _pools_placed(self, node: str, shape: PodShape, devices: tuple[DeviceAssignment, ...]) -> None:
        """A bind took `devices` of `node`: its pool's free share and the pod's group's claim
        shrink (until the next sweep rebuilds both from the cache)."""
        demand = demand_of(shape)
        taken = sum(d.milli for d in devices if not d.mig_profile)
        with self._lock:
            pools = self._pools
            pool = pools.pool_of.get(node) if pools is not None else None
            if pools is None or pool is None or not taken:
                return
            pools.free[pool] = pools.free.get(pool, 0.0) - taken
            pools.ledger.placed(demand.models, pool, demand.gpu_total)

    def _lead(self, node: Node, shape: PodShape, size: int) -> tuple[int, ...]:
        """The devices of `node` to try first for a share pod of a planned size: those
        awaiting the size, then (with room for the size's pattern) the idle ones."""
        packer = self._packer
        if packer is None:
            return ()
        with self._lock:
            lead = [d.index for d in node.gpus if packer.awaits(node.name, d.index, size)]
        demand = demand_of(shape)
        reserved, need = self._opening(node.name, size)
        if room_to_open(node, demand.cpu_milli, demand.memory_mib, reserved=reserved, need=need):
            models = demand.models
            lead += [d.index for d in node.gpus if d.is_idle and (models is None or d.model in models)]
        return tuple(lead)


def room_to_open(
    node: Node,
    cpu_milli: int,
    memory_mib: int,
    *,
    reserved: tuple[float, float],
    need: tuple[float, float],
    slack: float = 0.0,
) -> bool:
    """The one rule for room on a node: after a pod of (`cpu_milli`, `memory_mib`) and the CPU
    and memory `reserved` there for awaited pods, at least `need` is still free (the missing
    members of the pattern a share size opens; (0, 0) asks only whether the pod leaves the
    reservations whole). `slack` forgives rounding in the reservations' float sums."""
    cpu = node.free.cpu_milli - cpu_milli
    mem = node.free.memory_mib - memory_mib
    return cpu - reserved[0] >= need[0] - slack and mem - reserved[1] >= need[1] - slack


def _has_idle(node: Node, models: frozenset[str] | None) -> bool:
    return any(d.is_idle and (models is None or d.model in models) for d in node.gpus)
