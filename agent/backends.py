"""The two `Backend`s: `FakeBackend` (KWOK nodes, GPUs read from the Node object) and
`NvmlBackend` (real GPUs through NVML, `nvidia-ml-py`).

FakeBackend reads the node as the extender does (extender/objects.py `devices_of`), so both sides
agree on every index: whole GPUs are `status.allocatable["nvidia.com/gpu"]` at indices 0..n-1 with
the model and memory labels; static MIG GPUs follow from the `phalanx.io/mig-layout` annotation
(else one GPU per advertised `nvidia.com/mig-<profile>` resource, at n, n+1, ...). On a node
with the dynamic-MIG label whose model has a MIG table, whole GPUs can be cut: `create_mig`
checks the cut with `solver.mig.violations` (profile, start, overlap, counts), as the hardware
would refuse it. `phalanx.io/fake-gpu-health` ({"<index>": "<reason>"}) injects faults. UUIDs
are uuid5 of the node, index, profile and start, so restarts and other agents see the same ones.

NvmlBackend reads NVML on every `inventory()` (5 calls per GPU, 4 more per MIG slice; the agent polls each
second). MIG profile names follow NVIDIA's k8s-device-plugin (go-nvlib `NewMigProfile`):
"<slices>g.<GB>gb" plus "+me", "+me.all", "+gfx" or "-me" from the GPU-instance profile id,
where GB is the profile's share of the GPU's memory rounded up to eighths, times the GPU's
memory in whole GB (rounded up), rounded half away from zero -- so an H100 80GB's 9984 MB
profile is "1g.10gb" and an H200's half is "3g.71gb". Health: an NVML error reading a GPU marks
it unhealthy for that read; an XID critical-error event marks it unhealthy until the agent
restarts, except the XIDs the device plugin treats as application errors (`IGNORED_XIDS`). The
agent cuts and removes GPU instances (with one full compute instance each); it never changes MIG
mode or resets a GPU. GPU-instance calls need a privileged container, as NVIDIA's own tools do.

Both backends share one module (past the usual ~300 lines) so that they word a refused cut the
same way (`_cut_error`, the MIG table's `violations`) and tests hold them to it.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import math
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import structlog

from agent.inventory import BackendError, Gpu, Inventory, MigInstance
from solver.mig import MigCatalog, MigSlot, MigTable, load_tables, violations

log = structlog.get_logger("phalanx.agent.backends")

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"
MIG_LAYOUT_ANNOTATION = "phalanx.io/mig-layout"
FAKE_HEALTH_ANNOTATION = "phalanx.io/fake-gpu-health"
DYNAMIC_MIG_LABEL = "phalanx.io/mig-mode=dynamic"
DEFAULT_MEMORY_MIB = 81920  # an 80 GB GPU, the extender's default too
FAKE_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "fake-gpu.phalanx.io")

# NVIDIA k8s-device-plugin internal/rm/health.go: application errors, the GPU stays healthy.
IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
_MAX_EVENTS_PER_READ = 256  # an event storm must not stall the poll
_MAX_STATIC_SLICES = 64  # per layout entry: a hostile annotation cannot make the fake allocate without bound

_MIB = 2**20
_GIB = 2**30
_NO_INSTANCE = 0xFFFFFFFF  # an event's GPU-instance id when it concerns the whole GPU

# NVML_GPU_INSTANCE_PROFILE_* values -> profile name suffix (go-nvlib mig_profile.go)
_PROFILE_SUFFIX = {
    **dict.fromkeys((7, 8), "+me"),  # 1_SLICE_REV1, 2_SLICE_REV1
    **dict.fromkeys((10, 11, 12), "+gfx"),  # 1_SLICE_GFX, 2_SLICE_GFX, 4_SLICE_GFX
    **dict.fromkeys((13, 14), "-me"),  # 1_SLICE_NO_ME, 2_SLICE_NO_ME
    **dict.fromkeys((15, 16), "+me.all"),  # 1_SLICE_ALL_ME, 2_SLICE_ALL_ME
}
# compute slices of a GPU instance -> NVML_COMPUTE_INSTANCE_PROFILE_* of its full compute instance
_FULL_COMPUTE_INSTANCE = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}


# -- fake --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _NodeView:
    """What FakeBackend reads from one version of the Node object."""

    name: str
    model: str
    memory_mib: int
    whole: int  # GPUs at indices 0..whole-1 (dynamic MIG may cut them)
    static: tuple[Gpu, ...]  # MIG GPUs with a fixed layout
    health: Mapping[int, str]  # index -> why unhealthy
    table: MigTable | None  # set when the node is dynamic-MIG and the model has a table


def fake_gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(FAKE_UUID_NAMESPACE, f'{node}/{index}')}"


def fake_mig_uuid(gpu_uuid: str, profile: str, start: int) -> str:
    return f"MIG-{uuid.uuid5(FAKE_UUID_NAMESPACE, f'{gpu_uuid}/{profile}/{start}')}"


class FakeBackend:
    """GPUs that follow a Node object's labels, allocatable and annotations (KWOK nodes)."""

    name = "fake"

    def __init__(self, view: _NodeView, *, tables: MigCatalog, dynamic_mig_label: str) -> None:
        self._view = view
        self._tables = tables
        self._label = dynamic_mig_label
        self._cut: dict[int, tuple[MigInstance, ...]] = {}  # dynamic slices per whole GPU
        self._lock = threading.Lock()

    @classmethod
    def from_node(
        cls, node: Mapping[str, Any], *, tables: MigCatalog | None = None, dynamic_mig_label: str = DYNAMIC_MIG_LABEL
    ) -> FakeBackend:
        catalog = tables or load_tables()
        return cls(_read_node(node, catalog, dynamic_mig_label), tables=catalog, dynamic_mig_label=dynamic_mig_label)

    def update(self, node: Mapping[str, Any]) -> None:
        """Follow a new version of the node; slices on GPUs that are gone go with them."""
        view = _read_node(node, self._tables, self._label)
        with self._lock:
            if view.name != self._view.name:
                raise ValueError(f"FakeBackend of node {self._view.name} given node {view.name}")
            gone = sorted(i for i in self._cut if i >= view.whole)
            for index in gone:
                log.warning("fake GPU removed with its MIG slices", node=view.name, index=index)
                del self._cut[index]
            self._view = view

    def inventory(self) -> Inventory:
        with self._lock:
            view = self._view
            whole = [self._whole_gpu(view, i) for i in range(view.whole)]
            gpus = sorted((_with_health(g, view.health) for g in (*whole, *view.static)), key=lambda g: g.index)
            return Inventory(self.name, "fake", tuple(gpus), dynamic_mig=view.table is not None)

    def create_mig(self, index: int, profile: str, start: int) -> MigInstance:
        with self._lock:
            table = self._cuttable(index, profile, start)
            cut = self._cut.get(index, ())
            same = next((m for m in cut if m.profile == profile and m.start == start), None)
            if same is not None:
                return same
            wanted = table.profile(profile)
            problems = violations(table, (*(MigSlot(m.profile, m.start) for m in cut), MigSlot(profile, start)))
            if problems or wanted is None:
                raise BackendError(_cut_error(index, profile, start, "; ".join(problems)))
            gpu_uuid = fake_gpu_uuid(self._view.name, index)
            mig = MigInstance(fake_mig_uuid(gpu_uuid, profile, start), profile, start, wanted.memory_slices)
            self._cut[index] = tuple(sorted((*cut, mig), key=lambda m: m.start))
            return mig

    def destroy_mig(self, index: int, uuid: str) -> None:
        with self._lock:
            cut = self._cut.get(index, ())
            kept = tuple(m for m in cut if m.uuid != uuid)
            if len(kept) < len(cut):
                self._cut[index] = kept
                return
            if any(m.uuid == uuid for g in self._view.static if g.index == index for m in g.migs):
                raise BackendError(f"GPU {index}: MIG device {uuid} belongs to the node's static layout")

    def close(self) -> None:
        pass

    def _whole_gpu(self, view: _NodeView, index: int) -> Gpu:
        cut = self._cut.get(index, ())
        uid = fake_gpu_uuid(view.name, index)
        return Gpu(index, uid, view.model, view.memory_mib, mig_enabled=bool(cut), migs=cut)

    def _cuttable(self, index: int, profile: str, start: int) -> MigTable:
        view = self._view
        if view.table is None:
            why = f"dynamic MIG is off on node {view.name} ({self._label} not set, or no MIG table for {view.model})"
            raise BackendError(_cut_error(index, profile, start, why))
        if not 0 <= index < view.whole:
            static = any(g.index == index for g in view.static)
            why = "it has a static MIG layout" if static else f"no such GPU (GPUs 0..{view.whole - 1} can be cut)"
            raise BackendError(_cut_error(index, profile, start, why))
        return view.table


