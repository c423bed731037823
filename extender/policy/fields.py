"""Where each workload-policy field lives in a pod (or a pod template): read for the rules,
written for the defaults. The README's "Workload policies" section prints the same list.

- `compute.gpuDeviceRequest`: annotation `phalanx.io/gpuDeviceRequest`, else resource
  `nvidia.com/gpu`, else `gpu-fraction-num-devices` / `tensor-fusion.ai/gpu-count`; default to the
  annotation.
- `compute.gpuRequestType`, `gpuPortionLimit`, `gpuMemoryLimit`, `migProfile`: annotation
  `phalanx.io/<field>` (also `tensor-fusion.ai/vram-limit` for the memory limit, the profile of a
  `nvidia.com/mig-<profile>` resource for migProfile); default to the annotation.
- `compute.gpuPortionRequest`: annotation `phalanx.io/gpuPortionRequest`, else `gpu-fraction`.
- `compute.gpuMemoryRequest`: annotation `phalanx.io/gpuMemoryRequest`, else `gpu-memory` (MiB),
  `nvidia.com/gpumem` (MiB), `tensor-fusion.ai/vram-request`.
- `compute.cpuCoreRequest` / `cpuCoreLimit`, `cpuMemoryRequest` / `cpuMemoryLimit`: the
  containers' `resources.requests` / `limits` of cpu and memory, summed; default to the first
  container's.
- `compute.extendedResources`: every other container resource (not cpu, memory,
  ephemeral-storage, hugepages-*, the GPU ones), summed; default to the first container's
  requests and limits.
- `nodePools`: annotation `phalanx.io/node-pools` (a JSON list).
- `priorityClass`: `spec.priorityClassName` (a pod's default also sets `spec.priority`).
- `tolerations`: `spec.tolerations` (key, operator, value, effect, seconds); defaults appended.
  The two NoExecute tolerations the API server adds to every pod (not-ready, unreachable) are
  not the submitter's and are not read.
- `podAffinitySchedulingRule` / `podAffinityTopology`: annotation
  `kai.scheduler/topology-required-placement` (required) or `-preferred-placement` (preferred),
  its value the topology level.
- `terminateAfterPreemption`: annotation `phalanx.io/terminate-after-preemption`.
- `annotations` / `labels`: `metadata.annotations` / `metadata.labels` as (name, value) items,
  but for keys in Kubernetes' own domains (`kubernetes.io/`, `k8s.io/` and their subdomains).
- `backoffLimit`: the workload object: Job `.spec.backoffLimit`, Kubeflow jobs
  `.spec.runPolicy.backoffLimit`, JobSet `.spec.failurePolicy.maxRestarts`.

GPU defaults are written only to a pod that asks for GPUs in the policy spelling or not at all:
one in another spelling (`nvidia.com/gpu`, KAI, HAMi, TensorFusion) is complete as it is, and
adding `phalanx.io/` annotations to it would make it ask twice (`extender/gpu.py` refuses that).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import orjson

from extender import quantity
from extender.gangs.sources import KAI_PREFERRED, KAI_REQUIRED
from extender.gpu import (
    FRACTION,
    GPU,
    GPUCORES,
    GPUMEM,
    MEMORY,
    MIG_PREFIX,
    NUM_DEVICES,
    POLICY_FIELDS,
    POLICY_PREFIX,
    TF_COUNT,
    TF_VRAM,
    TF_VRAM_LIMIT,
    profile_of,
)

JSON = Any
NODE_POOLS = "phalanx.io/node-pools"
TERMINATE = "phalanx.io/terminate-after-preemption"
CORE_RESOURCES = ("cpu", "memory", "ephemeral-storage")
#: Workload-level fields and where each workload kind keeps them (group, kind) -> path.
BACKOFF_PATHS: dict[tuple[str, str], tuple[str, ...]] = {
    ("batch", "Job"): ("spec", "backoffLimit"),
    ("kubeflow.org", "PyTorchJob"): ("spec", "runPolicy", "backoffLimit"),
    ("kubeflow.org", "MPIJob"): ("spec", "runPolicy", "backoffLimit"),
    ("kubeflow.org", "TFJob"): ("spec", "runPolicy", "backoffLimit"),
    ("jobset.x-k8s.io", "JobSet"): ("spec", "failurePolicy", "maxRestarts"),
}
#: Fields that exist on a pod (template): the rest are the workload object's.
POD_LEVEL = frozenset(
    {
        *(f"compute.{f}" for f in POLICY_FIELDS),
        "compute.cpuCoreRequest",
        "compute.cpuCoreLimit",
        "compute.cpuMemoryRequest",
        "compute.cpuMemoryLimit",
        "compute.extendedResources",
        "nodePools",
        "priorityClass",
        "tolerations",
        "podAffinitySchedulingRule",
        "podAffinityTopology",
        "terminateAfterPreemption",
        "annotations",
        "labels",
    }
)
WORKLOAD_LEVEL = frozenset({"backoffLimit"})
_TOLERATION = (("key", "key"), ("operator", "operator"), ("value", "value"), ("effect", "effect"))


def _number(text: Any) -> Any:
    """An annotation's number as int or float when it is one; the text otherwise (the rules then
    report its type)."""
    if not isinstance(text, str):
        return text
    try:
        d = quantity.parse(text)
    except ValueError:
        return text
    return int(d) if d == d.to_integral_value() else float(d)


def _cores(d: Decimal) -> int | float:
    return int(d) if d == d.to_integral_value() else float(d)


def _sum(containers: list[JSON], section: str) -> dict[str, tuple[Decimal, list[str]]]:
    """Per resource: the total over the containers and the texts it was summed from."""
    out: dict[str, tuple[Decimal, list[str]]] = {}
    for c in containers:
        resources = _object(c.get("resources")) if isinstance(c, dict) else {}
        values = _object(resources.get(section))
        for name, text in values.items():
            try:
                value = quantity.parse(text)
            except (ValueError, TypeError):
                continue
            total, texts = out.get(name, (Decimal(0), []))
            out[name] = (total + value, [*texts, str(text)])
    return out


def _total_text(entry: tuple[Decimal, list[str]]) -> str:
    """One container's text as written; a sum of several in plain units."""
    total, texts = entry
    return texts[0] if len(texts) == 1 else str(int(total) if total == total.to_integral_value() else total)


