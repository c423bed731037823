"""Starvation holds: capacity held for a large gang that has waited too long.

A gang at the head of its queue (highest priority, then oldest) that has had quorum for
`queues.starvationSeconds` without a plan, and that preemption could not place either, gets a
hold: the nodes the solver would place it on if they were empty, preferring the nodes that are
freest now (so the hold fills soonest), for `queues.reservationSeconds`. While it lasts, what
frees on those nodes is kept for the gang: other pods and gangs are planned elsewhere. With
`queues.backfill`, pods of the same queue and lower priority may still use held capacity (they
are the first victims once the gang is planned, by the ordinary preemption path); without it,
held capacity stays idle. A hold ends when the gang is planned, leaves, or the time is up; the
gang may then get another.

Everything here runs under the gang manager's lock; the solve runs without it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import solver
from solver import (
    FULL_SHARE,
    ClusterSnapshot,
    GangRequest,
    GpuDevice,
    Node,
    NodeName,
    Outcome,
    Resources,
    SolverParams,
)


@dataclass(frozen=True, slots=True)
class Hold:
    gang: str
    queue: str
    priority: int
    nodes: frozenset[str]
    until: float  # monotonic


class Holds:
    def __init__(self) -> None:
        self.by_gang: dict[str, Hold] = {}

    def expire(self) -> list[Hold]:
        now = time.monotonic()
        ended = [h for h in self.by_gang.values() if h.until <= now]
        for hold in ended:
            del self.by_gang[hold.gang]
        return ended

    def blocked(self, *, gang: str, queue: str, priority: int, backfill: bool) -> frozenset[str]:
        """The nodes held against a pod or gang (none against the holder itself; with backfill,
        none against lower-priority work of the holder's queue)."""
        if not self.by_gang:
            return frozenset()
        out: set[str] = set()
        for hold in self.by_gang.values():
            if hold.gang == gang or (backfill and queue == hold.queue and priority < hold.priority):
                continue
            out |= hold.nodes
        return frozenset(out)

    def of_queue(self, queue: str) -> Hold | None:
        return next((h for h in self.by_gang.values() if h.queue == queue), None)


def fence(request: GangRequest, snapshot: ClusterSnapshot, blocked: frozenset[str]) -> GangRequest:
    """`request` kept off the blocked nodes (its groups' allowed nodes without them)."""
    if not blocked:
        return request
    every = frozenset(n.name for n in snapshot.nodes)
    groups = []
    for g in request.groups:
        allowed = g.shape.allowed_nodes if g.shape.allowed_nodes is not None else every
        groups.append(
            replace(g, shape=replace(g.shape, allowed_nodes=frozenset(NodeName(n) for n in allowed - blocked)))
        )
    return replace(request, groups=tuple(groups))


def choose(snapshot: ClusterSnapshot, request: GangRequest, params: SolverParams) -> frozenset[str] | None:
    """The nodes to hold: where the gang would go on the cluster emptied of running pods,
    preferring (node scores) the nodes with the most GPUs free now. None: it would not fit
    even on an empty cluster (nothing to hold for)."""
    scores = tuple((n.name, _freeness(n)) for n in snapshot.nodes if n.gpus)
    groups = tuple(replace(g, node_scores=scores, tiers=()) for g in request.groups)
    empty = replace(snapshot, nodes=tuple(_emptied(n) for n in snapshot.nodes))
    result = solver.plan(empty, [replace(request, groups=groups)], params=params)
    gang = result.gangs[0]
    if gang.outcome is not Outcome.PLACED:
        return None
    return frozenset(a.node for a in gang.assignments)


def _freeness(node: Node) -> int:
    return 100 * node.idle_gpus // max(1, len(node.gpus))


def _emptied(node: Node) -> Node:
    return replace(node, used=Resources(), gpus=tuple(_idle(d) for d in node.gpus))


def _idle(d: GpuDevice) -> GpuDevice:
    return replace(d, free_milli=FULL_SHARE, free_memory_mib=d.memory_mib, free_tflops=d.tflops, mig_layout=())
