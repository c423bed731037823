"""The gang state machine's edges: watch lag after binds, solves that do not block other
gangs, typed outcomes, and preemption that no eviction can help."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from extender.gangs import manager as manager_module
from extender.gangs.requests import split
from extender.objects import pod_info
from extender.outcomes import Fit
from tests.extender.fakes import pod
from tests.extender.test_gangs import add, manager_with, member, workload


def pass_gate(mgr: Any, pods: list[Any], names: list[str]) -> None:
    """Every member filtered and through the permit gate at once (the gate opens)."""
    nodes = {p.uid: mgr.filter(p, names).passed[0] for p in pods}
    results: dict[str, str | None] = {}
    threads = [
        threading.Thread(target=lambda p=p: results.__setitem__(p.uid, mgr.permit(p, nodes[p.uid]))) for p in pods
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert set(results.values()) == {""}


def bind_all(mgr: Any, pods: list[Any], names: list[str]) -> None:
    """Every member through the gate and bound, as far as the manager knows; the watch has
    not shown any of them bound yet (the cache still says pending)."""
    pass_gate(mgr, pods, names)
    for p in pods:
        mgr.bound(p)


def test_a_gang_bound_during_watch_lag_is_never_planned_again_by_another_gangs_solve() -> None:
    mgr, cache, _ = manager_with(8, workload("a", 2), workload("b", 2))
    a = add(cache, member("a0", "a"), member("a1", "a"))
    names = [f"n{i}" for i in range(8)]
    bind_all(mgr, a, names)
    assumed = cache.assumed_uids()
    plans = mgr.gangs["wl:default/a"].plans
    b = add(cache, member("b0", "b"), member("b1", "b"))
    assert mgr.filter(b[0], names).passed  # type: ignore[union-attr]  # a joint solve with every waiting gang
    assert mgr.gangs["wl:default/a"].plans == plans
    assert mgr.gangs["wl:default/a"].plan == {}
    assert cache.assumed_uids() - {p.uid for p in b} == assumed  # a's members counted once, where bound


def test_a_gang_bound_during_watch_lag_is_not_retried_by_the_sweep() -> None:
    mgr, cache, _ = manager_with(4, workload("a", 2))
    a = add(cache, member("a0", "a"), member("a1", "a"))
    bind_all(mgr, a, [f"n{i}" for i in range(4)])
    state = mgr.gangs["wl:default/a"]
    state.failed_attempt = (0, 2)  # as if a solve had failed before: the sweep's retry looks at it
    plans = state.plans
    mgr._last_retry = 0.0
    mgr.sweep()
    assert state.plans == plans and state.plan == {}


@pytest.mark.parametrize(
    ("case", "pods", "planned", "bound_here", "pending", "bound"),
    [
        ("nothing bound or planned: all pending", ["p0", "p1"], set(), set(), ["p0", "p1"], []),
        ("the watch shows a node: bound", ["p0", "p1@n0"], set(), set(), ["p0"], ["p1"]),
        ("planned members are not pending", ["p0", "p1"], {"uid-p1"}, set(), ["p0"], []),
        ("bound here, watch lagging: bound, not pending", ["p0", "p1"], set(), {"uid-p1"}, ["p0"], ["p1"]),
    ],
)
def test_member_split(
    case: str, pods: list[str], planned: set[str], bound_here: set[str], pending: list[str], bound: list[str]
) -> None:
    infos = [pod_info(pod(n.split("@")[0], gpus=1, node_name=n.partition("@")[2])) for n in pods]
    members = split(infos, planned=planned, bound_here=bound_here)
    assert ([p.name for p in members.pending], [p.name for p in members.bound]) == (pending, bound), case


def test_a_solve_does_not_block_another_gangs_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    mgr, cache, _ = manager_with(8, workload("a", 2), workload("b", 2))
    names = [f"n{i}" for i in range(8)]
    a = add(cache, member("a0", "a"), member("a1", "a"))
    assert mgr.filter(a[0], names).passed  # type: ignore[union-attr]  # a is planned
    entered, release = threading.Event(), threading.Event()
    real = manager_module.solver.plan

    def slow(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        assert release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(manager_module.solver, "plan", slow)
    b = add(cache, member("b0", "b"), member("b1", "b"))
    solving = threading.Thread(target=lambda: mgr.filter(b[0], names))
    solving.start()
    try:
        assert entered.wait(10)
        answer = mgr.filter(a[1], names)  # answered from a's plan while b solves
        assert answer is not None and answer.outcome is Fit.FITS
    finally:
        release.set()
        solving.join(10)
    assert len(mgr.gangs["wl:default/b"].plan) == 2


def test_waiting_for_quorum_or_a_definition_is_unresolvable() -> None:
    mgr, cache, _ = manager_with(4, workload("a", 4))
    (first,) = add(cache, member("a0", "a"))
    answer = mgr.filter(first, ["n0"])
    assert answer is not None and answer.outcome is Fit.UNRESOLVABLE
    (orphan,) = add(cache, member("x0", "missing"))
    answer = mgr.filter(orphan, ["n0"])
    assert answer is not None and answer.outcome is Fit.UNRESOLVABLE and "waiting for Workload" in answer.message


def test_a_gang_that_does_not_fit_now_is_unschedulable_not_unresolvable() -> None:
    mgr, cache, _ = manager_with(2, workload("a", 3))
    pods = add(cache, *(member(f"a{i}", "a") for i in range(3)))
    answer = mgr.filter(pods[0], ["n0", "n1"])
    assert answer is not None and answer.outcome is Fit.UNSCHEDULABLE  # capacity may free: preemption may help


def high(name: str, gang: str, priority: int) -> dict[str, Any]:
    p = member(name, gang)
    p["spec"]["priority"] = priority
    return p


def test_preemption_cannot_help_a_gang_without_quorum() -> None:
    mgr, cache, _ = manager_with(4, workload("a", 4))
    (first,) = add(cache, high("a0", "a", 1000))
    assert mgr.preemption_helps(first) is False


def test_preemption_helps_only_where_evicting_lower_priority_pods_makes_room(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manager_module, "PREEMPT_MEMO_S", 0.0)  # each question answered afresh
    mgr, cache, _ = manager_with(2, workload("a", 2))
    for i in range(2):  # both nodes full: one with a low-priority pod, one with an equal-priority pod
        blocker = pod(f"blk{i}", gpus=8, node_name=f"n{i}", phase="Running")
        blocker["spec"]["priority"] = 0 if i == 0 else 1000
        cache.pod_event("ADDED", blocker)
    members = add(cache, high("a0", "a", 1000), high("a1", "a", 1000))
    assert mgr.preemption_helps(members[0]) is False  # only one node can be freed: the gang needs two
    cache.pod_event("DELETED", pod("blk1", gpus=8, node_name="n1"))
    assert mgr.preemption_helps(members[0]) is True


def test_a_pod_of_no_gang_is_not_the_gang_managers_to_judge() -> None:
    mgr, _, _ = manager_with(2)
    assert mgr.preemption_helps(pod_info(pod("single", gpus=1))) is None


def test_the_wire_carries_unresolvable_reasons_and_preempt_offers_no_victims() -> None:
    """kube-scheduler skips preemption for FailedAndUnresolvableNodes; asked anyway (its own
    filters failed first), preempt leaves no candidate for a gang without quorum."""
    from extender.gangs.sources import WORKLOAD
    from tests.extender.fakes import extender_on, node

    blocker = pod("low", gpus=8, node_name="n0", phase="Running")
    ext = extender_on([node("n0")], [blocker])
    ext.gang_objects.replace(WORKLOAD, [workload("a", 4)])
    lone = high("a0", "a", 1000)
    ext.cache.pod_event("ADDED", lone)
    reply = ext.verbs.filter({"Pod": lone, "NodeNames": ["n0"]})
    assert reply["FailedNodes"] == {} and reply["FailedAndUnresolvableNodes"] == {"n0": "waiting for gang quorum 1/4"}
    victims = {"n0": {"Pods": [{"UID": "uid-low"}], "NumPDBViolations": 0}}
    assert ext.verbs.preempt({"Pod": lone, "NodeNameToMetaVictims": victims}) == {"NodeNameToMetaVictims": {}}
    single = pod("single", gpus=8)
    assert ext.verbs.preempt({"Pod": single, "NodeNameToMetaVictims": victims}) == {"NodeNameToMetaVictims": victims}


def test_a_gang_the_solver_rejects_gets_its_own_error_and_the_others_are_planned() -> None:
    """One Workload with an unknown topology level must not stop every other gang's solve."""
    mgr, cache, rec = manager_with(
        8, workload("bad", 2, topologyRequest={"required": "no-such-level"}), workload("good", 2)
    )
    bad = add(cache, member("x0", "bad"), member("x1", "bad"))
    good = add(cache, member("g0", "good"), member("g1", "good"))
    names = [f"n{i}" for i in range(8)]
    mgr.gangs.setdefault("wl:default/good", manager_module.GangState("wl:default/good"))
    answer = mgr.filter(bad[0], names)  # the joint solve takes "good" along
    assert answer is not None and answer.outcome is Fit.UNRESOLVABLE and "no-such-level" in answer.message
    assert any(reason == "Invalid" for reason, _ in rec.events)
    answer = mgr.filter(good[0], names)
    assert answer is not None and answer.outcome is Fit.FITS


