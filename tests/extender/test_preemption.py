"""Gang-aware preemption and reclaim in the gang cycle: whole victim units chosen by the solver,
evicted through the Eviction API after their plan is reserved, budgets respected, and nothing
evicted for a gang without quorum.

    rack b0-r0: n0 n1 n2 n3   (8 GPUs each)
    low0 on n0+n1 (priority 10), low1 on n2+n3 (priority 20), 2 x 8 GPUs each with their device
    records; the preemptors ask 16 GPUs.
"""

from __future__ import annotations

import time
from typing import Any

from extender.binder import Binder
from extender.cache import Cache
from extender.config import QueuesConfig
from extender.gangs.manager import AWAITING_VICTIMS, GangManager
from extender.gangs.sources import WORKLOAD, GangObjects
from extender.objects import DEVICES_ANNOTATION, encode_devices
from extender.preemption import Preemptor
from extender.queues import QueueBook
from solver import DeviceAssignment, SolverParams
from tests.extender.fakes import FakeKube, node
from tests.extender.test_gangs import LEVELS, Recorder, add, member, workload


def sweep(mgr: GangManager) -> None:
    """One round of the sweep, now (victim searches run there, never inside a verb)."""
    mgr._last_retry = 0.0
    mgr.sweep()


def evictions(kube: FakeKube, count: int) -> list[str]:
    """The evictions, once `count` have been made (they run on their own thread)."""
    end = time.monotonic() + 10
    while len(kube.evicted) < count and time.monotonic() < end:
        time.sleep(0.01)
    return sorted(kube.evicted)


def prioritized(p: dict[str, Any], priority: int, **labels: str) -> dict[str, Any]:
    p["spec"]["priority"] = priority
    p["metadata"]["labels"] = {**p["metadata"]["labels"], **labels}
    return p


def setup(
    *definitions: dict[str, Any], refuses: set[str] | None = None
) -> tuple[GangManager, Cache, FakeKube, Recorder]:
    cache = Cache(LEVELS)
    cache.replace_nodes([node(f"n{i}") for i in range(4)])
    objects = GangObjects()
    objects.replace(WORKLOAD, [workload("low0", 2), workload("low1", 2), *definitions])
    kube = FakeKube(budget_refuses=refuses or set())
    rec = Recorder()
    book = QueueBook(cache, QueuesConfig(), gang_of=lambda p: "")
    mgr = GangManager(cache, objects, SolverParams, rec.notify, rec.nudge, bind_wait_cap_s=2, admission=book)
    book.gang_of = mgr.gang_of
    mgr.preemptor = Preemptor(
        cache, Binder(kube), book, gang_of=mgr.gang_of, config=QueuesConfig, report=lambda obj, reason, message: None
    )
    for g, nodes, priority in (("low0", ("n0", "n1"), 10), ("low1", ("n2", "n3"), 20)):
        for i, where in enumerate(nodes):
            add(cache, prioritized(member(f"{g}-{i}", g, node_name=where, annotations=EIGHT), priority))
    return mgr, cache, kube, rec


EIGHT = {DEVICES_ANNOTATION: encode_devices(tuple(DeviceAssignment(i, memory_mib=81920) for i in range(8)))}


def test_a_high_priority_gang_evicts_one_whole_lower_priority_gang_and_waits_for_it_to_go() -> None:
    mgr, cache, kube, _ = setup(workload("high", 2))
    high = add(cache, *(prioritized(member(f"high-{i}", "high"), 1000) for i in range(2)))
    names = [f"n{i}" for i in range(4)]
    mgr.filter(high[0], names)
    sweep(mgr)
    victims = evictions(kube, 2)
    assert victims in (["default/low0-0", "default/low0-1"], ["default/low1-0", "default/low1-1"]), victims
    state = mgr.gangs["wl:default/high"]
    assert len(state.plan) == 2 and len(state.victims) == 2  # reserved before the victims are gone
    planned = next(iter(state.plan.values())).node
    answer = mgr.filter(high[0], [n for n in names if n != planned])  # kube-scheduler still counts them
    assert answer is not None and answer.message.startswith(AWAITING_VICTIMS) and state.plan  # not released
    for key in victims:
        cache.pod_event("DELETED", kube_pod(key))
    mgr.sweep()
    assert not state.victims and mgr._gate_open(state) is False  # members have not reached bind yet


