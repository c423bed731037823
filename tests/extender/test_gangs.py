"""Gang sources, eligibility and the plan-reserve-permit cycle, in process (the real
kube-scheduler path is in tests/e2e/test_gangs.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from extender.cache import Cache
from extender.eligibility import matches
from extender.gangs.manager import (
    GANG_TIMEOUT,
    NOT_OFFERED,
    WAITING_QUORUM,
    GangManager,
    Reservation,
    _nomination_order,
)
from extender.gangs.sources import (
    COSCHEDULING_POD_GROUP,
    KAI_POD_GROUP,
    NATIVE_POD_GROUP,
    VOLCANO_POD_GROUP,
    WORKLOAD,
    GangObjects,
    gang_key,
    resolve,
)
from extender.objects import pod_info
from solver.params import SolverParams
from tests.extender.fakes import node, pod

LEVELS = ("topology.phalanx.io/block", "topology.phalanx.io/rack", "kubernetes.io/hostname")


def workload(name: str, count: int, *, min_count: int | None = None, timeout_s: int = 60, **group: Any) -> dict:  # type: ignore[type-arg]
    gang = {
        "name": "workers",
        "minCount": min_count or count,
        "scheduleTimeoutSeconds": timeout_s,
        "rankedGroups": [{"name": "r", "eqGroups": [{"name": "w", "count": count}]}],
        **group,
    }
    return {"metadata": {"name": name, "namespace": "default", "uid": f"wl-{name}"}, "spec": {"gangGroups": [gang]}}


def member(name: str, gang: str, **kw: Any) -> dict:  # type: ignore[type-arg]
    p = pod(name, gpus=8, **kw)
    p["metadata"]["labels"] = {"phalanx.io/workload": gang}
    return p


# ---------------------------------------------------------------------------- sources


def test_workload_members_resolve_to_the_group_with_counts_timeout_and_topology() -> None:
    objects = GangObjects()
    objects.replace(
        WORKLOAD,
        [
            workload(
                "job",
                16,
                min_count=12,
                timeout_s=30,
                topologyRequest={"required": "block", "slices": [{"level": "rack", "size": 8}]},
            )
        ],
    )
    res = resolve(objects, "default", {"phalanx.io/workload": "job"}, {}, "")
    assert res is not None and res.spec is not None
    assert (res.key, res.spec.min_count, res.spec.count, res.spec.timeout_s) == ("wl:default/job", 12, 16, 30)
    assert res.spec.topology.required == "block" and res.spec.topology.slices[0].size == 8
    assert not res.spec.topology.balanced
    objects.replace(WORKLOAD, [workload("even", 4, topologyRequest={"preferred": "rack", "balanced": True})])
    even = resolve(objects, "default", {"phalanx.io/workload": "even"}, {}, "")
    assert even is not None and even.spec is not None and even.spec.topology.balanced


def test_a_missing_definition_is_a_reason_not_an_error() -> None:
    res = resolve(GangObjects(), "default", {"phalanx.io/workload": "later"}, {}, "")
    assert res is not None and res.spec is None and res.reason == "waiting for Workload default/later"


@pytest.mark.parametrize(
    ("case", "kind", "annotation", "spec", "want"),
    [
        (
            "a Volcano PodGroup named by scheduling.k8s.io/group-name",
            VOLCANO_POD_GROUP,
            "scheduling.k8s.io/group-name",
            {"minMember": 4, "queue": "q"},
            ("vc:ns/pg", 4, "", ""),
        ),
        (
            "a KAI PodGroup named by pod-group-name, with its topology levels",
            KAI_POD_GROUP,
            "pod-group-name",
            {
                "minMember": 3,
                "topologyConstraint": {"requiredTopologyLevel": "block", "preferredTopologyLevel": "rack"},
            },
            ("kai:ns/pg", 3, "block", "rack"),
        ),
    ],
)
def test_other_schedulers_pod_groups_are_gangs(
    case: str, kind: tuple[str, str], annotation: str, spec: dict[str, Any], want: tuple[str, int, str, str]
) -> None:
    objects = GangObjects()
    assert gang_key("ns", {}, "", {annotation: "pg"}) == want[0]
    missing = resolve(objects, "ns", {}, {annotation: "pg"}, "")
    assert missing is not None and missing.spec is None and "waiting for PodGroup ns/pg" in missing.reason, case
    objects.replace(kind, [{"metadata": {"name": "pg", "namespace": "ns"}, "spec": spec}])
    res = resolve(objects, "ns", {}, {annotation: "pg"}, "")
    assert res is not None and res.spec is not None
    topo = res.spec.topology
    assert (res.key, res.spec.min_count, topo.required, topo.preferred) == want, case


def test_replicated_gangs_are_separate_gangs() -> None:
    a = gang_key("ns", {"phalanx.io/workload": "lws", "phalanx.io/gang-replica": "0"}, "")
    b = gang_key("ns", {"phalanx.io/workload": "lws", "phalanx.io/gang-replica": "1"}, "")
    assert a != b and a == "wl:ns/lws//0"


def test_gang_mode_off_schedules_members_as_single_pods() -> None:
    objects = GangObjects()
    objects.replace(WORKLOAD, [workload("svc", 4, gangMode="Off")])
    res = resolve(objects, "default", {"phalanx.io/workload": "svc"}, {}, "")
    assert res is not None and res.spec is not None and not res.spec.enabled


def test_native_pod_group_gang_and_its_topology_key() -> None:
    objects = GangObjects()
    objects.replace(
        NATIVE_POD_GROUP,
        [
            {
                "metadata": {"name": "pg", "namespace": "ns"},
                "spec": {
                    "schedulingPolicy": {"gang": {"minCount": 3}},
                    "schedulingConstraints": {"topology": [{"key": "rack"}]},
                },
            }
        ],
    )
    res = resolve(objects, "ns", {}, {}, "pg")
    assert res is not None and res.spec is not None
    assert (res.key, res.spec.min_count, res.spec.topology.required) == ("pg:ns/pg", 3, "rack")


def test_coscheduling_label_with_kai_topology_annotations() -> None:
    objects = GangObjects()
    objects.replace(
        COSCHEDULING_POD_GROUP,
        [{"metadata": {"name": "pg", "namespace": "ns"}, "spec": {"minMember": 5, "scheduleTimeoutSeconds": 7}}],
    )
    annotations = {"kai.scheduler/topology-required-placement": "block"}
    res = resolve(objects, "ns", {"scheduling.x-k8s.io/pod-group": "pg"}, annotations, "")
    assert res is not None and res.spec is not None
    assert (res.spec.min_count, res.spec.timeout_s, res.spec.topology.required) == (5, 7, "block")


def test_pods_without_gang_labels_are_not_gang_members() -> None:
    assert resolve(GangObjects(), "ns", {"app": "x"}, {}, "") is None


# ---------------------------------------------------------------------------- eligibility


@pytest.mark.parametrize(
    ("case", "spec", "expected"),
    [
        ("selector matches", {"nodeSelector": {"zone": "a"}}, True),
        ("selector differs", {"nodeSelector": {"zone": "b"}}, False),
        (
            "affinity In",
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                            ]
                        }
                    }
                }
            },
            True,
        ),
        (
            "affinity NotIn",
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}
                            ]
                        }
                    }
                }
            },
            False,
        ),
        (
            "affinity Gt",
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["4"]}]}
                            ]
                        }
                    }
                }
            },
            True,
        ),
        (
            "matchFields on the name",
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                            ]
                        }
                    }
                }
            },
            False,
        ),
        ("taint not tolerated", {"tolerations": []}, False),
        ("taint tolerated by key", {"tolerations": [{"key": "gpu", "operator": "Exists"}]}, True),
        ("taint tolerated by value", {"tolerations": [{"key": "gpu", "operator": "Equal", "value": "yes"}]}, True),
    ],
)
def test_eligibility_follows_kube_scheduler_rules(case: str, spec: dict, expected: bool) -> None:  # type: ignore[type-arg]
    labels = {"zone": "a", "gpus": "8"}
    taints = [("gpu", "yes", "NoSchedule")] if "taint" in case else []
    assert matches("n0", labels, taints, spec) is expected


# ---------------------------------------------------------------------------- the cycle


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.nudged: list[str] = []
        self.nominated: dict[str, str | None] = {}

    def notify(self, spec: Any, reason: str, message: str, kind: str) -> None:
        self.events.append((reason, message))

    def nudge(self, namespace: str, name: str, value: str | None, nominate: str | None = None) -> None:
        if value is not None:
            self.nudged.append(name)
        if nominate is not None:
            self.nominated[name] = nominate


def manager_with(nodes: int, *definitions: dict) -> tuple[GangManager, Cache, Recorder]:  # type: ignore[type-arg]
    cache = Cache(LEVELS)
    cache.replace_nodes([node(f"n{i}", rack=f"b0-r{i // 4}") for i in range(nodes)])
    objects = GangObjects()
    objects.replace(WORKLOAD, list(definitions))
    rec = Recorder()
    return GangManager(cache, objects, SolverParams, rec.notify, rec.nudge, bind_wait_cap_s=5), cache, rec


def add(cache: Cache, *pods: dict) -> list[Any]:  # type: ignore[type-arg]
    for p in pods:
        cache.pod_event("ADDED", p)
    return [pod_info(p) for p in pods]


def test_no_member_is_placed_before_quorum_then_all_are_planned_at_once() -> None:
    mgr, cache, rec = manager_with(8, workload("job", 3))
    names = [f"n{i}" for i in range(8)]
    first = add(cache, member("p0", "job"))[0]
    answer = mgr.filter(first, names)
    assert answer is not None and answer.passed == [] and {answer.message} == {f"{WAITING_QUORUM} 1/3"}
    rest = add(cache, member("p1", "job"), member("p2", "job"))
    answer = mgr.filter(first, names)
    assert answer is not None and len(answer.passed) == 1
    planned = {m.uid: mgr.filter(m, names).passed[0] for m in [first, *rest]}  # type: ignore[union-attr]
    assert len(set(planned.values())) == 3  # one node each
    assert rec.nudged == ["p0"]  # only the member kube-scheduler parked needs waking
    assert cache.assumed_uids() == set(planned)  # capacity reserved for all
    # every member nominated to its planned node, so kube-scheduler checks that node alone
    assert rec.nominated == {m.name: planned[m.uid] for m in [first, *rest]}


def test_parked_members_are_nominated_among_the_queued_ones() -> None:
    """kube-scheduler retries a parked member whenever its backoff ends: its nomination (with
    its wake-up) goes out among the queued members', one after every 8 of theirs, not after
    all of them; the queued members keep their plan order."""
    planned = [(f"u{i}", Reservation(f"n{i}", ())) for i in range(20)]
    order = [uid for uid, _ in _nomination_order(planned, {"u0", "u1", "u2"})]
    queued = [f"u{i}" for i in range(3, 20)]
    assert order == [*queued[:8], "u0", *queued[8:16], "u1", *queued[16:], "u2"]
    assert _nomination_order(planned, set()) == planned
    assert _nomination_order(planned, {uid for uid, _ in planned}) == planned


def test_the_sweep_brings_the_solver_view_up_to_date_while_a_gang_waits_for_quorum() -> None:
    """The plan at quorum then rebuilds only the nodes that changed since, not every node."""
    mgr, cache, _ = manager_with(8, workload("job", 3))
    mgr.sweep()
    assert cache._snapshot is None  # no gang: nothing to prepare
    first = add(cache, member("p0", "job"))[0]
    assert mgr.filter(first, [f"n{i}" for i in range(8)]) is not None  # waiting for quorum
    mgr.sweep()
    assert cache._snapshot is not None and cache._snapshot[0] == cache.generation


def test_filter_answers_from_the_plan_without_solving_again() -> None:
    mgr, cache, _ = manager_with(8, workload("job", 2))
    members = add(cache, member("p0", "job"), member("p1", "job"))
    names = [f"n{i}" for i in range(8)]
    mgr.filter(members[0], names)
    plans = mgr.gangs["wl:default/job"].plans
    for _ in range(50):
        mgr.filter(members[1], names)
    assert mgr.gangs["wl:default/job"].plans == plans


def test_the_gate_opens_only_when_every_planned_member_has_arrived() -> None:
    mgr, cache, _ = manager_with(8, workload("job", 3))
    members = add(cache, *(member(f"p{i}", "job") for i in range(3)))
    names = [f"n{i}" for i in range(8)]
    nodes = {m.uid: mgr.filter(m, names).passed[0] for m in members}  # type: ignore[union-attr]
    results: dict[str, str | None] = {}
    threads = [
        threading.Thread(target=lambda m=m: results.__setitem__(m.name, mgr.permit(m, nodes[m.uid])))
        for m in members[:2]
    ]
    for t in threads:
        t.start()
    time.sleep(0.3)  # a window in which an early open would show
    assert results == {}
    results["p2"] = mgr.permit(members[2], nodes[members[2].uid])
    for t in threads:
        t.join(5)
    assert results == {"p0": "", "p1": "", "p2": ""}


def test_a_gate_that_does_not_close_in_time_releases_everything() -> None:
    mgr, cache, rec = manager_with(8, workload("job", 2, timeout_s=1))
    members = add(cache, member("p0", "job"), member("p1", "job"))
    names = [f"n{i}" for i in range(8)]
    node0 = mgr.filter(members[0], names).passed[0]  # type: ignore[union-attr]
    error = mgr.permit(members[0], node0)
    assert error is not None and error.startswith(GANG_TIMEOUT)
    assert cache.assumed_uids() == set()
    assert ("Released", error) in rec.events
    assert rec.nominated == {"p0": "", "p1": ""}  # nominations cleared with the reservation


def test_a_planned_node_left_out_of_a_sample_keeps_the_plan_and_nominates_again() -> None:
    """kube-scheduler filters a share of the nodes unless the pod carries a nominated node: a
    member taken up before its nomination landed is offered a sample without its planned node.
    That is no refusal: the plan stays, the member is nominated and woken; only a member that
    was nominated to the node and still not offered it (kube-scheduler's plugins refused the
    node) releases the gang."""
    mgr, cache, rec = manager_with(8, workload("job", 2))
    members = add(cache, member("p0", "job"), member("p1", "job"))
    everything = [f"n{i}" for i in range(8)]
    planned = mgr.filter(members[0], everything).passed[0]  # type: ignore[union-attr]
    other = mgr.gangs["wl:default/job"].plan[members[1].uid].node
    sample = [n for n in everything if n != other]
    rec.nudged.clear()
    rec.nominated.clear()
    answer = mgr.filter(members[1], sample)
    assert answer is not None and answer.passed == [] and answer.message.startswith(NOT_OFFERED)
    assert answer.outcome.value == "unresolvable"  # no preemption attempt for a sampling gap
    assert cache.assumed_uids() == {m.uid for m in members}  # the plan holds
    # kube-scheduler's failed cycle clears the nomination; the watch shows it and it is written again
    cleared = {**member("p1", "job"), "status": {"phase": "Pending"}}
    mgr.renominate("MODIFIED", cleared)
    assert rec.nominated == {"p1": other} and rec.nudged == []
    rec.nominated.clear()
    mgr.renominate("MODIFIED", {**cleared, "status": {"phase": "Pending", "nominatedNodeName": other}})
    assert rec.nominated == {}  # in place: nothing to write
    # the nominated member is offered its node alone and gets it
    assert mgr.filter(members[1], [other]).passed == [other]  # type: ignore[union-attr]
    # nominated to the node, yet not offered it: kube-scheduler's own plugins refused the node
    nominated = pod_info({**member("p1", "job"), "status": {"phase": "Pending", "nominatedNodeName": other}})
    assert nominated.nominated == other
    mgr.filter(nominated, sample)
    assert any(reason == "Released" for reason, _ in rec.events)
    state = mgr.gangs["wl:default/job"]
    assert planned and state.plans == 2  # released, then planned again
    # bound members leave the index: their events write nothing
    bound = {**member("p0", "job", node_name=state.plan[members[0].uid].node)}
    mgr.renominate("MODIFIED", bound)
    assert members[0].uid not in mgr.nominations


def test_a_second_gang_never_takes_a_reserved_node() -> None:
    mgr, cache, _ = manager_with(4, workload("a", 3), workload("b", 3))
    a = add(cache, *(member(f"a{i}", "a") for i in range(3)))
    b = add(cache, *(member(f"b{i}", "b") for i in range(3)))
    names = [f"n{i}" for i in range(4)]
    assert mgr.filter(a[0], names).passed  # type: ignore[union-attr]
    answer = mgr.filter(b[0], names)
    assert answer is not None and answer.passed == []
    assert not any(uid.startswith("uid-b") for uid in cache.assumed_uids())


def test_gangs_with_quorum_are_planned_together_so_a_constrained_one_is_not_starved() -> None:
    # Rack b0-r0 (n0-n3) is the only place gang b may go; gang a could go anywhere. Planned alone
    # and first, a could take b0-r0; planned together, a goes to b0-r1 and both fit.
    mgr, cache, _ = manager_with(8, workload("a", 4), workload("b", 4))
    only_r0 = {"nodeSelector": {"topology.phalanx.io/rack": "b0-r0"}}
    b = add(cache, *(member(f"b{i}", "b") | {"spec": {**member(f"b{i}", "b")["spec"], **only_r0}} for i in range(4)))
    a = add(cache, *(member(f"a{i}", "a") for i in range(4)))
    mgr.filter(b[0], [])  # b's first filter: quorum met, gang known (its nodes are not candidates yet)
    mgr.gangs["wl:default/b"].plan.clear()
    for uid in list(cache.assumed_uids()):
        cache.forget(uid)  # start from no reservations, with b known to the manager
    answer = mgr.filter(a[0], [f"n{i}" for i in range(8)])
    assert answer is not None and answer.passed
    plan_a = {mgr.gangs["wl:default/a"].plan[m.uid].node for m in a}
    plan_b = {mgr.gangs["wl:default/b"].plan[m.uid].node for m in b}
    assert plan_b == {"n0", "n1", "n2", "n3"} and plan_a == {"n4", "n5", "n6", "n7"}


def test_members_beyond_a_bound_quorum_join_as_far_as_they_fit() -> None:
    mgr, cache, _ = manager_with(5, workload("elastic", 7, min_count=4))
    names = [f"n{i}" for i in range(5)]
    first = add(cache, *(member(f"e{i}", "elastic") for i in range(4)))
    assert mgr.filter(first[0], names).passed  # type: ignore[union-attr]
    assert len(mgr.gangs["wl:default/elastic"].plan) == 4
    late = add(cache, *(member(f"e{i}", "elastic") for i in range(4, 7)))
    answers = [mgr.filter(m, names) for m in late]
    assert sum(1 for a in answers if a is not None and a.passed) == 1  # one node left: one more joins


def test_a_gang_that_did_not_fit_is_planned_in_the_background_once_capacity_frees() -> None:
    mgr, cache, rec = manager_with(4, workload("g", 4))
    blocker = pod("blocker", gpus=8, node_name="n0", phase="Running")
    cache.pod_event("ADDED", blocker)
    members = add(cache, *(member(f"g{i}", "g") for i in range(4)))
    answer = mgr.filter(members[0], [f"n{i}" for i in range(4)])
    assert answer is not None and answer.passed == []
    rec.nudged.clear()
    cache.pod_event("DELETED", blocker)  # freed with no event kube-scheduler would link to the gang
    mgr._last_retry = 0.0
    mgr.sweep()
    assert len(mgr.gangs["wl:default/g"].plan) == 4
    assert rec.nudged == ["g0"]  # the parked member comes back and finds its reservation