def _cut_error(index: int, profile: str, start: int, why: str) -> str:
    return f"GPU {index}: cannot cut {profile} at memory slice {start}: {why}"


def _read_node(node: Mapping[str, Any], tables: MigCatalog, dynamic_mig_label: str) -> _NodeView:
    meta, status = node.get("metadata") or {}, node.get("status") or {}
    name = str(meta.get("name", ""))
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    allocatable = status.get("allocatable") or {}
    model = str(labels.get(PRODUCT_LABEL, "unknown"))
    memory = _int(labels.get(MEMORY_LABEL, DEFAULT_MEMORY_MIB), DEFAULT_MEMORY_MIB, f"{MEMORY_LABEL} on {name}")
    whole = max(0, _int(allocatable.get(GPU_RESOURCE, 0), 0, f"{GPU_RESOURCE} on {name}"))
    table = tables.table_for(model)
    key, _, value = dynamic_mig_label.partition("=")
    layout = _layout(annotations.get(MIG_LAYOUT_ANNOTATION), name) or _advertised(allocatable, whole)
    static = _static_gpus(name, model, memory, whole, layout, table)
    health = _health(annotations.get(FAKE_HEALTH_ANNOTATION), name)
    dynamic = table if labels.get(key) == value else None
    return _NodeView(name, model, memory, whole, static, health, dynamic)


