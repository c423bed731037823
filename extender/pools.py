"""GPU pools and device ratings: what the configuration says about GPUs beyond the node objects.

A pool (the Phalanx reading of a GPUPool spec) is a named set of nodes chosen by node selector
terms, with its own placement mode (CompactFirst bin-packs, LowLoadFirst spreads), GPU model
filter, TFLOPs oversubscription ratio and QoS priorities. A node belongs to the first pool whose
selector matches it. A pod joins a pool with the annotation `phalanx.io/gpu-pool` (or
TensorFusion's `tensor-fusion.ai/gpupool`); it then runs only on the pool's nodes and GPUs, and
its QoS (`phalanx.io/qos` / `tensor-fusion.ai/qos`) maps to the pool's priority for it.

`Hardware` is resolved once per configuration and consulted when a node object becomes the
solver's devices: TFLOPs capacity per device is the model's rating times the pool's ratio
(nodes outside every pool are not oversold), and dynamic-MIG nodes get their model's MIG table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from extender.config import GpuConfig, PoolConfig
from extender.eligibility import term_matches
from solver import MigTable, Node, PlacementMode, load_tables

POOL_ANNOTATIONS = ("phalanx.io/gpu-pool", "tensor-fusion.ai/gpupool")
QOS_ANNOTATIONS = ("phalanx.io/qos", "tensor-fusion.ai/qos")
NOT_IN_POOL = "node is not in GPU pool"
UNKNOWN_POOL = "GPU pool is not defined (gpu.pools in the Phalanx ConfigMap)"
NO_POOL_MODEL = "no GPU of the pool's models on this node"


def annotation(annotations: dict[str, str], keys: tuple[str, ...]) -> str:
    for key in keys:
        value = annotations.get(key, "").strip()
        if value:
            return value
    return ""


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    terms: tuple[dict[str, Any], ...]
    mode: PlacementMode
    model_filters: tuple[str, ...]  # lower-case substrings; () = every model
    oversell_percent: int
    qos_priority: dict[str, int] = field(hash=False)
    default_qos: str = "medium"

    @staticmethod
    def of(config: PoolConfig) -> Pool:
        spec = config.spec
        filters = tuple(m.lower() for f in spec.scheduling_config.placement.gpu_filters for m in f.params["models"])
        return Pool(
            name=config.name,
            terms=spec.node_manager_config.node_selector.node_selector_terms,
            mode=PlacementMode(spec.scheduling_config.placement.mode),
            model_filters=filters,
            oversell_percent=spec.capacity_config.oversubscription.tflops_oversell_ratio,
            qos_priority={d.name: d.priority for d in spec.qos_config.definitions},
            default_qos=spec.qos_config.default_qos,
        )

    def contains(self, name: str, labels: Mapping[str, str]) -> bool:
        return any(term_matches(name, labels, t) for t in self.terms)

    def allows_model(self, model: str) -> bool:
        return not self.model_filters or any(f in model.lower() for f in self.model_filters)

    def models(self, known: Iterable[str]) -> frozenset[str] | None:
        """The exact models of `known` this pool allows; None when it allows every model."""
        return None if not self.model_filters else frozenset(m for m in known if self.allows_model(m))

    def priority(self, qos: str) -> int:
        return self.qos_priority.get(qos or self.default_qos, self.qos_priority.get(self.default_qos, 0))


class Hardware:
    """Device ratings, pools and the dynamic-MIG marker from one configuration."""

    def __init__(self, config: GpuConfig) -> None:
        self.default_memory_mib = config.default_memory_mib
        self.models = tuple((m.match.lower(), round(m.tflops * 1000)) for m in config.models)
        self.pools = tuple(Pool.of(p) for p in config.pools)
        self.by_name = {p.name: p for p in self.pools}
        key, _, value = config.dynamic_mig_label.partition("=")
        self.dynamic_mig_label = (key, value)
        self.mig_tables = load_tables()
        self._key = (config.default_memory_mib, config.models, config.pools, config.dynamic_mig_label)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Hardware) and other._key == self._key

    def __hash__(self) -> int:
        return hash(self._key)

    def pool_of(self, name: str, labels: Mapping[str, str]) -> Pool | None:
        return next((p for p in self.pools if p.contains(name, labels)), None)

    def tflops(self, model: str, pool: Pool | None) -> int:
        """Milli-TFLOPs one device of `model` offers, oversubscription included; 0 if unrated."""
        lowered = model.lower()
        rating = next((t for match, t in self.models if match in lowered), 0)
        return rating * (pool.oversell_percent if pool is not None else 100) // 100

    def partition(self, model: str, labels: Mapping[str, str]) -> MigTable | None:
        """The MIG table Phalanx cuts this node's GPUs by, if the node is marked dynamic-MIG
        and its model has a table (config/mig-profiles.yaml)."""
        key, value = self.dynamic_mig_label
        return self.mig_tables.table_for(model) if labels.get(key) == value else None


def summary(pool: Pool | None, name: str, nodes: Iterable[Node]) -> dict[str, Any]:
    """Capacity of one pool (or of the nodes in no pool): physical and virtual TFLOPs, VRAM."""
    total_nodes = gpus = vram = vram_free = tflops = tflops_free = 0
    for node in nodes:
        total_nodes += 1
        for d in node.gpus:
            gpus += 1
            vram += d.memory_mib
            vram_free += d.free_memory_mib if not d.is_mig else 0
            tflops += d.tflops
            tflops_free += d.free_tflops
    ratio = (pool.oversell_percent if pool is not None else 100) / 100
    return {
        "name": name,
        "placementMode": pool.mode.value if pool is not None else None,
        "gpuModels": list(pool.model_filters) if pool is not None else [],
        "tflopsOversellRatio": round(ratio * 100),
        "qos": dict(pool.qos_priority) if pool is not None else {},
        "defaultQoS": pool.default_qos if pool is not None else None,
        "totalNodes": total_nodes,
        "totalGPUs": gpus,
        "totalTFlops": round(tflops / ratio / 1000, 3),
        "virtualTFlops": round(tflops / 1000, 3),
        "allocatedTFlops": round((tflops - tflops_free) / 1000, 3),
        "availableTFlops": round(tflops_free / 1000, 3),
        "totalVRAMMiB": vram,
        "allocatedVRAMMiB": vram - vram_free,
        "availableVRAMMiB": vram_free,
        "allocatedTFlopsPercent": round(100 * (tflops - tflops_free) / tflops, 2) if tflops else 0.0,
        "allocatedVRAMPercent": round(100 * (vram - vram_free) / vram, 2) if vram else 0.0,
    }
