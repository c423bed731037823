"""Prioritize's ranking by fragmentation: growth per node to extender scores (pure).

FGD-style: the node where the target workload's fragmentation grows least scores 10, ties
broken by node name (a fixed order packs; kube-scheduler's random tie-break among equal
scores would scatter pods, which costs several points of allocation); the others scale down
with their growth. With a packing plan, nodes rank by tier first (extender/sharing.py): the
best tier's nodes take 5..9, the rest 0..4. Without `by_name`, every node equal to the best
gets 10, and when no node stands out there are no scores at all.

Replies are shifted so the lowest score is 0 and zeros are left out: the scheduler adds
nothing for a missing host, and a shift common to all hosts keeps their order, so the reply
stays small when most nodes look alike.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from itertools import compress, islice, repeat
from operator import eq


def fragmentation_scores(deltas: dict[str, float], tiers: dict[str, int], *, by_name: bool) -> dict[str, int]:
    """Host -> score (0 left out) for the nodes of `deltas` (fragmentation growth, finite)."""
    if not deltas:
        return {}
    tier = tiers.get
    lead = fragmentation_lead(deltas, tiers)
    top, first = tier(lead, 0), deltas[lead]
    if by_name:
        leaders = [lead]
    else:
        leaders = [n for n, d in deltas.items() if d == first and tier(n, 0) == top]
        if len(leaders) == len(deltas):
            return {}
    if tiers:
        upper = {n: d for n, d in deltas.items() if tier(n, 0) == top}
        lower = {n: d for n, d in deltas.items() if tier(n, 0) != top}
    else:
        upper, lower = deltas, {}
    scores: dict[str, int] = {}
    for (low, high), members in (((5, 9), upper), ((0, 4), lower)):
        if members:
            band = score_band(set(members.values()), low, high)  # few distinct deltas: score each once
            scores.update({n: band[d] for n, d in members.items()})
    for n in leaders:
        scores[n] = 10
    floor = min(scores.values())
    return {n: v - floor for n, v in scores.items() if v > floor}


def fragmentation_lead(deltas: dict[str, float], tiers: dict[str, int]) -> str:
    """The node `fragmentation_scores` gives its one 10 with `by_name` (`deltas` not empty):
    the best tier, then the least growth, then the first name. O(n), no sort."""
    if tiers:
        tier = tiers.get
        return min(deltas, key=lambda n: (-tier(n, 0), deltas[n], n))
    lead = untiered_lead(deltas, deltas.values())  # the common case (no packing preference here)
    assert lead is not None  # `deltas`: finite growth, not empty
    return lead


def untiered_lead(names: Iterable[str], values: Collection[float]) -> str | None:
    """The node `fragmentation_lead` picks without tiers, from each name's growth (`values`, one
    per name, inf where it does not fit) instead of a map of the finite ones: the least growth,
    then the first name; None when no node fits. A filter's cut to one node, in two C-speed
    passes over the names."""
    least = min(values, default=math.inf)
    if least == math.inf:
        return None
    return min(compress(names, map(eq, repeat(least), values)))


def untiered_scores(names: list[str], values: list[float]) -> dict[str, int]:
    """`fragmentation_scores(deltas, {}, by_name=False)` from each name's growth (`values`, one
    per name, inf where it does not fit) instead of a map of the finite ones, the same scores
    in the same order: a prioritize of a pod without GPUs in C-speed passes over the names,
    with Python's work only per distinct growth (a few node states)."""
    finite = set(values)
    finite.discard(math.inf)
    if len(finite) <= 1:
        return {}  # no node stands out (or none fits)
    band = score_band(finite, 5, 9)
    band[min(finite)] = 10  # the leaders: every node of the least growth
    floor = min(band.values())
    shifted = {d: b - floor for d, b in band.items() if b > floor}
    scored = list(map(shifted.__contains__, values))
    return dict(zip(compress(names, scored), map(shifted.__getitem__, compress(values, scored)), strict=True))


def untiered_scores_by_name(names: list[str], values: list[float]) -> dict[str, int]:
    """`fragmentation_scores(deltas, {}, by_name=True)` from each name's growth (`values`, one
    per name, inf where it does not fit), the same scores in the same order: a prioritize of a
    GPU pod (one that states preferences, so filter kept every node) in C-speed passes over the
    names, with Python's work per distinct growth. The lead (least growth, then first name)
    gets 10, every other node its growth's band 5..9, all shifted so the lowest is 0."""
    lead = untiered_lead(names, values)
    if lead is None:
        return {}
    finite = set(values)
    finite.discard(math.inf)
    least = min(finite)
    band = score_band(finite, 5, 9)
    shared = len(set(compress(names, map(eq, repeat(least), values)))) > 1  # another node grows as little
    floor = min([b for d, b in band.items() if d != least or shared], default=10)
    shifted = {d: b - floor for d, b in band.items() if b > floor}
    scored = list(map(shifted.__contains__, values))
    scores = dict(zip(compress(names, scored), map(shifted.__getitem__, compress(values, scored)), strict=True))
    if floor < 10:
        scores[lead] = 10 - floor
    return scores


def score_band(values: set[float], low: int, high: int) -> dict[float, int]:
    """Scores low..high for fragmentation deltas, the least growth highest, linear between."""
    best, worst = min(values), max(values)
    span = worst - best
    if span <= 0:
        return {d: high for d in values}
    return {d: low + round((high - low) * (1 - (d - best) / span)) for d in values}


# ------------------------------------------------------------------ sampling the candidates

MIN_SAMPLE = 100  # kube-scheduler's minFeasibleNodesToFind
MIN_SAMPLE_PERCENT = 5  # its minFeasibleNodesPercentageToFind


def sample_size(nodes: int) -> int:
    """How many feasible nodes kube-scheduler scores by default (numFeasibleNodesToFind with
    percentageOfNodesToScore unset): all below 100 nodes, else 50 % less 1 % per 125 nodes,
    at least 5 % and at least 100 (420 of 1,000 nodes, 500 of 5,000)."""
    if nodes < MIN_SAMPLE:
        return nodes
    percent = max(50 - nodes // 125, MIN_SAMPLE_PERCENT)
    return max(nodes * percent // 100, MIN_SAMPLE)


def best(names: list[str], scores: dict[str, int], k: int) -> list[str]:
    """The k names of highest score (`scores` holds the positive ones, a subset of `names`;
    the rest count as 0), equals taken in the order of `names`, which the result keeps.
    Passes over `scores` and `names` with set lookups only: 5,000 names in about 1 ms."""
    if len(names) <= k:
        return names
    buckets: dict[int, list[str]] = {}
    for n, s in scores.items():
        buckets.setdefault(s, []).append(n)
    keep: set[str] = set()
    for value in sorted(buckets, reverse=True):
        bucket = buckets[value]
        if len(keep) + len(bucket) > k:  # a tie at the cut: its first in the order of names
            ties = set(bucket)
            keep.update(islice((n for n in names if n in ties), k - len(keep)))
            break
        keep.update(bucket)
    else:  # every scored node kept: then the first unscored ones
        keep.update(islice((n for n in names if n not in scores), k - len(keep)))
    if len(keep) == 1:  # filter's cut to one node: no pass over the names for its order
        (only,) = keep
        return [only] if only in names else []
    return [n for n in names if n in keep]