def _int(value: Any, default: int, what: str) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        log.warning("fake node: not an integer, using the default", field=what, value=value, default=default)
        return default


def _layout(text: Any, node: str) -> list[tuple[int, str, int]]:
    """`phalanx.io/mig-layout`: [{"index", "profile", "slices"}]; unreadable means none (as the extender)."""
    if not text:
        return []
    try:
        return [(int(e["index"]), str(e["profile"]), int(e["slices"])) for e in json.loads(text)]
    except (ValueError, KeyError, TypeError) as e:
        log.warning("fake node: MIG layout ignored", node=node, annotation=MIG_LAYOUT_ANNOTATION, error=str(e))
        return []


def _advertised(allocatable: Mapping[str, Any], whole: int) -> list[tuple[int, str, int]]:
    """Without a layout, the extender reads one GPU per advertised MIG profile, in name order."""
    counts: dict[str, int] = {}
    for key, value in allocatable.items():
        if key.startswith(MIG_RESOURCE_PREFIX):
            profile = key[len(MIG_RESOURCE_PREFIX) :]
            profile = profile[:-3] + "+me" if profile.endswith(".me") else profile  # "+" is "." in resource names
            counts[profile] = _int(value, 0, key)
    named = [(p, n) for p, n in sorted(counts.items()) if n > 0]
    return [(whole + offset, profile, n) for offset, (profile, n) in enumerate(named)]


def _static_gpus(
    node: str, model: str, memory: int, whole: int, layout: list[tuple[int, str, int]], table: MigTable | None
) -> tuple[Gpu, ...]:
    by_index: dict[int, list[tuple[str, int]]] = {}
    for index, profile, slices in layout:
        if index < whole:
            log.warning("fake node: MIG layout entry for a whole GPU (or below 0) ignored", node=node, index=index)
            continue
        by_index.setdefault(index, []).append((profile, slices))
    out = []
    for index, entries in sorted(by_index.items()):
        gpu_uuid = fake_gpu_uuid(node, index)
        migs = tuple(_place(gpu_uuid, entries, table))
        out.append(Gpu(index, gpu_uuid, model, memory, mig_enabled=True, migs=migs))
    return tuple(out)


