"""Dynamic MIG in the device model: the solver cuts slices on partitionable GPUs, layouts stay
valid for the model, and a GPU is either whole/shared or in MIG mode, never both.

Nodes below have 2 partitionable H100 80GB GPUs each unless a test says otherwise.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from solver import NodeState, plan
from solver.mig import MigSlot, load_tables, violations
from solver.model import (
    ClusterSnapshot,
    EqGroup,
    GangName,
    GangRequest,
    GpuDemand,
    GpuDevice,
    GpuKind,
    Node,
    NodeName,
    Outcome,
    PodShape,
    Resources,
)
from solver.validate import validate

H100 = load_tables().table_for("NVIDIA-H100-80GB-HBM3")
assert H100 is not None
PROFILES = [p.name for p in H100.profiles]


def dynamic_node(name: str = "n0", gpus: int = 2, layouts: dict[int, tuple[MigSlot, ...]] | None = None) -> Node:
    layouts = layouts or {}
    devices = tuple(
        GpuDevice(i, "H100-80GB-HBM3", 81559, partition=H100, mig_layout=layouts.get(i, ())) for i in range(gpus)
    )
    return Node(NodeName(name), Resources(128_000, 1 << 20, 110), gpus=devices, topology=(name,))


def mig_pod(profile: str, count: int = 1) -> PodShape:
    return PodShape(Resources(pods=1), GpuDemand.mig(profile, count))


def layouts(state: NodeState) -> dict[int, tuple[MigSlot, ...]]:
    return {d.index: d.mig_layout for d in state.devices}


def test_a_first_small_slice_keeps_the_large_profiles_placeable() -> None:
    """1g.10gb on an empty GPU goes to the last memory slice: 4g.40gb@0 and 3g.40gb@4 stay possible."""
    state = NodeState(dynamic_node(gpus=1))
    (a,) = state.take(mig_pod("1g.10gb")) or ()
    assert (a.index, a.mig_profile, a.mig_start) == (0, "1g.10gb", 6)
    assert state.capacity(mig_pod("4g.40gb")) == 1
    assert state.capacity(mig_pod("7g.80gb")) == 0


def test_slices_go_to_a_gpu_already_in_mig_mode_before_an_idle_one() -> None:
    node = dynamic_node(layouts={1: (MigSlot("3g.40gb", 0),)})
    (a,) = NodeState(node).take(mig_pod("3g.40gb")) or ()
    assert (a.index, a.mig_start) == (1, 4)


def test_a_gpu_in_mig_mode_takes_no_whole_or_shared_pod() -> None:
    node = dynamic_node(layouts={0: (MigSlot("1g.10gb", 6),)})
    state = NodeState(node)
    assert state.capacity(PodShape(gpu=GpuDemand.whole(2))) == 0
    assert state.capacity(PodShape(gpu=GpuDemand.whole(1))) == 1
    taken = state.take(PodShape(gpu=GpuDemand.share(500)))
    assert taken is not None and taken[0].index == 1


def test_a_shared_gpu_is_not_cut() -> None:
    state = NodeState(dynamic_node(gpus=1))
    assert state.take(PodShape(gpu=GpuDemand.share(250))) is not None
    assert state.capacity(mig_pod("1g.10gb")) == 0


def test_gang_of_mig_pods_is_planned_with_valid_layouts() -> None:
    """7 × 3g.40gb on 2 nodes × 2 GPUs (2 per GPU): the plan cuts 7 valid slices, the validator agrees."""
    snapshot = ClusterSnapshot((dynamic_node("n0"), dynamic_node("n1")), ("kubernetes.io/hostname",))
    gang = GangRequest(GangName("g"), (EqGroup("w", mig_pod("3g.40gb"), 7),))
    result = plan(snapshot, [gang])
    assert result.gang("g").outcome is Outcome.PLACED
    assert validate(snapshot, [gang], result) == []
    per_device: dict[tuple[str, int], list[MigSlot]] = {}
    for a in result.gang("g").assignments:
        for d in a.devices:
            per_device.setdefault((a.node, d.index), []).append(MigSlot(d.mig_profile, d.mig_start))
    assert sum(len(v) for v in per_device.values()) == 7
    assert all(violations(H100, tuple(v)) == [] for v in per_device.values())


def test_a_gang_that_needs_more_slices_than_can_be_cut_is_not_placed() -> None:
    snapshot = ClusterSnapshot((dynamic_node("n0"),), ("kubernetes.io/hostname",))
    gang = GangRequest(GangName("g"), (EqGroup("w", mig_pod("4g.40gb"), 3),))
    result = plan(snapshot, [gang])
    assert result.gang("g").outcome is not Outcome.PLACED and not result.gang("g").assignments


def test_validator_rejects_an_overlapping_cut() -> None:
    from solver.model import Assignment, DeviceAssignment, GangPlan, PlanResult, SolveStatus

    snapshot = ClusterSnapshot((dynamic_node("n0", layouts={0: (MigSlot("3g.40gb", 4),)}),), ())
    gang = GangRequest(GangName("g"), (EqGroup("w", mig_pod("4g.40gb"), 1),))
    bad = DeviceAssignment(0, 0, 0, "4g.40gb", mig_start=4)
    result = PlanResult(
        SolveStatus.FEASIBLE,
        (GangPlan(GangName("g"), Outcome.PLACED, (Assignment(GangName("g"), "w", 0, NodeName("n0"), (bad,)),)),),
    )
    errors = validate(snapshot, [gang], result)
    assert errors and any("cannot start at memory slice 4" in e or "overlap" in e for e in errors)


DEMANDS = st.one_of(
    st.sampled_from(PROFILES).map(lambda p: GpuDemand.mig(p)),
    st.just(GpuDemand.whole(1)),
    st.integers(100, 900).map(lambda m: GpuDemand.share(m)),
)


@given(st.lists(DEMANDS, min_size=1, max_size=25))
@settings(max_examples=150, deadline=None)
def test_any_sequence_of_pods_keeps_every_gpu_valid(demands: list[GpuDemand]) -> None:
    """Whatever arrives, each GPU ends whole-used, shared, idle or cut into a layout valid for
    H100 — never a mix."""
    state = NodeState(dynamic_node(gpus=2))
    users: dict[int, set[GpuKind]] = {0: set(), 1: set()}
    for demand in demands:
        for a in state.take(PodShape(Resources(pods=1), demand)) or ():
            users[a.index].add(demand.kind)
    for d in state.devices:
        assert violations(H100, d.mig_layout) == []
        assert len(users[d.index]) <= 1, users
        if d.mig_layout:
            assert d.free_milli == 1000 and users[d.index] == {GpuKind.MIG}
