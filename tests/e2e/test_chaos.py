"""The quick subset of the fault suite (benchmarks/chaos.py) as assertions, on the session cluster.

The extender runs as a subprocess that the suite SIGKILLs and restarts; kube-apiserver is
killed and restarted on its port once. Every wait inside the suite is on a condition with a
deadline. Figures (bind times, RSS) are the benchmark's to record; here only the invariants
are asserted: every creation order binds, no partial gang, no device booked twice, no crash,
no 5xx, every hostile pod reported and none blocking readiness or other pods.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks import chaos
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def harness(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[chaos.Harness]:
    with chaos.attach(cluster, tmp_path_factory.mktemp("chaos")) as h:
        yield h
        assert h.ext.start_failures == [], f"the extender exited while starting; see {h.ext.log}"


def test_every_creation_order_of_crd_workload_pods_and_restart_binds_the_gang(harness: chaos.Harness) -> None:
    result = chaos.creation_orders(harness, chaos.QUICK_ORDERS, settle_s=30)
    assert result["not_bound"] == [], str(result)


def test_extender_kills_during_gang_binds_leave_no_partial_gang_and_no_device_booked_twice(
    harness: chaos.Harness,
) -> None:
    result = chaos.kills(harness, chaos.QUICK.kills, chaos.kill_extender)
    assert result["partial_gangs"] == 0, str(result)
    assert result["double_booked_devices"] == 0, str(result)
    assert result["unbound_gangs"] == 0 and result["unbound_singles"] == 0, str(result)
    assert result["crashes"] == 0, str(result)


def test_an_apiserver_kill_during_scheduling_leaves_every_gang_whole_and_everything_bound(
    harness: chaos.Harness,
) -> None:
    result = chaos.kills(harness, chaos.QUICK.apiserver_kills, chaos.kill_apiserver)
    assert result["partial_gangs"] == 0, str(result)
    assert result["double_booked_devices"] == 0, str(result)
    assert result["unbound_gangs"] == 0 and result["unbound_singles"] == 0, str(result)
    assert result["crashes"] == 0, str(result)


def test_hostile_pods_are_reported_and_block_neither_readiness_nor_other_pods(harness: chaos.Harness) -> None:
    result = chaos.hostile_pods(harness, chaos.QUICK.hostile)
    assert result["unreported"] == [], str(result)
    assert result["ready_after_restart_s"] is not None, str(result)
    assert result["good_pods_blocked"] == 0, str(result)
    assert result["binds_expected_not_bound"] == [], str(result)
    assert result["forged_node_overcommit"] == 0, str(result)
    assert result["double_booked_devices"] == 0, str(result)


def test_malformed_and_slow_http_crashes_nothing_and_answers_no_5xx(harness: chaos.Harness) -> None:
    result = chaos.malformed_http(harness, chaos.QUICK.requests, slow=chaos.QUICK.slow, hold_s=chaos.QUICK.hold_s)
    assert result["crashes"] == 0, str(result)
    assert result["http_5xx"] == 0, str(result)
    assert result["timeouts"] == 0, str(result)
    assert result["slow"]["threads_settled"], str(result)
