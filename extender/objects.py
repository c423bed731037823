"""Kubernetes objects (plain JSON) to the facts the cache keeps, and the device annotation.

Device assignment contract (what a node agent reads): the pod annotation
`phalanx.io/gpu-devices` holds a JSON list with one entry per device the pod uses:
- `{"index": 3, "milli": 1000, "memoryMiB": 81920}`: a whole or shared GPU (milli = share in
  thousandths, memoryMiB = GPU memory granted on that device), plus `"tflops": 20.5` when the
  pod asked for compute in TFLOPs;
- `{"index": 5, "mig": "1g.10gb"}`: a slice of a static MIG partition;
- `{"index": 2, "mig": "3g.40gb", "start": 4}`: a dynamic MIG slice the agent creates at that
  memory-slice position (NVIDIA placement start) before the pod starts.
It is written by the Binding itself (one API call with the node) and is the record the cache
rebuilds device usage from after a restart.

Where a node agent runs (agent/), the Node carries `phalanx.io/gpu-inventory`: the GPUs the
agent read from NVML (index, UUID, model, memory, MIG slices, health). It replaces the guess
from labels: an unhealthy GPU is left out (nothing new is placed on it), a static MIG GPU's
slices are the ones that exist, and model and memory are the device's own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from extender import quantity
from extender.gpu import GPU, MANAGED, MIG_PREFIX, DemandError, container_resources, demand, profile_of
from extender.node_pools import NODE_POOLS_ANNOTATION, NodePools, Reading, read
from extender.pools import POOL_ANNOTATIONS, QOS_ANNOTATIONS, Hardware, annotation
from solver import FULL_SHARE, DeviceAssignment, GpuDemand, GpuDevice, GpuKind, MigSlice, NodeName, Resources

DEVICES_ANNOTATION = "phalanx.io/gpu-devices"
MIG_LAYOUT_ANNOTATION = "phalanx.io/mig-layout"
INVENTORY_ANNOTATION = "phalanx.io/gpu-inventory"
MAX_INVENTORY = 64 * 1024  # bytes: 16 GPUs with 7 slices each is ~6 KiB
PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"
TERMINAL = ("Succeeded", "Failed")
NO_POOLS = Reading()

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What the cache keeps of a Node: everything but usage."""

    name: NodeName
    allocatable: Resources
    labels: dict[str, str]
    taints: tuple[str, ...]
    topology: tuple[str, ...]
    devices: tuple[GpuDevice, ...]
    unschedulable: bool


