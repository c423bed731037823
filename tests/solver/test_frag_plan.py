"""Gangs placed with a target workload: devices go where fragmentation grows least, and the
plan stays valid (the validator is the oracle)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from solver import plan
from solver.frag import WorkloadClass
from solver.model import (
    ClusterSnapshot,
    EqGroup,
    GangName,
    GangRequest,
    GpuDemand,
    GpuDevice,
    Node,
    NodeName,
    Outcome,
    PodShape,
    Resources,
)
from solver.params import SolverParams
from solver.validate import validate

WORKLOAD = (
    WorkloadClass(cpu_milli=1000, gpu_milli=1000, num_gpu=1, models=None, probability=0.5),
    WorkloadClass(cpu_milli=1000, gpu_milli=500, num_gpu=1, models=None, probability=0.5),
)


def node(name: str, free: list[int]) -> Node:
    gpus = tuple(GpuDevice(i, "A100", 81920, f) for i, f in enumerate(free))
    return Node(NodeName(name), Resources(64_000, 1 << 20, 110), gpus=gpus, topology=(name,))


def test_share_members_fill_half_used_gpus_first() -> None:
    snapshot = ClusterSnapshot((node("n0", [1000, 500, 1000, 500]),), ("kubernetes.io/hostname",))
    gang = GangRequest(GangName("g"), (EqGroup("w", PodShape(Resources(1000, 0, 1), GpuDemand.share(500)), 2),))
    result = plan(snapshot, [gang], params=SolverParams(workload=WORKLOAD))
    assert result.gang("g").outcome is Outcome.PLACED and validate(snapshot, [gang], result) == []
    assert sorted(d.index for a in result.gang("g").assignments for d in a.devices) == [1, 3]


@given(
    frees=st.lists(st.lists(st.sampled_from([0, 250, 500, 750, 1000]), min_size=2, max_size=4), min_size=1, max_size=4),
    milli=st.sampled_from([250, 500, 1000]),
    count=st.integers(1, 6),
)
@settings(max_examples=60, deadline=None)
def test_plans_with_a_workload_are_always_valid(frees: list[list[int]], milli: int, count: int) -> None:
    snapshot = ClusterSnapshot(tuple(node(f"n{i}", f) for i, f in enumerate(frees)), ("kubernetes.io/hostname",))
    demand = GpuDemand.whole(1) if milli == 1000 else GpuDemand.share(milli)
    gang = GangRequest(GangName("g"), (EqGroup("w", PodShape(Resources(1000, 0, 1), demand), count),))
    result = plan(snapshot, [gang], params=SolverParams(workload=WORKLOAD))
    assert validate(snapshot, [gang], result) == []
