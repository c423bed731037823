"""Placement primitives (solver.placement, solver.compact): node picking and the fewest domains
that hold a gang, as Kueue-style tables with one behaviour per case."""

from __future__ import annotations

import pytest

from solver.compact import fewest_to_hold
from solver.placement import NodePods, pick_nodes

# Node capacities are in pods of one group; node indices are the keys.
PICK_CASES = [
    pytest.param({0: 8, 1: 4, 2: 5}, 4, [NodePods(1, 4)], id="one node holds all; the tightest that does is taken"),
    pytest.param(
        {0: 3, 1: 5, 2: 2, 3: 4},
        7,
        [NodePods(1, 5), NodePods(2, 2)],
        id="too much for one node; the largest first, then the tightest that holds the rest",
    ),
    pytest.param(
        {0: 3, 1: 3, 2: 3},
        7,
        [NodePods(0, 3), NodePods(1, 3), NodePods(2, 1)],
        id="equal capacities are filled in node order",
    ),
    pytest.param(
        {3: 4, 1: 4, 2: 4},
        4,
        [NodePods(3, 4)],
        id="equal tightest nodes; the last in node order takes the rest",
    ),
    pytest.param({0: 2, 1: 1}, 4, None, id="the nodes cannot hold the pods; nothing is picked"),
    pytest.param({0: 2}, 0, [], id="no pods; no node"),
]


@pytest.mark.parametrize(("live", "need", "expected"), PICK_CASES)
def test_pick_nodes(live: dict[int, int], need: int, expected: list[NodePods] | None) -> None:
    assert pick_nodes(sorted(live), need, live) == expected


SINGLE_CASES = [
    pytest.param({0: 8, 1: 5, 2: 6}, 5, [NodePods(1, 5)], id="one node; the tightest that holds all"),
    pytest.param({2: 5, 1: 5}, 5, [NodePods(1, 5)], id="one node; equal tightest nodes go to the lower index"),
    pytest.param({0: 3, 1: 3}, 5, None, id="one node; none holds all, even if together they would"),
]


@pytest.mark.parametrize(("live", "need", "expected"), SINGLE_CASES)
def test_pick_one_node(live: dict[int, int], need: int, expected: list[NodePods] | None) -> None:
    assert pick_nodes(sorted(live), need, live, single=True) == expected


def test_pick_nodes_only_looks_at_the_nodes_it_is_given() -> None:
    """A node with capacity but outside the pool (another unit) is never picked."""
    assert pick_nodes([1], 2, {0: 9, 1: 2}) == [NodePods(1, 2)]


FEWEST_CASES = [
    pytest.param([1, 5, 3], 6, 2, id="largest capacities first; two domains hold six"),
    pytest.param([2, 7], 7, 1, id="one domain holds it all"),
    pytest.param([1, 2, 3], 6, 3, id="it takes every domain, exactly"),
    pytest.param([1, 2], 4, None, id="all domains together fall short"),
    pytest.param([], 1, None, id="no domain at all"),
    pytest.param([4], 0, 0, id="nothing to hold; no domain"),
]


@pytest.mark.parametrize(("caps", "need", "expected"), FEWEST_CASES)
def test_fewest_to_hold(caps: list[int], need: int, expected: int | None) -> None:
    assert fewest_to_hold(caps, need) == expected
