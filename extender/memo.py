"""Per pod shape, what filter and prioritize learnt about each node, kept until it moves.

kube-scheduler sends a stream of pods, most of them alike, each with the same candidate
nodes. A `ShapeMemo` holds, for one pod shape, which nodes were checked, why the failing ones
fail, their scores and fragmentation deltas. It is synced from the cache's change log
(`Cache.changes_since`), so each call re-checks only the nodes touched since the last.

`catch_up` does that re-checking off the verbs' path, when pods change (a background thread of
the extender): after a burst of changes (a job's 2,000 pods deleted) the next filters would
otherwise rebuild and measure hundreds of nodes each (10-25 ms, measured: the p99 of a steady
stream that follows). It works in small batches, each under the memo's lock, so a verb waits
for one batch at most, and a node touched again meanwhile is dropped by the next sync as usual.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from extender.cache import Cache
from extender.pools import NOT_IN_POOL, Pool
from solver import (
    GpuKind,
    Node,
    PlacementMode,
    PodShape,
    WorkloadClass,
    fits,
    node_score,
    node_state,
    placement_delta,
    unfit_reason,
)

BATCH = 16  # nodes re-checked per hold of a memo's lock
# Between batches the catch-up sleeps: the GIL goes to a call waiting for it at once, rather than
# at the next switch interval of a pass that may take hundreds of ms after a mass deletion.
BATCH_PAUSE_S = 0.0005
MEASURED_STATES = 4096  # node states whose fragmentation growth a memo keeps (then starts over)


@dataclass
class ShapeMemo:
    """Per pod shape: which nodes were checked, why the failing ones fail, and scores. Synced
    from the cache's change log, so each call re-checks only nodes touched since the last."""

    epoch: int = -1
    cursor: int = 0
    checked: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)
    scores: dict[str, int] = field(default_factory=dict)
    deltas: dict[str, float] = field(default_factory=dict)  # fragmentation growth per node
    workload_generation: int = -1  # the target workload `deltas` were measured against
    shape: PodShape | None = None  # the pod shape it is for (the sweep re-measures `deltas`)
    pool: Pool | None = None  # the GPU pool its pods ask for, as last configured
    mode: PlacementMode = PlacementMode.COMPACT_FIRST  # its pods' placement mode (part of the memo's key)
    ranked: bool = False  # ranked by fragmentation `deltas` (catch_up measures them again)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # The growth per node state (`solver.node_state`), for the target workload it was
    # measured against: one tuple, read and replaced whole (the sweep measures without the lock).
    _measured: tuple[tuple[WorkloadClass, ...] | None, dict[object, float]] = field(
        default_factory=lambda: (None, {}), repr=False
    )

    def by_fragmentation(self, workload: tuple[WorkloadClass, ...]) -> bool:
        """Whether its pods are ranked by fragmentation growth against `workload` (`deltas`);
        otherwise a GPU shape is ranked by how full it leaves a node (`scores`, which do not
        depend on the workload), and a shape without GPUs is not ranked. With no workload (no
        pod placed anywhere, e.g. after a job's pods all left) every GPU shape has `scores`."""
        assert self.shape is not None
        if not workload or self.mode is not PlacementMode.COMPACT_FIRST:
            return False
        kind = self.shape.gpu.kind
        if kind is GpuKind.NONE:  # a pod without GPUs: only where it could strand some
            return any(c.uses_gpu for c in workload)
        return kind in (GpuKind.SHARE, GpuKind.WHOLE)

    def score(self, node: Node) -> int:
        """How full placing this memo's shape leaves `node` (`solver.node_score`, 0..8)."""
        assert self.shape is not None
        return node_score(node, self.shape, self.mode)

    def delta(self, node: Node, workload: tuple[WorkloadClass, ...]) -> float:
        """The fragmentation growth of placing this memo's shape on `node` (inf: it does not
        fit), measured once per node state and target workload. Most nodes of a cluster are in
        one of a few states (empty, k devices taken by pods alike), and each bound pod moves
        one node to a state some other node had: the measure (about 40 µs for an 8-GPU node)
        was taken for each node after each change, for each pod shape."""
        assert self.shape is not None
        against, table = self._measured
        if against is not workload:
            table = {}
            self._measured = (workload, table)
        key = node_state(node)
        delta = table.get(key)
        if delta is None:
            if len(table) >= MEASURED_STATES:
                table.clear()
            verdict = placement_delta(node, self.shape, workload)
            delta = table[key] = verdict.delta if verdict.fits else math.inf
        return delta

    def sync(self, cache: Cache) -> list[str] | None:
        """Forget what moved since the last sync; returns the nodes forgotten (None: all)."""
        changes = cache.changes_since(self.epoch, self.cursor)
        changed, self.epoch, self.cursor = changes.nodes, changes.epoch, changes.cursor
        if changed is None:
            self.checked.clear()
            self.failed.clear()
            self.scores.clear()
            self.deltas.clear()
            return None
        # Checked by filter, or only measured by prioritize (a pod without GPUs passes filter
        # untouched, and only its ranking uses the memo).
        forgotten = [n for n in changed if n in self.checked or n in self.deltas]
        for name in changed:
            self.checked.discard(name)
            self.failed.pop(name, None)
            self.scores.pop(name, None)
            self.deltas.pop(name, None)
        return forgotten

    def check(self, cache: Cache, name: str) -> bool:
        """Check one node in; False (nothing memoised) for a node the cache lacks."""
        node = cache.node_model(name)
        if node is None or self.shape is None:
            return False
        self.checked.add(name)
        if self.pool is not None and not self.pool.contains(name, node.labels):
            self.failed[name] = f"{NOT_IN_POOL} {self.pool.name}"
        elif not fits(node, self.shape):
            self.failed[name] = unfit_reason(node, self.shape)
        return True


def catch_up(memos: Sequence[ShapeMemo], cache: Cache, workload: tuple[WorkloadClass, ...], generation: int) -> int:
    """Check again the nodes each memo forgot since its last sync (fit, and what ranks it: the
    fragmentation delta of a ranked memo measured against `workload` of `generation`, or the
    score of a GPU shape ranked without one); the nodes re-checked."""
    done = 0
    for memo in memos:
        if memo.shape is None:
            continue
        measure = memo.ranked and memo.workload_generation == generation and memo.by_fragmentation(workload)
        score = memo.shape.gpu.kind is not GpuKind.NONE and not memo.by_fragmentation(workload)
        with memo.lock:
            forgotten = memo.sync(cache)
        for start in range(0, len(forgotten or ()), BATCH):
            if start:
                time.sleep(BATCH_PAUSE_S)
            with memo.lock:
                memo.sync(cache)  # touched again meanwhile: forgotten again, re-checked on a later round
                for name in (forgotten or [])[start : start + BATCH]:
                    if name in memo.checked or not memo.check(cache, name):
                        continue  # checked by a call meanwhile, or gone from the cache
                    done += 1
                    node = cache.node_model(name) if (measure or score) and name not in memo.failed else None
                    if node is not None and measure:
                        memo.deltas[name] = memo.delta(node, workload)
                    elif node is not None and score:
                        memo.scores[name] = memo.score(node)
    return done