def read_pod(template: Mapping[str, JSON]) -> tuple[dict[str, JSON], bool]:
    """The policy fields a pod or pod template asks for, and whether its GPU request is in a
    spelling other than the policy's (then GPU defaults are not written)."""
    meta, spec = _object(template.get("metadata")), _object(template.get("spec"))
    annotations = {k: v for k, v in _object(meta.get("annotations")).items() if isinstance(v, str)}
    labels = {k: v for k, v in _object(meta.get("labels")).items() if isinstance(v, str)}
    containers = [c for c in _list(spec.get("containers")) if isinstance(c, dict)]
    requests, limits = _sum(containers, "requests"), _sum(containers, "limits")
    compute: dict[str, JSON] = {}
    policy = {f: annotations[POLICY_PREFIX + f] for f in POLICY_FIELDS if POLICY_PREFIX + f in annotations}
    gpu_total = (limits.get(GPU) or requests.get(GPU) or (Decimal(0), []))[0]
    mig = [n for n in {**requests, **limits} if n.startswith(MIG_PREFIX)]
    other = bool(
        gpu_total
        or mig
        or any(k in annotations for k in (FRACTION, MEMORY, NUM_DEVICES, TF_VRAM, TF_COUNT))
        or GPUMEM in requests
        or GPUMEM in limits
        or GPUCORES in limits
    )
    if policy:
        for f, text in policy.items():
            compute[f] = _number(text) if f in ("gpuDeviceRequest", "gpuPortionRequest", "gpuPortionLimit") else text
    else:
        if gpu_total:
            compute["gpuDeviceRequest"] = _cores(gpu_total)
        elif NUM_DEVICES in annotations or TF_COUNT in annotations:
            compute["gpuDeviceRequest"] = _number(annotations.get(NUM_DEVICES, annotations.get(TF_COUNT)))
        if FRACTION in annotations:
            compute["gpuPortionRequest"] = _number(annotations[FRACTION])
        memory = annotations.get(MEMORY)
        hami = (limits.get(GPUMEM) or requests.get(GPUMEM) or (None, []))[0]
        if memory is not None:
            compute["gpuMemoryRequest"] = f"{memory}Mi" if str(memory).isdigit() else memory
        elif hami is not None:
            compute["gpuMemoryRequest"] = f"{int(hami)}Mi"
        elif TF_VRAM in annotations:
            compute["gpuMemoryRequest"] = annotations[TF_VRAM]
        if TF_VRAM_LIMIT in annotations:
            compute["gpuMemoryLimit"] = annotations[TF_VRAM_LIMIT]
        if len(mig) == 1:
            compute["migProfile"] = profile_of(mig[0])
    for field, section, name in (
        ("cpuCoreRequest", requests, "cpu"),
        ("cpuCoreLimit", limits, "cpu"),
        ("cpuMemoryRequest", requests, "memory"),
        ("cpuMemoryLimit", limits, "memory"),
    ):
        if name in section:
            compute[field] = _cores(section[name][0]) if name == "cpu" else _total_text(section[name])
    extended = []
    for name in sorted({**requests, **limits}):
        if name in CORE_RESOURCES or name.startswith(("hugepages-", MIG_PREFIX)) or name in (GPU, GPUMEM, GPUCORES):
            continue
        extended.append({"resource": name, "quantity": _total_text(limits.get(name) or requests[name])})
    if extended:
        compute["extendedResources"] = extended
    out: dict[str, JSON] = {"compute": compute} if compute else {}
    if NODE_POOLS in annotations:
        try:
            out["nodePools"] = orjson.loads(annotations[NODE_POOLS])
        except orjson.JSONDecodeError:
            out["nodePools"] = annotations[NODE_POOLS]
    if spec.get("priorityClassName"):
        out["priorityClass"] = spec["priorityClassName"]
    tolerations = []
    for t in _list(spec.get("tolerations")):
        if isinstance(t, dict) and not _system_toleration(t):
            item = {ours: t[theirs] for ours, theirs in _TOLERATION if theirs in t}
            item.setdefault("key", "")
            if "tolerationSeconds" in t:
                item["seconds"] = t["tolerationSeconds"]
            tolerations.append(item)
    if tolerations:
        out["tolerations"] = tolerations
    for annotation, rule in ((KAI_REQUIRED, "required"), (KAI_PREFERRED, "preferred")):
        if annotations.get(annotation):
            out["podAffinitySchedulingRule"] = rule
            out["podAffinityTopology"] = annotations[annotation]
            break
    if TERMINATE in annotations:
        text = str(annotations[TERMINATE]).lower()
        out["terminateAfterPreemption"] = {"true": True, "false": False}.get(text, annotations[TERMINATE])
    if mine := [{"name": k, "value": v} for k, v in annotations.items() if not _system_key(k) and k not in OWNED]:
        out["annotations"] = mine
    if mine := [{"name": k, "value": v} for k, v in labels.items() if not _system_key(k)]:
        out["labels"] = mine
    return out, other and not policy


