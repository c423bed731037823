"""Requests to Kubernetes objects, and Kubernetes objects to the API's answers: pure functions.

An allocation is a Pod (scheduled by the scheduler that calls Phalanx); an allocation with
`gangScheduling.groupId` or a job is also a Phalanx `Workload` whose pods join it by label; a
quota is a Phalanx `Queue`. Nothing is stored twice: these functions only translate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from extender.api.models import (
    Allocation,
    GangScheduling,
    JobSpec,
    MatchExpression,
    NodeSelectorTerm,
    PodAffinity,
    Quota,
    ResourceRequirements,
    Scheduling,
    seconds,
)
from extender.gangs.sources import GROUP_LABEL, WORKLOAD_LABEL
from extender.objects import PodInfo
from extender.queues import QUEUE_LABELS
from solver import FULL_SHARE

JSON = dict[str, Any]
API_VERSION = "phalanx.io/v1"
KIND_LABEL = "phalanx.io/api"  # "allocation" or "job": made through this API
JOB_LABEL = "phalanx.io/job"
INDEX_LABEL = "phalanx.io/job-index"
BOOST_ANNOTATION = "phalanx.io/boost"  # {"previous": 200, "expires": "<RFC 3339>", "reason": ..., "by": ...}
GANG_GROUP = "members"
WORKLOAD_API = "phalanx.io/v1alpha1"
QUEUE_API = "phalanx.io/v1alpha1"
#: Quota resource names -> the Queue's.
QUEUE_RESOURCES = {"cpu": "cpu", "memory": "memory", "nvidia.com/gpu": "gpu", "gpu": "gpu"}
QUEUE_NAMES = {v: k for k, v in QUEUE_RESOURCES.items() if k != "gpu"}


def _expression(e: MatchExpression) -> JSON:
    """The seed's Gte/Lte as Kubernetes' Gt/Lt over integers (Gte 80 is Gt 79)."""
    if e.operator in ("Gte", "Lte"):
        op = "Gt" if e.operator == "Gte" else "Lt"
        try:
            bound = int(e.values[0]) + (-1 if op == "Gt" else 1)
        except (IndexError, ValueError):
            raise ValueError(f"{e.key}: {e.operator} needs one integer value, got {e.values!r}") from None
        return {"key": e.key, "operator": op, "values": [str(bound)]}
    out: JSON = {"key": e.key, "operator": e.operator}
    if e.operator not in ("Exists", "DoesNotExist"):
        out["values"] = list(e.values)
    return out


def _term(t: NodeSelectorTerm) -> JSON:
    return {"matchExpressions": [_expression(e) for e in t.matchExpressions]}


def _pod_terms(a: PodAffinity) -> list[JSON]:
    return [
        {"topologyKey": t.topologyKey, "labelSelector": {"matchLabels": dict(t.labelSelector.matchLabels)}}
        for t in a.requiredDuringScheduling
    ]


def _resources(r: ResourceRequirements) -> JSON:
    out: JSON = {}
    if r.requests:
        out["requests"] = {k: str(v) for k, v in r.requests.items()}
    if r.limits:
        out["limits"] = {k: str(v) for k, v in r.limits.items()}
    # Extended resources (GPUs) must have limits equal to requests: a request alone implies it.
    for k, v in r.requests.items():
        if "/" in k and k not in r.limits:
            out.setdefault("limits", {})[k] = str(v)
    return out


def pod_spec(
    *,
    scheduler: str,
    resources: ResourceRequirements,
    scheduling: Scheduling,
    image: str,
    command: list[str],
    priority_class: str | None = None,
    preemption_policy: str | None = None,
    deadline_s: int | None = None,
) -> JSON:
    """The pod spec of one allocation (ValueError naming the field for what Kubernetes cannot say)."""
    container: JSON = {"name": "main", "image": image, "resources": _resources(resources)}
    if command:
        container["command"] = list(command)
    spec: JSON = {"schedulerName": scheduler, "containers": [container], "restartPolicy": "Never"}
    if scheduling.nodeSelector:
        spec["nodeSelector"] = dict(scheduling.nodeSelector)
    affinity: JSON = {}
    a = scheduling.affinity
    if a is not None and a.nodeAffinity is not None:
        node: JSON = {}
        required = a.nodeAffinity.requiredDuringScheduling
        if required is not None:
            terms = [_term(t) for t in required.nodeSelectorTerms]
            node["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}
        if a.nodeAffinity.preferredDuringScheduling:
            node["preferredDuringSchedulingIgnoredDuringExecution"] = [
                {"weight": p.weight, "preference": _term(p.preference)}
                for p in a.nodeAffinity.preferredDuringScheduling
            ]
        if node:
            affinity["nodeAffinity"] = node
    for ours, theirs in (("podAffinity", "podAffinity"), ("podAntiAffinity", "podAntiAffinity")):
        terms_of = getattr(a, ours, None) if a is not None else None
        if terms_of is not None and terms_of.requiredDuringScheduling:
            affinity[theirs] = {"requiredDuringSchedulingIgnoredDuringExecution": _pod_terms(terms_of)}
    if affinity:
        spec["affinity"] = affinity
    if scheduling.tolerations:
        spec["tolerations"] = [
            {k: v for k, v in t.model_dump().items() if v != "" or k == "operator"} for t in scheduling.tolerations
        ]
    if scheduling.topologySpreadConstraints:
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": c.maxSkew,
                "topologyKey": c.topologyKey,
                "whenUnsatisfiable": c.whenUnsatisfiable,
                "labelSelector": {"matchLabels": dict(c.labelSelector.matchLabels)} if c.labelSelector else {},
            }
            for c in scheduling.topologySpreadConstraints
        ]
    if priority_class:
        spec["priorityClassName"] = priority_class
    if preemption_policy:
        spec["preemptionPolicy"] = preemption_policy
    if deadline_s:
        spec["activeDeadlineSeconds"] = deadline_s
    return spec


def workload(
    namespace: str,
    name: str,
    gang: GangScheduling | None,
    *,
    members: int,
    priority: int | None,
    scheduling: Scheduling,
    labels: Mapping[str, str],
) -> JSON:
    """The Workload of a gang: one gang group, `members` pods, minCount from `gang`."""
    group: JSON = {"name": GANG_GROUP, "maxCount": members}
    if gang is None:
        group["gangMode"] = "Off"
    else:
        group["minCount"] = min(gang.minMembers, members) if members else gang.minMembers
        group["scheduleTimeoutSeconds"] = max(1, seconds(gang.timeout))
    if priority:
        group["priority"] = priority
    topo = scheduling.topology
    if topo is not None and (topo.required or topo.preferred):
        group["topologyRequest"] = {k: v for k, v in (("required", topo.required), ("preferred", topo.preferred)) if v}
    return {
        "apiVersion": WORKLOAD_API,
        "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {"gangGroups": [group]},
    }


def allocation_pod(req: Allocation, namespace: str, scheduler: str) -> JSON:
    spec = req.spec
    labels = {**req.metadata.labels, KIND_LABEL: "allocation"}
    gang = spec.gangScheduling or spec.scheduling.gangScheduling
    if gang is not None and gang.groupId:
        labels[WORKLOAD_LABEL] = gang.groupId
        labels[GROUP_LABEL] = GANG_GROUP
    if spec.queue:
        labels[QUEUE_LABELS[0]] = spec.queue
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": req.metadata.name,
            "namespace": namespace,
            "labels": labels,
            "annotations": dict(req.metadata.annotations),
        },
        "spec": pod_spec(
            scheduler=scheduler,
            resources=spec.resources,
            scheduling=spec.scheduling,
            image=spec.image,
            command=spec.command,
            priority_class=spec.priorityClass,
            preemption_policy=spec.preemptionPolicy,
            deadline_s=seconds(spec.ttl) if spec.ttl else None,
        ),
    }


def job_pods(name: str, namespace: str, spec: JobSpec, labels: Mapping[str, str], scheduler: str) -> list[JSON]:
    t = spec.template
    pod_labels = {
        **t.metadata.get("labels", {}),
        **labels,
        KIND_LABEL: "job",
        JOB_LABEL: name,
        WORKLOAD_LABEL: name,
        GROUP_LABEL: GANG_GROUP,
    }
    if spec.queue:
        pod_labels[QUEUE_LABELS[0]] = spec.queue
    body = pod_spec(
        scheduler=scheduler,
        resources=t.spec.resources,
        scheduling=t.spec.scheduling,
        image=t.spec.image,
        command=t.spec.command,
        priority_class=spec.priorityClass,
        deadline_s=spec.activeDeadlineSeconds,
    )
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-{i}",
                "namespace": namespace,
                "labels": {**pod_labels, INDEX_LABEL: str(i)},
                "annotations": dict(t.metadata.get("annotations", {})),
            },
            "spec": body,
        }
        for i in range(spec.parallelism)
    ]


#: What a pod made again must not carry over: its placement and what the API server set.
_NOT_REPLAYED = {
    "nodeName",
    "nominatedNodeName",
    "priority",
    "preemptionPolicy",
    "ephemeralContainers",
}  # admission sets the priority fields again
_PLACEMENT_ANNOTATIONS = ("phalanx.io/gpu-devices", "phalanx.io/gang-plan")


def replayable(pod: JSON, suffix: str) -> JSON:
    """A pod as it was read, to be created again under a new name (`<name>-<suffix>`, or the
    old suffix replaced): its labels, annotations and spec, without its placement, identity
    or status, and without the service-account volume admission adds again."""
    meta = pod.get("metadata") or {}
    name = str(meta.get("name", ""))
    index = (meta.get("labels") or {}).get(INDEX_LABEL)
    base = f"{meta.get('labels', {}).get(JOB_LABEL)}-{index}" if index is not None else name
    spec = {k: v for k, v in (pod.get("spec") or {}).items() if k not in _NOT_REPLAYED}
    injected = {
        v.get("name") for v in spec.get("volumes") or [] if str(v.get("name", "")).startswith("kube-api-access-")
    }
    if injected:
        spec["volumes"] = [v for v in spec["volumes"] if v.get("name") not in injected]
        for c in (*(spec.get("initContainers") or []), *(spec.get("containers") or [])):
            c["volumeMounts"] = [m for m in c.get("volumeMounts") or [] if m.get("name") not in injected]
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in _PLACEMENT_ANNOTATIONS}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{base}-{suffix}",
            "namespace": meta.get("namespace"),
            "labels": dict(meta.get("labels") or {}),
            "annotations": annotations,
        },
        "spec": spec,
    }


def queue_of_quota(q: Quota) -> JSON:
    spec: JSON = {}
    for part, field in (("limit", q.spec.hard), ("deserved", q.spec.soft)):
        if field:
            spec[part] = {QUEUE_RESOURCES[k]: str(v) for k, v in field.items()}
    if q.spec.parent:
        spec["parent"] = q.spec.parent
    if q.spec.weight is not None:
        spec["weight"] = q.spec.weight
    return {
        "apiVersion": QUEUE_API,
        "kind": "Queue",
        "metadata": {"name": q.metadata.name, "labels": dict(q.metadata.labels)},
        "spec": spec,
    }


def unknown_quota_resources(amounts: Iterable[str], part: str) -> list[dict[str, str]]:
    return [
        {
            "field": f"spec.{part}.{k}",
            "message": f"{k!r} is not a quota resource here; use one of {', '.join(sorted(QUEUE_RESOURCES))}",
        }
        for k in amounts
        if k not in QUEUE_RESOURCES
    ]


def requested(pod: PodInfo) -> dict[str, str]:
    """What a pod asks for, as quantities (GPUs as devices, or a share of one)."""
    r = pod.requests
    out = {}
    if r.cpu_milli:
        out["cpu"] = f"{r.cpu_milli}m"
    if r.memory_mib:
        out["memory"] = f"{r.memory_mib}Mi"
    d = pod.demand
    if d.count:
        if d.mig_profile:
            out[f"nvidia.com/mig-{d.mig_profile}"] = str(d.count)
        elif d.milli >= FULL_SHARE and not d.memory_mib:
            out["nvidia.com/gpu"] = str(d.count)
        else:
            out["nvidia.com/gpu"] = f"{d.count * d.milli / FULL_SHARE:g}"
            if d.memory_mib:
                out["gpuMemory"] = f"{d.count * d.memory_mib}Mi"
    for k, v in r.extended:
        if k not in out and not k.startswith("nvidia.com/"):
            out[k] = str(v)
    return out


def phase(pod: PodInfo) -> str:
    if pod.phase in ("Succeeded", "Failed", "Running"):
        return pod.phase
    return "Scheduled" if pod.node else "Pending"


def allocation(pod: PodInfo, *, queue: str = "", position: int | None = None, reason: str = "") -> JSON:
    """An allocation as the API shows it, from what the cache keeps of its pod."""
    scheduled: JSON = {"type": "Scheduled", "status": "True" if pod.node else "False"}
    if not pod.node:
        scheduled.update(reason="Unscheduled", message=reason or "Waiting for scheduler")
    status: JSON = {"phase": phase(pod), "conditions": [scheduled]}
    if pod.node:
        status["nodeName"] = pod.node
        status["allocatedResources"] = requested(pod)
        if pod.devices:
            status["devices"] = [
                {"index": a.index, "milli": a.milli, "memoryMiB": a.memory_mib, "mig": a.mig_profile}
                for a in pod.devices
            ]
    if queue:
        status["queue"] = queue
    if position is not None:
        status["queuePosition"] = position
    meta: JSON = {
        "name": pod.name,
        "namespace": pod.namespace,
        "uid": pod.uid,
        "resourceVersion": pod.resource_version,
        "creationTimestamp": pod.created,
        "labels": dict(pod.labels),
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "Allocation",
        "metadata": meta,
        "spec": {"resources": {"requests": requested(pod)}},
        "status": status,
    }