def test_min_count_above_the_declared_members_says_so() -> None:
    mgr, cache, rec = manager_with(4, workload("odd", 2, min_count=3))
    pods = add(cache, member("o0", "odd"), member("o1", "odd"))
    answer = mgr.filter(pods[0], ["n0"])
    assert answer is not None and answer.outcome is Fit.UNRESOLVABLE and "minCount exceeds" in answer.message
    assert ("Invalid", answer.message) in rec.events


def test_a_definition_with_an_unreadable_field_is_a_reason_not_a_500() -> None:
    mgr, cache, _ = manager_with(4, workload("junk", 2, min_count="many"))  # type: ignore[arg-type]
    pods = add(cache, member("j0", "junk"), member("j1", "junk"))
    answer = mgr.filter(pods[0], ["n0"])
    assert answer is not None and answer.outcome is Fit.UNRESOLVABLE and "invalid gang definition" in answer.message


def test_should_the_solver_raise_for_one_gang_the_others_are_still_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defence in depth: a defect that makes `solver.plan` raise for one request must cost
    only that gang."""
    mgr, cache, _ = manager_with(8, workload("bad", 2), workload("good", 2))
    real = manager_module.solver.plan

    def plan(snapshot: Any, requests: Any, **kw: Any) -> Any:
        if any(r.name == "wl:default/bad" for r in requests):
            raise ValueError("boom")
        return real(snapshot, requests, **kw)

    monkeypatch.setattr(manager_module.solver, "plan", plan)
    bad = add(cache, member("x0", "bad"), member("x1", "bad"))
    good = add(cache, member("g0", "good"), member("g1", "good"))
    names = [f"n{i}" for i in range(8)]
    assert mgr.filter(good[0], names).outcome is Fit.FITS  # type: ignore[union-attr]  # known, planned
    mgr.gangs["wl:default/good"].plan.clear()
    for uid in cache.assumed_uids():
        cache.forget(uid)  # good waits for a plan again: the next solve takes it along with bad
    answer = mgr.filter(bad[0], names)
    assert answer is not None and answer.outcome is Fit.UNRESOLVABLE and "invalid gang request" in answer.message
    assert len(mgr.gangs["wl:default/good"].plan) == 2  # planned in the same round, without the bad one


def test_the_preemption_answer_is_reused_for_a_few_seconds() -> None:
    """kube-scheduler asks for every member on every attempt: the cluster-wide what-if solve
    is not repeated for each."""
    mgr, cache, _ = manager_with(2, workload("a", 2))
    for i in range(2):
        blocker = pod(f"blk{i}", gpus=8, node_name=f"n{i}", phase="Running")
        blocker["spec"]["priority"] = 1000
        cache.pod_event("ADDED", blocker)
    members = add(cache, high("a0", "a", 1000), high("a1", "a", 1000))
    calls = 0
    real = manager_module.solver.plan

    def counting(*args: Any, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*args, **kw)

    manager_module.solver.plan = counting  # type: ignore[assignment]
    try:
        assert [mgr.preemption_helps(m) for m in members * 3] == [False] * 6
    finally:
        manager_module.solver.plan = real  # type: ignore[assignment]
    assert calls == 1


def test_a_plan_whose_devices_were_taken_while_solving_is_not_reserved(monkeypatch: pytest.MonkeyPatch) -> None:
    """The solve runs without locks: a single pod bound meanwhile must not be double-booked."""
    mgr, cache, _ = manager_with(3, workload("a", 2))
    real = manager_module.solver.plan
    taken: list[str] = []

    def racing(snapshot: Any, asks: Any, **kw: Any) -> Any:
        result = real(snapshot, asks, **kw)
        if not taken and result.gangs[0].assignments:
            node = result.gangs[0].assignments[0].node
            cache.pod_event("ADDED", pod("single", gpus=8, node_name=node, phase="Running"))
            taken.append(node)
        return result

    monkeypatch.setattr(manager_module.solver, "plan", racing)
    members = add(cache, member("a0", "a"), member("a1", "a"))
    names = [f"n{i}" for i in range(3)]
    first = mgr.filter(members[0], names)
    assert first is not None and first.outcome is not Fit.FITS and mgr.gangs["wl:default/a"].plan == {}
    again = mgr.filter(members[0], names)  # planned again, around the single pod
    assert again is not None and again.outcome is Fit.FITS
    assert taken[0] not in {r.node for r in mgr.gangs["wl:default/a"].plan.values()}


def test_once_the_gate_opened_the_timeout_no_longer_releases_the_binding_gang() -> None:
    mgr, cache, _ = manager_with(4, workload("a", 2, timeout_s=1))
    members = add(cache, member("a0", "a"), member("a1", "a"))
    names = [f"n{i}" for i in range(4)]
    pass_gate(mgr, members, names)  # the gate opened; the binds are under way
    state = mgr.gangs["wl:default/a"]
    # The gang's 1 s timeout no longer applies: a sweep after it must not forget the devices
    # the binds are using (they end well within the binding grace).
    assert state.deadline - manager_module.time.monotonic() > manager_module.BINDING_GRACE_S / 2
    mgr.sweep()
    assert len(state.plan) == 2 and cache.assumed_uids() == {m.uid for m in members}


def test_a_gang_member_whose_bind_fails_keeps_its_reservation() -> None:
    from extender.gangs.sources import WORKLOAD
    from tests.extender.fakes import extender_on, node

    ext = extender_on([node("n0"), node("n1")], [])
    ext.gang_objects.replace(WORKLOAD, [workload("g", 1)])
    obj = member("g0", "g")
    ext.kube.pods["default/g0"] = obj  # type: ignore[attr-defined]
    ext.cache.pod_event("ADDED", obj)
    planned = ext.verbs.filter({"Pod": obj, "NodeNames": ["n0", "n1"]})["NodeNames"]
    assert len(planned) == 1
    ext.kube.fail_bind = True  # type: ignore[attr-defined]
    args = {"PodNamespace": "default", "PodName": "g0", "PodUID": "uid-g0", "Node": planned[0]}
    assert ext.verbs.bind(args)["Error"]
    assert ext.cache.assumed("uid-g0") is not None  # still reserved: the retry binds it there
    ext.kube.fail_bind = False  # type: ignore[attr-defined]
    assert ext.verbs.bind(args) == {"Error": ""}


def test_a_planned_members_filter_reply_names_one_node_and_no_failures() -> None:
    from extender.gangs.sources import WORKLOAD
    from tests.extender.fakes import extender_on, node

    ext = extender_on([node(f"n{i}") for i in range(50)], [])
    ext.gang_objects.replace(WORKLOAD, [workload("g", 1)])
    obj = member("g0", "g")
    ext.cache.pod_event("ADDED", obj)
    reply = ext.verbs.filter({"Pod": obj, "NodeNames": [f"n{i}" for i in range(50)]})
    assert len(reply["NodeNames"]) == 1 and reply["FailedNodes"] == {} and reply["FailedAndUnresolvableNodes"] == {}


def test_after_a_start_every_unbound_member_is_woken_once() -> None:
    """Members parked before a restart (or whose definition was listed before them) have no
    other event coming that kube-scheduler would link to them."""
    mgr, cache, rec = manager_with(4, workload("a", 2))
    add(cache, member("a0", "a"), member("a1", "a"), pod("single", gpus=1))
    mgr.wake_all()
    assert sorted(rec.nudged) == ["a0", "a1"]
