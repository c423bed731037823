"""The node's GPUs as the agent sees them, and the backend protocol that reports them.

A backend is the only part that touches hardware: `NvmlBackend` (NVML through `nvidia-ml-py`)
on a node with a driver, `FakeBackend` on KWOK nodes (its GPUs follow the node's labels). The
rest of the agent works on `Inventory` values and never asks which backend it has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class BackendError(RuntimeError):
    """The hardware refused an operation (a MIG slice that cannot be cut, NVML failing); the
    message names the device and the operation."""


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG device (a GPU instance with its compute instance)."""

    uuid: str
    profile: str  # as in the resource name: "1g.10gb", "1g.10gb+me"
    start: int  # first memory slice (NVIDIA placement start)
    size: int  # memory slices


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int  # the index Phalanx's device record names (NVML index order)
    uuid: str
    model: str  # as gpu-feature-discovery writes nvidia.com/gpu.product ("NVIDIA-H100-80GB-HBM3")
    memory_mib: int
    mig_enabled: bool = False
    migs: tuple[MigInstance, ...] = ()
    healthy: bool = True
    health_reason: str = ""  # why not healthy ("XID 79", "NVML: GPU is lost")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "uuid": self.uuid,
            "model": self.model,
            "memoryMiB": self.memory_mib,
            "healthy": self.healthy,
        }
        if self.mig_enabled:
            out["mig"] = True
            out["slices"] = [
                {"uuid": m.uuid, "profile": m.profile, "start": m.start, "size": m.size} for m in self.migs
            ]
        if self.health_reason:
            out["reason"] = self.health_reason
        return out


@dataclass(frozen=True, slots=True)
class Inventory:
    backend: str  # "nvml" or "fake"
    driver_version: str
    gpus: tuple[Gpu, ...] = ()
    dynamic_mig: bool = False  # the agent cuts MIG slices per pod on this node
    by_index: dict[int, Gpu] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_index", {g.index: g for g in self.gpus})

    def gpu(self, index: int) -> Gpu | None:
        return self.by_index.get(index)

    def to_json(self) -> dict[str, Any]:
        """The node annotation `phalanx.io/gpu-inventory` (what the extender reads)."""
        out: dict[str, Any] = {
            "backend": self.backend,
            "driver": self.driver_version,
            "gpus": [g.to_json() for g in self.gpus],
        }
        if self.dynamic_mig:
            out["dynamicMig"] = True
        return out


class Backend(Protocol):
    """What the agent needs from the hardware. Every method may raise `BackendError`."""

    name: str

    def inventory(self) -> Inventory:
        """The GPUs now: identity, memory, MIG mode and slices, health. Cheap enough to call
        every second (the agent polls it for health changes)."""
        ...

    def create_mig(self, index: int, profile: str, start: int) -> MigInstance:
        """Cut a GPU instance (and its compute instance) of `profile` at placement `start` on
        GPU `index`; returns the MIG device. Cutting what already exists returns it."""
        ...

    def destroy_mig(self, index: int, uuid: str) -> None:
        """Remove the MIG device `uuid` on GPU `index`; removing what is gone is not an error."""
        ...

    def close(self) -> None: ...