def kube_pod(key: str) -> dict[str, Any]:
    namespace, name = key.split("/")
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"}}


def test_a_unit_a_disruption_budget_protects_is_left_and_the_other_chosen() -> None:
    mgr, cache, kube, _ = setup(workload("high", 2), refuses={"low0-0"})
    high = add(cache, *(prioritized(member(f"high-{i}", "high"), 1000) for i in range(2)))
    mgr.filter(high[0], [f"n{i}" for i in range(4)])
    sweep(mgr)
    assert evictions(kube, 2) == ["default/low1-0", "default/low1-1"]


def test_equal_priority_in_the_same_queue_evicts_nothing() -> None:
    mgr, cache, kube, _ = setup(workload("peer", 2))
    peer = add(cache, *(prioritized(member(f"peer-{i}", "peer"), 10) for i in range(2)))
    mgr.filter(peer[0], [f"n{i}" for i in range(4)])
    sweep(mgr)
    assert kube.evicted == [] and not mgr.gangs["wl:default/peer"].plan


def test_a_gang_without_quorum_evicts_nothing() -> None:
    mgr, cache, kube, _ = setup(workload("high", 4))
    high = add(cache, prioritized(member("high-0", "high"), 1000))
    mgr.preempt_for(high[0])
    mgr.filter(high[0], [f"n{i}" for i in range(4)])
    sweep(mgr)
    mgr.sweep()
    assert kube.evicted == []


def test_a_queue_within_its_deserved_quota_reclaims_borrowed_gangs_whatever_their_priority() -> None:
    mgr, cache, kube, _ = setup(workload("mine", 2))
    book = mgr.admission
    assert isinstance(book, QueueBook)
    book.replace_queues(
        [
            {"metadata": {"name": "a"}, "spec": {}},
            {"metadata": {"name": "b"}, "spec": {"deserved": {"gpu": 16}}},
        ]
    )
    for g, nodes in (("low0", ("n0", "n1")), ("low1", ("n2", "n3"))):  # queue a deserves nothing: all borrowed
        for i, where in enumerate(nodes):
            cache.pod_event(
                "MODIFIED", prioritized(member(f"{g}-{i}", g, node_name=where), 10, **{"phalanx.io/queue": "a"})
            )
    book.note_scheduler("default-scheduler")
    mine = add(cache, *(prioritized(member(f"mine-{i}", "mine"), 0, **{"phalanx.io/queue": "b"}) for i in range(2)))
    mgr.filter(mine[0], [f"n{i}" for i in range(4)])
    sweep(mgr)
    assert len(evictions(kube, 2)) == 2 and {k.rsplit("-", 1)[0] for k in kube.evicted} in (
        {"default/low0"},
        {"default/low1"},
    )


def test_a_replica_that_does_not_lead_evicts_nothing_not_even_a_dry_run() -> None:
    mgr, cache, kube, _ = setup(workload("high", 2))
    assert mgr.preemptor is not None
    mgr.preemptor.binder = Binder(kube, fence=lambda: "the scheduler beside this replica does not lead")
    high = add(cache, *(prioritized(member(f"high-{i}", "high"), 1000) for i in range(2)))
    mgr.filter(high[0], [f"n{i}" for i in range(4)])
    sweep(mgr)
    assert not [c for c in kube.calls if c[1].endswith("/eviction")]
    assert not mgr.gangs["wl:default/high"].plan


def test_a_pod_evicted_for_one_gang_is_never_a_victim_for_another() -> None:
    """Until the first gang's victims are gone they still count on their nodes: a second gang
    must evict other units, not plan into the devices the first one holds."""
    mgr, cache, kube, _ = setup(workload("high-a", 2), workload("high-b", 2))
    a = add(cache, *(prioritized(member(f"high-a-{i}", "high-a"), 1000) for i in range(2)))
    b = add(cache, *(prioritized(member(f"high-b-{i}", "high-b"), 1000) for i in range(2)))
    names = [f"n{i}" for i in range(4)]
    mgr.filter(a[0], names)
    sweep(mgr)
    assert len(evictions(kube, 2)) == 2
    mgr.filter(b[0], names)
    sweep(mgr)
    assert evictions(kube, 4) == ["default/low0-0", "default/low0-1", "default/low1-0", "default/low1-1"]


