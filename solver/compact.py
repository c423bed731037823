"""Bound-guided placement: the CP-SAT hint, and the floors that prove a plan optimal.

`floors()` gives, per counted level, the fewest domains of that level any placement of the
gang can use (largest capacities first, in the best domain of the required level). They
are valid lower bounds for every gang, exact for single-group gangs at the coarsest
counted level.

`compact_gang()` places a gang level by level from the coarsest counted level: in each
candidate domain of the required level, take the largest domains of that level first and
the last one tightest-fit, then recurse into the next counted level inside each. It meets
the floor at the coarsest counted level by construction; when it meets every floor the
plan is optimal and needs no search (`plan()` says "proven by bound").
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.greedy import place_gang
from solver.ledger import Ledger
from solver.lexfloor import pair_floor
from solver.placement import Member, Selection, domain_caps, gang_order, live_caps, pick_nodes, take_selection
from solver.problem import GangProblem, Problem
from solver.topology import TopologyIndex


def fewest_to_hold(caps: list[int], need: int) -> int | None:
    """Least number of capacities (largest first) summing to `need`; None if all fall short."""
    if need <= 0:
        return 0
    total = 0
    for k, c in enumerate(sorted(caps, reverse=True), start=1):
        total += c
        if total >= need:
            return k
    return None


def scopes(topo: TopologyIndex, gp: GangProblem) -> list[list[int]]:
    """Root domains a whole placement must stay inside: each domain of the required level
    alone, or all top-level domains together ([-1] stands for a cluster without levels)."""
    if 0 <= gp.required_level < topo.above:
        return [[d] for d in topo.levels_of[gp.required_level]]
    return [topo.levels_of[0] if topo.above else [-1]]


def domains_at(topo: TopologyIndex, roots: list[int], level: int) -> list[int]:
    """Domains of `level` under `roots`; for the host level, units (their nodes follow)."""
    out: list[int] = []
    stack = list(reversed(roots))
    while stack:
        d = stack.pop()
        if d < 0:
            return [-1]
        dom = topo.domains[d]
        if dom.level == level:
            out.append(d)
        elif dom.level < level:
            stack.extend(reversed(dom.children))
    return out


def nodes_under(topo: TopologyIndex, roots: list[int]) -> list[int]:
    return [n for u in domains_at(topo, roots, topo.above - 1 if topo.above else 0) for n in topo.unit_nodes(u)]


@dataclass(frozen=True, slots=True)
class ScopeFloor:
    """The fewest domains per counted level (`least`: level -> count) that hold a gang's quorum
    inside one scope (`roots`); `least` is None when the scope cannot hold it at all."""

    roots: list[int]
    least: dict[int, int] | None


def scope_floors(topo: TopologyIndex, gp: GangProblem) -> list[ScopeFloor]:
    """Per scope, the fewest domains of each counted level that hold the gang's quorum
    (largest capacities first)."""
    need = gp.request.quorum
    node_caps: dict[int, int] = {}
    for group in gp.groups:
        for n, c in group.node_caps.items():
            node_caps[n] = node_caps.get(n, 0) + c
    totals = domain_caps(topo, gp, node_caps)
    out: list[ScopeFloor] = []
    for roots in scopes(topo, gp):
        here: dict[int, int] = {}
        for level in gp.counted_levels:
            if level == topo.host_level:
                caps = [node_caps[n] for n in nodes_under(topo, roots) if n in node_caps]
            else:
                caps = [totals.get(d, 0) for d in domains_at(topo, roots, level)]
            least = fewest_to_hold(caps, need)
            if least is None:
                break
            here[level] = least
        out.append(ScopeFloor(roots, here if len(here) == len(gp.counted_levels) else None))
    return out


def floors(topo: TopologyIndex, gp: GangProblem) -> dict[int, int] | None:
    """Per counted level, the fewest domains a lexicographically best placement of the gang
    uses: per level on its own, and for the second counted level the fewest given the
    fewest of the first (`lexfloor.pair_floor`)."""
    per_scope = [f for f in scope_floors(topo, gp) if f.least is not None]
    if not per_scope:
        return None
    least = {lv: min(f.least[lv] for f in per_scope if f.least) for lv in gp.counted_levels}
    upper = _upper_level(topo, gp)
    if upper is not None:
        # A best placement lies in a scope using the fewest upper domains; given that many,
        # it uses at least the fewest children any such scope allows.
        totals = domain_caps(topo, gp, _summed_caps(gp))
        tight = [f.roots for f in per_scope if f.least and f.least[upper] == least[upper]]
        pairs = [pair_floor(topo, domains_at(topo, roots, upper), gp.request.quorum, totals) for roots in tight]
        lowers = [p.lower for p in pairs if p is not None]
        if lowers and len(lowers) == len(pairs):
            least[upper + 1] = max(least[upper + 1], min(lowers))
    return least


def _upper_level(topo: TopologyIndex, gp: GangProblem) -> int | None:
    """The first counted level when the second one is above hosts too, else None."""
    levels = gp.counted_levels
    if len(levels) < 2 or levels[1] >= topo.above or levels[1] != levels[0] + 1:
        return None
    return levels[0]


def _summed_caps(gp: GangProblem) -> dict[int, int]:
    node_caps: dict[int, int] = {}
    for group in gp.groups:
        for n, c in group.node_caps.items():
            node_caps[n] = node_caps.get(n, 0) + c
    return node_caps


def compact_gang(topo: TopologyIndex, gp: GangProblem, ledger: Ledger) -> list[Member] | None:
    """Single-group gangs level by level (see module doc); others fall back to None."""
    if len(gp.groups) != 1 or gp.required_level == topo.host_level:
        return None
    caps = gp.groups[0]
    live = live_caps(caps, ledger)
    need = caps.count
    dcaps = domain_caps(topo, gp, live)
    best: tuple[tuple[int, ...], Selection] | None = None
    # Slice levels are walked too, so every slice lands whole inside one domain.
    levels = sorted({*gp.counted_levels, *(s.level for s in gp.slices), topo.host_level})
    slice_levels = {s.level for s in gp.slices}
    upper = _upper_level(topo, gp) if not gp.slices else None
    for roots in scopes(topo, gp):
        tries = [_cover(topo, levels, slice_levels, roots, 0, need, dcaps, live)]
        if upper is not None:
            # The upper domains whose children hold the gang in the fewest (lexfloor.py).
            pair = pair_floor(topo, domains_at(topo, roots, upper), need, dcaps)
            if pair is not None:
                depth = levels.index(upper + 1)
                tries.append(_cover(topo, levels, slice_levels, list(pair.chosen), depth, need, dcaps, live))
        for selection in tries:
            if selection is None:
                continue
            score = _counts(topo, gp, selection)
            if best is None or score < best[0]:
                best = (score, selection)
    if best is None:
        return None
    ledger.begin()
    members: list[Member] = []
    if not take_selection(ledger, caps, best[1], members):
        ledger.rollback()
        return None
    ledger.commit()
    return members


def _cover(
    topo: TopologyIndex,
    levels: list[int],
    slice_levels: set[int],
    roots: list[int],
    depth: int,
    need: int,
    dcaps: dict[int, int],
    live: dict[int, int],
) -> Selection | None:
    """`need` pods under `roots`, using as few domains of `levels[depth]` as possible, then
    descending into the chosen domains together: the next level picks its largest domains
    across all of them, which keeps this level's count and lowers the next one's. At a slice
    level each chosen domain gets its own (slice-aligned) amount instead, so every slice stays
    whole inside one domain."""
    level = levels[depth]
    if level == topo.host_level:
        return pick_nodes([n for n in nodes_under(topo, roots) if n in live], need, live)
    pool = sorted((d for d in domains_at(topo, roots, level) if dcaps.get(d, 0) > 0), key=lambda d: -dcaps[d])
    chosen: list[tuple[int, int]] = []  # (domain, amount)
    remaining = need
    while remaining > 0 and pool:
        if dcaps[pool[0]] >= remaining:
            j = len(pool) - 1
            while dcaps[pool[j]] < remaining:
                j -= 1
            chosen.append((pool.pop(j), remaining))
            remaining = 0
        else:
            d = pool.pop(0)
            chosen.append((d, dcaps[d]))
            remaining -= dcaps[d]
    if remaining > 0:
        return None
    if level not in slice_levels:
        return _cover(topo, levels, slice_levels, [d for d, _ in chosen], depth + 1, need, dcaps, live)
    out: Selection = []
    for d, amount in chosen:
        part = _cover(topo, levels, slice_levels, [d], depth + 1, amount, dcaps, live)
        if part is None:
            return None
        out.extend(part)
    return out


def _counts(topo: TopologyIndex, gp: GangProblem, selection: Selection) -> tuple[int, ...]:
    """Domains used per counted level, coarsest first (the lexicographic compactness)."""
    per_level: dict[int, set[int]] = {lv: set() for lv in gp.counted_levels}
    for pick in selection:
        path = topo.path_of_node(pick.node)
        for lv in gp.counted_levels:
            per_level[lv].add(pick.node if lv == topo.host_level else path[lv])
    return tuple(len(per_level[lv]) for lv in gp.counted_levels)


def compact(problem: Problem, ledger: Ledger) -> dict[int, list[Member]]:
    """Every gang by `compact_gang`, else by the greedy baseline, in priority order."""
    placed: dict[int, list[Member]] = {}
    for gp in gang_order(problem):
        members = compact_gang(problem.topo, gp, ledger) or place_gang(problem.topo, gp, ledger)
        if members is not None:
            placed[gp.index] = members
    return placed
