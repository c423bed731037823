"""Sub-groups as the gang sources state them (a Workload's ranked groups, a KAI PodGroup's leaf
sub-groups), the quorum each needs, and preferred node affinity as node scores."""

from __future__ import annotations

from typing import Any

import pytest

from extender.config import PhalanxConfig
from extender.eligibility import preference
from extender.gangs.requests import Entry, Members, quorum_shortfall, request
from extender.gangs.sources import KAI_POD_GROUP, WORKLOAD, GangObjects, GangSpec, SubGroupSpec, resolve
from extender.objects import pod_info
from extender.pools import Hardware
from solver import ClusterSnapshot, GangRequest, Node, NodeName, Resources, TopologyRequest, plan
from tests.extender.fakes import pod


def workload_with(ranked: list[dict[str, Any]], min_count: int = 0) -> dict[str, Any]:
    gang: dict[str, Any] = {"name": "g", "rankedGroups": ranked}
    if min_count:
        gang["minCount"] = min_count
    return {"metadata": {"name": "job", "namespace": "ns"}, "spec": {"gangGroups": [gang]}}


def ranked(name: str, count: int, **fields: Any) -> dict[str, Any]:
    return {"name": name, "eqGroups": [{"name": name, "count": count}], **fields}


@pytest.mark.parametrize(
    ("case", "groups", "want", "default"),
    [
        (
            "leader in one rack, workers in one block",
            [
                ranked("leader", 1, topologyRequest={"required": "rack"}),
                ranked("workers", 8, minCount=4, topologyRequest={"required": "block"}),
            ],
            (
                SubGroupSpec("leader", 0, TopologyRequest(required="rack")),
                SubGroupSpec("workers", 4, TopologyRequest(required="block")),
            ),
            "",
        ),
        ("ranked groups without constraints are no sub-groups", [ranked("a", 2), ranked("b", 2)], (), ""),
        (
            "one ranked group takes unlabelled members",
            [ranked("all", 4, topologyRequest={"preferred": "rack"})],
            (SubGroupSpec("all", 0, TopologyRequest(preferred="rack")),),
            "all",
        ),
    ],
)
def test_a_workloads_ranked_groups_are_its_sub_groups(
    case: str, groups: list[dict[str, Any]], want: tuple[SubGroupSpec, ...], default: str
) -> None:
    objects = GangObjects()
    objects.replace(WORKLOAD, [workload_with(groups)])
    res = resolve(objects, "ns", {"phalanx.io/workload": "job"}, {}, "")
    assert res is not None and res.spec is not None
    assert res.spec.subgroups == want, case
    assert res.spec.default_subgroup == default, case
    if want:
        assert res.spec.subgroup_of({"phalanx.io/ranked-group": want[-1].name}) == want[-1].name
        assert res.spec.subgroup_of({}) == default


def test_a_kai_pod_groups_leaf_sub_groups_with_their_topology_and_min_sub_groups() -> None:
    """KAI's hierarchical example: subgroup-ab is a parent; a, b and c are the leaves."""
    spec = {
        "minMember": 6,
        "minSubGroup": 2,
        "topologyConstraint": {"requiredTopologyLevel": "zone"},
        "subGroups": [
            {"name": "subgroup-ab", "topologyConstraint": {"requiredTopologyLevel": "spine"}},
            {
                "name": "a",
                "minMember": 1,
                "parent": "subgroup-ab",
                "topologyConstraint": {"requiredTopologyLevel": "rack"},
            },
            {"name": "b", "minMember": 2, "parent": "subgroup-ab"},
            {"name": "c", "minMember": 3, "topologyConstraint": {"preferredTopologyLevel": "rack"}},
            "junk",
        ],
    }
    objects = GangObjects()
    objects.replace(KAI_POD_GROUP, [{"metadata": {"name": "pg", "namespace": "ns"}, "spec": spec}])
    res = resolve(objects, "ns", {}, {"pod-group-name": "pg"}, "")
    assert res is not None and res.spec is not None
    assert res.spec.topology.required == "zone"
    assert res.spec.subgroups == (
        SubGroupSpec("a", 1, TopologyRequest(required="rack")),
        SubGroupSpec("b", 2, TopologyRequest()),
        SubGroupSpec("c", 3, TopologyRequest(preferred="rack")),
    )
    assert res.spec.min_subgroups == 2
    assert res.spec.subgroup_of({"kai.scheduler/subgroup-name": "b"}) == "b"


def spec_with(subgroups: tuple[SubGroupSpec, ...], min_count: int, min_subgroups: int = 0) -> GangSpec:
    return GangSpec(
        key="wl:ns/job",
        namespace="ns",
        source=WORKLOAD,
        owner={},
        min_count=min_count,
        count=0,
        timeout_s=60,
        topology=TopologyRequest(),
        subgroups=subgroups,
        min_subgroups=min_subgroups,
        subgroup_label="phalanx.io/ranked-group",
    )


def members(*groups: str) -> list[Any]:
    out = []
    for i, g in enumerate(groups):
        p = pod(f"m{i}", gpus=1)
        p["metadata"]["labels"] = {"phalanx.io/ranked-group": g} if g else {}
        out.append(pod_info(p))
    return out


LEADER = SubGroupSpec("leader", 1, TopologyRequest())
WORKERS = SubGroupSpec("workers", 3, TopologyRequest())


