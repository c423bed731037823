"""Preferred nodes in gang placement (issue 15): `EqGroup.node_scores` from preferred node
affinity and node-pool order. A gang goes to its best-scored nodes while they hold it, then
the next tier, down to every node it may use; never less placement than without scores.

    block b0: rack b0r0 [8 8 8 8]   rack b0r1 [8 8 8 8]
    block b1: rack b1r0 [8 8 8 8]
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from solver import (
    ClusterSnapshot,
    EqGroup,
    GangName,
    GangRequest,
    NodeName,
    Outcome,
    PlanResult,
    ScoreBand,
    SolverParams,
    TopologyRequest,
    plan,
)
from solver.validate import validate
from tests.solver.builders import LEVELS, ClusterBuilder, whole

ZONE, BLOCK, RACK, HOST = LEVELS


def cluster() -> ClusterSnapshot:
    return ClusterBuilder().rack("b0", "b0r0", [8] * 4).rack("b0", "b0r1", [8] * 4).rack("b1", "b1r0", [8] * 4).build()


def scores(**racks: int) -> tuple[tuple[NodeName, int], ...]:
    return tuple((NodeName(f"{rack}h{i}"), s) for rack, s in racks.items() for i in range(4))


def gang(
    count: int, node_scores: tuple[tuple[NodeName, int], ...], *, gpus: int = 8, name: str = "g", **topo: str
) -> GangRequest:
    group = EqGroup("w", whole(gpus), count, node_scores=node_scores)
    return GangRequest(GangName(name), (group,), topology=TopologyRequest(**topo))


def solve(*gangs: GangRequest) -> PlanResult:
    snap = cluster()
    result = plan(snap, list(gangs), params=SolverParams())
    assert validate(snap, list(gangs), result) == []
    return result


def racks(result: PlanResult, name: str = "g") -> set[str]:
    return {a.node[:4] for a in result.gang(name).assignments}


@pytest.mark.parametrize(
    ("case", "request_", "want"),
    [
        ("the preferred rack, though any rack holds the gang", gang(2, scores(b0r1=100), preferred=RACK), {"b0r1"}),
        ("the other preferred rack", gang(2, scores(b1r0=100), preferred=RACK), {"b1r0"}),
        ("the better of two tiers", gang(2, scores(b0r0=30, b1r0=80), preferred=RACK), {"b1r0"}),
        (
            "the next tier when the best is too small",
            gang(6, scores(b0r0=30, b0r1=30, b1r0=80), required=BLOCK),
            {"b0r0", "b0r1"},
        ),
        ("every node when no tier holds it", gang(10, scores(b1r0=100)), {"b0r0", "b0r1", "b1r0"}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_gang_goes_to_its_best_tier_that_holds_it(case: str, request_: GangRequest, want: set[str]) -> None:
    result = solve(request_)
    assert result.gang("g").outcome is Outcome.PLACED, case
    assert racks(result) == want, case


def test_inside_the_tier_compactness_still_decides() -> None:
    """Two racks score equally: a 3-member gang preferring rack compactness takes one of them
    whole-heartedly, never both."""
    result = solve(gang(3, scores(b0r0=50, b1r0=50), preferred=RACK))
    assert len(racks(result)) == 1 and racks(result) <= {"b0r0", "b1r0"}


def test_a_preference_never_costs_another_gang_its_placement() -> None:
    """A higher-priority gang without preferences fills block b1; the preferring gang falls
    back from b1r0 to block b0 instead of failing."""
    other = GangRequest(
        GangName("other"), (EqGroup("w", whole(8), 4),), topology=TopologyRequest(required=BLOCK), priority=10
    )
    preferring = gang(2, scores(b1r0=100), name="pref", required=BLOCK)
    result = solve(other, preferring)
    assert result.gang("other").outcome is Outcome.PLACED and result.gang("pref").outcome is Outcome.PLACED
    assert not racks(result, "pref") & racks(result, "other")


# ---------------------------------------------------------------------------- given tiers (node pools)

POOL_A = ("b0r0h0", "b0r0h1")  # scores 90: too small for three 8-GPU members
POOL_B = ("b1r0h0", "b1r0h1", "b1r0h2", "b1r0h3")  # scores 50


def pooled(count: int, tiers: tuple[ScoreBand, ...]) -> GangRequest:
    node_scores = tuple((NodeName(n), 90) for n in POOL_A) + tuple((NodeName(n), 50) for n in POOL_B)
    group = EqGroup("w", whole(8), count, node_scores=node_scores, tiers=tiers)
    return GangRequest(GangName("g"), (group,))


def test_a_given_tier_is_a_band_so_a_gang_does_not_spill_across_pools() -> None:
    """Pool A (90) cannot hold three members: with the pools as bands the gang goes to pool B
    whole; with the scores alone (tier "50 and up") it may mix A and B."""
    banded = solve(pooled(3, (ScoreBand(90, 100), ScoreBand(50, 89))))
    assert {a.node for a in banded.gang("g").assignments} <= set(POOL_B)
    cumulative = solve(pooled(3, ()))
    assert {a.node for a in cumulative.gang("g").assignments} <= set(POOL_A + POOL_B)


def test_a_band_from_zero_takes_the_unscored_nodes() -> None:
    """The last pool of a node-pool list, the nodes in no pool, scores 0..w-1: a band from 0
    holds every node not scoring above it, scored or not."""
    result = solve(pooled(3, (ScoreBand(90, 100), ScoreBand(50, 89), ScoreBand(0, 49))))
    assert {a.node for a in result.gang("g").assignments} <= set(POOL_B)  # B holds it: not further
    full = solve(pooled(5, (ScoreBand(90, 100), ScoreBand(50, 89), ScoreBand(0, 49))))
    assert not {a.node for a in full.gang("g").assignments} & set(POOL_A + POOL_B)


def test_more_given_tiers_than_derived_ones_each_stay_a_tier() -> None:
    """Five one-node pools that cannot hold two members, then rack b1r0: the gang goes to the
    sixth tier, not to every node (which four derived tiers would have led to)."""
    singles = [f"b0r0h{i}" for i in range(4)] + ["b0r1h0"]
    node_scores = tuple((NodeName(n), 95 - 10 * i) for i, n in enumerate(singles))
    node_scores += tuple((NodeName(n), 40) for n in POOL_B)
    tiers = (*(ScoreBand(95 - 10 * i, 95 - 10 * i) for i in range(5)), ScoreBand(40, 40))
    group = EqGroup("w", whole(8), 2, node_scores=node_scores, tiers=tiers)
    result = solve(GangRequest(GangName("g"), (group,)))
    assert {a.node for a in result.gang("g").assignments} <= set(POOL_B)


def test_tiers_that_cannot_hold_the_gang_are_skipped_unplanned(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first tier is planned; of the four one-node tiers after it none could hold two
    members alone, so the next plan is on rack b1r0: two solves, not six."""
    plan_module = importlib.import_module("solver.plan")  # `solver.plan` is the function
    calls = []
    original = plan_module._plan

    def counting(*args: Any, **kwargs: Any) -> PlanResult:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(plan_module, "_plan", counting)
    test_more_given_tiers_than_derived_ones_each_stay_a_tier()
    assert len(calls) == 2
