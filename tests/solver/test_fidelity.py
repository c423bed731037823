"""Placement fidelity with the peers (issue 15, correctness): unlabeled nodes, multi-group
gangs, whole-gang explanations, invalid requests, lexicographic preferred topology.

Purpose-built clusters, drawn where they are used; levels are those of builders.LEVELS
(zone > block > rack > host). Each case id says the behaviour it pins down.
"""

from __future__ import annotations

import pytest

from solver import (
    ClusterSnapshot,
    EqGroup,
    GangName,
    GangRequest,
    Outcome,
    PlanResult,
    PodShape,
    Resources,
    Slice,
    SolverParams,
    TopologyRequest,
    UnlabeledNodes,
    plan,
)
from solver.admit import INVALID_REQUEST
from solver.explain import (
    GROUPS_DO_NOT_FIT_TOGETHER,
    MISSING_TOPOLOGY_LABEL,
    NOT_ENOUGH_CAPACITY,
    REQUIRED_TOPOLOGY,
    TAKEN_BY_OTHERS,
)
from solver.greedy import place_gang
from solver.ledger import Ledger
from solver.problem import prepare
from solver.topology import TopologyIndex
from solver.validate import validate
from tests.solver.builders import LEVELS, ClusterBuilder, gang, whole

ZONE, BLOCK, RACK, HOST = LEVELS


def solve(snapshot: ClusterSnapshot, *gangs: GangRequest, params: SolverParams | None = None) -> PlanResult:
    result = plan(snapshot, list(gangs), params=params or SolverParams())
    assert validate(snapshot, list(gangs), result) == []
    return result


def nodes_of(result: PlanResult, name: str) -> list[str]:
    return sorted(a.node for a in result.gang(name).assignments)


def cpu(milli: int) -> PodShape:
    return PodShape(Resources(milli, 1024, 1))


def job(*groups: tuple[str, PodShape, int], required: str = "") -> GangRequest:
    eqs = tuple(EqGroup(name, shape, count) for name, shape, count in groups)
    return GangRequest(GangName("job"), eqs, topology=TopologyRequest(required=required))


# ---------------------------------------------------------------------------- 1. unlabeled nodes
#
#   block b0: rack r0 [8 8]      b0 / "" (no rack label): u0 u1 u2 [8 8 8]
#   no labels at all: x0 [8]


def unlabeled() -> ClusterSnapshot:
    b = ClusterBuilder().rack("b0", "r0", [8, 8])
    for i in range(3):
        b.node(f"u{i}", ("z0", "b0", "", f"u{i}"))
    return b.node("x0", ("", "", "", "x0")).build()


EXCLUDE, EMPTY = SolverParams(), SolverParams(unlabeled_nodes=UnlabeledNodes.EMPTY_DOMAIN)
LEFT_OUT = "(4 eligible nodes without a label of zone, block, rack are left out of topology-constrained placement)"

UNLABELED_CASES = [
    pytest.param(
        gang("g", whole(8), 3, required=RACK),
        EXCLUDE,
        [],
        f"{NOT_ENOUGH_CAPACITY}: group 'worker' needs 24 GPUs (3 pods); eligible nodes have room for 16 GPUs "
        + LEFT_OUT,
        id="rack required; nodes without a rack label are in no rack, and the message says so",
    ),
    pytest.param(
        gang("g", whole(8), 3, required=RACK),
        EMPTY,
        ["u0", "u1", "u2"],
        "",
        id="rack required; EmptyDomain policy: the nodes without a rack label form one rack",
    ),
    pytest.param(
        gang("g", whole(8), 5, required=BLOCK),
        EXCLUDE,
        ["r0h0", "r0h1", "u0", "u1", "u2"],
        "",
        id="block required; nodes missing only the finer rack label still belong to their block",
    ),
    pytest.param(
        gang("g", whole(8), 6),
        EXCLUDE,
        ["r0h0", "r0h1", "u0", "u1", "u2", "x0"],
        "",
        id="no topology request; unlabeled nodes run pods as any other",
    ),
    pytest.param(
        gang("g", whole(8, allowed_nodes=frozenset({"u0", "x0"})), 1, preferred=RACK),  # type: ignore[arg-type]
        EXCLUDE,
        [],
        f"{MISSING_TOPOLOGY_LABEL}: group 'worker' matches 2 nodes, all without a label of zone, block, rack; "
        "such nodes are left out of topology-constrained placement",
        id="rack preferred; every eligible node unlabeled: unresolvable, naming the labels",
    ),
]


@pytest.mark.parametrize(("request_", "params", "expected", "message"), UNLABELED_CASES)
def test_nodes_missing_a_topology_label(
    request_: GangRequest, params: SolverParams, expected: list[str], message: str
) -> None:
    result = solve(unlabeled(), request_, params=params)
    assert nodes_of(result, "g") == expected
    assert result.gang("g").explanation == message
    if message.startswith(MISSING_TOPOLOGY_LABEL):
        assert result.gang("g").outcome is Outcome.UNRESOLVABLE


