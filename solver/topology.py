"""The topology tree: domains per level, built once per snapshot.

Levels come from the snapshot, coarsest first. The host is always the last level: either the
snapshot's own last level (when its values are unique per node, e.g. kubernetes.io/hostname)
or an implicit one. "Units" are the domains just above hosts (racks, typically); the solver's
first phase counts pods per unit, the second picks nodes inside units.

      zone-a
     /      \\
  blk-1    blk-2        <- level 1
  /   \\      |
 r1   r2     r3         <- units (level 2)
 |..  |..    |..
 hosts                  <- host level
"""

from __future__ import annotations

from dataclasses import dataclass, field

from solver.model import ClusterSnapshot

HOST_LEVEL = "host"


@dataclass(slots=True)
class Domain:
    id: int
    level: int  # index into TopologyIndex.levels
    path: tuple[str, ...]
    parent: int  # -1 for a top-level domain
    children: list[int] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)  # node indices (units only)

    @property
    def label(self) -> str:
        return "/".join(self.path)


class TopologyIndex:
    """Domains of every level above hosts, with parent links, for one snapshot."""

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        levels = snapshot.levels
        n = len(levels)
        host_is_last = n > 0 and _unique_last(snapshot)
        self.above = n - 1 if host_is_last else n  # levels above the host
        self.levels: tuple[str, ...] = levels if host_is_last else (*levels, HOST_LEVEL)
        self.domains: list[Domain] = []
        self.by_path: dict[tuple[str, ...], int] = {}
        self.unit_of: list[int] = []  # node index -> unit domain id (-1 if no levels above)
        self.levels_of: dict[int, list[int]] = {i: [] for i in range(self.above)}
        # node index -> the coarsest level above hosts whose label the node lacks (an empty
        # value or a short path); `above` when it has them all. Such a node sits in an
        # empty-named domain of that level (see `problem.prepare` for who may use it).
        self.missing_from: list[int] = []
        for i, node in enumerate(snapshot.nodes):
            self.unit_of.append(self._insert(i, node.topology))
            self.missing_from.append(_first_missing(node.topology, self.above))

    def _insert(self, node_index: int, topology: tuple[str, ...]) -> int:
        if self.above == 0:
            return -1
        parent = -1
        path: tuple[str, ...] = ()
        for level in range(self.above):
            value = topology[level] if level < len(topology) else ""
            path = (*path, value)
            did = self.by_path.get(path)
            if did is None:
                did = len(self.domains)
                self.domains.append(Domain(did, level, path, parent))
                self.by_path[path] = did
                self.levels_of[level].append(did)
                if parent >= 0:
                    self.domains[parent].children.append(did)
            parent = did
        self.domains[parent].nodes.append(node_index)
        return parent

    @property
    def host_level(self) -> int:
        return len(self.levels) - 1

    def has_level(self, name: str) -> bool:
        return name in ("hostname", "kubernetes.io/hostname", HOST_LEVEL) or name in self.levels

    def level_of(self, name: str) -> int:
        if name in ("hostname", "kubernetes.io/hostname", HOST_LEVEL):
            return self.host_level
        try:
            return self.levels.index(name)
        except ValueError:
            raise ValueError(f"unknown topology level {name!r}; levels are {self.levels}") from None

    def units(self) -> list[int]:
        """Unit domain ids; [-1] (one unit holding every node) when there are no levels."""
        return self.levels_of[self.above - 1] if self.above else [-1]

    def unit_nodes(self, unit: int) -> list[int]:
        return self.domains[unit].nodes if unit >= 0 else list(range(len(self.unit_of)))

    def ancestor(self, domain: int, level: int) -> int:
        d = self.domains[domain]
        while d.level > level:
            d = self.domains[d.parent]
        return d.id

    def path_of_node(self, node_index: int) -> tuple[int, ...]:
        """Domain ids of a node per level above hosts, coarsest first."""
        unit = self.unit_of[node_index]
        if unit < 0:
            return ()
        out = [unit]
        while self.domains[out[-1]].parent >= 0:
            out.append(self.domains[out[-1]].parent)
        return tuple(reversed(out))


def _first_missing(path: tuple[str, ...], above: int) -> int:
    for level in range(above):
        if level >= len(path) or not path[level]:
            return level
    return above


def _unique_last(snapshot: ClusterSnapshot) -> bool:
    seen: set[str] = set()
    for node in snapshot.nodes:
        path = node.topology
        if len(path) < len(snapshot.levels) or not path[-1] or path[-1] in seen:
            return False
        seen.add(path[-1])
    return True
