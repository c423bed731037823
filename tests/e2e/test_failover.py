"""HA failover through the real kube-scheduler: two replicas of the shipped Deployment, the
leading one killed while a 32-member gang is being placed (before quorum, with 31 members
waiting at the gate, with half of it bound); every gang ends whole on the new leader, never partial, and no device is
claimed twice. `python -m benchmarks.kwok_failover` runs the same for 20 kills."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import kwok_failover
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.e2e


def test_killing_the_leader_leaves_no_partial_gang_and_no_double_booked_device(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    result = kwok_failover.run(cluster, tmp_path, kills=3)
    print({k: v for k, v in result.items() if k != "trials"})
    for trial in result["trials"]:
        print(trial)
    assert result["partial_gangs"] == 0
    assert result["double_booked_devices"] == 0
    assert result["unplaced_gangs"] == 0  # capacity suffices: the new leader places each gang whole
    assert result["gangs_split_across_racks"] == 0  # required rack holds across the failover