def _place(gpu_uuid: str, entries: list[tuple[str, int]], table: MigTable | None) -> Iterator[MigInstance]:
    """Each slice at the lowest valid start that is still free, largest profiles first; a profile
    the table does not know, or a layout that does not fit, takes starts past the last one used."""
    occupied = 0
    end = 0  # first memory slice after everything placed
    sized = [(name, n, table.profile(name) if table else None) for name, n in entries]
    for name, count, profile in sorted(sized, key=lambda e: -(e[2].memory_slices if e[2] else 1)):
        size = profile.memory_slices if profile else 1
        for _ in range(min(count, _MAX_STATIC_SLICES)):
            free = [s for s in profile.starts if not profile.mask(s) & occupied] if profile else []
            start = free[0] if free else end
            occupied |= ((1 << size) - 1) << start
            end = max(end, start + size)
            yield MigInstance(fake_mig_uuid(gpu_uuid, name, start), name, start, size)


def _health(text: Any, node: str) -> dict[int, str]:
    """`phalanx.io/fake-gpu-health`: {"<index>": "<reason>"}; anything unreadable is ignored."""
    if not text:
        return {}
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
        return {int(k): str(v) or "injected fault" for k, v in raw.items()}
    except (ValueError, TypeError, RecursionError) as e:
        log.warning("fake node: health ignored", node=node, annotation=FAKE_HEALTH_ANNOTATION, error=str(e))
        return {}


def _with_health(gpu: Gpu, health: Mapping[int, str]) -> Gpu:
    reason = health.get(gpu.index)
    return gpu if reason is None else replace(gpu, healthy=False, health_reason=reason)


# -- NVML --------------------------------------------------------------------------------------


