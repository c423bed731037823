"""What this node holds, checked against its inventory, and the container edits that give a
pod's containers exactly their devices.

An allocation is a pod bound here with a device record (`agent.contract`). `bind` admits one:
- every GPU it names must be in the inventory (`UnknownDevice`) and healthy (`DeviceUnhealthy`);
  a record is never served with other devices than it names;
- shares on one GPU may not sum past the device (`Oversubscribed`): milli <= 1000 and GPU memory
  <= the device's, whole GPUs are exclusive, a static MIG slice of the profile must be free;
- a dynamic MIG entry is cut now, at its placement start (`MigFailed` if the hardware refuses).
Binding the same pod again with the same record is a no-op (the extender retries, the kubelet
calls PreStartContainer on every container start); another record for the same pod is refused.

A bind is all or nothing: a slice cut for a record that is then refused is destroyed again.

`release` ends one: its dynamic slices are destroyed; `reap` destroys dynamic slices nobody
holds (a failed destroy, a bind whose pod never came). `rebuild` re-admits the pods already on
the node after an agent restart: the pods are the record. The one choice a record leaves to the
node, which static MIG slice of a profile a pod gets, is pinned by pod UID in a small state file
(`state`), so two pods of one profile never swap slices under running containers.

Locking: one lock; backend calls (cutting a slice) happen under it, so two binds never race for
one placement.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agent.contract import FULL_SHARE, Grant
from agent.inventory import Backend, BackendError, Gpu, Inventory, MigInstance
from agent.mps import MPS_PIPE_DIRECTORY, MPS_SHM_DIRECTORY

# failure reasons (BindResponse.failure_reason); stable wording, tests assert on them
UNKNOWN_DEVICE = "UnknownDevice"
DEVICE_UNHEALTHY = "DeviceUnhealthy"
OVERSUBSCRIBED = "Oversubscribed"
INVALID_RECORD = "InvalidRecord"
MIG_FAILED = "MigFailed"
CONFLICT = "Conflict"


class BindRefused(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class Device:
    """One device an allocation uses, resolved against the inventory."""

    grant: Grant
    gpu_uuid: str
    mig: MigInstance | None = None  # the slice, for MIG grants

    @property
    def uuid(self) -> str:
        """What NVIDIA_VISIBLE_DEVICES names: the MIG device, else the GPU."""
        return self.mig.uuid if self.mig else self.gpu_uuid


@dataclass(frozen=True, slots=True)
class Allocation:
    key: str  # "<namespace>/<name>"
    uid: str
    grants: tuple[Grant, ...]
    devices: tuple[Device, ...]


@dataclass(frozen=True, slots=True)
class Mount:
    host_path: str
    container_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    """What a container of the pod gets: the environment the NVIDIA container runtime and CUDA
    read, and mounts (the MPS pipe directory for shares)."""

    env: dict[str, str]
    mounts: tuple[Mount, ...] = ()
    mps: bool = False  # the limits are MPS client settings: the daemon must run


@dataclass
class _Use:
    shares: int = 0  # share grants (any: a TFLOPs-only one takes no milli and no memory)
    milli: int = 0
    memory_mib: int = 0
    whole: str = ""  # key of the pod holding the GPU whole
    slices: dict[str, str] = field(default_factory=dict)  # MIG uuid -> key


class Ledger:
    def __init__(self, backend: Backend, *, state: Path | None = None) -> None:
        self._backend = backend
        self._lock = threading.Lock()
        self._inventory = backend.inventory()
        self._allocations: dict[str, Allocation] = {}
        self._state = state  # where the static-slice pins are kept (a host path: they outlive the agent)
        self._pins: dict[str, tuple[str, ...]] = _load_pins(state)

    # -- inventory ---------------------------------------------------------------------------

    @property
    def inventory(self) -> Inventory:
        return self._inventory

    def refresh(self) -> bool:
        """Read the backend again; True when the inventory changed (health, slices)."""
        fresh = self._backend.inventory()
        with self._lock:
            changed = fresh != self._inventory
            self._inventory = fresh
        return changed

    # -- allocations -------------------------------------------------------------------------

    def get(self, key: str) -> Allocation | None:
        with self._lock:
            return self._allocations.get(key)

    def allocations(self) -> list[Allocation]:
        with self._lock:
            return sorted(self._allocations.values(), key=lambda a: a.key)

    def bind(self, key: str, uid: str, grants: tuple[Grant, ...]) -> Allocation:
        """Admit the pod `key` holding `grants`; raises `BindRefused`."""
        if not grants:
            raise BindRefused(INVALID_RECORD, f"pod {key}: the device record is empty")
        with self._lock:
            held = self._allocations.get(key)
            if held is not None:
                if held.grants == grants and (not uid or held.uid == uid):
                    return held
                raise BindRefused(CONFLICT, f"pod {key} is bound here with other devices ({_show(held.grants)})")
            uses = self._uses()
            cut: list[tuple[int, str]] = []
            try:
                devices = tuple(self._admit(key, uid, g, uses, cut) for g in grants)
            except BindRefused:
                self._destroy(cut)  # all or nothing: no slice outlives a refused record
                raise
            alloc = Allocation(key, uid, grants, devices)
            self._allocations[key] = alloc
            self._pin(alloc)
            return alloc

    def release(self, key: str) -> Allocation | None:
        """Forget the pod `key` and destroy its dynamic slices."""
        with self._lock:
            alloc = self._allocations.pop(key, None)
            if alloc is None:
                return None
            self._destroy([(d.grant.index, d.mig.uuid) for d in alloc.devices if d.grant.dynamic and d.mig])
            if alloc.uid in self._pins:
                del self._pins[alloc.uid]
                self._save_pins()
            return alloc

    def reap(self) -> list[str]:
        """Destroy the dynamic slices no allocation holds (a release whose destroy failed, a
        BindAllocation whose pod never came before a restart); the caller holds every pending
        bind in the ledger. Only on a dynamic-MIG node, where every slice is the agent's."""
        with self._lock:
            if not self._inventory.dynamic_mig:
                return []
            held = {d.mig.uuid for a in self._allocations.values() for d in a.devices if d.mig is not None}
            orphans = [(g.index, m.uuid) for g in self._inventory.gpus for m in g.migs if m.uuid not in held]
            self._destroy(orphans)
            return [uuid for _, uuid in orphans]

    def _destroy(self, slices: list[tuple[int, str]]) -> None:
        """Lock held. A failure leaves the slice in the inventory; `reap` tries it again."""
        for index, uuid in slices:
            with contextlib.suppress(BackendError):
                self._backend.destroy_mig(index, uuid)
        if slices:
            self._inventory = self._backend.inventory()

    def _pin(self, alloc: Allocation) -> None:
        """Lock held: remember which static slices `alloc` took, across restarts."""
        static = tuple(d.mig.uuid for d in alloc.devices if d.mig is not None and not d.grant.dynamic)
        if static and alloc.uid and self._pins.get(alloc.uid) != static:
            self._pins[alloc.uid] = static
            self._save_pins()

    def _save_pins(self) -> None:
        if self._state is None:
            return
        tmp = self._state.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._pins, sort_keys=True))
        os.replace(tmp, self._state)

    def rebuild(self, pods: Iterable[tuple[str, str, tuple[Grant, ...]]]) -> dict[str, BindRefused]:
        """Admit the pods already on the node (after a restart); returns the refused ones."""
        refused: dict[str, BindRefused] = {}
        for key, uid, grants in pods:
            try:
                self.bind(key, uid, grants)
            except BindRefused as e:
                refused[key] = e
        return refused

    def edits(self, alloc: Allocation) -> ContainerEdits:
        """The container environment for `alloc` (every container of the pod gets the same)."""
        env = {
            "NVIDIA_VISIBLE_DEVICES": ",".join(d.uuid for d in alloc.devices),
            "PHALANX_GPU_DEVICES": ",".join(d.uuid for d in alloc.devices),
        }
        shared = [(i, d) for i, d in enumerate(alloc.devices) if not d.grant.mig and not d.grant.whole]
        if not shared:
            return ContainerEdits(env)
        # MPS (CUDA >= 11.5 clients): the ordinals are the container's own (its visible devices).
        gpus = self._inventory.by_index
        limits = []
        for ordinal, d in shared:
            gpu = gpus.get(d.grant.index)
            mib = d.grant.memory_mib or (gpu.memory_mib * d.grant.milli // FULL_SHARE if gpu else 0)
            if mib:
                limits.append(f"{ordinal}={mib}M")
                env[f"CUDA_DEVICE_MEMORY_LIMIT_{ordinal}"] = f"{mib}m"  # HAMi-core's spelling
        if limits:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(limits)
        milli = min(d.grant.milli for _, d in shared)
        if milli:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, milli // 10))
            env["CUDA_DEVICE_SM_LIMIT"] = str(max(1, milli // 10))
        env["CUDA_MPS_PIPE_DIRECTORY"] = MPS_PIPE_DIRECTORY
        mounts = (Mount(MPS_PIPE_DIRECTORY, MPS_PIPE_DIRECTORY), Mount(MPS_SHM_DIRECTORY, "/dev/shm"))
        return ContainerEdits(env, mounts, mps=True)

    # -- internals (lock held) ------------------------------------------------------------------

    def _uses(self) -> dict[int, _Use]:
        uses: dict[int, _Use] = {}
        for alloc in self._allocations.values():
            for d in alloc.devices:
                use = uses.setdefault(d.grant.index, _Use())
                if d.mig is not None:
                    use.slices[d.mig.uuid] = alloc.key
                elif d.grant.whole:
                    use.whole = alloc.key
                else:
                    use.shares += 1
                    use.milli += d.grant.milli
                    use.memory_mib += d.grant.memory_mib
        return uses

    def _admit(self, key: str, uid: str, g: Grant, uses: dict[int, _Use], cut: list[tuple[int, str]]) -> Device:
        gpu = self._inventory.gpu(g.index)
        if gpu is None:
            known = ", ".join(str(i) for i in sorted(self._inventory.by_index)) or "none"
            raise BindRefused(UNKNOWN_DEVICE, f"pod {key}: GPU {g.index} is not on this node (GPUs: {known})")
        if not gpu.healthy:
            raise BindRefused(
                DEVICE_UNHEALTHY, f"pod {key}: GPU {g.index} ({gpu.uuid}) is unhealthy: {gpu.health_reason}"
            )
        use = uses.setdefault(g.index, _Use())
        if g.mig:
            return self._admit_mig(key, g, gpu, use, uid, cut)
        if gpu.mig_enabled:
            raise BindRefused(INVALID_RECORD, f"pod {key}: GPU {g.index} is in MIG mode; the record asks a share of it")
        if use.whole or use.slices:
            holder = use.whole or next(iter(use.slices.values()))
            raise BindRefused(OVERSUBSCRIBED, f"pod {key}: GPU {g.index} is held by {holder}")
        if g.whole:
            if use.shares:
                raise BindRefused(OVERSUBSCRIBED, f"pod {key}: GPU {g.index} is shared by {use.shares} pods")
            use.whole = key
            return Device(g, gpu.uuid)
        if use.milli + g.milli > FULL_SHARE:
            raise BindRefused(
                OVERSUBSCRIBED, f"pod {key}: GPU {g.index} has {FULL_SHARE - use.milli}/1000 free, asked {g.milli}"
            )
        if use.memory_mib + g.memory_mib > gpu.memory_mib:
            raise BindRefused(
                OVERSUBSCRIBED,
                f"pod {key}: GPU {g.index} has {gpu.memory_mib - use.memory_mib} MiB free, asked {g.memory_mib}",
            )
        use.shares += 1
        use.milli += g.milli
        use.memory_mib += g.memory_mib
        return Device(g, gpu.uuid)

    def _admit_mig(self, key: str, g: Grant, gpu: Gpu, use: _Use, uid: str, cut: list[tuple[int, str]]) -> Device:
        if use.whole or use.shares:
            raise BindRefused(OVERSUBSCRIBED, f"pod {key}: GPU {g.index} is held whole or shared")
        if g.dynamic:
            mine = next((m for m in gpu.migs if m.profile == g.mig and m.start == g.start), None)
            if mine is not None and mine.uuid in use.slices:
                raise BindRefused(
                    OVERSUBSCRIBED,
                    f"pod {key}: slice {g.mig}@{g.start} on GPU {g.index} is held by {use.slices[mine.uuid]}",
                )
            try:
                mig = mine
                if mig is None:
                    mig = self._backend.create_mig(g.index, g.mig, g.start)
                    cut.append((g.index, mig.uuid))
            except BackendError as e:
                raise BindRefused(
                    MIG_FAILED, f"pod {key}: cutting {g.mig} at {g.start} on GPU {g.index}: {e}"
                ) from None
            self._inventory = self._backend.inventory()
            use.slices[mig.uuid] = key
            return Device(g, gpu.uuid, mig)
        if not gpu.mig_enabled:
            raise BindRefused(
                INVALID_RECORD, f"pod {key}: GPU {g.index} is not in MIG mode; the record asks a {g.mig} slice"
            )
        free = [m for m in gpu.migs if m.profile == g.mig and m.uuid not in use.slices]
        if not free:
            total = sum(1 for m in gpu.migs if m.profile == g.mig)
            reason = UNKNOWN_DEVICE if not total else OVERSUBSCRIBED
            raise BindRefused(reason, f"pod {key}: no free {g.mig} slice on GPU {g.index} ({total} there)")
        # The slice this pod held before a restart (the record names a profile, not a slice):
        # two pods of one profile never swap slices under their running containers.
        pinned = set(self._pins.get(uid, ()))
        mig = min(free, key=lambda m: (m.uuid not in pinned, m.start))
        use.slices[mig.uuid] = key
        return Device(g, gpu.uuid, mig)


def _load_pins(state: Path | None) -> dict[str, tuple[str, ...]]:
    if state is None or not state.exists():
        return {}
    try:
        raw = json.loads(state.read_text())
        return {str(uid): tuple(str(u) for u in uuids) for uid, uuids in raw.items()}
    except (ValueError, AttributeError, TypeError):
        return {}  # unreadable: slices are chosen afresh (as on a first start)


def _show(grants: tuple[Grant, ...]) -> str:
    return ", ".join(f"GPU {g.index} {g.mig or f'{g.milli}/1000'}" for g in grants)
