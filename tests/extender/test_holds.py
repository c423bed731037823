"""Starvation holds: a gang that waited long at the head of its queue gets nodes held for it;
other work stays off them, except lower-priority backfill of its queue when allowed.

    n0 n1 n2 n3 (8 GPUs each), each running a 4-GPU pod of priority 100.
    big: 4 members x 8 GPUs, priority 50: fits only on an empty cluster, preempts nothing.
"""

from __future__ import annotations

import time
from typing import Any

from extender.config import QueuesConfig
from extender.gangs.manager import GangManager
from extender.objects import pod_info
from tests.extender.fakes import pod
from tests.extender.test_gangs import add, manager_with, member, workload

NAMES = [f"n{i}" for i in range(4)]


def with_priority(p: dict[str, Any], priority: int) -> dict[str, Any]:
    p["spec"]["priority"] = priority
    return p


def starving(*, backfill: bool = True) -> GangManager:
    mgr, cache, _ = manager_with(4, workload("big", 4))
    mgr.queue_config = lambda: QueuesConfig(starvationSeconds=10, backfill=backfill)
    add(cache, *(with_priority(pod(f"busy{i}", gpus=4, node_name=f"n{i}"), 100) for i in range(4)))
    big = add(cache, *(with_priority(member(f"big-{i}", "big"), 50) for i in range(4)))
    answer = mgr.filter(big[0], NAMES)
    assert answer is not None and not answer.passed
    mgr.gangs["wl:default/big"].quorum_at = time.monotonic() - 60  # waited past starvationSeconds
    mgr.sweep()
    return mgr


def test_a_gang_starving_at_the_head_of_its_queue_gets_the_nodes_it_needs_held() -> None:
    mgr = starving()
    hold = mgr.holds.by_gang["wl:default/big"]
    assert hold.nodes == frozenset(NAMES) and hold.priority == 50
    assert mgr.describe()[0]["held"] == NAMES


def test_held_nodes_are_kept_from_other_work_of_equal_or_higher_priority() -> None:
    mgr = starving()
    assert mgr.held_against(pod_info(with_priority(pod("rival", gpus=4), 100))) == frozenset(NAMES)


def test_lower_priority_backfill_of_the_same_queue_may_use_held_nodes() -> None:
    assert starving().held_against(pod_info(with_priority(pod("filler", gpus=4), 10))) == frozenset()


def test_without_backfill_held_capacity_stays_idle() -> None:
    mgr = starving(backfill=False)
    assert mgr.held_against(pod_info(with_priority(pod("filler", gpus=4), 10))) == frozenset(NAMES)


def test_a_hold_ends_when_its_time_is_up() -> None:
    mgr = starving()
    hold = mgr.holds.by_gang["wl:default/big"]
    mgr.holds.by_gang[hold.gang] = type(hold)(hold.gang, hold.queue, hold.priority, hold.nodes, time.monotonic() - 1)
    mgr._last_starving = time.monotonic()  # no new hold in this sweep
    mgr.sweep()
    assert "wl:default/big" not in mgr.holds.by_gang


def test_a_gang_that_has_not_waited_long_gets_no_hold() -> None:
    mgr, cache, _ = manager_with(4, workload("big", 4))
    mgr.queue_config = lambda: QueuesConfig(starvationSeconds=600)
    add(cache, *(with_priority(pod(f"busy{i}", gpus=4, node_name=f"n{i}"), 100) for i in range(4)))
    big = add(cache, *(with_priority(member(f"big-{i}", "big"), 50) for i in range(4)))
    mgr.filter(big[0], NAMES)
    mgr.sweep()
    assert mgr.holds.by_gang == {}