# ---------------------------------------------------------------------------- 2. multi-group gangs
#
#   rack r0: n0 [0]  (the node a CPU-only leader fits tightest: lowest index, no GPUs)
#   rack r1: [0 8 8 8] (its first node has no free GPU either)


def leader_first() -> ClusterSnapshot:
    return ClusterBuilder().rack("b0", "r0", [0]).rack("b0", "r1", [0, 8, 8, 8]).build()


MULTI_GROUP_CASES = [
    pytest.param(
        job(("leader", cpu(4000), 1), ("worker", whole(4), 2), required=HOST),
        {"leader": ["r1"], "worker": ["r1", "r1"]},
        id="host required; the leader goes where the workers fit, not to the GPU-less node",
    ),
    pytest.param(
        job(("worker", whole(4), 2), ("leader", cpu(4000), 1), required=HOST),
        {"leader": ["r1"], "worker": ["r1", "r1"]},
        id="host required; groups in the other order place the same",
    ),
    pytest.param(
        job(("leader", cpu(4000), 1), ("worker", whole(8), 3), required=RACK),
        {"leader": ["r1"], "worker": ["r1", "r1", "r1"]},
        id="rack required; the leader's tightest rack is too small for the workers, the gang takes r1",
    ),
    pytest.param(
        job(("worker", whole(8), 3), ("leader", cpu(4000), 1), required=RACK),
        {"leader": ["r1"], "worker": ["r1", "r1", "r1"]},
        id="rack required; groups in the other order place the same",
    ),
]


@pytest.mark.parametrize(("request_", "expected"), MULTI_GROUP_CASES)
def test_order_of_groups_never_decides_feasibility(request_: GangRequest, expected: dict[str, list[str]]) -> None:
    """Racks per group (the validator checks the required level: one host for HOST)."""
    result = solve(leader_first(), request_)
    got = {g: sorted(a.node[:2] for a in result.gang("job").assignments if a.group == g) for g in expected}
    assert result.gang("job").outcome is Outcome.PLACED
    assert got == expected


@pytest.mark.parametrize(("request_", "expected"), MULTI_GROUP_CASES)
def test_greedy_alone_places_multi_group_gangs_in_one_domain(
    request_: GangRequest, expected: dict[str, list[str]]
) -> None:
    """The greedy baseline (CP-SAT's hint and fallback) finds the domain too."""
    snapshot = leader_first()
    topo = TopologyIndex(snapshot)
    gp = prepare(snapshot, [request_], topo).gangs[0]
    members = place_gang(topo, gp, Ledger(snapshot))
    assert members is not None
    assert len({topo.unit_of[m.node] for m in members}) == 1


# ---------------------------------------------------------------------------- 3. whole-gang explanations
#
#   rack r0: g0 [8 GPUs, 2 cores]     rack r1: c0 [no GPUs, 64 cores]


def split_racks() -> ClusterSnapshot:
    b = ClusterBuilder().node("g0", ("z0", "b0", "r0", "g0"), cpu=2000)
    return b.node("c0", ("z0", "b0", "r1", "c0"), gpus=0, free_gpus=0, cpu=64000).build()


EXPLAIN_CASES = [
    pytest.param(
        split_racks(),
        [job(("leader", cpu(32000), 1), ("worker", whole(8), 1), required=RACK)],
        f"{REQUIRED_TOPOLOGY}: needs 1 pods for 'leader' and 8 GPUs for 'worker' within one rack; "
        "each group fits in some rack, but no rack holds them all",
        id="rack required; each group fits some rack, none holds both: the required level binds",
    ),
    pytest.param(
        ClusterBuilder().node("n0", ("z0", "b0", "r0", "n0"), cpu=10000).build(),
        [job(("leader", cpu(6000), 1), ("worker", cpu(6000), 1))],
        f"{GROUPS_DO_NOT_FIT_TOGETHER}: needs 1 pods for 'leader' and 1 pods for 'worker'; "
        "each group fits the free capacity alone, but they share nodes and do not fit together",
        id="no topology; leader and worker each fit the node's CPU alone, not together",
    ),
    pytest.param(
        ClusterBuilder().node("n0", ("z0", "b0", "r0", "n0"), cpu=10000).build(),
        [job(("leader", cpu(6000), 1), ("worker", cpu(6000), 1), required=HOST)],
        f"{GROUPS_DO_NOT_FIT_TOGETHER}: needs 1 pods for 'leader' and 1 pods for 'worker' within one hostname; "
        "each group fits the free capacity alone, but they share nodes and do not fit together",
        id="host required; a gang solved alone is never told its capacity was taken by others",
    ),
]


@pytest.mark.parametrize(("snapshot", "requests", "message"), EXPLAIN_CASES)
def test_explanations_name_what_binds_the_whole_gang(
    snapshot: ClusterSnapshot, requests: list[GangRequest], message: str
) -> None:
    result = solve(snapshot, *requests)
    assert result.gang("job").outcome is Outcome.UNSCHEDULABLE
    assert result.gang("job").explanation == message