def queued(mgr: GangManager, cache: Cache, queues: list[dict[str, Any]], where: dict[str, str]) -> None:
    """Queues on, and the low gangs moved into queues: {gang: queue}."""
    book = mgr.admission
    assert isinstance(book, QueueBook)
    book.replace_queues(queues)
    for g, nodes, priority in (("low0", ("n0", "n1"), 10), ("low1", ("n2", "n3"), 20)):
        for i, node_name in enumerate(nodes):
            p = member(f"{g}-{i}", g, node_name=node_name, annotations=EIGHT)
            cache.pod_event("MODIFIED", prioritized(p, priority, **{"phalanx.io/queue": where[g]}))
    book.note_scheduler("default-scheduler")


def test_a_gang_its_queue_limit_refuses_evicts_lower_priority_work_of_that_queue() -> None:
    """Queue a at its 16-GPU limit with low0 (priority 10); a priority-1000 gang of a evicts
    low0 (frees both the quota and the room), not low1 of another queue."""
    mgr, cache, kube, _ = setup(workload("high", 2))
    queued(
        mgr,
        cache,
        [{"metadata": {"name": "a"}, "spec": {"limit": {"gpu": 16}}}, {"metadata": {"name": "b"}, "spec": {}}],
        {"low0": "a", "low1": "b"},
    )
    high = add(cache, *(prioritized(member(f"high-{i}", "high"), 1000, **{"phalanx.io/queue": "a"}) for i in range(2)))
    mgr.filter(high[0], [f"n{i}" for i in range(4)])  # refused by the limit, then preempts in its queue
    sweep(mgr)
    assert evictions(kube, 2) == ["default/low0-0", "default/low0-1"]
    assert mgr.gangs["wl:default/high"].plan  # reserved on the nodes low0 leaves


def test_a_queue_within_its_deserved_quota_reclaims_even_when_its_parent_is_at_its_limit() -> None:
    """org (limit 32) = a (borrowing all 32, deserves 0) + b (deserves 16): b's 16-GPU gang
    evicts one of a's gangs although org is at its limit."""
    mgr, cache, kube, _ = setup(workload("mine", 2))
    queued(
        mgr,
        cache,
        [
            {"metadata": {"name": "org"}, "spec": {"limit": {"gpu": 32}}},
            {"metadata": {"name": "a"}, "spec": {"parent": "org"}},
            {"metadata": {"name": "b"}, "spec": {"parent": "org", "deserved": {"gpu": 16}}},
        ],
        {"low0": "a", "low1": "a"},
    )
    mine = add(cache, *(prioritized(member(f"mine-{i}", "mine"), 0, **{"phalanx.io/queue": "b"}) for i in range(2)))
    mgr.filter(mine[0], [f"n{i}" for i in range(4)])
    sweep(mgr)
    assert evictions(kube, 2) == ["default/low0-0", "default/low0-1"]  # the cheaper of a's two gangs


def test_a_victim_search_put_off_by_its_throttle_runs_later_without_any_cluster_change() -> None:
    """kube-scheduler stops asking for a parked gang; the sweep must search again once the
    throttle allows, even though nothing in the cluster moved since its last plan."""
    mgr, cache, kube, _ = setup(workload("high", 2))
    preemptor, mgr.preemptor = mgr.preemptor, None
    high = add(cache, *(prioritized(member(f"high-{i}", "high"), 1000) for i in range(2)))
    mgr.filter(high[0], [f"n{i}" for i in range(4)])  # not placed; no preemption yet
    mgr.preemptor = preemptor
    state = mgr.gangs["wl:default/high"]
    state.preempt_tried = time.monotonic()  # as if a search had just run: throttled
    mgr._last_retry = 0.0
    mgr.sweep()
    assert kube.evicted == []
    state.preempt_tried -= 10
    state.swept -= 10
    mgr._last_retry = 0.0
    mgr.sweep()
    assert len(evictions(kube, 2)) == 2


def test_a_filter_call_never_searches_for_victims_the_sweep_does() -> None:
    """The victim search and its dry-run evictions are API calls and solves: never inside
    kube-scheduler's scheduling cycle."""
    mgr, cache, kube, _ = setup(workload("high", 2))
    high = add(cache, *(prioritized(member(f"high-{i}", "high"), 1000) for i in range(2)))
    mgr.filter(high[0], [f"n{i}" for i in range(4)])
    mgr.preempt_for(high[0])
    assert not [c for c in kube.calls if c[1].endswith("/eviction")]
    sweep(mgr)
    assert len(evictions(kube, 2)) == 2
