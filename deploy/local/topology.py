"""The fake GPU cluster description (``config/cluster.yaml``), validated with pydantic.

The cluster is a regular tree: blocks × racks per block × nodes per rack. Every node has the
same shape (CPU, memory, pods, GPUs of one model); racks listed under ``migRacks`` cut some of
each node's GPUs into static MIG slices, exposed the way the NVIDIA device plugin's ``mixed``
strategy does: whole GPUs as ``nvidia.com/gpu``, slices as ``nvidia.com/mig-<profile>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from deploy.local.paths import DEFAULT_CLUSTER_CONFIG


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True, extra="forbid")


class TopologySpec(_Model):
    """Shape of the topology tree."""

    blocks: int = Field(default=2, ge=1, description="Blocks (spine groups); 2 gives a two-way choice.")
    racks_per_block: int = Field(default=4, ge=1, description="Racks in each block.")
    nodes_per_rack: int = Field(default=8, ge=1, description="Nodes in each rack; 8 as in a DGX pod.")


class NodeShape(_Model):
    """Non-GPU capacity of every node (Kubernetes quantities)."""

    cpu: str = Field(default="128", description="CPU cores; a DGX A100 has 128.")
    memory: str = Field(default="1Ti", description="Memory; a DGX A100 has 1-2 TiB.")
    pods: int = Field(default=110, ge=1, description="Pod slots; the kubelet default.")


class GpuSpec(_Model):
    """GPUs of every node."""

    product: str = Field(default="NVIDIA-A100-SXM4-80GB", description="Value of the nvidia.com/gpu.product label.")
    count: int = Field(default=8, ge=0, description="GPUs per node; 8 as in a DGX/HGX A100.")
    memory_mib: int = Field(default=81920, ge=1, alias="memoryMiB", description="Memory of one GPU in MiB (80 GiB).")


class MigPartition(_Model):
    """Some GPUs of a node, each cut into the same number of slices of one MIG profile."""

    profile: str = Field(description="MIG profile such as 1g.10gb or 3g.40gb.")
    gpus: int = Field(ge=1, description="How many of the node's GPUs are cut this way.")
    slices_per_gpu: int = Field(ge=1, description="Slices per GPU (7 × 1g.10gb, 2 × 3g.40gb).")


class MigRack(_Model):
    """A rack whose nodes all use the same static MIG layout."""

    block: int = Field(ge=0, description="Block index (0-based).")
    rack: int = Field(ge=0, description="Rack index inside the block (0-based).")
    partitions: tuple[MigPartition, ...] = Field(description="Cut GPUs; the rest stay whole.")


class ClusterSpec(_Model):
    """The whole fake cluster."""

    name_prefix: str = Field(default="gpu", description="Node names are <prefix>-b<block>-r<rack>-n<nn>.")
    topology: TopologySpec = Field(default_factory=TopologySpec)
    node: NodeShape = Field(default_factory=NodeShape)
    gpu: GpuSpec = Field(default_factory=GpuSpec)
    mig_racks: tuple[MigRack, ...] = Field(default=(), description="Racks with static MIG slices.")

    @model_validator(mode="after")
    def _mig_racks_fit(self) -> Self:
        for mig in self.mig_racks:
            if mig.block >= self.topology.blocks or mig.rack >= self.topology.racks_per_block:
                raise ValueError(f"MIG rack b{mig.block}-r{mig.rack} is outside the topology")
            if sum(p.gpus for p in mig.partitions) > self.gpu.count:
                raise ValueError(f"MIG rack b{mig.block}-r{mig.rack} cuts more GPUs than a node has")
        return self

    @property
    def node_count(self) -> int:
        t = self.topology
        return t.blocks * t.racks_per_block * t.nodes_per_rack

    def mig_layout(self, block: int, rack: int) -> tuple[MigPartition, ...]:
        """Return the MIG partitions of nodes in rack ``rack`` of block ``block`` (may be empty)."""
        for mig in self.mig_racks:
            if (mig.block, mig.rack) == (block, rack):
                return mig.partitions
        return ()


def load_cluster_spec(path: Path | str = DEFAULT_CLUSTER_CONFIG) -> ClusterSpec:
    """Load and validate a cluster description YAML file."""
    return ClusterSpec.model_validate(yaml.safe_load(Path(path).read_text()) or {})
