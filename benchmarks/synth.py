"""Synthetic clusters for the solver benchmarks (seeded, reproducible).

A cluster is zones > blocks > racks > hosts of identical GPU nodes; occupancy takes whole
GPUs (and matching CPU and memory) from a share of the nodes. `with_used()` replaces some
nodes' used GPUs, so that a known placement exists in an otherwise full cluster.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from solver import ClusterSnapshot, GpuDevice, Node, NodeName, Resources

LEVELS = ("topology.phalanx.io/zone", "topology.phalanx.io/block", "topology.phalanx.io/rack", "kubernetes.io/hostname")
ZONE, BLOCK, RACK, HOST = LEVELS


@dataclass(frozen=True, slots=True)
class Shape:
    zones: int
    blocks_per_zone: int
    racks_per_block: int
    nodes_per_rack: int
    gpus_per_node: int = 8
    gpu_model: str = "NVIDIA-A100-SXM4-80GB"
    gpu_memory_mib: int = 81920
    cpu_milli: int = 128_000
    memory_mib: int = 1_048_576
    pods: int = 110

    @property
    def nodes(self) -> int:
        return self.zones * self.blocks_per_zone * self.racks_per_block * self.nodes_per_rack


def node(shape: Shape, name: str, path: tuple[str, ...], used_gpus: int) -> Node:
    per_gpu_cpu = shape.cpu_milli // (shape.gpus_per_node * 2)
    per_gpu_mem = shape.memory_mib // (shape.gpus_per_node * 2)
    devices = tuple(
        GpuDevice(
            i,
            shape.gpu_model,
            shape.gpu_memory_mib,
            free_milli=0 if i < used_gpus else 1000,
            free_memory_mib=0 if i < used_gpus else shape.gpu_memory_mib,
        )
        for i in range(shape.gpus_per_node)
    )
    return Node(
        NodeName(name),
        Resources(shape.cpu_milli, shape.memory_mib, shape.pods),
        Resources(per_gpu_cpu * used_gpus, per_gpu_mem * used_gpus, min(used_gpus, 1) * used_gpus),
        topology=path,
        gpus=devices,
    )


def cluster(shape: Shape, *, occupancy: float = 0.5, seed: int = 0, full: bool = False) -> ClusterSnapshot:
    """Each node is busy with probability `occupancy`, holding 1..8 used GPUs at random;
    `full`: every node holds at least one used GPU (nothing needing a whole node fits)."""
    rnd = random.Random(seed)
    nodes = []
    for z in range(shape.zones):
        for b in range(shape.blocks_per_zone):
            for r in range(shape.racks_per_block):
                for h in range(shape.nodes_per_rack):
                    zone, block, rack = f"z{z}", f"z{z}b{b}", f"z{z}b{b}r{r}"
                    name = f"{rack}h{h}"
                    busy = full or rnd.random() < occupancy
                    used = rnd.randint(1, shape.gpus_per_node) if busy else 0
                    nodes.append(node(shape, name, (zone, block, rack, name), used))
    return ClusterSnapshot(tuple(nodes), LEVELS)


def with_used(snapshot: ClusterSnapshot, shape: Shape, used: dict[str, int]) -> ClusterSnapshot:
    """The same cluster with some nodes' used GPU counts replaced."""
    nodes = tuple(node(shape, n.name, n.topology, used[n.name]) if n.name in used else n for n in snapshot.nodes)
    return ClusterSnapshot(nodes, snapshot.levels, snapshot.generation + 1)