@dataclass(frozen=True, slots=True)
class OwnerRef:
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What the cache keeps of a Pod."""

    uid: str
    namespace: str
    name: str
    node: str  # "" while pending
    phase: str
    requests: Resources
    demand: GpuDemand
    devices: tuple[DeviceAssignment, ...] | None  # from the annotation; None if absent
    error: str  # why the GPU request is invalid, "" if valid
    labels: dict[str, str]
    annotations: dict[str, str]
    scheduler: str
    created: str
    scheduling_group: str = ""  # spec.schedulingGroup.podGroupName (scheduling.k8s.io gangs)
    placement: str = ""  # nodeSelector, affinity, tolerations, GPU pool and node pools, as canonical JSON
    pool: str = ""  # GPU pool the pod asks for ("" = none)
    gpu_models: frozenset[str] | None = None  # GPU models its node selection allows (None: any)
    qos: str = ""  # QoS level within its pool
    owners: tuple[OwnerRef, ...] = ()
    priority: int = 0  # spec.priority: who may preempt whom
    prefers: bool = False  # states preferences kube-scheduler scores (filter's sample keeps every node)
    device_error: str = ""  # why the device record is not trusted ("" if absent or valid)
    node_pools: NodePools = ()  # phalanx.io/node-pools, most preferred first (extender/node_pools.py)
    node_pools_error: str = ""  # why that annotation is ignored ("" if absent or valid)
    # status.nominatedNodeName as this version of the object says (compare=False: the cache
    # skips status chatter, so only a pod read at its own resourceVersion carries it exactly)
    nominated: str = field(default="", compare=False)
    resource_version: str = field(default="", compare=False)  # as the object was read
    spec_hash: int = field(default=0, compare=False)  # of spec as read (`spec_hash`); 0: unknown
    obj: JSON = field(default_factory=dict, compare=False, repr=False)  # as listed (Resource Interface keys)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def active(self) -> bool:
        return self.phase not in TERMINAL


def scalar(resources: dict[str, Any], *, pods: int) -> Resources:
    """CPU, memory, pods and domain-qualified extended resources other than GPU ones."""
    extended = []
    for key, value in resources.items():
        if "/" in key and key not in MANAGED and not key.startswith(MIG_PREFIX):
            extended.append((key, quantity.count(value)))
    return Resources(
        cpu_milli=quantity.milli(resources.get("cpu", 0)),
        memory_mib=quantity.mib(resources.get("memory", 0)),
        pods=pods,
        extended=tuple(sorted(extended)),
    )


def node_info(obj: JSON, levels: tuple[str, ...], hardware: Hardware) -> NodeInfo:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    labels = meta.get("labels") or {}
    alloc = status.get("allocatable") or {}
    taints = tuple(f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}" for t in spec.get("taints") or [])
    return NodeInfo(
        name=NodeName(meta["name"]),
        allocatable=scalar(alloc, pods=quantity.count(alloc.get("pods", 110))),
        labels=labels,
        taints=taints,
        topology=tuple(labels.get(level, "") for level in levels),
        devices=devices_of(alloc, labels, meta.get("annotations") or {}, hardware, meta["name"]),
        unschedulable=bool(spec.get("unschedulable")),
    )


def devices_of(
    alloc: JSON, labels: dict[str, str], annotations: dict[str, str], hardware: Hardware, name: str = ""
) -> tuple[GpuDevice, ...]:
    """Whole GPUs take indices 0..n-1; MIG GPUs follow, from `phalanx.io/mig-layout` when the
    node has it, else one device per advertised profile holding all its slices. Whole GPUs carry
    their TFLOPs rating (times the node's pool oversubscription)."""
    inventory = _inventory(annotations.get(INVENTORY_ANNOTATION))
    if inventory is not None:
        return _from_inventory(inventory, labels, hardware, name)
    model = labels.get(PRODUCT_LABEL, "unknown")
    try:
        memory = int(labels.get(MEMORY_LABEL, hardware.default_memory_mib))
    except ValueError:
        memory = hardware.default_memory_mib
    whole = quantity.count(alloc.get(GPU, 0))
    tflops = hardware.tflops(model, hardware.pool_of(name, labels))
    partition = hardware.partition(model, labels)
    out = [GpuDevice(i, model, memory, tflops=tflops, partition=partition) for i in range(whole)]
    mig = {profile_of(k): quantity.count(v) for k, v in alloc.items() if k.startswith(MIG_PREFIX)}
    layout = _layout(annotations.get(MIG_LAYOUT_ANNOTATION))
    if layout:
        by_index: dict[int, list[MigSlice]] = {}
        for entry in layout:
            by_index.setdefault(entry[0], []).append(MigSlice(entry[1], entry[2]))
        out.extend(GpuDevice(i, model, memory, 0, 0, tuple(s)) for i, s in sorted(by_index.items()))
    else:
        for offset, (profile, n) in enumerate(sorted(mig.items())):
            if n > 0:
                out.append(GpuDevice(whole + offset, model, memory, 0, 0, (MigSlice(profile, n),)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class _Reported:
    """One GPU of an agent's inventory."""

    index: int
    model: str
    memory_mib: int
    healthy: bool
    slices: tuple[str, ...]  # MIG profiles of its slices; () when not in MIG mode
    mig: bool


def _inventory(text: str | None) -> list[_Reported] | None:
    """The agent's inventory; None when absent or unreadable (the labels are used then)."""
    if not text or len(text) > MAX_INVENTORY:
        return None
    try:
        gpus = json.loads(text)["gpus"]
        out = []
        for g in gpus:
            index, memory = g["index"], g["memoryMiB"]
            if not isinstance(index, int) or not 0 <= index < MAX_INDEX or not isinstance(memory, int) or memory <= 0:
                return None
            slices = tuple(str(s["profile"]) for s in g.get("slices") or ())
            out.append(
                _Reported(
                    index,
                    str(g.get("model") or "unknown"),
                    memory,
                    g.get("healthy") is not False,
                    slices,
                    bool(g.get("mig")),
                )
            )
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    return out if len({g.index for g in out}) == len(out) else None


def _from_inventory(
    inventory: list[_Reported], labels: dict[str, str], hardware: Hardware, name: str
) -> tuple[GpuDevice, ...]:
    """The healthy GPUs an agent reported. On a dynamic-MIG node every GPU is partitionable
    and its slices are the pods' (the cache counts them from their records); elsewhere a GPU in
    MIG mode offers the slices that exist."""
    out = []
    for g in sorted(inventory, key=lambda g: g.index):
        if not g.healthy:
            continue
        partition = hardware.partition(g.model, labels)
        if g.mig and partition is None:
            counts: dict[str, int] = {}
            for profile in g.slices:
                counts[profile] = counts.get(profile, 0) + 1
            out.append(
                GpuDevice(
                    g.index, g.model, g.memory_mib, 0, 0, tuple(MigSlice(p, n) for p, n in sorted(counts.items()))
                )
            )
            continue
        tflops = hardware.tflops(g.model, hardware.pool_of(name, labels))
        out.append(GpuDevice(g.index, g.model, g.memory_mib, tflops=tflops, partition=partition))
    return tuple(out)


def _layout(text: str | None) -> list[tuple[int, str, int]]:
    if not text:
        return []
    try:
        return [(int(e["index"]), str(e["profile"]), int(e["slices"])) for e in json.loads(text)]
    except (ValueError, KeyError, TypeError):
        return []


def pod_info(obj: JSON) -> PodInfo:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    annotations = meta.get("annotations") or {}
    pool = annotation(annotations, POOL_ANNOTATIONS)
    error = ""
    try:
        resources = container_resources(obj)
        gpu = demand(obj, resources)
        requests = scalar(_with_init(obj, resources), pods=1)
    except (DemandError, ValueError) as e:
        resources, gpu, requests, error = {}, GpuDemand(), Resources(pods=1), str(e)[:512]
    except (ArithmeticError, TypeError, AttributeError, RecursionError) as e:
        # Any field a user wrote can be hostile (Infinity, 1e999999, wrong types): the pod is
        # kept with its error (filter refuses it, an event reports it), never dropped or raised.
        resources, gpu, requests, error = {}, GpuDemand(), Resources(pods=1), f"{type(e).__name__}: {e}"[:512]
    devices, device_error = _record(annotations.get(DEVICES_ANNOTATION), gpu, bool(spec.get("nodeName")))
    text = annotations.get(NODE_POOLS_ANNOTATION)
    pools = NO_POOLS if text is None else read(text)
    return PodInfo(
        uid=_text(meta.get("uid")),
        namespace=_text(meta.get("namespace")),
        name=_text(meta.get("name")),
        resource_version=_text(meta.get("resourceVersion")),
        node=spec.get("nodeName") or "",
        phase=status.get("phase", "Pending"),
        requests=requests,
        demand=gpu,
        devices=devices,
        error=error,
        device_error=device_error,
        node_pools=pools.pools,
        node_pools_error=pools.error,
        nominated=_text(status.get("nominatedNodeName")),
        labels=meta.get("labels") or {},
        annotations=annotations,
        scheduler=spec.get("schedulerName", "default-scheduler"),
        created=meta.get("creationTimestamp", ""),
        scheduling_group=(spec.get("schedulingGroup") or {}).get("podGroupName") or "",
        placement=_placement(spec, pool, pools.pools),
        pool=pool,
        gpu_models=selected_models(spec),
        qos=annotation(annotations, QOS_ANNOTATIONS),
        owners=owner_refs(meta),
        priority=_priority(spec.get("priority")),
        prefers=scored_preferences(spec),
        obj=obj if meta.get("ownerReferences") else {},  # RI gang keys read owned pods only
        spec_hash=spec_hash(spec),
    )


def bound_pod_info(old: PodInfo, obj: JSON) -> PodInfo | None:
    """`pod_info(obj)` without reading the pod again, when `obj` is the pending pod `old` has
    read, now bound: its node set, its device record maybe added, its status moved, and
    nothing else (labels, other annotations, owners, the rest of the spec). A bound pod's
    event is one of every pod's few, and the full reading is most of its cost (issue 14).
    None when anything else moved: the caller reads it whole."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    node = spec.get("nodeName")
    if old.node or not node or not isinstance(node, str) or not old.spec_hash:
        return None
    annotations = meta.get("annotations") or {}
    if (meta.get("labels") or {}) != old.labels or meta.get("creationTimestamp", "") != old.created:
        return None
    if (_text(meta.get("name")), _text(meta.get("namespace"))) != (old.name, old.namespace):
        return None
    if not isinstance(annotations, dict) or _but_devices(annotations) != _but_devices(old.annotations):
        return None
    if owner_refs(meta) != old.owners or spec_hash(spec) != old.spec_hash:
        return None
    status = obj.get("status") or {}
    phase, version, nominated = (
        status.get("phase", "Pending"),
        meta.get("resourceVersion"),
        status.get("nominatedNodeName"),
    )
    if not isinstance(phase, str):
        return None
    devices, device_error = _record(annotations.get(DEVICES_ANNOTATION), old.demand, True)
    return replace(
        old,
        node=node,
        phase=phase,
        devices=devices,
        device_error=device_error,
        annotations=annotations,
        nominated=_text(nominated),
        resource_version=_text(version),
        obj=obj if meta.get("ownerReferences") else {},
    )


def _but_devices(annotations: dict[str, Any]) -> dict[str, Any]:
    return (
        {k: v for k, v in annotations.items() if k != DEVICES_ANNOTATION}
        if DEVICES_ANNOTATION in annotations
        else annotations
    )


def spec_hash(spec: Any) -> int:
    """A hash of a pod's spec as serialised, but its node (`PodInfo.node` keeps that apart), 0
    when it cannot be: the cache reads a pod again whenever its spec changed, even with nothing
    else changed (an in-place resize, a gated pod's nodeSelector set by a queueing controller),
    and a bind, which sets the node alone, leaves it as it was (`bound_pod_info`)."""
    if isinstance(spec, dict) and "nodeName" in spec:
        spec = {k: v for k, v in spec.items() if k != "nodeName"}
    try:
        return hash(orjson.dumps(spec)) or 1
    except (TypeError, orjson.JSONEncodeError):
        return 0


def _record(text: Any, gpu: GpuDemand, bound: bool) -> tuple[tuple[DeviceAssignment, ...] | None, str]:
    """The pod's device record, or (None, why it is not trusted): its devices are then
    inferred as for a pod bound by another scheduler. An unbound pod's record is ignored
    silently: its bind writes the real one."""
    if not text:
        return None, ""
    try:
        devices = decode_devices(text if isinstance(text, str) else None)
        if devices is not None:
            check_record(devices, gpu)
    except DeviceRecordError as e:
        return None, f"{DEVICES_ANNOTATION}: {e}" if bound else ""
    return devices, ""


def _text(value: Any) -> str:
    """A metadata string as the API server would give it ("" for absent or not a string)."""
    return value if isinstance(value, str) else ""


def _priority(value: Any) -> int:
    """spec.priority (the admission plugin resolves priorityClassName into it); 0 if absent
    or not an int32, as kube-scheduler treats a pod without one."""
    return value if isinstance(value, int) and not isinstance(value, bool) and -(2**31) <= value < 2**31 else 0


def owner_refs(meta: JSON) -> tuple[OwnerRef, ...]:
    """The object's owners, its controller first."""
    refs = [
        OwnerRef(
            str(r.get("apiVersion", "")),
            str(r.get("kind", "")),
            str(r.get("name", "")),
            str(r.get("uid", "")),
            bool(r.get("controller")),
        )
        for r in meta.get("ownerReferences") or []
        if isinstance(r, dict)
    ]
    return tuple(sorted(refs, key=lambda r: not r.controller))


def _placement(spec: JSON, pool: str, node_pools: NodePools) -> str:
    relevant = {k: spec[k] for k in ("nodeSelector", "affinity", "tolerations") if spec.get(k)}
    if pool:
        relevant["gpuPool"] = pool
    if node_pools:  # canonical text: the same pools spelt differently make one gang group
        relevant["nodePools"] = [str(s) for s in node_pools]
    return orjson.dumps(relevant, option=orjson.OPT_SORT_KEYS).decode() if relevant else ""


def scored_preferences(spec: JSON) -> bool:
    """Whether the pod states preferences kube-scheduler's Score plugins weigh: preferred node
    or pod (anti-)affinity, or topology spread that may be broken (ScheduleAnyway). Filter
    leaves such a pod every node, not the sample Phalanx ranks best (extender/verbs.py)."""
    affinity = spec.get("affinity")
    if isinstance(affinity, dict):
        for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
            terms = affinity.get(kind)
            if isinstance(terms, dict) and terms.get("preferredDuringSchedulingIgnoredDuringExecution"):
                return True
    spread = spec.get("topologySpreadConstraints")
    return isinstance(spread, list) and any(
        isinstance(c, dict) and c.get("whenUnsatisfiable") == "ScheduleAnyway" for c in spread
    )


def selected_models(spec: JSON) -> frozenset[str] | None:
    """The GPU models (`nvidia.com/gpu.product`) a pod's nodeSelector and required node
    affinity allow, None when they allow any. Affinity terms are ORed: a term that does not
    name models allows any. Only `In` narrows (NotIn, Exists and the rest are left to
    kube-scheduler's filter). Malformed fields allow any: the API server validates them, and a
    pod this reads wrongly is only ranked, never refused, by what this returns."""
    try:
        models: frozenset[str] | None = None
        selector = spec.get("nodeSelector")
        if isinstance(selector, dict) and isinstance(selector.get(PRODUCT_LABEL), str):
            models = frozenset({selector[PRODUCT_LABEL]})
        required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or {}
        terms = required.get("nodeSelectorTerms") or []
        if not isinstance(terms, list) or not terms:
            return models
        union: set[str] = set()
        for term in terms:
            named: frozenset[str] | None = None
            for e in (term or {}).get("matchExpressions") or []:
                if e.get("key") == PRODUCT_LABEL and e.get("operator") == "In":
                    values = frozenset(v for v in e.get("values") or [] if isinstance(v, str))
                    named = values if named is None else named & values
            if named is None:
                return models  # this term allows any model
            union |= named
        return frozenset(union) if models is None else models & union
    except (AttributeError, TypeError):
        return None


def _with_init(pod: JSON, resources: dict[str, Any]) -> dict[str, Any]:
    """Effective requests: the larger of the containers' sum and any init container, plus
    the pod overhead (as kube-scheduler computes them)."""
    spec = pod.get("spec") or {}
    out = dict(resources)
    for c in spec.get("initContainers") or []:
        res = c.get("resources") or {}
        merged = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        for key in ("cpu", "memory"):
            if key in merged and quantity.parse(merged[key]) > quantity.parse(out.get(key, 0)):
                out[key] = merged[key]
    for key, value in (spec.get("overhead") or {}).items():
        out[key] = str(quantity.parse(out.get(key, 0)) + quantity.parse(value))
    return out


def encode_devices(devices: tuple[DeviceAssignment, ...]) -> str:
    out: list[dict[str, Any]] = []
    for d in devices:
        entry: dict[str, Any]
        if d.mig_profile:
            entry = {"index": d.index, "mig": d.mig_profile}
            if d.mig_start >= 0:
                entry["start"] = d.mig_start
        else:
            entry = {"index": d.index, "milli": d.milli, "memoryMiB": d.memory_mib}
            if d.tflops:
                entry["tflops"] = d.tflops / 1000
        out.append(entry)
    return json.dumps(out, separators=(",", ":"))


MAX_RECORD = 16 * 1024  # bytes: a record of 64 devices is ~3 KiB
MAX_INDEX = 64  # device indexes per node
MAX_MEMORY_MIB = 2**20  # 1 TiB of memory on one device
MAX_TFLOPS = 100_000


class DeviceRecordError(ValueError):
    """A `phalanx.io/gpu-devices` record the cache must not trust (it names the problem)."""


def _bounded_int(e: dict[str, Any], key: str, low: int, high: int, default: int | None = None) -> int:
    value = e.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise DeviceRecordError(f"{key} must be an integer in [{low}, {high}], not {value!r}")
    return value


def _device(e: Any) -> DeviceAssignment:
    if not isinstance(e, dict):
        raise DeviceRecordError(f"each entry must be an object, not {type(e).__name__}")
    index = _bounded_int(e, "index", 0, MAX_INDEX - 1)
    if "mig" in e:
        if not isinstance(e["mig"], str) or not e["mig"] or len(e["mig"]) > 32:
            raise DeviceRecordError(f"mig must be a profile name, not {e['mig']!r}")
        return DeviceAssignment(index, 0, 0, e["mig"], mig_start=_bounded_int(e, "start", -1, 63, -1))
    tflops = e.get("tflops", 0)
    if isinstance(tflops, bool) or not isinstance(tflops, int | float) or not 0 <= tflops <= MAX_TFLOPS:
        raise DeviceRecordError(f"tflops must be a number in [0, {MAX_TFLOPS}], not {tflops!r}")
    return DeviceAssignment(
        index,
        _bounded_int(e, "milli", 0, FULL_SHARE, 0),
        _bounded_int(e, "memoryMiB", 0, MAX_MEMORY_MIB, 0),
        tflops=round(float(tflops) * 1000),
    )


def decode_devices(text: str | None) -> tuple[DeviceAssignment, ...] | None:
    """The record as written at bind; None when absent. Raises `DeviceRecordError` for a
    record that is malformed, out of range, or names one device twice (outside MIG slices)."""
    if not text:
        return None
    if len(text) > MAX_RECORD:
        raise DeviceRecordError(f"longer than {MAX_RECORD} bytes")
    try:
        entries = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise DeviceRecordError(f"not JSON: {e}") from None
    if not isinstance(entries, list) or len(entries) > MAX_INDEX * 8:
        raise DeviceRecordError("must be a JSON list of at most 512 entries")
    devices = tuple(_device(e) for e in entries)
    whole = [d.index for d in devices if not d.mig_profile]
    if len(set(whole)) != len(whole):
        raise DeviceRecordError("names a device twice")
    return devices


def check_record(devices: tuple[DeviceAssignment, ...], gpu: GpuDemand) -> None:
    """A record must match the pod's own request: a pod holds the devices it asked for and
    nothing else (a forged record on a CPU pod, or more devices than requested, is refused)."""
    kind = gpu.kind
    if kind is GpuKind.NONE:
        raise DeviceRecordError("the pod requests no GPU")
    if len(devices) != gpu.count:
        raise DeviceRecordError(f"{len(devices)} entries for a request of {gpu.count} devices")
    if kind is GpuKind.MIG and any(d.mig_profile != gpu.mig_profile for d in devices):
        raise DeviceRecordError(f"entries are not {gpu.mig_profile} slices")
    if kind is not GpuKind.MIG and any(d.mig_profile for d in devices):
        raise DeviceRecordError("MIG entries for a request of GPUs")
    if kind is GpuKind.WHOLE and any(d.milli != FULL_SHARE for d in devices):
        raise DeviceRecordError("a whole-GPU request with a partial entry")