#: Annotations other policy fields own: judged (and written) as those fields, not as annotations.
OWNED = frozenset({*(POLICY_PREFIX + f for f in POLICY_FIELDS), NODE_POOLS, TERMINATE, KAI_REQUIRED, KAI_PREFERRED})


def _object(value: JSON) -> dict[str, JSON]:
    return value if isinstance(value, dict) else {}


def _list(value: JSON) -> list[JSON]:
    return value if isinstance(value, list) else []


#: What the API server's DefaultTolerationSeconds admission adds to every pod before the webhooks.
SYSTEM_TOLERATIONS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def _system_toleration(t: Mapping[str, JSON]) -> bool:
    return t.get("key") in SYSTEM_TOLERATIONS and t.get("effect") == "NoExecute"


def _system_key(key: str) -> bool:
    """Labels and annotations of Kubernetes' own domains (kubernetes.io, k8s.io), which its
    components write: not the submitter's, not judged."""
    prefix = key.partition("/")[0] if "/" in key else ""
    return prefix in ("kubernetes.io", "k8s.io") or prefix.endswith((".kubernetes.io", ".k8s.io"))


def read_workload(obj: Mapping[str, JSON], group: str, kind: str) -> dict[str, JSON]:
    """The workload-level policy fields of a workload object."""
    path = BACKOFF_PATHS.get((group, kind))
    if path is None:
        return {}
    value: JSON = obj
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return {} if value is None else {"backoffLimit": value}


