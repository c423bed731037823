"""Lexicographic floors: the fewest domains of one level given the fewest of the level above.

Compactness is lexicographic from the coarsest counted level down (objective.py), so the
best plan uses the fewest blocks first and only then the fewest racks. The fewest racks
overall (`compact.fewest_to_hold` over every rack) may need more blocks than the fewest; the
fewest racks among plans that use the fewest blocks is the bound a lexicographic optimum meets.

`pair_floor` computes it exactly for capacities counted per domain: a knapsack over the
domains of the upper level, each contributing its largest children first,

    best[t][r] = most pods held by t upper domains using r of their children,

and returns the least r with best[k][r] >= need (k: the fewest upper domains), with the upper
domains that achieve it, so `compact` can place the gang there. Sizes are bounded by
`MAX_CELLS`; past it None is returned and callers use the per-level floors alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from solver.topology import TopologyIndex

MAX_CELLS = 2_000_000  # table cells x children tried: ~1 s of Python at most, ~10 ms typically


@dataclass(frozen=True, slots=True)
class PairFloor:
    """`upper` domains used at the least (`count`), then `lower` children at the least given
    that; `chosen`: upper domains of one placement that meets both."""

    count: int
    lower: int
    chosen: tuple[int, ...]


def pair_floor(topo: TopologyIndex, uppers: list[int], need: int, dcaps: dict[int, int]) -> PairFloor | None:
    """Fewest `uppers` holding `need`, then fewest of their children given that many."""
    held = [d for d in uppers if dcaps.get(d, 0) > 0]
    k = _fewest([dcaps[d] for d in held], need)
    if k is None or need <= 0:
        return None
    prefixes = [
        list(accumulate(sorted((dcaps.get(c, 0) for c in topo.domains[d].children), reverse=True))) for d in held
    ]
    width = sum(len(p) for p in prefixes)
    if (k + 1) * (width + 1) * max(1, width) > MAX_CELLS:
        return None
    tables = _knapsack(prefixes, k, width, need)
    last = tables[-1][k]
    lower = next((r for r in range(width + 1) if last[r] >= need), None)
    if lower is None:
        return None
    return PairFloor(k, lower, tuple(_backtrack(tables, prefixes, held, need, k, lower)))


def _fewest(caps: list[int], need: int) -> int | None:
    total = 0
    for k, c in enumerate(sorted(caps, reverse=True), start=1):
        total += c
        if total >= need:
            return k
    return None


def _knapsack(prefixes: list[list[int]], k: int, width: int, need: int) -> list[list[list[int]]]:
    """tables[i][t][r]: most pods (capped at need; -1 unreachable) from the first i uppers."""
    table = [[-1] * (width + 1) for _ in range(k + 1)]
    table[0][0] = 0
    tables = [table]
    for prefix in prefixes:
        new = [row[:] for row in table]
        for t in range(k):
            for r, held in enumerate(table[t]):
                if held < 0:
                    continue
                for j, cap in enumerate(prefix, start=1):
                    if r + j > width:
                        break
                    value = min(need, held + cap)
                    if value > new[t + 1][r + j]:
                        new[t + 1][r + j] = value
        tables.append(new)
        table = new
    return tables


def _backtrack(
    tables: list[list[list[int]]], prefixes: list[list[int]], held: list[int], need: int, t: int, r: int
) -> list[int]:
    """The upper domains of one best table entry, walking the tables back."""
    chosen: list[int] = []
    for i in range(len(prefixes), 0, -1):
        value, before = tables[i][t][r], tables[i - 1]
        if before[t][r] == value:
            continue  # reachable without the i-th upper domain
        prefix = prefixes[i - 1]
        j = next(
            j
            for j in range(1, min(len(prefix), r) + 1)
            if before[t - 1][r - j] >= 0 and min(need, before[t - 1][r - j] + prefix[j - 1]) == value
        )
        chosen.append(held[i - 1])
        t, r = t - 1, r - j
    return sorted(chosen)
