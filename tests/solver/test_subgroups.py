"""Sub-groups (issue 15): per-group topology and per-group minimums inside one gang, as
KAI-Scheduler's sub-groups and kube-scheduler's CompositePodGroup express them.

    block b0: rack b0r0 [8 8 8 8]   rack b0r1 [8 8 0 0]
    block b1: rack b1r0 [8 8 8 0]   rack b1r1 [8 8 8 8]

Whole-node members (8 GPUs) unless a case says otherwise; each case id says the rule.
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
    PodShape,
    Slice,
    SolverParams,
    SubGroup,
    TopologyRequest,
    plan,
)
from solver.admit import INVALID_REQUEST
from solver.validate import validate
from tests.solver.builders import LEVELS, ClusterBuilder, whole

ZONE, BLOCK, RACK, HOST = LEVELS
NODE = whole(8)


def cluster() -> ClusterSnapshot:
    b = ClusterBuilder()
    for block, racks in {
        "b0": {"b0r0": [8, 8, 8, 8], "b0r1": [8, 8, 0, 0]},
        "b1": {"b1r0": [8, 8, 8, 0], "b1r1": [8] * 4},
    }.items():
        for rack, free in racks.items():
            b.rack(block, rack, free)
    return b.build()


def solve(*gangs: GangRequest, snapshot: ClusterSnapshot | None = None) -> PlanResult:
    snap = snapshot or cluster()
    result = plan(snap, list(gangs), params=SolverParams())
    assert validate(snap, list(gangs), result) == []
    return result


def racks(result: PlanResult, gang: str, *groups: str) -> Counter[str]:
    """Members per rack of the named groups (rack = node name's prefix)."""
    return Counter(a.node[:4] for a in result.gang(gang).assignments if not groups or a.group in groups)


def request(
    groups: list[tuple[str, int]],
    subs: list[SubGroup],
    *,
    required: str = "",
    preferred: str = "",
    min_count: int = 0,
    min_subgroups: int = 0,
    shape: PodShape = NODE,
) -> GangRequest:
    eqs = tuple(EqGroup(name, shape, count) for name, count in groups)
    topo = TopologyRequest(required=required, preferred=preferred)
    return GangRequest(GangName("job"), eqs, min_count, topo, subgroups=tuple(subs), min_subgroups=min_subgroups)


def test_leader_in_one_rack_workers_in_one_block() -> None:
    """The gang needs one block; its leader sub-group (2) one rack; its workers (4) anywhere in
    that block. Leaders in rack b0r1 (2 free) and workers in b0r0, or in b1: all in one block,
    the leaders in one rack."""
    job = request(
        [("leader", 2), ("workers", 4)],
        [SubGroup("lead", ("leader",), 0, TopologyRequest(required=RACK)), SubGroup("work", ("workers",), 0)],
        required=BLOCK,
    )
    result = solve(job)
    assert result.gang("job").outcome is Outcome.PLACED
    leader = racks(result, "job", "leader")
    assert len(leader) == 1 and sum(leader.values()) == 2
    assert len({a.node[:2] for a in result.gang("job").assignments}) == 1  # one block


def test_each_replica_in_its_own_rack() -> None:
    """Three replica sub-groups of 3 members, each required in one rack: racks hold 4, 2, 3 and
    4 nodes, so each replica takes a rack with at least 3 free (b0r0, b1r0, b1r1), never b0r1."""
    subs = [SubGroup(f"r{i}", (f"g{i}",), 0, TopologyRequest(required=RACK)) for i in range(3)]
    job = request([(f"g{i}", 3) for i in range(3)], subs)
    result = solve(job)
    assert result.gang("job").outcome is Outcome.PLACED
    for i in range(3):
        where = racks(result, "job", f"g{i}")
        assert len(where) == 1 and sum(where.values()) == 3, where
    assert "b0r1" not in racks(result, "job")


def test_a_sub_group_that_cannot_fit_fails_the_gang_unless_the_sub_group_quorum_allows() -> None:
    """A sub-group of 5 required in one rack fits no rack (4 at most): with every sub-group
    required the gang is not placed; with 2 of 3 required it is placed without that one."""
    subs = [
        SubGroup("a", ("a",), 0, TopologyRequest(required=RACK)),
        SubGroup("b", ("b",), 0, TopologyRequest(required=RACK)),
        SubGroup("big", ("big",), 0, TopologyRequest(required=RACK)),
    ]
    groups = [("a", 2), ("b", 2), ("big", 5)]
    every = solve(request(groups, subs, min_count=4))
    assert every.gang("job").outcome is not Outcome.PLACED
    two = solve(request(groups, subs, min_count=4, min_subgroups=2))
    assert two.gang("job").outcome is Outcome.PLACED
    assert {a.group for a in two.gang("job").assignments} == {"a", "b"}


def test_a_sub_group_minimum_places_it_whole_or_not_at_all() -> None:
    """Workers (8) need at least 6 together in one rack; racks hold at most 4: no placement of
    6 exists, so the gang is not placed even though its own minimum (2) could be met."""
    subs = [SubGroup("w", ("workers",), 6, TopologyRequest(required=RACK))]
    result = solve(request([("workers", 8)], subs, min_count=2))
    assert result.gang("job").outcome is not Outcome.PLACED
    lower = solve(
        request([("workers", 8)], [SubGroup("w", ("workers",), 3, TopologyRequest(required=RACK))], min_count=2)
    )
    assert lower.gang("job").outcome is Outcome.PLACED
    assert sum(racks(lower, "job").values()) in (3, 4) and len(racks(lower, "job")) == 1


@pytest.mark.parametrize("reverse", [False, True], ids=["as listed", "reversed"])
def test_the_order_of_sub_groups_never_decides_feasibility(reverse: bool) -> None:
    """Small first would take the 4-node rack b0r0 for the 2-member sub-group and leave the
    4-member one nowhere in block b0; the search finds the placement in either order."""
    snap = ClusterBuilder().rack("b0", "b0r0", [8, 8, 8, 8]).rack("b0", "b0r1", [8, 8, 0, 0]).build()
    subs = [
        SubGroup("small", ("s",), 0, TopologyRequest(required=RACK)),
        SubGroup("large", ("l",), 0, TopologyRequest(required=RACK)),
    ]
    groups = [("s", 2), ("l", 4)]
    if reverse:
        subs, groups = subs[::-1], groups[::-1]
    result = solve(request(groups, subs, required=BLOCK), snapshot=snap)
    assert result.gang("job").outcome is Outcome.PLACED
    assert racks(result, "job", "l") == Counter({"b0r0": 4}) and racks(result, "job", "s") == Counter({"b0r1": 2})


def test_slices_on_the_workers_only() -> None:
    """Workers in rack slices of 2, the leader unsliced: every pair of
    consecutive workers shares a rack; the leader goes anywhere in the block."""
    subs = [
        SubGroup("lead", ("leader",)),
        SubGroup("work", ("workers",), 0, TopologyRequest(slices=(Slice(RACK, 2),))),
    ]
    result = solve(request([("leader", 1), ("workers", 6)], subs, required=BLOCK))
    assert result.gang("job").outcome is Outcome.PLACED
    workers = sorted((a for a in result.gang("job").assignments if a.group == "workers"), key=lambda a: a.rank)
    for i in range(0, 6, 2):
        assert workers[i].node[:4] == workers[i + 1].node[:4]


@pytest.mark.parametrize(
    ("subs", "min_subgroups", "fragment"),
    [
        ([SubGroup("x", ("nope",))], 0, "names group 'nope'"),
        ([SubGroup("x", ("a",)), SubGroup("y", ("a",))], 0, "group 'a' is in sub-groups 'x' and 'y'"),
        ([SubGroup("x", ("a",), 3)], 0, "minCount 3, outside 0..2"),
        ([SubGroup("x", ("a",))], 2, "minSubGroups 2 is outside 0..1"),
        ([SubGroup("x", ("a",), 0, TopologyRequest(required="zonee"))], 0, "'zonee' is not a topology level"),
        ([SubGroup("x", ("a",), 0, TopologyRequest(required=ZONE))], 0, "coarser than the gang's 'block'"),
    ],
    ids=["unknown group", "group twice", "minimum above members", "too many sub-groups", "unknown level", "coarser"],
)
def test_invalid_sub_groups_are_the_gangs_own_error(subs: list[SubGroup], min_subgroups: int, fragment: str) -> None:
    bad = request([("a", 2), ("b", 1)], subs, required=BLOCK, min_subgroups=min_subgroups)
    good = GangRequest(GangName("other"), (EqGroup("w", NODE, 1),))
    result = solve(bad, good)
    assert result.gang("job").outcome is Outcome.UNRESOLVABLE
    assert INVALID_REQUEST in result.gang("job").explanation and fragment in result.gang("job").explanation
    assert result.gang("other").outcome is Outcome.PLACED


def test_sub_grouped_and_plain_gangs_share_the_cluster_without_double_booking() -> None:
    """A plain gang takes its nodes first; the sub-grouped gang is placed on what is left."""
    plain = GangRequest(GangName("plain"), (EqGroup("w", NODE, 7),), topology=TopologyRequest(required=BLOCK))
    subs = [SubGroup("a", ("a",), 0, TopologyRequest(required=RACK))]
    job = request([("a", 3), ("b", 2)], subs, required=BLOCK)
    result = solve(plain, job)
    assert result.gang("plain").outcome is Outcome.PLACED and result.gang("job").outcome is Outcome.PLACED
    nodes = [a.node for g in ("plain", "job") for a in result.gang(g).assignments]
    assert len(nodes) == len(set(nodes))


def test_the_explanation_names_the_sub_group_that_cannot_fit() -> None:
    subs = [
        SubGroup("a", ("a",), 0, TopologyRequest(required=RACK)),
        SubGroup("big", ("big",), 0, TopologyRequest(required=RACK)),
    ]
    result = solve(request([("a", 2), ("big", 5)], subs))
    why = result.gang("job").explanation
    assert why.startswith("sub-group 'big': required topology does not fit: needs 40 GPUs within one rack"), why


def test_the_explanation_says_when_sub_groups_fit_alone_but_not_together() -> None:
    """Two sub-groups of 4 each need a rack of their own inside one block: b0 has racks of 4
    and 2 free nodes, b1 of 3 and 4; each fits alone, never both in one block."""
    subs = [
        SubGroup("a", ("a",), 0, TopologyRequest(required=RACK)),
        SubGroup("b", ("b",), 0, TopologyRequest(required=RACK)),
    ]
    result = solve(request([("a", 4), ("b", 4)], subs, required=BLOCK))
    assert result.gang("job").outcome is Outcome.UNSCHEDULABLE
    assert result.gang("job").explanation == (
        "sub-groups do not fit together: each needed sub-group fits alone, "
        "but not all of them within one block together"
    )
