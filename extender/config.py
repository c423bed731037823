"""Phalanx configuration: the `config.yaml` key of the `phalanx-config` ConfigMap.

Validated with pydantic at the boundary and resolved into solver parameters here, so the
solver never sees a flag. An invalid update is rejected whole, with every error and the field
it concerns; the last good configuration stays active.
"""

from __future__ import annotations

from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from solver.params import PlacementMode, SolverParams

CONFIGMAP_NAME = "phalanx-config"
CONFIGMAP_KEY = "config.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class TopologyConfig(_Strict):
    levels: tuple[str, ...] = Field(
        default=("topology.phalanx.io/block", "topology.phalanx.io/rack", "kubernetes.io/hostname"),
        description="Node label keys of the topology levels, coarsest first. The host level "
        "(kubernetes.io/hostname) may be last; gangs name these keys in topology requests.",
    )

    @field_validator("levels")
    @classmethod
    def _distinct(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(v)) != len(v):
            raise ValueError("levels must be distinct")
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


class GpuConfig(_Strict):
    placement_mode: Literal["CompactFirst", "LowLoadFirst"] = Field(
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


class ServerConfig(_Strict):
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", alias="logLevel", description="Log level; info logs one line per extender call."
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
