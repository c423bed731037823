"""Prioritize's score band: fragmentation growth to scores, least growth highest."""

from __future__ import annotations

import math
import random

import pytest

from extender.scoring import (
    best,
    fragmentation_lead,
    fragmentation_scores,
    untiered_lead,
    untiered_scores,
    untiered_scores_by_name,
)
from extender.scoring import score_band as _band


@pytest.mark.parametrize(
    ("case", "values", "low", "high", "want"),
    [
        ("one value takes the top of the band", {0.5}, 5, 9, {0.5: 9}),
        ("equal growth everywhere: all top", {1.0}, 0, 4, {1.0: 4}),
        ("least growth highest, most lowest", {0.0, 1.0}, 5, 9, {0.0: 9, 1.0: 5}),
        ("linear between, rounded", {0.0, 0.5, 1.0}, 0, 4, {0.0: 4, 0.5: 2, 1.0: 0}),
        ("negative growth (a fragmentation drop) ranks first", {-1.0, 0.0, 3.0}, 0, 4, {-1.0: 4, 0.0: 3, 3.0: 0}),
    ],
)
def test_band(case: str, values: set[float], low: int, high: int, want: dict[float, int]) -> None:
    assert _band(values, low, high) == want, case


@pytest.mark.parametrize(
    ("case", "deltas", "tiers", "by_name", "want"),
    [
        ("least growth leads; shifted so the lowest is 0 and left out", {"a": 0.0, "b": 1.0}, {}, True, {"a": 5}),
        ("ties at the top break by name", {"b": 0.0, "a": 0.0, "c": 1.0}, {}, True, {"a": 5, "b": 4}),
        ("without the name tie-break every leader ties", {"b": 0.0, "a": 0.0, "c": 1.0}, {}, False, {"a": 5, "b": 5}),
        ("no node stands out: no scores", {"a": 0.5, "b": 0.5}, {}, False, {}),
        ("a better packing tier beats less growth", {"a": 0.0, "b": 2.0}, {"b": 2}, True, {"b": 6}),
        ("a node eating a reservation ranks below an equal one", {"a": 0.0, "b": 0.0}, {"a": -1}, True, {"b": 6}),
        ("no nodes", {}, {}, True, {}),
    ],
)
def test_fragmentation_scores(
    case: str, deltas: dict[str, float], tiers: dict[str, int], by_name: bool, want: dict[str, int]
) -> None:
    assert fragmentation_scores(deltas, tiers, by_name=by_name) == want, case


@pytest.mark.parametrize("seed", range(200))
def test_the_lead_is_the_one_node_scored_highest(seed: int) -> None:
    """filter's cut to one node takes `fragmentation_lead` without scoring the rest: it must be
    the node `fragmentation_scores` ranks first, ties and tiers included."""
    rnd = random.Random(seed)
    names = [f"n{i:02d}" for i in rnd.sample(range(60), rnd.randint(1, 40))]
    deltas = {n: float(rnd.choice([0, 0.5, 1, 2, 3])) for n in names}
    tiers = {n: rnd.choice([0, 1]) for n in names if rnd.random() < 0.5} if seed % 2 else {}
    scores = fragmentation_scores(deltas, tiers, by_name=True)
    assert best(names, scores, 1) == [fragmentation_lead(deltas, tiers)]


@pytest.mark.parametrize("seed", range(200))
def test_the_untiered_lead_is_the_least_growth_then_the_first_name(seed: int) -> None:
    """filter's cut to one node without packing tiers (and `fragmentation_lead` without tiers)
    reads each name's growth in a list, inf where it does not fit, repeats included (a client
    may send them): the least growth, then the first name, or none when none fits."""
    rnd = random.Random(seed)
    names = [f"n{rnd.randrange(60):02d}" for _ in range(rnd.randint(0, 40))]
    growth = {n: rnd.choice([0.0, 0.5, 1.0, 2.0, -1.0, math.inf]) for n in set(names)}
    values = [growth[n] for n in names]
    finite = [n for n, v in zip(names, values, strict=True) if v != math.inf]
    least = min((growth[n] for n in finite), default=math.inf)
    want = min((n for n in finite if growth[n] == least), default=None)  # by hand: least, then name
    assert untiered_lead(names, values) == want


@pytest.mark.parametrize("by_name", [False, True])
@pytest.mark.parametrize("seed", range(200))
def test_the_untiered_scores_are_fragmentation_scores(seed: int, by_name: bool) -> None:
    """prioritize without packing tiers scores from the list of each name's growth, repeats
    included: the same scores as `fragmentation_scores` of the map of the finite ones, in the
    same order (the reply's). Without `by_name` (a pod without GPUs) every node of the least
    growth gets 10; with it (a GPU pod, which filter left every node for its preferences) the
    one lead, ties to the first name."""
    rnd = random.Random(seed)
    names = [f"n{rnd.randrange(60):02d}" for _ in range(rnd.randint(0, 40))]
    growth = {n: rnd.choice([0.0, 0.25, 0.5, 1.0, 2.0, -1.0, math.inf]) for n in set(names)}
    values = [growth[n] for n in names]
    deltas = {n: v for n, v in zip(names, values, strict=True) if v != math.inf}
    want = fragmentation_scores(deltas, {}, by_name=by_name)
    got = untiered_scores_by_name(names, values) if by_name else untiered_scores(names, values)
    assert list(got.items()) == list(want.items())


@pytest.mark.parametrize(
    ("values", "want"),
    [
        ([0.0], {}),  # one node: nothing to tell apart
        ([0.0, 0.0], {"a": 1}),  # equals: the first name leads
        ([1.0, 0.0], {"b": 5}),  # the lead 10, the other 5: shifted, zeros left out
        ([math.inf, 2.0, 1.0], {"c": 5}),
        ([math.inf, math.inf], {}),
    ],
)
def test_the_untiered_scores_by_name_by_hand(values: list[float], want: dict[str, int]) -> None:
    assert untiered_scores_by_name(["a", "b", "c"][: len(values)], values) == want
