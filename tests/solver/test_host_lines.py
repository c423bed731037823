"""Host lines (solver.families.host_lines): the CP-SAT bound on hosts per unit is exact, i.e.
the least h meeting every line is the least number of nodes that hold y pods."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from solver.families import HostLine, host_lines

LINE_CASES = [
    pytest.param(
        [2, 4, 4, 1],
        [HostLine(4, 0, 0), HostLine(2, 2, 8), HostLine(1, 3, 10)],
        id="one line per distinct capacity, largest first, with the nodes above it and their total",
    ),
    pytest.param([3, 3, 3], [HostLine(3, 0, 0)], id="equal capacities give one line"),
    pytest.param([5], [HostLine(5, 0, 0)], id="one node gives one line through the origin"),
    pytest.param([], [], id="no nodes give no lines"),
]


@pytest.mark.parametrize(("caps", "expected"), LINE_CASES)
def test_host_lines(caps: list[int], expected: list[HostLine]) -> None:
    assert host_lines(caps) == expected


def least_hosts_by_lines(lines: list[HostLine], pods: int) -> int:
    """The least h >= 0 with cap * h >= pods - larger_total + cap * larger on every line."""
    need = [math.ceil((pods - line.larger_total + line.cap * line.larger) / line.cap) for line in lines]
    return max([0, *need])


def least_hosts_brute_force(caps: list[int], pods: int) -> int:
    """The fewest nodes whose capacities add up to at least `pods`, trying every subset."""
    for k in range(len(caps) + 1):
        if any(sum(chosen) >= pods for chosen in itertools.combinations(caps, k)):
            return k
    raise AssertionError("pods beyond the nodes' total")


@given(st.lists(st.integers(1, 6), min_size=1, max_size=6), st.data())
def test_host_lines_bound_is_the_brute_force_least_hosts(caps: list[int], data: st.DataObject) -> None:
    """For every pod count the nodes can hold, the lines give exactly the brute-force least hosts."""
    pods = data.draw(st.integers(0, sum(caps)))
    assert least_hosts_by_lines(host_lines(caps), pods) == least_hosts_brute_force(caps, pods)
