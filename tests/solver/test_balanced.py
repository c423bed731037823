"""Balanced placement (issue 15, Kueue's BalancedPlacement): the fewest preferred-level
domains that hold the gang, members spread evenly over them.

    block b0: rack r0 [8 x 7 nodes]   rack r1 [8 x 7 nodes]   rack r2 [8 x 2 nodes]
"""

from __future__ import annotations

from collections import Counter

import pytest

from solver import (
    ClusterSnapshot,
    EqGroup,
    GangName,
    GangRequest,
    Outcome,
    PlanResult,
    SolverParams,
    TopologyRequest,
    plan,
)
from solver.admit import INVALID_REQUEST
from solver.validate import validate
from tests.solver.builders import LEVELS, ClusterBuilder, whole

ZONE, BLOCK, RACK, HOST = LEVELS


def cluster() -> ClusterSnapshot:
    return ClusterBuilder().rack("b0", "r0", [8] * 7).rack("b0", "r1", [8] * 7).rack("b0", "r2", [8] * 2).build()


def gang(count: int, *, balanced: bool, gpus: int = 8) -> GangRequest:
    topo = TopologyRequest(required=BLOCK, preferred=RACK, balanced=balanced)
    return GangRequest(GangName("g"), (EqGroup("w", whole(gpus), count),), topology=topo)


def solve(*gangs: GangRequest) -> PlanResult:
    snap = cluster()
    result = plan(snap, list(gangs), params=SolverParams())
    assert validate(snap, list(gangs), result) == []
    return result


def per_rack(result: PlanResult) -> list[int]:
    return sorted(Counter(a.node[:2] for a in result.gang("g").assignments).values())


@pytest.mark.parametrize(
    ("count", "compact", "even"),
    [(8, [1, 7], [4, 4]), (9, [2, 7], [4, 5]), (14, [7, 7], [7, 7]), (5, [5], [5])],
    ids=["8 over two racks", "9 over two racks", "already even", "one rack"],
)
def test_balanced_spreads_over_the_same_number_of_racks(count: int, compact: list[int], even: list[int]) -> None:
    assert per_rack(solve(gang(count, balanced=False))) == compact
    balanced = solve(gang(count, balanced=True))
    assert balanced.gang("g").outcome is Outcome.PLACED
    assert per_rack(balanced) == even


def test_balanced_keeps_the_compact_placement_when_the_even_split_does_not_fit() -> None:
    """Another gang holds 5 nodes of rack r1 first; 9 members then go 7 + 2, and an even 5 + 4
    cannot fit r1's 2 free nodes: the compact placement stays."""
    other = GangRequest(
        GangName("other"),
        (EqGroup("w", whole(8), 5, node_scores=tuple((f"r1h{i}", 100) for i in range(5))),),  # type: ignore[misc]
        priority=10,
    )
    result = solve(other, gang(9, balanced=True))
    assert result.gang("g").outcome is Outcome.PLACED and sum(per_rack(result)) == 9


def test_balanced_without_a_preferred_level_is_the_gangs_own_error() -> None:
    bad = GangRequest(GangName("g"), (EqGroup("w", whole(8), 2),), topology=TopologyRequest(balanced=True))
    result = solve(bad)
    assert (
        INVALID_REQUEST in result.gang("g").explanation
        and "balanced needs topology.preferred" in result.gang("g").explanation
    )
