"""Phalanx placement engine: pure Python + OR-Tools CP-SAT, no Kubernetes imports.

This module is the solver's public surface: the extender imports only the names below (an
import-linter contract in pyproject.toml enforces it), so the modules behind it can be split
and renamed without touching the Kubernetes side.

- `plan(snapshot, requests, params=...)`: one joint solve for gangs (CP-SAT, greedy fallback).
- The normalized model: `ClusterSnapshot`, `Node`, `GpuDevice`, `PodShape`, `GangRequest`, ...
- One pod against one node (the extender's hot path): `fits`, `unfit_reason`, `node_score`,
  and `NodeState` / `DeviceState` for device choice and accounting.
- Fragmentation (FGD and Phalanx's measure): `WorkloadClass`, `workload_classes`,
  `workload_drift`, `demand_of`, `placement_delta`, `node_state`.
- Share packing: `PackingPlan`, `Packer`.
- `validate_plan(snapshot, requests, result)`: the independent plan check (empty: valid).
- MIG profile tables: `MigTable` (its `MigProfile`s, cut slices `MigSlot`), `load_tables`.
- Queues and quotas: `QueueSpec`, `QueueTree`, `usage_of`, `rollup`, `limit_check`,
  `fair_shares`, `fair_share_check`, `borrowed` (vectors: `add`, `sub`, `format_amount`).
- Gang-aware preemption: `choose_victims` over `VictimUnit`s of `RunningPod`s -> `Preemption`;
  `free` / `freed` give a node / snapshot back its pods' capacity.
"""

from solver.admit import INVALID_REQUEST
from solver.capacity import DeviceState
from solver.fit import fits
from solver.frag import WorkloadClass, demand_of, node_state, placement_delta, workload_classes, workload_drift
from solver.mig import MigProfile, MigSlot, MigTable, load_tables
from solver.model import (
    FULL_SHARE,
    Assignment,
    ClusterSnapshot,
    DeviceAssignment,
    EqGroup,
    GangName,
    GangPlan,
    GangRequest,
    GpuDemand,
    GpuDevice,
    GpuKind,
    MigSlice,
    Node,
    NodeName,
    Outcome,
    PlanResult,
    PodShape,
    Resources,
    ScoreBand,
    Slice,
    SolveStatus,
    SubGroup,
    TopologyRequest,
)
from solver.packing import Packer, PackingPlan
from solver.params import PlacementMode, SolverParams, UnlabeledNodes
from solver.plan import plan
from solver.pools import ModelPool, PoolLedger, PoolPlan
from solver.preempt import Preemption, RunningPod, VictimUnit, choose_victims, free, freed
from solver.preference import NodeState
from solver.queues import (
    DEFAULT_QUEUE,
    GPU_RESOURCES,
    RESOURCES,
    QueueSpec,
    QueueTree,
    Vector,
    add,
    borrowed,
    fair_share_check,
    fair_shares,
    format_amount,
    limit_check,
    limit_excess,
    rollup,
    sub,
    usage_of,
)
from solver.single import reason as unfit_reason
from solver.single import score as node_score
from solver.validate import validate as validate_plan

__all__ = [
    "DEFAULT_QUEUE",
    "FULL_SHARE",
    "GPU_RESOURCES",
    "INVALID_REQUEST",
    "RESOURCES",
    "Assignment",
    "ClusterSnapshot",
    "DeviceAssignment",
    "DeviceState",
    "EqGroup",
    "GangName",
    "GangPlan",
    "GangRequest",
    "GpuDemand",
    "GpuDevice",
    "GpuKind",
    "MigProfile",
    "MigSlice",
    "MigSlot",
    "MigTable",
    "ModelPool",
    "Node",
    "NodeName",
    "NodeState",
    "Outcome",
    "Packer",
    "PackingPlan",
    "PlacementMode",
    "PlanResult",
    "PodShape",
    "PoolLedger",
    "PoolPlan",
    "Preemption",
    "QueueSpec",
    "QueueTree",
    "Resources",
    "RunningPod",
    "ScoreBand",
    "Slice",
    "SolveStatus",
    "SolverParams",
    "SubGroup",
    "TopologyRequest",
    "UnlabeledNodes",
    "Vector",
    "VictimUnit",
    "WorkloadClass",
    "add",
    "borrowed",
    "choose_victims",
    "demand_of",
    "fair_share_check",
    "fair_shares",
    "fits",
    "format_amount",
    "free",
    "freed",
    "limit_check",
    "limit_excess",
    "load_tables",
    "node_score",
    "node_state",
    "placement_delta",
    "plan",
    "rollup",
    "sub",
    "unfit_reason",
    "usage_of",
    "validate_plan",
    "workload_classes",
    "workload_drift",
]
