"""Placement behaviour of `solver.plan` on the drawn cluster (see builders.py) and small
purpose-built ones. Each case id says the behaviour it pins down."""

from __future__ import annotations

from collections import Counter

import pytest

from solver import (
    ClusterSnapshot,
    GangRequest,
    MigSlice,
    Outcome,
    PlacementMode,
    PlanResult,
    SolverParams,
    SolveStatus,
    plan,
)
from solver.explain import NO_ELIGIBLE_NODE, NOT_ENOUGH_CAPACITY, REQUIRED_TOPOLOGY, SLICE_MISMATCH, TAKEN_BY_OTHERS
from solver.model import GpuDemand, NodeName, PodShape, Resources
from solver.validate import validate
from tests.solver.builders import LEVELS, ClusterBuilder, drawn, gang, share, whole

ZONE, BLOCK, RACK, HOST = LEVELS


def solve(snapshot: ClusterSnapshot, *gangs: GangRequest, params: SolverParams | None = None) -> PlanResult:
    result = plan(snapshot, list(gangs), params=params or SolverParams())
    assert validate(snapshot, list(gangs), result) == []
    return result


def racks_of(result: PlanResult, name: str) -> Counter[str]:
    return Counter(a.node[:4] for a in result.gang(name).assignments)


def test_required_block_keeps_the_gang_in_one_block() -> None:
    result = solve(drawn(), gang("g", whole(8), 5, required=BLOCK))
    blocks = {a.node[:2] for a in result.gang("g").assignments}
    assert result.gang("g").outcome is Outcome.PLACED
    assert len(blocks) == 1


def test_required_block_with_preferred_rack_uses_the_fewest_racks() -> None:
    # 4 whole nodes fit in rack b0r0 alone; any other choice needs two racks.
    result = solve(drawn(), gang("g", whole(8), 4, required=BLOCK, preferred=RACK))
    assert racks_of(result, "g") == Counter({"b0r0": 4})
    assert result.status is SolveStatus.OPTIMAL
    assert result.objective == result.bound


def test_the_tightest_fit_is_not_always_the_most_compact() -> None:
    # Block b1 (3 whole nodes) is the tightest block for 3 pods but b0r0 holds them in one rack too;
    # with block required and rack preferred both are 1 rack / 3 hosts: either is optimal.
    result = solve(drawn(), gang("g", whole(8), 3, required=BLOCK, preferred=RACK))
    assert len(racks_of(result, "g")) == 1
    assert result.gang("g").domains_used[-1] == 3


def test_gang_too_large_for_any_rack_binds_nothing_and_says_why() -> None:
    result = solve(drawn(), gang("g", whole(8), 5, required=RACK))
    g = result.gang("g")
    assert g.outcome is Outcome.UNSCHEDULABLE and g.assignments == ()
    assert g.explanation == (f"{REQUIRED_TOPOLOGY}: needs 40 GPUs within one rack; the largest rack has 32 GPUs free")


def test_not_enough_capacity_anywhere_is_reported_with_totals() -> None:
    result = solve(drawn(), gang("g", whole(8), 10))
    assert result.gang("g").explanation.startswith(f"{NOT_ENOUGH_CAPACITY}: group 'worker' needs 80 GPUs")
    assert result.status is SolveStatus.INFEASIBLE


def test_slices_of_eight_ranks_each_stay_inside_one_rack() -> None:
    result = solve(drawn(), gang("g", whole(1), 24, required=BLOCK, slices=((RACK, 8),)))
    ordered = sorted(result.gang("g").assignments, key=lambda a: a.rank)
    for start in range(0, 24, 8):
        assert len({a.node[:4] for a in ordered[start : start + 8]}) == 1


def test_slice_size_that_does_not_divide_the_gang_is_unresolvable() -> None:
    result = solve(drawn(), gang("g", whole(1), 10, slices=((RACK, 4),)))
    assert result.gang("g").outcome is Outcome.UNRESOLVABLE
    assert result.gang("g").explanation.startswith(SLICE_MISMATCH)


def test_host_slices_put_a_multiple_of_k_pods_on_each_host() -> None:
    result = solve(drawn(), gang("g", whole(2), 8, slices=((HOST, 2),)))
    per_host = Counter(a.node for a in result.gang("g").assignments)
    assert all(n % 2 == 0 for n in per_host.values())


