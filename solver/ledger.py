"""Capacity consumed during one solve, node by node, with all-or-nothing transactions.

Only nodes a plan touches get a mutable `NodeState`; every other node answers from the
capacities prepared from the snapshot. A gang is placed inside a transaction and rolled back
whole if any member does not fit, so a solve never leaves a gang half-placed.
"""

from __future__ import annotations

from solver.frag import WorkloadClass
from solver.model import ClusterSnapshot, DeviceAssignment, PodShape
from solver.preference import NodeState


class Ledger:
    def __init__(
        self, snapshot: ClusterSnapshot, *, spread: bool = False, workload: tuple[WorkloadClass, ...] = ()
    ) -> None:
        self.nodes = snapshot.nodes
        self.spread = spread
        self.workload = workload  # with it (and not spreading), devices go where fragmentation grows least
        self.states: dict[int, NodeState] = {}
        self._saved: dict[int, NodeState | None] | None = None

    def capacity(self, node: int, shape: PodShape, prepared: int) -> int:
        """Pods of `shape` that still fit; `prepared` is the snapshot-time answer."""
        state = self.states.get(node)
        return prepared if state is None else min(prepared, state.capacity(shape))

    def take(self, node: int, shape: PodShape) -> tuple[DeviceAssignment, ...] | None:
        state = self.states.get(node)
        if self._saved is not None and node not in self._saved:
            self._saved[node] = None if state is None else state.copy()
        if state is None:
            state = self.states[node] = NodeState(self.nodes[node])
        return state.take(shape, spread=self.spread, workload=self.workload)

    def apply(self, node: int, shape: PodShape, devices: tuple[DeviceAssignment, ...]) -> None:
        """Consume one pod of `shape` on exactly `devices` (outside transactions)."""
        state = self.states.get(node)
        if state is None:
            state = self.states[node] = NodeState(self.nodes[node])
        state.consume_exactly(shape, devices)

    def checkpoint(self) -> dict[int, NodeState]:
        """The touched nodes as they are now, for `restore` (transactions do not nest)."""
        return {n: s.copy() for n, s in self.states.items()}

    def restore(self, saved: dict[int, NodeState]) -> None:
        self.states = {n: s.copy() for n, s in saved.items()}

    def begin(self) -> None:
        self._saved = {}

    def commit(self) -> None:
        self._saved = None

    def rollback(self) -> None:
        assert self._saved is not None, "rollback outside a transaction"
        for node, saved in self._saved.items():
            if saved is None:
                self.states.pop(node, None)
            else:
                self.states[node] = saved
        self._saved = None