def test_a_multi_group_gang_that_fits_alone_but_lost_to_another_is_told_so() -> None:
    snapshot = ClusterBuilder().rack("b0", "r0", [8]).build()
    first = job(("leader", cpu(1000), 1), ("worker", whole(8), 1))
    second = GangRequest(GangName("other"), first.groups, priority=1)
    result = solve(snapshot, first, second)
    assert result.gang("other").outcome is Outcome.PLACED
    assert result.gang("job").explanation.startswith(TAKEN_BY_OTHERS)


# ---------------------------------------------------------------------------- 4 + 6. invalid requests

LEVEL_LIST = "(levels: zone, block, rack, kubernetes.io/hostname)"


def topo_gang(topology: TopologyRequest, count: int = 4, min_count: int = 0) -> GangRequest:
    return GangRequest(GangName("bad"), (EqGroup("worker", whole(1), count),), min_count, topology)


INVALID_CASES = [
    pytest.param(
        topo_gang(TopologyRequest(required="rak")),
        f"topology.required 'rak' is not a topology level of this cluster {LEVEL_LIST}",
        id="required level with a typo",
    ),
    pytest.param(
        topo_gang(TopologyRequest(preferred="topology.kubernetes.io/rack")),
        f"topology.preferred 'topology.kubernetes.io/rack' is not a topology level of this cluster {LEVEL_LIST}",
        id="preferred level that does not exist",
    ),
    pytest.param(
        topo_gang(TopologyRequest(slices=(Slice("pod", 2),))),
        f"topology.slices[0].level 'pod' is not a topology level of this cluster {LEVEL_LIST}",
        id="slice on an unknown level",
    ),
    pytest.param(
        topo_gang(TopologyRequest(slices=(Slice(RACK, 0),))),
        "topology.slices[0] on 'rack' has size 0; a slice needs a size of 1 or more",
        id="slice without a size",
    ),
    pytest.param(
        topo_gang(TopologyRequest(required=RACK, slices=(Slice(BLOCK, 2),))),
        "topology.slices[0].level 'block' is coarser than topology.required 'rack': "
        "a block slice cannot fit inside one rack",
        id="slice level coarser than the required level",
    ),
    pytest.param(
        topo_gang(TopologyRequest(), count=4, min_count=5),
        "minCount 5 is outside 0..4 (the gang's members)",
        id="minCount above the member count",
    ),
    pytest.param(
        topo_gang(TopologyRequest(), count=0),
        "the gang has no members",
        id="a gang without members",
    ),
]


@pytest.mark.parametrize(("bad", "detail"), INVALID_CASES)
def test_an_invalid_request_is_answered_alone_and_the_others_are_planned(bad: GangRequest, detail: str) -> None:
    snapshot = ClusterBuilder().rack("b0", "r0", [8, 8]).build()
    good = gang("good", whole(8), 2, required=RACK)
    result = solve(snapshot, bad, good)
    assert [g.gang for g in result.gangs] == ["bad", "good"]
    assert result.gang("bad").outcome is Outcome.UNRESOLVABLE
    assert result.gang("bad").explanation == f"{INVALID_REQUEST}: {detail}"
    assert result.gang("good").outcome is Outcome.PLACED


def test_a_call_of_only_invalid_requests_places_nothing_and_raises_nothing() -> None:
    snapshot = ClusterBuilder().rack("b0", "r0", [8]).build()
    result = solve(snapshot, topo_gang(TopologyRequest(required="rak")))
    assert result.gang("bad").outcome is Outcome.UNRESOLVABLE


# ---------------------------------------------------------------------------- 5. lexicographic preferred
#
#   free GPUs per host:  block b0: r0 [8]   block b1: r1 [6]   block b2: r2 [4 4]  r3 [4 4]
# 4 pods of 4 GPUs: r0 + r2 is 2 racks on 3 hosts across 2 blocks; r2 + r3 is 2 racks on 4
# hosts in one block. One block fewer outweighs a host.


def three_blocks() -> ClusterSnapshot:
    b = ClusterBuilder().rack("b0", "r0", [8]).rack("b1", "r1", [6])
    return b.rack("b2", "r2", [4, 4]).rack("b2", "r3", [4, 4]).build()


LEX_CASES = [
    pytest.param(
        gang("g", whole(4), 4, preferred=RACK),
        ["r2h0", "r2h1", "r3h0", "r3h1"],
        id="rack preferred; one block fewer outweighs a host",
    ),
    pytest.param(
        gang("g", whole(4), 4, required=ZONE, preferred=RACK),
        ["r2h0", "r2h1", "r3h0", "r3h1"],
        id="zone required, rack preferred; blocks inside the zone still count first",
    ),
    pytest.param(
        gang("g", whole(4), 4, preferred=HOST),
        ["r2h0", "r2h1", "r3h0", "r3h1"],
        id="host preferred; blocks and racks count before hosts",
    ),
    pytest.param(
        gang("g", whole(4), 2, preferred=RACK),
        ["r0h0", "r0h0"],
        id="rack preferred; a gang one host holds stays on one host",
    ),
]


@pytest.mark.parametrize(("request_", "expected"), LEX_CASES)
def test_preferred_topology_is_lexicographic_from_the_coarsest_level(
    request_: GangRequest, expected: list[str]
) -> None:
    result = solve(three_blocks(), request_)
    assert nodes_of(result, "g") == expected