def test_ranks_are_contiguous_inside_racks() -> None:
    result = solve(drawn(), gang("g", whole(1), 40, preferred=RACK))
    ordered = [a.node[:4] for a in sorted(result.gang("g").assignments, key=lambda a: a.rank)]
    seen: list[str] = []
    for rack in ordered:
        if not seen or seen[-1] != rack:
            assert rack not in seen, "a rack's ranks are split"
            seen.append(rack)


def test_min_count_places_as_many_as_fit_but_at_least_the_quorum() -> None:
    result = solve(drawn(), gang("g", whole(8), 12, min_count=6))
    assert 6 <= len(result.gang("g").assignments) <= 12
    assert len(result.gang("g").assignments) == 9  # every whole node in the cluster


def test_quorum_that_cannot_be_met_places_nothing() -> None:
    result = solve(drawn(), gang("g", whole(8), 12, min_count=10))
    assert result.gang("g").assignments == ()
    assert result.gang("g").explanation.startswith(NOT_ENOUGH_CAPACITY + ": only 9 of 12 members fit")


def test_two_gangs_that_fit_alone_but_not_together_one_places_whole_and_the_other_none() -> None:
    a = gang("a", whole(8), 6)
    b = gang("b", whole(8), 6)
    result = solve(drawn(), a, b)
    counts = sorted(len(g.assignments) for g in result.gangs)
    assert counts == [0, 6]
    waiting = next(g for g in result.gangs if not g.assignments)
    assert waiting.explanation.startswith(TAKEN_BY_OTHERS)


def test_higher_priority_gang_wins_the_capacity() -> None:
    result = solve(drawn(), gang("low", whole(8), 6), gang("high", whole(8), 6, priority=10))
    assert len(result.gang("high").assignments) == 6
    assert result.gang("low").assignments == ()


def test_joint_solve_places_both_gangs_where_order_based_greedy_places_one() -> None:
    # Block b1 holds exactly 3 whole nodes; gang b may only use b1. Greedy puts a (first by name)
    # into the tighter b1 and loses b; the joint model places a in b0 and b in b1.
    snapshot = drawn()
    b1 = frozenset(NodeName(n.name) for n in snapshot.nodes if n.topology[1] == "b1")
    only_b1 = PodShape(Resources(1000, 1024, 1), GpuDemand.whole(8), allowed_nodes=b1)
    result = solve(snapshot, gang("a", whole(8), 3, required=BLOCK), gang("b", only_b1, 3, required=BLOCK))
    assert all(g.outcome is Outcome.PLACED for g in result.gangs)


def test_whole_gpus_never_land_on_a_shared_device() -> None:
    snapshot = ClusterBuilder().node("n0", ("z", "b", "r", "n0"), gpus=2, shares=[999, 1000]).build()
    result = solve(snapshot, gang("g", whole(1), 1))
    assert [d.index for d in result.gang("g").assignments[0].devices] == [1]
    assert solve(snapshot, gang("g", whole(2), 1)).gang("g").outcome is Outcome.UNSCHEDULABLE


def test_shares_fill_the_fullest_device_first_in_compact_first_mode() -> None:
    snapshot = ClusterBuilder().node("n0", ("z", "b", "r", "n0"), gpus=2, shares=[1000, 500]).build()
    result = solve(snapshot, gang("g", share(250), 2))
    assert [a.devices[0].index for a in result.gang("g").assignments] == [1, 1]


def test_shares_spread_over_idle_devices_in_low_load_first_mode() -> None:
    snapshot = ClusterBuilder().node("n0", ("z", "b", "r", "n0"), gpus=2, shares=[1000, 500]).build()
    params = SolverParams(placement_mode=PlacementMode.LOW_LOAD_FIRST)
    result = solve(snapshot, gang("g", share(250), 1), params=params)
    assert result.gang("g").assignments[0].devices[0].index == 0


def test_shares_never_exceed_one_device() -> None:
    snapshot = ClusterBuilder().node("n0", ("z", "b", "r", "n0"), gpus=1, shares=[1000]).build()
    assert solve(snapshot, gang("g", share(300), 3)).gang("g").outcome is Outcome.PLACED
    assert solve(snapshot, gang("g", share(300), 4)).gang("g").outcome is Outcome.UNSCHEDULABLE


