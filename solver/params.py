"""Solver parameters, resolved from configuration at the edge (no feature flags inside)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from solver.frag import WorkloadClass


class PlacementMode(enum.Enum):
    """GPUPool placement mode: bin-pack partly used GPUs and nodes, or spread over idle ones."""

    COMPACT_FIRST = "CompactFirst"
    LOW_LOAD_FIRST = "LowLoadFirst"


class UnlabeledNodes(enum.Enum):
    """Where a node missing one of the topology labels may take members of a gang whose
    topology request (required, preferred or a slice) is at or below the missing level.

    EXCLUDE, as Kueue, KAI-Scheduler and kube-scheduler's topology plugins do: such a node
    is left out of that gang's placement (it still runs pods without a topology request and
    gangs whose levels are all above the missing one). EMPTY_DOMAIN: the missing value is
    one empty-named domain like any other, so unlabeled nodes may form a "rack" together.
    """

    EXCLUDE = "Exclude"
    EMPTY_DOMAIN = "EmptyDomain"


@dataclass(frozen=True, slots=True)
class SolverParams:
    # CP-SAT wall-clock limit per solve; past it the best feasible plan (or the greedy plan) is used.
    time_limit_s: float = 1.0
    # CP-SAT search workers; 2 matches the 2-core machines this runs on.
    workers: int = 2
    # Fixed seed: the same input gives the same plan.
    seed: int = 0
    placement_mode: PlacementMode = PlacementMode.COMPACT_FIRST
    # The target workload's pod classes (solver.frag): with CompactFirst, GPU devices for shares
    # and whole GPUs are chosen where the fragmentation measure grows least. Empty: best fit.
    workload: tuple[WorkloadClass, ...] = ()
    # Nodes missing a topology label: left out of topology-constrained gangs by default, as
    # the peers do (a node without a rack label is in no rack; see `UnlabeledNodes`).
    unlabeled_nodes: UnlabeledNodes = UnlabeledNodes.EXCLUDE