def mig_profile_name(profile: int, slices: int, memory_mb: int, gpu_memory_bytes: int) -> str:
    """NVIDIA's name for GPU-instance profile `profile` (an NVML_GPU_INSTANCE_PROFILE_* value) with
    `slices` compute slices and `memory_mb` MiB on a GPU of `gpu_memory_bytes` (go-nvlib's rule,
    float operations in its order so the results agree to the bit)."""
    fraction = (float(memory_mb) * _MIB) / float(gpu_memory_bytes)
    fraction = math.ceil(fraction * 8) / 8
    gb = fraction * float((gpu_memory_bytes + _GIB - 1) // _GIB)
    rounded = int(gb) + (1 if gb - int(gb) >= 0.5 else 0)  # Go's math.Round: half away from zero
    return f"{slices}g.{rounded}gb{_PROFILE_SUFFIX.get(profile, '')}"


@dataclass(frozen=True, slots=True)
class _GiProfile:
    """One GPU-instance profile a GPU offers."""

    name: str
    id: int  # NVML's profile id (what nvmlDeviceCreateGpuInstance* takes): 19 for an H100's 1g
    slices: int  # compute slices


def _nvml() -> Any:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise BackendError("NVML is unavailable: the nvidia-ml-py package (module pynvml) is not installed") from None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """The node's GPUs through NVML. `dynamic_mig` is what the agent read from the node's label."""

    name = "nvml"

    def __init__(self, tables: MigCatalog | None = None, *, dynamic_mig: bool = False) -> None:
        self._nv = nv = _nvml()
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            raise BackendError(
                f"NVML cannot start ({e}): no NVIDIA driver on this node, or its libnvidia-ml.so is not mounted"
                " into the agent's container"
            ) from None
        try:
            self._driver = _text(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError as e:
            nv.nvmlShutdown()
            raise BackendError(f"NVML cannot read the driver version: {e}") from None
        self._tables = tables or load_tables()
        self._dynamic = dynamic_mig
        self._lock = threading.Lock()
        self._known: dict[int, Gpu] = {}  # last good reading per index
        self._profiles: dict[str, tuple[_GiProfile, ...]] = {}  # per GPU uuid; fixed while the driver runs
        self._xid: dict[str, str] = {}  # GPU uuid -> "XID n", sticky
        self._uuids: dict[str, int] = {}
        self._events = self._register_events()
        self._closed = False

    # -- Backend ---------------------------------------------------------------------------------

    def inventory(self) -> Inventory:
        nv = self._nv
        with self._lock:
            self._check_open()
            event_error = self._drain_events()
            try:
                count = int(nv.nvmlDeviceGetCount())
            except nv.NVMLError as e:
                count, event_error = len(self._known), f"NVML: {e}"
            gpus = tuple(self._read(i, event_error) for i in range(count))
            return Inventory(self.name, self._driver, gpus, dynamic_mig=self._dynamic)

    def create_mig(self, index: int, profile: str, start: int) -> MigInstance:
        nv = self._nv
        with self._lock:
            self._check_open()
            try:
                return self._create(index, profile, start)
            except nv.NVMLError as e:
                raise BackendError(_cut_error(index, profile, start, f"NVML: {e}")) from None

    def destroy_mig(self, index: int, uuid: str) -> None:
        nv = self._nv
        with self._lock:
            self._check_open()
            try:
                self._destroy(index, uuid)
            except nv.NVMLError as e:
                raise BackendError(f"GPU {index}: cannot destroy MIG device {uuid}: NVML: {e}") from None

    def close(self) -> None:
        nv = self._nv
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._events is not None:
                    nv.nvmlEventSetFree(self._events)
                nv.nvmlShutdown()
            except nv.NVMLError as e:
                log.warning("NVML shutdown failed", error=str(e))

    # -- reading ---------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BackendError("NVML backend is closed")

    def _read(self, index: int, fault: str) -> Gpu:
        try:
            gpu = self._read_gpu(index)
        except self._nv.NVMLError as e:
            known = self._known.get(index) or Gpu(index, "", "unknown", 0)
            return replace(known, healthy=False, health_reason=f"NVML: {e}")
        self._known[index] = gpu
        reason = self._xid.get(gpu.uuid) or fault
        return replace(gpu, healthy=False, health_reason=reason) if reason else gpu

    def _read_gpu(self, index: int) -> Gpu:
        nv = self._nv
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        gpu_uuid = _text(nv.nvmlDeviceGetUUID(handle))
        model = "-".join(_text(nv.nvmlDeviceGetName(handle)).split())  # as gpu-feature-discovery writes it
        total = int(nv.nvmlDeviceGetMemoryInfo(handle).total)
        if not self._mig_enabled(handle):
            return Gpu(index, gpu_uuid, model, total // _MIB)
        profiles = self._gi_profiles(gpu_uuid, handle, total)
        migs = sorted(
            (self._mig(handle, m, profiles) for m in self._mig_handles(handle)), key=lambda m: (m.start, m.uuid)
        )
        return Gpu(index, gpu_uuid, model, total // _MIB, mig_enabled=True, migs=tuple(migs))

    def _mig_enabled(self, handle: Any) -> bool:
        nv = self._nv
        try:
            current = nv.nvmlDeviceGetMigMode(handle)[0]
        except nv.NVMLError_NotSupported:
            return False
        return bool(current == nv.NVML_DEVICE_MIG_ENABLE)

    def _mig_handles(self, handle: Any) -> list[Any]:
        nv = self._nv
        try:
            slots = int(nv.nvmlDeviceGetMaxMigDeviceCount(handle))
        except nv.NVMLError_NotSupported:
            return []
        out = []
        for slot in range(slots):
            try:
                out.append(nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot))
            except (nv.NVMLError_NotFound, nv.NVMLError_InvalidArgument):
                continue  # an empty slot (go-nvlib skips both)
        return out

    def _mig(self, handle: Any, mig: Any, profiles: tuple[_GiProfile, ...]) -> MigInstance:
        nv = self._nv
        instance = nv.nvmlDeviceGetGpuInstanceById(handle, nv.nvmlDeviceGetGpuInstanceId(mig))
        info = nv.nvmlGpuInstanceGetInfo(instance)
        profile_id = int(info.profileId)
        name = next((p.name for p in profiles if p.id == profile_id), f"profile-{profile_id}")
        return MigInstance(_text(nv.nvmlDeviceGetUUID(mig)), name, int(info.placement.start), int(info.placement.size))

    def _gi_profiles(self, gpu_uuid: str, handle: Any, total: int) -> tuple[_GiProfile, ...]:
        known = self._profiles.get(gpu_uuid)
        if known is not None:
            return known
        nv = self._nv
        out = []
        for profile in range(int(nv.NVML_GPU_INSTANCE_PROFILE_COUNT)):
            try:
                info = self._versioned(nv.nvmlDeviceGetGpuInstanceProfileInfo, handle, profile)
            except (nv.NVMLError_NotSupported, nv.NVMLError_InvalidArgument):
                continue  # this GPU has no such profile
            name = mig_profile_name(profile, int(info.sliceCount), int(info.memorySizeMB), total)
            out.append(_GiProfile(name, int(info.id), int(info.sliceCount)))
        self._profiles[gpu_uuid] = tuple(out)
        return self._profiles[gpu_uuid]

    def _versioned(self, fn: Any, *args: Any) -> Any:
        """The *V (v2) call, or v1 on a driver older than it."""
        try:
            return fn(*args)
        except self._nv.NVMLError_FunctionNotFound:
            return fn(*args, version=1)

    # -- health events ---------------------------------------------------------------------------

    def _register_events(self) -> Any:
        nv = self._nv
        try:
            events = nv.nvmlEventSetCreate()
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as e:
            log.warning("NVML events unavailable: XIDs will not mark GPUs unhealthy", error=str(e))
            return None
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                self._uuids[_text(nv.nvmlDeviceGetUUID(handle))] = index
                if not int(nv.nvmlDeviceGetSupportedEventTypes(handle)) & nv.nvmlEventTypeXidCriticalError:
                    log.warning("GPU reports no XID events", index=index)
                    continue
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, events)
            except nv.NVMLError as e:
                log.warning("cannot watch a GPU's XID events", index=index, error=str(e))
        return events

    def _drain_events(self) -> str:
        """Take the XID events waiting (without blocking); returns a fault for every GPU when the
        wait itself fails (the device plugin then marks every GPU unhealthy too)."""
        nv = self._nv
        if self._events is None:
            return ""
        for _ in range(_MAX_EVENTS_PER_READ):
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError_Timeout:
                return ""
            except nv.NVMLError as e:
                log.warning("NVML event wait failed", error=str(e))
                return f"NVML: event wait: {e}"
            self._on_event(data)
        return ""

    def _on_event(self, data: Any) -> None:
        nv = self._nv
        xid = int(data.eventData)
        if int(data.eventType) != nv.nvmlEventTypeXidCriticalError or xid in IGNORED_XIDS:
            log.info("GPU event ignored", type=int(data.eventType), xid=xid)
            return
        try:
            targets = [_text(nv.nvmlDeviceGetUUID(data.device))]
        except nv.NVMLError:
            targets = []
        if not targets or targets[0] not in self._uuids:
            targets = list(self._uuids)  # which GPU is unknown: all of them (as the device plugin)
        instance = int(data.gpuInstanceId)
        reason = f"XID {xid}" if instance == _NO_INSTANCE else f"XID {xid} (GPU instance {instance})"
        for gpu_uuid in targets:
            log.warning("GPU unhealthy until the agent restarts", uuid=gpu_uuid, reason=reason)
            self._xid.setdefault(gpu_uuid, reason)

    # -- MIG -------------------------------------------------------------------------------------

    def _create(self, index: int, name: str, start: int) -> MigInstance:
        nv = self._nv
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        if not self._mig_enabled(handle):
            raise BackendError(_cut_error(index, name, start, "MIG mode is off (the agent never turns it on)"))
        gpu = self._read_gpu(index)
        same = next((m for m in gpu.migs if m.profile == name and m.start == start), None)
        if same is not None:
            return same
        profile = self._check_cut(gpu, self._profiles[gpu.uuid], name, start)  # _read_gpu read them
        size = self._placement_size(handle, profile, index, start)
        compute_profile = _FULL_COMPUTE_INSTANCE.get(profile.slices)
        if compute_profile is None:
            raise BackendError(
                _cut_error(index, name, start, f"no compute-instance profile of {profile.slices} slices")
            )
        placement = nv.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, size
        instance = nv.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile.id, ctypes.byref(placement))
        try:
            instance_id = int(nv.nvmlGpuInstanceGetInfo(instance).id)
            shared = nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            compute = self._versioned(
                nv.nvmlGpuInstanceGetComputeInstanceProfileInfo, instance, compute_profile, shared
            )
            nv.nvmlGpuInstanceCreateComputeInstance(instance, compute.id)
        except nv.NVMLError:
            self._undo(instance)
            raise
        for mig in self._mig_handles(handle):
            if int(nv.nvmlDeviceGetGpuInstanceId(mig)) == instance_id:
                return MigInstance(_text(nv.nvmlDeviceGetUUID(mig)), name, start, size)
        raise BackendError(
            _cut_error(index, name, start, f"GPU instance {instance_id} was created but shows no MIG device")
        )

    def _undo(self, instance: Any) -> None:
        """Leave no GPU instance without a compute instance behind a failed cut."""
        try:
            self._nv.nvmlGpuInstanceDestroy(instance)
        except self._nv.NVMLError as e:
            log.warning("cannot remove a half-cut GPU instance", error=str(e))

    def _check_cut(self, gpu: Gpu, profiles: tuple[_GiProfile, ...], name: str, start: int) -> _GiProfile:
        """The GPU's profile `name`; the model's MIG table, when there is one, words a refusal
        the way FakeBackend does before NVML would refuse it."""
        profile = next((p for p in profiles if p.name == name), None)
        if profile is None:
            offered = ", ".join(sorted({p.name for p in profiles})) or "none"
            raise BackendError(
                _cut_error(gpu.index, name, start, f"{gpu.model} has no such profile (it has: {offered})")
            )
        table = self._tables.table_for(gpu.model)
        if table is not None and table.profile(name) is not None:
            layout = (*(MigSlot(m.profile, m.start) for m in gpu.migs), MigSlot(name, start))
            problems = violations(table, layout)
            if problems:
                raise BackendError(_cut_error(gpu.index, name, start, "; ".join(problems)))
        return profile

    def _placement_size(self, handle: Any, profile: _GiProfile, index: int, start: int) -> int:
        nv = self._nv
        count = ctypes.c_uint(0)
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile.id, None, ctypes.byref(count))
        placements = (nv.c_nvmlGpuInstancePlacement_t * max(1, count.value))()
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile.id, placements, ctypes.byref(count))
        sizes = {int(p.start): int(p.size) for p in placements[: count.value]}
        if start not in sizes:
            valid = sorted(sizes)
            raise BackendError(_cut_error(index, profile.name, start, f"not a placement start (valid starts: {valid})"))
        return sizes[start]

    def _destroy(self, index: int, mig_uuid: str) -> None:
        nv = self._nv
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        migs = self._mig_handles(handle)
        target = next((m for m in migs if _text(nv.nvmlDeviceGetUUID(m)) == mig_uuid), None)
        if target is None:
            return
        instance_id = int(nv.nvmlDeviceGetGpuInstanceId(target))
        instance = nv.nvmlDeviceGetGpuInstanceById(handle, instance_id)
        for mig in migs:  # every compute instance of the GPU instance is a MIG device
            if int(nv.nvmlDeviceGetGpuInstanceId(mig)) == instance_id:
                compute_id = nv.nvmlDeviceGetComputeInstanceId(mig)
                nv.nvmlComputeInstanceDestroy(nv.nvmlGpuInstanceGetComputeInstanceById(instance, compute_id))
        nv.nvmlGpuInstanceDestroy(instance)
