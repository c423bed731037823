"""Phalanx configuration: the `config.yaml` key of the `phalanx-config` ConfigMap.

Validated with pydantic at the boundary and resolved into solver parameters here, so the
solver never sees a flag. An invalid update is rejected whole, with every error and the field
it concerns; the last good configuration stays active.
"""

from __future__ import annotations

from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from solver import PlacementMode, SolverParams

CONFIGMAP_NAME = "phalanx-config"
CONFIGMAP_KEY = "config.yaml"


# The wire spellings, once: PlacementMode(...) turns a mode into the solver's enum at the edge.
PlacementName = Literal["CompactFirst", "LowLoadFirst"]
QosName = Literal["low", "medium", "high", "critical"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


def _distinct(values: tuple[str, ...], what: str) -> None:
    if len(set(values)) != len(values):
        raise ValueError(f"{what} must be distinct, got {list(values)}")


class TopologyConfig(_Strict):
    levels: tuple[str, ...] = Field(
        default=("topology.phalanx.io/block", "topology.phalanx.io/rack", "kubernetes.io/hostname"),
        description="Node label keys of the topology levels, coarsest first. The host level "
        "(kubernetes.io/hostname) may be last; gangs name these keys in topology requests.",
    )

    @field_validator("levels")
    @classmethod
    def _distinct_levels(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        _distinct(v, "levels")
        if any(not level.strip() for level in v):
            raise ValueError("levels must be non-empty label keys")
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
    workers: int = Field(2, ge=1, le=64, description="CP-SAT search workers (threads). 2 suits a 2-core sidecar.")
    seed: int = Field(0, description="CP-SAT random seed: fixed so the same cluster gives the same plan.")


class GpuModelConfig(_Strict):
    match: str = Field(
        min_length=1,
        description="Case-insensitive substring of the node label nvidia.com/gpu.product this row is for; "
        "the first matching row wins.",
    )
    tflops: float = Field(gt=0, description="Dense FP16 tensor TFLOPs of one device, the unit TFLOPs requests use.")


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


class NodeSelector(_Strict):
    node_selector_terms: tuple[dict[str, Any], ...] = Field(
        alias="nodeSelectorTerms",
        min_length=1,
        description="Kubernetes node selector terms (ORed; matchExpressions and matchFields within a term ANDed).",
    )


class NodeManagerConfig(_Strict):
    node_selector: NodeSelector = Field(alias="nodeSelector", description="Which nodes belong to the pool.")


class QosDefinition(_Strict):
    name: QosName
    priority: int = Field(description="Priority pods of this QoS get in gang planning (higher is placed first).")
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
        description="Gang-planning priority per QoS level: low < medium < high < critical, 100 apart.",
    )


class GpuFilter(_Strict):
    type: Literal["model"] = Field(description="model: keep only GPUs whose model contains one of params.models.")
    params: dict[str, tuple[str, ...]] = Field(description="For type model: {models: [...]} (substrings).")

    @field_validator("params")
    @classmethod
    def _models(cls, v: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        if set(v) != {"models"} or not v["models"]:
            raise ValueError("a model filter takes params {models: [<substring>, ...]}")
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
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", description="Pods pick the pool by this name.")
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
        description="GPU memory (MiB) assumed for nodes without the nvidia.com/gpu.memory label.",
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


class PhalanxConfig(_Strict):
    topology: TopologyConfig = TopologyConfig()
    solver: SolverConfig = SolverConfig()
    gpu: GpuConfig = GpuConfig()
    server: ServerConfig = ServerConfig()

    def solver_params(self) -> SolverParams:
        return SolverParams(
            time_limit_s=self.solver.time_limit_seconds,
            workers=self.solver.workers,
            seed=self.solver.seed,
            placement_mode=PlacementMode(self.gpu.placement_mode),
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