def test_gpu_memory_requests_are_bounded_by_device_memory() -> None:
    snapshot = ClusterBuilder().node("n0", ("z", "b", "r", "n0"), gpus=1, shares=[1000]).build()
    assert solve(snapshot, gang("g", share(0, 40960), 2)).gang("g").outcome is Outcome.PLACED
    assert solve(snapshot, gang("g", share(0, 40960), 3)).gang("g").outcome is Outcome.UNSCHEDULABLE


def test_a_multi_device_share_takes_distinct_devices() -> None:
    snapshot = ClusterBuilder().node("n0", ("z", "b", "r", "n0"), gpus=2, shares=[1000, 1000]).build()
    result = solve(snapshot, gang("g", share(500, count=2), 2))
    for a in result.gang("g").assignments:
        assert sorted(d.index for d in a.devices) == [0, 1]
    assert solve(snapshot, gang("g", share(500, count=3), 1)).gang("g").outcome is not Outcome.PLACED


def test_mig_pods_consume_free_slices_of_their_profile_only() -> None:
    slices = (MigSlice("1g.10gb", 2), MigSlice("3g.40gb", 1))
    snapshot = ClusterBuilder().node("n0", ("z", "b", "r", "n0"), gpus=2, mig=[slices, slices]).build()
    mig = PodShape(Resources(100, 256, 1), GpuDemand.mig("1g.10gb"))
    result = solve(snapshot, gang("g", mig, 4))
    assert Counter(a.devices[0].index for a in result.gang("g").assignments) == Counter({0: 2, 1: 2})
    assert solve(snapshot, gang("g", mig, 5)).gang("g").outcome is Outcome.UNSCHEDULABLE
    assert solve(snapshot, gang("g", whole(1), 1)).gang("g").outcome is Outcome.UNSCHEDULABLE


def test_gpu_model_filter_restricts_devices() -> None:
    snapshot = ClusterBuilder().rack("b", "r0", [8], model="H100").rack("b", "r1", [8], model="A100").build()
    result = solve(snapshot, gang("g", whole(8, gpu_models=frozenset({"A100"})), 1))
    assert result.gang("g").assignments[0].node == "r1h0"


def test_ineligible_everywhere_is_unresolvable_with_reason() -> None:
    result = solve(drawn(), gang("g", whole(1, allowed_nodes=frozenset()), 1))
    assert result.gang("g").outcome is Outcome.UNRESOLVABLE
    assert result.gang("g").explanation.startswith(NO_ELIGIBLE_NODE)


def test_cordoned_nodes_are_not_used() -> None:
    snapshot = (
        ClusterBuilder().node("a", ("z", "b", "r", "a"), unschedulable=True).node("b", ("z", "b", "r", "b")).build()
    )
    assert solve(snapshot, gang("g", whole(8), 1)).gang("g").assignments[0].node == "b"


def test_required_host_puts_every_member_on_one_node() -> None:
    result = solve(drawn(), gang("g", whole(2), 4, required=HOST))
    assert len({a.node for a in result.gang("g").assignments}) == 1


def test_snapshot_without_levels_still_packs_hosts() -> None:
    b = ClusterBuilder(levels=())
    for i, free in enumerate([2, 8, 8, 3]):
        b.node(f"n{i}", (), free_gpus=free)
    result = solve(b.build(), gang("g", whole(1), 10))
    assert result.gang("g").domains_used == (2,)


def test_a_gang_of_a_leader_and_workers_places_both_groups() -> None:
    from solver import EqGroup, GangName

    leader = PodShape(Resources(4000, 8192, 1))
    request = GangRequest(
        GangName("job"),
        (EqGroup("leader", leader, 1), EqGroup("worker", whole(8), 4)),
        topology=gang("x", whole(1), 1, required=BLOCK, preferred=RACK).topology,
    )
    result = solve(drawn(), request)
    groups = Counter(a.group for a in result.gang("job").assignments)
    assert groups == Counter({"leader": 1, "worker": 4})
    assert [a.rank for a in result.gang("job").assignments] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("mode", list(PlacementMode))
def test_plans_are_deterministic(mode: PlacementMode) -> None:
    params = SolverParams(placement_mode=mode)
    gangs = [gang("a", whole(2), 6, preferred=RACK), gang("b", share(300), 5)]
    first = plan(drawn(), gangs, params=params)
    second = plan(drawn(), gangs, params=params)
    assert first.gangs == second.gangs
