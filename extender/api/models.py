"""The allocation API's request bodies, as pydantic models (the OpenAPI document is made from
them): the seed's shapes (`shared/seeds/resource-allocation-service-api.txt`), field names as
the wire has them. Every model refuses fields it does not know, so a typo is a 400 naming it,
never a setting silently ignored.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from extender import quantity

_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DURATION = re.compile(r"^(\d{1,9})(s|m|h)$")
_UNITS = {"s": 1, "m": 60, "h": 3600}


def _name(value: str) -> str:
    if not _DNS1123.match(value):
        raise ValueError("a lowercase DNS-1123 name: a-z, 0-9, '-' and '.', alphanumeric at both ends")
    return value


def _quantity(value: str | int | float) -> str:
    try:
        amount = quantity.parse(value)
    except (ValueError, ArithmeticError) as e:
        raise ValueError(f"not a Kubernetes quantity: {value!r} ({e})") from None
    if amount < 0:
        raise ValueError(f"negative quantity {value!r}")
    return str(value)


def seconds(text: str) -> int:
    """ "300s", "5m", "2h" -> seconds."""
    m = _DURATION.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not a duration such as 300s, 5m or 2h")
    return int(m.group(1)) * _UNITS[m.group(2)]


MAX_DURATION_S = 366 * 86_400


def _duration(value: str) -> str:
    if seconds(value) > MAX_DURATION_S:
        raise ValueError(f"{value!r} is longer than a year")
    return value


Name = Annotated[str, Field(min_length=1, max_length=63), AfterValidator(_name)]
Quantity = Annotated[str | int | float, AfterValidator(_quantity)]
Duration = Annotated[str, Field(max_length=16), AfterValidator(_duration)]
ResourceList = Annotated[dict[Annotated[str, Field(max_length=253)], Quantity], Field(max_length=32)]
Labels = Annotated[
    dict[Annotated[str, Field(max_length=317)], Annotated[str, Field(max_length=63)]], Field(max_length=64)
]
Annotations = Annotated[
    dict[Annotated[str, Field(max_length=317)], Annotated[str, Field(max_length=4096)]], Field(max_length=64)
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ObjectMeta(_Model):
    name: Name
    namespace: Name | None = Field(None, description="must match the path's namespace when given")
    labels: Labels = {}
    annotations: Annotations = {}
    resourceVersion: str | None = Field(None, max_length=64, description="optimistic concurrency on updates")


class ResourceRequirements(_Model):
    requests: ResourceList = {}
    limits: ResourceList = {}


class MatchExpression(_Model):
    key: Annotated[str, Field(min_length=1, max_length=317)]
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Gte", "Lte"]
    values: Annotated[list[Annotated[str, Field(max_length=63)]], Field(max_length=64)] = []


class NodeSelectorTerm(_Model):
    matchExpressions: Annotated[list[MatchExpression], Field(min_length=1, max_length=32)]


class RequiredNodeAffinity(_Model):
    nodeSelectorTerms: Annotated[list[NodeSelectorTerm], Field(min_length=1, max_length=16)]


class PreferredTerm(_Model):
    weight: Annotated[int, Field(ge=1, le=100)]
    preference: NodeSelectorTerm


class NodeAffinity(_Model):
    requiredDuringScheduling: RequiredNodeAffinity | None = None
    preferredDuringScheduling: Annotated[list[PreferredTerm], Field(max_length=16)] = []


class LabelSelector(_Model):
    matchLabels: Labels = {}


class PodAffinityTerm(_Model):
    topologyKey: Annotated[str, Field(min_length=1, max_length=317)]
    labelSelector: LabelSelector = LabelSelector()


class PodAffinity(_Model):
    requiredDuringScheduling: Annotated[list[PodAffinityTerm], Field(max_length=16)] = []


class Affinity(_Model):
    nodeAffinity: NodeAffinity | None = None
    podAffinity: PodAffinity | None = None
    podAntiAffinity: PodAffinity | None = None


class Toleration(_Model):
    key: Annotated[str, Field(max_length=317)] = ""
    operator: Literal["Exists", "Equal"] = "Equal"
    value: Annotated[str, Field(max_length=63)] = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""


class TopologySpread(_Model):
    maxSkew: Annotated[int, Field(ge=1, le=1000)]
    topologyKey: Annotated[str, Field(min_length=1, max_length=317)]
    whenUnsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = "DoNotSchedule"
    labelSelector: LabelSelector | None = None


class GangScheduling(_Model):
    groupId: Name | None = Field(None, description="allocations with one groupId are one gang")
    minMembers: Annotated[int, Field(ge=1, le=100_000)]
    timeout: Duration = "300s"


class Topology(_Model):
    required: Annotated[str, Field(max_length=317)] = Field("", description="node label: every member in one domain")
    preferred: Annotated[str, Field(max_length=317)] = Field("", description="node label: as few domains as possible")


class Scheduling(_Model):
    nodeSelector: Labels = {}
    affinity: Affinity | None = None
    tolerations: Annotated[list[Toleration], Field(max_length=32)] = []
    topologySpreadConstraints: Annotated[list[TopologySpread], Field(max_length=8)] = []
    gangScheduling: GangScheduling | None = None
    topology: Topology | None = Field(None, description="a gang's topology (Phalanx Workload topologyRequest)")


class AllocationSpec(_Model):
    resources: ResourceRequirements
    priority: int | None = Field(None, ge=-(10**9), le=10**9, description="a gang's priority (its Workload's)")
    priorityClass: Name | None = Field(None, description="the pod's PriorityClass (preemption)")
    preemptionPolicy: Literal["PreemptLowerPriority", "Never"] | None = None
    scheduling: Scheduling = Scheduling()
    ttl: Duration | None = Field(None, description="the pod's activeDeadlineSeconds")
    gangScheduling: GangScheduling | None = None
    queue: Name | None = Field(None, description="the Phalanx Queue (quota); default: the namespace's")
    image: Annotated[str, Field(min_length=1, max_length=512)] = "registry.k8s.io/pause:3.10"
    command: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=64)] = []


class Allocation(_Model):
    apiVersion: Literal["phalanx.io/v1"] | None = None
    kind: Literal["Allocation"] | None = None
    metadata: ObjectMeta
    spec: AllocationSpec


class DeleteOptions(_Model):
    gracePeriodSeconds: Annotated[int, Field(ge=0, le=86_400)] | None = None
    propagationPolicy: Literal["Foreground", "Background", "Orphan"] | None = None
    preconditions: dict[Literal["resourceVersion", "uid"], Annotated[str, Field(max_length=64)]] = {}


class BulkRelease(_Model):
    labelSelector: Annotated[str, Field(min_length=1, max_length=1024)]
    gracePeriodSeconds: Annotated[int, Field(ge=0, le=86_400)] | None = None
    dryRun: bool = False


class JobTemplateSpec(_Model):
    resources: ResourceRequirements
    scheduling: Scheduling = Scheduling()
    image: Annotated[str, Field(min_length=1, max_length=512)] = "registry.k8s.io/pause:3.10"
    command: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=64)] = []


class JobTemplate(_Model):
    spec: JobTemplateSpec
    metadata: dict[Literal["labels", "annotations"], Labels] = {}


class JobSpec(_Model):
    parallelism: Annotated[int, Field(ge=1, le=10_000)]
    completions: Annotated[int, Field(ge=1, le=10_000)] | None = None
    backoffLimit: Annotated[int, Field(ge=0, le=1000)] = 0
    activeDeadlineSeconds: Annotated[int, Field(ge=1, le=10**8)] | None = None
    template: JobTemplate
    priority: int = Field(0, ge=-(10**9), le=10**9)
    priorityClass: Name | None = None
    queue: Name | None = None


class Job(_Model):
    apiVersion: Literal["phalanx.io/v1"] | None = None
    kind: Literal["Job"] | None = None
    metadata: ObjectMeta
    spec: JobSpec


class Cancel(_Model):
    reason: Annotated[str, Field(max_length=1024)] = ""
    gracePeriodSeconds: Annotated[int, Field(ge=0, le=86_400)] | None = None


class Boost(_Model):
    newPriority: int = Field(ge=-(10**9), le=10**9)
    reason: Annotated[str, Field(max_length=1024)] = ""
    duration: Duration = Field("3600s", description="the boost ends after it; the priority goes back")
    approvedBy: Annotated[str, Field(max_length=253)] = ""


class QuotaSpec(_Model):
    hard: ResourceList = Field({}, description="limits: never exceeded (the Queue's spec.limit)")
    soft: ResourceList = Field({}, description="guaranteed share (the Queue's spec.deserved)")
    parent: Name | None = None
    weight: Annotated[int, Field(ge=0, le=1_000_000)] | None = None


class Quota(_Model):
    apiVersion: Literal["phalanx.io/v1"] | None = None
    kind: Literal["ResourceQuota"] | None = None
    metadata: ObjectMeta
    spec: QuotaSpec


class QuotaPatchSpec(_Model):
    hard: dict[str, Quantity | None] = {}
    soft: dict[str, Quantity | None] = {}
    weight: Annotated[int, Field(ge=0, le=1_000_000)] | None = None


class QuotaPatchMeta(_Model):
    resourceVersion: Annotated[str, Field(max_length=64)] | None = None


class QuotaPatch(_Model):
    metadata: QuotaPatchMeta = QuotaPatchMeta()
    spec: QuotaPatchSpec = QuotaPatchSpec()


class Drain(_Model):
    gracePeriodSeconds: Annotated[int, Field(ge=0, le=86_400)] | None = None
    deleteEmptyDirData: bool = False
    ignoreDaemonSets: bool = True
    force: bool = False
    reason: Annotated[str, Field(max_length=1024)] = ""
    gangPolicy: Literal["EvictGang", "Wait"] | None = Field(
        None, description="a gang member on the node: evict its whole gang, or leave the gang and wait"
    )
    timeoutSeconds: Annotated[int, Field(ge=1, le=86_400)] = 3600


class NodePatchSpec(_Model):
    unschedulable: bool


class NodePatch(_Model):
    spec: NodePatchSpec


class Preemption(_Model):
    targetAllocation: Annotated[str, Field(min_length=1, max_length=253)]
    reason: Annotated[str, Field(max_length=1024)] = ""
    gracePeriodSeconds: Annotated[int, Field(ge=0, le=86_400)] | None = None
    initiatedBy: Annotated[str, Field(max_length=253)] = ""


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema(ref_template="#/components/schemas/{model}")
