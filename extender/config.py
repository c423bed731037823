"""Phalanx configuration: the `config.yaml` key of the `phalanx-config` ConfigMap.

Validated with pydantic at the boundary and resolved into solver parameters here, so the
solver never sees a flag. An invalid update is rejected whole, with every error and the field
it concerns; the last good configuration stays active. Past 400 lines on purpose: it is the
configuration reference, every field with its description, unit, bounds and cross-field rules,
in one schema.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from extender.scoring import MIN_SAMPLE, sample_size
from solver import PlacementMode, SolverParams, UnlabeledNodes

CONFIGMAP_NAME = "phalanx-config"
CONFIGMAP_KEY = "config.yaml"


# The wire spellings, once: PlacementMode(...) turns a mode into the solver's enum at the edge.
PlacementName = Literal["CompactFirst", "LowLoadFirst"]
QosName = Literal["low", "medium", "high", "critical"]

HOSTNAME_LABEL = "kubernetes.io/hostname"
# CP-SAT's random_seed is an int32 (a larger one makes every solve raise).
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# Kubernetes label syntax (apimachinery validation.IsQualifiedName / IsValidLabelValue).
_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_NAME = re.compile(rf"^{_NAME}$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class _Strict(BaseModel):
    # allow_inf_nan=False: an `.inf` or `.nan` in YAML is never a usable number here.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, allow_inf_nan=False)


def _distinct(values: tuple[str, ...], what: str) -> None:
    if len(set(values)) != len(values):
        raise ValueError(f"{what} must be distinct, got {list(values)}")


def label_key_problem(key: str) -> str | None:
    """Why `key` is not a Kubernetes label key ([prefix/]name, a qualified name), or None."""
    prefix, _, name = key.rpartition("/")
    if "/" in prefix or (key.count("/") == 1 and not prefix):
        return f"{key!r} is not a label key: at most one '/', with a prefix before it"
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"{key!r}: the prefix must be a DNS subdomain (lower case, at most 253 characters)"
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return (
            f"{key!r}: the name must be 1-63 characters of letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return None


def _label_key(key: str) -> str:
    if (problem := label_key_problem(key)) is not None:
        raise ValueError(problem)
    return key


def _label_value(value: str) -> str:
    if value and (len(value) > 63 or not _LABEL_NAME.match(value)):
        raise ValueError(f"{value!r} is not a label value (at most 63 letters, digits, '-', '_', '.')")
    return value


class TopologyConfig(_Strict):
    levels: tuple[str, ...] = Field(
        default=("topology.phalanx.io/block", "topology.phalanx.io/rack", HOSTNAME_LABEL),
        min_length=1,
        max_length=16,
        description="Node label keys of the topology levels, coarsest first, distinct. The host level "
        "(kubernetes.io/hostname) may only be last; gangs name these keys in topology requests. At least "
        "one: the gang planner indexes levels, and an empty list made every gang fail. At most 16: "
        "each level adds a family of domain variables to every solve.",
    )
    unlabeled_nodes: Literal["Exclude", "EmptyDomain"] = Field(
        "Exclude",
        alias="unlabeledNodes",
        description="A node missing one of the level labels: Exclude leaves it out of gangs whose topology "
        "request is at or below the missing level (as Kueue, KAI-Scheduler and kube-scheduler's topology "
        "plugins do; it still runs other pods); EmptyDomain treats the missing value as one domain like any "
        "other (unlabeled nodes then form a 'rack' together).",
    )

    @field_validator("levels")
    @classmethod
    def _valid_levels(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for level in v:
            _label_key(level)
        _distinct(v, "levels")
        if HOSTNAME_LABEL in v[:-1]:
            raise ValueError(f"{HOSTNAME_LABEL} is the host level: it may only be the last level")
        return v


class SolverConfig(_Strict):
    time_limit_seconds: float = Field(
        1.0,
        alias="timeLimitSeconds",
        gt=0,
        le=60,
        description="CP-SAT wall-clock limit per gang solve (s). 1 s: long enough to prove most "
        "plans optimal, short enough that a gang never waits noticeably; past it the best "
        "feasible or greedy plan is used.",
    )
    workers: int = Field(
        2,
        ge=1,
        le=64,
        description="CP-SAT search workers (threads), 1 to 64 (0 would mean 'all cores' to CP-SAT). "
        "2 suits a 2-core sidecar.",
    )
    seed: int = Field(
        0,
        ge=INT32_MIN,
        le=INT32_MAX,
        description="CP-SAT random seed, a 32-bit signed integer (CP-SAT rejects any other): fixed so the "
        "same cluster gives the same plan.",
    )


class GpuModelConfig(_Strict):
    match: str = Field(
        min_length=1,
        pattern=r"\S",
        description="Case-insensitive substring of the node label nvidia.com/gpu.product this row is for; "
        "the first matching row wins.",
    )
    tflops: float = Field(
        gt=0,
        le=100_000,
        description="Dense FP16 tensor TFLOPs of one device, the unit TFLOPs requests use. At most 100,000, "
        "the bound device records are read with (objects.MAX_TFLOPS).",
    )


DEFAULT_GPU_MODELS = (
    # NVIDIA datasheets, dense FP16/BF16 tensor TFLOPs (sparsity not counted).
    GpuModelConfig(match="H200", tflops=989),
    GpuModelConfig(match="H100", tflops=989),
    GpuModelConfig(match="H800", tflops=989),
    GpuModelConfig(match="A100", tflops=312),
    GpuModelConfig(match="A800", tflops=312),
    GpuModelConfig(match="L40S", tflops=362),
    GpuModelConfig(match="L40", tflops=181),
    GpuModelConfig(match="A10", tflops=125),
    GpuModelConfig(match="L4", tflops=121),
    GpuModelConfig(match="V100", tflops=125),
    GpuModelConfig(match="T4", tflops=65),
)


class Oversubscription(_Strict):
    tflops_oversell_ratio: int = Field(
        500,
        alias="tflopsOversellRatio",
        ge=100,
        le=100000,
        description="TFLOPs sold per physical TFLOPs, in percent (GPUPool semantics): 500 lets TFLOPs requests "
        "add up to 5x a device's rating. Share, memory and whole-GPU requests are never oversold.",
    )


class CapacityConfig(_Strict):
    oversubscription: Oversubscription = Oversubscription()


class _Requirement(_Strict):
    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _values_fit_operator(self) -> _Requirement:
        op, values = self.operator, self.values
        if op in ("In", "NotIn") and not values:
            raise ValueError(f"operator {op} needs at least one value")
        if op in ("Exists", "DoesNotExist") and values:
            raise ValueError(f"operator {op} takes no values")
        if op in ("Gt", "Lt") and (len(values) != 1 or not re.fullmatch(r"-?[0-9]{1,18}", values[0])):
            raise ValueError(f"operator {op} takes exactly one integer value")
        return self


class _LabelRequirement(_Requirement):
    @field_validator("key")
    @classmethod
    def _key(cls, v: str) -> str:
        return _label_key(v)


class _FieldRequirement(_Requirement):
    key: Literal["metadata.name"] = Field(description="The only node field selectors may name.")


class _SelectorTerm(_Strict):
    match_expressions: tuple[_LabelRequirement, ...] = Field((), alias="matchExpressions")
    match_fields: tuple[_FieldRequirement, ...] = Field((), alias="matchFields")

    @model_validator(mode="after")
    def _not_empty(self) -> _SelectorTerm:
        if not self.match_expressions and not self.match_fields:
            raise ValueError("a term needs matchExpressions or matchFields (an empty term matches no node)")
        return self


_TERM = TypeAdapter(_SelectorTerm)


class NodeSelector(_Strict):
    node_selector_terms: tuple[dict[str, Any], ...] = Field(
        alias="nodeSelectorTerms",
        min_length=1,
        description="Kubernetes node selector terms (ORed; matchExpressions and matchFields within a term ANDed). "
        "Checked as Kubernetes checks them (label keys, operators and their values; matchFields on "
        "metadata.name only); kept as given for the matcher (eligibility.term_matches).",
    )

    @field_validator("node_selector_terms")
    @classmethod
    def _terms(cls, v: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
        for term in v:
            _TERM.validate_python(term)
        return v


class NodeManagerConfig(_Strict):
    node_selector: NodeSelector = Field(alias="nodeSelector", description="Which nodes belong to the pool.")


class QosDefinition(_Strict):
    name: QosName
    priority: int = Field(
        ge=INT32_MIN,
        le=INT32_MAX,
        description="Priority pods of this QoS get in gang planning (higher is placed first); 32-bit, as "
        "Kubernetes priorities are.",
    )
    description: str = Field("", description="Free text for people; Phalanx does not read it.")


class QosConfig(_Strict):
    default_qos: QosName = Field("medium", alias="defaultQoS", description="QoS of pods that name none.")
    definitions: tuple[QosDefinition, ...] = Field(
        (
            QosDefinition(name="low", priority=0),
            QosDefinition(name="medium", priority=100),
            QosDefinition(name="high", priority=200),
            QosDefinition(name="critical", priority=300),
        ),
        min_length=1,
        description="Gang-planning priority per QoS level: low < medium < high < critical, 100 apart. Each "
        "name at most once, and defaultQoS among them.",
    )

    @model_validator(mode="after")
    def _default_defined(self) -> QosConfig:
        names = tuple(d.name for d in self.definitions)
        _distinct(names, "QoS definition names")
        if self.default_qos not in names:
            raise ValueError(f"defaultQoS {self.default_qos!r} has no definition (defined: {list(names)})")
        return self


class GpuFilter(_Strict):
    type: Literal["model"] = Field(description="model: keep only GPUs whose model contains one of params.models.")
    params: dict[str, tuple[str, ...]] = Field(description="For type model: {models: [...]} (substrings).")

    @field_validator("params")
    @classmethod
    def _models(cls, v: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        if set(v) != {"models"} or not v["models"] or any(not m.strip() for m in v["models"]):
            raise ValueError("a model filter takes params {models: [<non-empty substring>, ...]}")
        return v


class Placement(_Strict):
    mode: PlacementName = Field(
        "CompactFirst", description="Bin-pack (CompactFirst) or spread (LowLoadFirst), at node and GPU level."
    )
    gpu_filters: tuple[GpuFilter, ...] = Field(
        (), alias="gpuFilters", description="Keep only GPUs every filter passes; none: every GPU of the pool."
    )


class SchedulingConfig(_Strict):
    placement: Placement = Placement()


class PoolSpec(_Strict):
    """The part of a GPUPool spec (tensor-fusion.ai/v1) Phalanx acts on, at the same paths."""

    capacity_config: CapacityConfig = Field(CapacityConfig(), alias="capacityConfig")
    node_manager_config: NodeManagerConfig = Field(alias="nodeManagerConfig")
    qos_config: QosConfig = Field(QosConfig(), alias="qosConfig")
    scheduling_config: SchedulingConfig = Field(SchedulingConfig(), alias="schedulingConfig")


class PoolConfig(_Strict):
    name: str = Field(
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Pods pick the pool by this name (a DNS label: it is written into label values).",
    )
    spec: PoolSpec


class GpuConfig(_Strict):
    placement_mode: PlacementName = Field(
        "CompactFirst",
        alias="placementMode",
        description="CompactFirst bin-packs partly used GPUs and nodes (keeps whole GPUs free for "
        "big pods); LowLoadFirst spreads over idle ones (less interference).",
    )
    default_memory_mib: int = Field(
        81920,
        alias="defaultMemoryMiB",
        gt=0,
        le=2**20,
        description="GPU memory (MiB) assumed for nodes without the nvidia.com/gpu.memory label. 80 GiB: an "
        "A100/H100-80GB; at most 1 TiB per device.",
    )
    models: tuple[GpuModelConfig, ...] = Field(
        DEFAULT_GPU_MODELS, description="TFLOPs rating per GPU model; TFLOPs requests fit only rated models."
    )
    pools: tuple[PoolConfig, ...] = Field(
        (),
        description="GPU pools: named node sets with their own placement mode, GPU model filter, TFLOPs "
        "oversubscription and QoS priorities. A node belongs to the first pool whose selector matches.",
    )
    fragmentation_scoring: bool = Field(
        True,
        alias="fragmentationScoring",
        description="With CompactFirst, score nodes and pick devices by how much the cluster's own workload "
        "(the classes of its pods) fragments (solver/frag.py); false: plain best fit.",
    )
    dynamic_mig_label: str = Field(
        "phalanx.io/mig-mode=dynamic",
        alias="dynamicMigLabel",
        pattern=r"^[^=]+=[^=]*$",
        description="Node label key=value marking nodes whose GPUs Phalanx partitions with MIG on demand.",
    )

    @field_validator("pools")
    @classmethod
    def _distinct_pools(cls, v: tuple[PoolConfig, ...]) -> tuple[PoolConfig, ...]:
        _distinct(tuple(p.name for p in v), "pool names")
        return v

    @field_validator("models")
    @classmethod
    def _distinct_models(cls, v: tuple[GpuModelConfig, ...]) -> tuple[GpuModelConfig, ...]:
        # Matching is case-insensitive and the first row wins: a repeated match is a dead row.
        _distinct(tuple(m.match.lower() for m in v), "model matches (case-insensitive)")
        return v

    @field_validator("dynamic_mig_label")
    @classmethod
    def _mig_label(cls, v: str) -> str:
        key, _, value = v.partition("=")
        _label_key(key)
        _label_value(value)
        return v


class ServerConfig(_Strict):
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info",
        alias="logLevel",
        description="Log level. info: start-up, configuration applied, watches (listed, expired, new kinds), "
        "workload types and gang decisions (planned, not placed, released), not each extender call; "
        "warning and error: faults and rejected input. debug adds one line per filter call (pod, node count, "
        "outcome, cache generation) and per bind (pod, node, devices, API time). Per-verb latency and outcome "
        "counts are in /metrics at every level. Default info: quiet at the scheduler's call rate.",
    )


class FilterConfig(_Strict):
    sample_nodes: Literal["auto", "all"] | Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        "auto",
        alias="sampleNodes",
        description="How many of the nodes that pass filter go on to scoring, the ones Phalanx ranks best. "
        "auto: a GPU pod gets the one node Phalanx ranks best among those kube-scheduler offered (its packing "
        "and fragmentation scores decide; kube-scheduler then skips its Score plugins and prioritize, which "
        "halves the extender calls), a pod without GPUs keeps the nodes Phalanx ranks first for it (where it "
        "strands the fewest GPUs; all when none stands out), at most 100: the fewest kube-scheduler itself ever "
        "scores (its minFeasibleNodesToFind; its own default scores 420 of 1,000 nodes, 500 of 5,000), for "
        "kube-scheduler's scores to choose among; all: no cut, every GPU pod scored by kube-scheduler and "
        "prioritize too (pods without GPUs keep every node Phalanx ranks first); N: at most N for GPU pods, pods "
        "without GPUs as auto cuts them (or N, when more). Pods with preferences kube-scheduler scores "
        "(preferred node or pod affinity, ScheduleAnyway spread) keep every node. A single GPU pod offered one "
        "node has its devices counted from that filter's reply until its bind (30 s at most), so the next pod "
        "sees them taken.",
    )

    def size(self, nodes: int, *, gpu: bool = True) -> int:
        """The cut for a pod (with GPUs or not) on a cluster of `nodes` nodes (no cut: `nodes`)."""
        if self.sample_nodes == "all":
            return nodes
        count = sample_size(nodes)
        if not gpu:  # kube-scheduler scores 100 nodes, not 420 of 1,000: ~0.4 ms less of its cycle per such pod
            fewest = min(count, MIN_SAMPLE)
            return fewest if self.sample_nodes == "auto" else max(self.sample_nodes, fewest)
        return 1 if self.sample_nodes == "auto" else self.sample_nodes


class QueuesConfig(_Strict):
    """Queues, quotas, fair share and preemption (the Queue CRD, phalanx.io/v1alpha1)."""

    default_queue: str = Field(
        "default",
        alias="defaultQueue",
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="The queue of pods that name none (no phalanx.io/queue, kai.scheduler/queue or "
        "scheduling.volcano.sh/queue-name label on the pod or its namespace). It exists even without a Queue "
        "object (no limit, nothing deserved, weight 1).",
    )
    fair_share: Literal["PerResource", "Off"] = Field(
        "PerResource",
        alias="fairShare",
        description="How idle capacity beyond deserved quotas is divided. PerResource: KAI-Scheduler's way, "
        "each resource kind (cpu, memory, gpu, ...) water-filled over sibling queues by over-quota weight, "
        "capped at what each queue wants and its limit; a gang or pod beyond its queue's fair share waits "
        "while another queue below its share waits, unless the idle capacity covers both. Off: limits only, "
        "first come first served.",
    )
    preemption: bool = Field(
        True,
        description="Gang-aware preemption: a pending gang (or pod) with quorum that does not fit evicts the "
        "cheapest set of whole lower-priority gangs the solver finds (through the Eviction API, so "
        "PodDisruptionBudgets hold) and the freed capacity is held for it.",
    )
    reclaim: bool = Field(
        True,
        description="A queue below its deserved quota reclaims capacity that queues above theirs borrowed "
        "(evicting whole borrowing gangs, whatever their priority).",
    )
    reservation_seconds: int = Field(
        120,
        alias="reservationSeconds",
        ge=5,
        le=3600,
        description="How long capacity freed by preemption, or held for a starving gang, stays reserved "
        "for it (s). 120: victims get their grace period (30 s by default) and the gang time to bind.",
    )
    backfill: bool = Field(
        True,
        description="While capacity is held for a starving gang, let lower-priority pods use it (they are the "
        "first victims when the gang is ready); false: held capacity stays idle.",
    )
    starvation_seconds: int = Field(
        300,
        alias="starvationSeconds",
        ge=10,
        le=86400,
        description="A gang at the head of its queue that has waited this long (s) gets capacity held for it "
        "(chosen by the solver, for reservationSeconds). 300: longer than a typical gang's bind.",
    )
    aging_per_minute: int = Field(
        0,
        alias="agingPerMinute",
        ge=0,
        le=1_000_000,
        description="Priority added per minute a gang waits (its queue order and preemption rights); 0: off. "
        "Lets a long-waiting gang overtake younger gangs of somewhat higher priority.",
    )
    status_seconds: float = Field(
        5.0,
        alias="statusSeconds",
        ge=1,
        le=300,
        description="How often Queue statuses are written (s); only changed statuses are written.",
    )


class ApiConfig(_Strict):
    """The allocation API (`/api/v1/namespaces/{ns}/allocations`, jobs, quotas, nodes, metrics)."""

    scheduler_name: str = Field(
        "default-scheduler",
        alias="schedulerName",
        min_length=1,
        max_length=253,
        description="The schedulerName of pods the API creates, and of the pods it shows as allocations: "
        "a kube-scheduler profile that calls Phalanx.",
    )
    requests_per_minute: int = Field(
        1200,
        alias="requestsPerMinute",
        ge=1,
        le=10_000_000,
        description="Requests a tenant (the namespace in the path, else the caller) may make a minute on "
        "average; past it 429 with X-RateLimit-* and Retry-After.",
    )
    burst: int = Field(200, ge=1, le=1_000_000, description="Requests a tenant may make at once.")
    max_in_flight: int = Field(
        64,
        alias="maxInFlight",
        ge=1,
        le=10_000,
        description="API requests served at once (watch streams aside); past it 503 with Retry-After.",
    )
    max_watchers: int = Field(256, alias="maxWatchers", ge=1, le=10_000, description="Open watch streams at most.")
    drain_gang_policy: Literal["EvictGang", "Wait"] = Field(
        "EvictGang",
        alias="drainGangPolicy",
        description="A drain that meets a gang member: evict the whole gang (its pods are recreated by their "
        "controller and placed again as a gang), or leave the gang running and report the drain as waiting.",
    )
    prices: dict[Literal["cpu", "memory", "gpu"], Annotated[float, Field(ge=0, le=1e6)]] = Field(
        {},
        description="Price per resource hour for the usage report's cost: cpu per core, memory per GiB, gpu "
        "per device (a share counts its fraction). E.g. the GPU pool QoS prices.",
    )
    currency: str = Field("$", max_length=8, description="Prefix of the cost figures.")


class PhalanxConfig(_Strict):
    topology: TopologyConfig = TopologyConfig()
    solver: SolverConfig = SolverConfig()
    gpu: GpuConfig = GpuConfig()
    filter: FilterConfig = FilterConfig()
    server: ServerConfig = ServerConfig()
    queues: QueuesConfig = QueuesConfig()
    api: ApiConfig = ApiConfig()

    def solver_params(self) -> SolverParams:
        return SolverParams(
            time_limit_s=self.solver.time_limit_seconds,
            workers=self.solver.workers,
            seed=self.solver.seed,
            placement_mode=PlacementMode(self.gpu.placement_mode),
            unlabeled_nodes=UnlabeledNodes(self.topology.unlabeled_nodes),
        )


def unmatched_levels(config: PhalanxConfig, node_label_sets: Iterable[Mapping[str, str]]) -> list[str]:
    """The configured topology levels no node carries as a label, in configured order.

    Empty when there are no nodes (nothing to judge yet). A level no node has puts every node in
    one domain of that level: placements stay valid but the level constrains nothing, so the
    caller should warn (an Event) rather than reject the configuration.
    """
    missing = dict.fromkeys(config.topology.levels)
    seen_node = False
    for labels in node_label_sets:
        seen_node = True
        for level in [lv for lv in missing if lv in labels]:
            del missing[level]
        if not missing:
            break
    return list(missing) if seen_node else []


def unmatched_levels_message(levels: Iterable[str]) -> str:
    """Event text for `unmatched_levels`."""
    return (
        f"no node carries the topology level label(s) {', '.join(levels)}: gangs requesting these levels "
        "cannot be kept within one domain; check topology.levels in the Phalanx configuration"
    )


class ConfigError(ValueError):
    """An invalid configuration; the message lists every problem with its field path."""


def parse(text: str, *, source: str) -> PhalanxConfig:
    try:
        data: Any = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return PhalanxConfig.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"{source}: {problems}") from None