def _get(values: Mapping[str, JSON], dotted: str) -> JSON:
    value: JSON = values
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _text(value: JSON) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def apply_pod_defaults(
    template: Mapping[str, JSON],
    values: Mapping[str, JSON],
    defaulted: frozenset[str] | set[str],
    *,
    gpu_in_other_spelling: bool,
    priority: tuple[int, str] | None = None,
) -> dict[str, JSON] | None:
    """A copy of `template` with the defaulted fields written where `POD_FIELDS` says, or None
    when nothing changes. `values` are the evaluation's effective fields; `defaulted` names the
    fields (and itemized instances, `tolerations[key]`) whose value came from a default.
    `priority` is the defaulted PriorityClass's value and preemption policy, written beside its
    name in a pod (a template leaves them to the pod's own admission)."""
    tops = {d.split("[", 1)[0] for d in defaulted}
    if not tops or not all(isinstance(template.get(k, {}), dict) for k in ("metadata", "spec")):
        return None  # nothing to write, or a template too malformed to write into
    out = copy.deepcopy(dict(template))
    meta = out.setdefault("metadata", {})
    spec = out.setdefault("spec", {})
    annotations: dict[str, str] = dict(_object(meta.get("annotations")))
    labels: dict[str, str] = dict(_object(meta.get("labels")))
    containers = _list(spec.get("containers"))
    main = containers[0] if containers and isinstance(containers[0], dict) else None
    if main is not None and not isinstance(main.setdefault("resources", {}), dict):
        main = None
    for field in sorted(tops):
        value = _get(values, field)
        if value is None:
            continue
        name = field.removeprefix("compute.")
        if field.startswith("compute.") and name in POLICY_FIELDS:
            if not gpu_in_other_spelling:
                annotations[POLICY_PREFIX + name] = _text(value)
        elif field in (
            "compute.cpuCoreRequest",
            "compute.cpuCoreLimit",
            "compute.cpuMemoryRequest",
            "compute.cpuMemoryLimit",
        ):
            if main is not None:
                section = "requests" if name.endswith("Request") else "limits"
                resource = "cpu" if "Core" in name else "memory"
                section_of = main["resources"].setdefault(section, {})
                if isinstance(section_of, dict):
                    section_of[resource] = _text(value)
        elif field == "compute.extendedResources":
            if main is not None:
                res = main["resources"]
                for item in value:
                    if _touched(defaulted, field, item.get("resource")):
                        for section in ("requests", "limits"):
                            into = res.setdefault(section, {})
                            if isinstance(into, dict):
                                into[str(item["resource"])] = _text(item.get("quantity", 1))
        elif field == "nodePools":
            annotations[NODE_POOLS] = orjson.dumps(value).decode()
        elif field == "priorityClass":
            spec["priorityClassName"] = value
            if priority is not None:
                spec["priority"], spec["preemptionPolicy"] = priority
        elif field == "tolerations":
            have = spec.setdefault("tolerations", [])
            for item in value if isinstance(have, list) else ():
                if _touched(defaulted, field, item.get("key", "")):
                    toleration = {theirs: item[ours] for ours, theirs in _TOLERATION if ours in item}
                    if "seconds" in item:
                        toleration["tolerationSeconds"] = item["seconds"]
                    if toleration not in have:
                        have.append(toleration)
        elif field in ("podAffinitySchedulingRule", "podAffinityTopology"):
            rule, level = values.get("podAffinitySchedulingRule"), values.get("podAffinityTopology")
            if rule in ("required", "preferred") and level:
                annotations[KAI_REQUIRED if rule == "required" else KAI_PREFERRED] = str(level)
        elif field == "terminateAfterPreemption":
            annotations[TERMINATE] = _text(value)
        elif field in ("annotations", "labels"):
            into = annotations if field == "annotations" else labels
            for item in value:
                if _touched(defaulted, field, item.get("name")):
                    into[str(item["name"])] = _text(item.get("value", ""))
    if annotations:
        meta["annotations"] = annotations
    if labels:
        meta["labels"] = labels
    return out if out != template else None


def _touched(defaulted: set[str] | frozenset[str], field: str, key: Any) -> bool:
    """Whether a default made or filled the item `key` of the itemized `field` (the instance
    `field[key]`, or one of its attributes `field[key].attr`)."""
    item = f"{field}[{key}]"
    return field in defaulted or any(d == item or d.startswith(item + ".") for d in defaulted)


def apply_workload_defaults(
    obj: Mapping[str, JSON], group: str, kind: str, values: Mapping[str, JSON], defaulted: set[str] | frozenset[str]
) -> list[dict[str, JSON]]:
    """JSON patch operations writing the workload-level defaults into the object."""
    path = BACKOFF_PATHS.get((group, kind))
    if path is None or "backoffLimit" not in defaulted or values.get("backoffLimit") is None:
        return []
    ops: list[dict[str, JSON]] = []
    node: JSON = obj
    for depth, key in enumerate(path[:-1]):
        node = node.get(key) if isinstance(node, dict) else None
        if node is None:
            ops.append({"op": "add", "path": pointer(path[: depth + 1]), "value": {}})
    ops.append({"op": "add", "path": pointer(path), "value": values["backoffLimit"]})
    return ops


def pointer(path: tuple[Any, ...] | list[Any]) -> str:
    """A JSON pointer (RFC 6901) to `path`."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)
