"""Per pod shape, what filter and prioritize learnt about each node, kept until it moves.

kube-scheduler sends a stream of pods, most of them alike, each with the same candidate
nodes. A `ShapeMemo` holds, for one pod shape, which nodes were checked, why the failing ones
fail, their scores and fragmentation deltas. It is synced from the cache's change log
(`Cache.changes_since`), so each call re-checks only the nodes touched since the last.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from extender.cache import Cache
from solver import PodShape


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
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sync(self, cache: Cache) -> None:
        changes = cache.changes_since(self.epoch, self.cursor)
        changed, self.epoch, self.cursor = changes.nodes, changes.epoch, changes.cursor
        if changed is None:
            self.checked.clear()
            self.failed.clear()
            self.scores.clear()
            self.deltas.clear()
            return
        for name in changed:
            self.checked.discard(name)
            self.failed.pop(name, None)
            self.scores.pop(name, None)
            self.deltas.pop(name, None)