@pytest.mark.parametrize(
    ("case", "spec", "groups", "want"),
    [
        ("below the gang's minCount", spec_with((), 4), ("", "", ""), "waiting for gang quorum 3/4"),
        ("quorum", spec_with((), 3), ("", "", ""), ""),
        (
            "every sub-group needs its minimum",
            spec_with((LEADER, WORKERS), 3),
            ("leader", "workers", "workers"),
            "waiting for gang quorum of sub-group workers 2/3",
        ),
        ("all sub-groups at their minimum", spec_with((LEADER, WORKERS), 4), ("leader", *["workers"] * 3), ""),
        ("one of two sub-groups is enough", spec_with((LEADER, WORKERS), 1, min_subgroups=1), ("leader",), ""),
        (
            "a sub-group of all its members needs at least one",
            spec_with((SubGroupSpec("x", 0, TopologyRequest()),), 1),
            ("",),
            "waiting for gang quorum of sub-group x 0/1",
        ),
    ],
)
def test_quorum_counts_the_gang_and_each_required_sub_group(
    case: str, spec: GangSpec, groups: tuple[str, ...], want: str
) -> None:
    assert quorum_shortfall(spec, members(*groups)) == want, case


PREFERS_POOL_A = {
    "affinity": {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 80,
                    "preference": {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
                },
                {"weight": 20, "preference": {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}},
                "junk",
                {"weight": True, "preference": {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}},
                {"weight": 500, "preference": {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}},
            ]
        }
    }
}


@pytest.mark.parametrize(
    ("case", "labels", "spec", "want"),
    [
        ("both terms match", {"pool": "a"}, PREFERS_POOL_A, 100),
        ("the second term only", {"pool": "b"}, PREFERS_POOL_A, 20),
        ("no term matches", {}, PREFERS_POOL_A, 0),
        ("no preferred terms", {"pool": "a"}, {}, 0),
    ],
)
def test_preferred_node_affinity_sums_the_matching_weights(
    case: str, labels: dict[str, str], spec: dict[str, Any], want: int
) -> None:
    assert preference("n", labels, spec) == want, case


# ---------------------------------------------------------------------------- to the solver

RACKS = ("rack", "kubernetes.io/hostname")


def snapshot() -> ClusterSnapshot:
    """Two racks of two nodes: r0n0 r0n1 | r1n0 r1n1."""
    nodes = [
        Node(NodeName(f"{r}{n}"), Resources(8000, 65536, 110), labels={"rack": r}, topology=(r, f"{r}{n}"))
        for r in ("r0", "r1")
        for n in ("n0", "n1")
    ]
    return ClusterSnapshot(tuple(nodes), RACKS)


def member_pod(name: str, group: str = "", node: str = "", affinity: dict[str, Any] | None = None) -> Any:
    p = pod(name, node_name=node, phase="Running" if node else "Pending")
    p["metadata"]["labels"] = {"phalanx.io/ranked-group": group} if group else {}
    if affinity:
        p["spec"]["affinity"] = affinity
    return pod_info(p)


def ask(spec: GangSpec, pending: list[Any], bound: list[Any] = ()) -> GangRequest:  # type: ignore[assignment]
    entry = Entry(spec.key, spec, Members(pending, list(bound)))
    return request(snapshot(), entry, hardware=Hardware(PhalanxConfig().gpu), pool_models=lambda pool: None)


def test_members_go_to_their_sub_group_with_its_minimum_and_topology() -> None:
    spec = spec_with((SubGroupSpec("leader", 0, TopologyRequest(required="rack")), WORKERS), 4)
    gang = ask(spec, members("leader", "workers", "workers", "workers"))
    by_name = {s.name: s for s in gang.subgroups}
    assert set(by_name) == {"leader", "workers"}
    assert by_name["leader"].topology.required == "rack" and by_name["workers"].min_count == 3
    sizes = {g.name: g.count for g in gang.groups}
    assert sorted(sizes[n] for n in by_name["workers"].groups) == [3]


def test_a_sub_group_whose_members_run_needs_only_what_they_lack_and_stays_in_their_rack() -> None:
    """Two of three workers run in rack r1: the third must join them in r1, and the workers
    sub-group needs one more member (not three)."""
    spec = spec_with((SubGroupSpec("workers", 3, TopologyRequest(required="rack")),), 3)
    running = [member_pod("w0", "workers", "r1n0"), member_pod("w1", "workers", "r1n1")]
    gang = ask(spec, [member_pod("w2", "workers")], running)
    [sub] = gang.subgroups
    assert sub.min_count == 1
    [group] = gang.groups
    assert group.shape.allowed_nodes == frozenset({"r1n0", "r1n1"})
    assert gang.min_count == 1


def test_a_satisfied_sub_group_is_optional_for_the_quorum_of_sub_groups() -> None:
    spec = spec_with((LEADER, WORKERS), 4)
    running = [member_pod("l0", "leader", "r0n0")]
    gang = ask(spec, [member_pod("l1", "leader"), *[member_pod(f"w{i}", "workers") for i in range(3)]], running)
    assert {s.name for s in gang.subgroups} == {"leader", "workers"}
    assert gang.min_subgroups == 1  # the leader sub-group is placed already


def test_preferred_affinity_becomes_node_scores_normalised_to_the_best_node() -> None:
    affinity = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 40,
                    "preference": {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]},
                }
            ]
        }
    }
    gang = ask(spec_with((), 1), [member_pod("p", affinity=affinity)])
    [group] = gang.groups
    assert group.node_scores == (("r1n0", 100), ("r1n1", 100))


@pytest.mark.parametrize("peer", ["r0n1", "r1n0"])
def test_a_member_joining_later_goes_next_to_its_placed_peers(peer: str) -> None:
    """One member runs on `peer`; the one that joins (elastic growth, a replacement) is planned
    in the same rack, whichever rack that is."""
    gang = ask(spec_with((), 1), [member_pod("late")], [member_pod("early", node=peer)])
    result = plan(snapshot(), [gang])
    [placed] = result.gangs[0].assignments
    assert placed.node[:2] == peer[:2]
