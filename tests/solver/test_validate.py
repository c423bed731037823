"""The oracle tested: every check of the plan validator rejects its own hand-made bad plan with
its own reason, and a valid plan of each family passes every check.

The scene below (one CPU-and-GPU node per rack, a cordoned node, a node with static MIG slices
and one with a partitionable H100); each case builds what it needs from it:

    block b0
    ├── rack r0   n0  cpu 4000m (1000m used), 4 GiB, 4 pods, 2 NICs
    │                 gpu0 idle A100 (100 TFLOPs), gpu1 half shared (500 milli, 20 GiB, 50 TFLOPs free)
    ├── rack r1   n1  like n0          cordoned  like n0, unschedulable
    └── rack r2   mig gpu0 static MIG (2 x 1g.10gb, 1 x 3g.40gb free)
                  h100 gpu0 partitionable H100, idle; gpu1 partitionable, 3g.40gb cut at 4;
                       gpu2 partitionable, half shared
"""

from __future__ import annotations

from typing import cast

import pytest

from solver import (
    ClusterSnapshot,
    DeviceAssignment,
    EqGroup,
    GangName,
    GangPlan,
    GangRequest,
    GpuDemand,
    GpuDevice,
    MigSlice,
    Node,
    NodeName,
    Outcome,
    PlanResult,
    PodShape,
    Resources,
    Slice,
    SolveStatus,
    SubGroup,
    TopologyRequest,
    load_tables,
)
from solver import validate as validator
from solver.mig import MigSlot
from solver.model import Assignment
from solver.validate import CHECKS, validate, violations
from tests.validator_mutations import disable

LEVELS = ("block", "rack", "kubernetes.io/hostname")
NIC = "example.com/nic"
H100 = load_tables().table_for("NVIDIA-H100-80GB-HBM3")
assert H100 is not None


def gpu(index: int = 0, **kw: object) -> GpuDevice:
    """An idle A100 40 GB with 100 TFLOPs unless told otherwise."""
    fields: dict[str, object] = {"model": "A100", "memory_mib": 40960, "tflops": 100_000, **kw}
    return GpuDevice(index, **fields)  # type: ignore[arg-type]


def node(name: str, rack: str, *gpus: GpuDevice, unschedulable: bool = False) -> Node:
    alloc = Resources(4000, 4096, 4, ((NIC, 2),))
    path = ("b0", rack, name)
    return Node(NodeName(name), alloc, Resources(1000), topology=path, gpus=gpus, unschedulable=unschedulable)


SHARED = gpu(1, free_milli=500, free_memory_mib=20480, free_tflops=50_000)
SNAPSHOT = ClusterSnapshot(
    (
        node("n0", "r0", gpu(0), SHARED),
        node("n1", "r1", gpu(0), SHARED),
        node("cordoned", "r1", gpu(0), SHARED, unschedulable=True),
        node("mig", "r2", gpu(0, mig=(MigSlice("1g.10gb", 2), MigSlice("3g.40gb", 1)))),
        node(
            "h100",
            "r2",
            gpu(0, model="H100", memory_mib=81559, partition=H100),
            gpu(1, model="H100", memory_mib=81559, partition=H100, mig_layout=(MigSlot("3g.40gb", 4),)),
            gpu(2, model="H100", memory_mib=81559, partition=H100, free_milli=500),
        ),
    ),
    LEVELS,
)


NO_GPU = GpuDemand()


def pod(cpu: int = 1000, memory: int = 1024, gpu: GpuDemand = NO_GPU, *, extended: int = 0, **kw: object) -> PodShape:
    """`extended` NICs; other keywords go to PodShape (allowed_nodes, gpu_models)."""
    scalars = Resources(cpu, memory, 1, ((NIC, extended),) if extended else ())
    return PodShape(scalars, gpu, **kw)  # type: ignore[arg-type]


def request(
    shape: PodShape, count: int = 1, *, name: str = "g", min_count: int = 0, topology: TopologyRequest | None = None
) -> GangRequest:
    groups = (EqGroup("worker", shape, count),)
    return GangRequest(GangName(name), groups, min_count, topology or TopologyRequest())


def member(rank: int, on: str, *devices: DeviceAssignment, group: str = "worker", gang: str = "g") -> Assignment:
    return Assignment(GangName(gang), group, rank, NodeName(on), devices)


def placed(*members: Assignment, gang: str = "g") -> GangPlan:
    return GangPlan(GangName(gang), Outcome.PLACED, members)


def whole(index: int) -> DeviceAssignment:
    return DeviceAssignment(index)


def share(index: int, milli: int = 0, memory_mib: int = 0, tflops: int = 0) -> DeviceAssignment:
    return DeviceAssignment(index, milli, memory_mib, tflops=tflops)


def sliced(index: int, profile: str, start: int = -1) -> DeviceAssignment:
    return DeviceAssignment(index, 0, 0, profile, mig_start=start)


def with_subs(*subs: SubGroup, min_count: int = 0, leads: int = 2) -> GangRequest:
    """Leads (ranks 0..1) and two workers (ranks 2..3, or 0..1 without leads), in sub-groups."""
    groups = ((EqGroup("lead", pod(), leads),) if leads else ()) + (EqGroup("worker", pod(), 2),)
    return GangRequest(GangName("g"), groups, min_count, subgroups=subs)


ONE = request(pod())
TWO = request(pod(), 2)
WHOLE = request(pod(gpu=GpuDemand.whole(1)))
SHARE_300 = request(pod(gpu=GpuDemand.share(300)), 2)
MIG_1G = request(pod(gpu=GpuDemand.mig("1g.10gb")))
MIG_1G_TWICE = request(pod(gpu=GpuDemand.mig("1g.10gb")), 2)
RACK = TopologyRequest(required="rack")
HOST_PAIRS = TopologyRequest(slices=(Slice("kubernetes.io/hostname", 2),))

BadCase = tuple[str, list[GangRequest], tuple[GangPlan, ...]]

# (checks, requests, plan): the plan breaks the first named check's rule, and only the rules
# of the checks named (space-separated).
BAD = [
    pytest.param(
        "gang_known",
        [ONE],
        (placed(member(0, "n0")), GangPlan(GangName("ghost"), Outcome.UNSCHEDULABLE)),
        id="a plan answers a gang nobody asked for",
    ),
    pytest.param(
        "gang_answered_once",
        [ONE],
        (GangPlan(GangName("g"), Outcome.UNSCHEDULABLE), GangPlan(GangName("g"), Outcome.UNSCHEDULABLE)),
        id="a gang answered twice",
    ),
    pytest.param("gang_answered_once", [ONE], (), id="a gang left unanswered"),
    pytest.param(
        "gang_quorum",
        [request(pod(), 3, min_count=2)],
        (placed(member(0, "n0")),),
        id="a placed gang with fewer members than its minCount",
    ),
    pytest.param(
        "gang_all_or_nothing",
        [TWO],
        (GangPlan(GangName("g"), Outcome.UNSCHEDULABLE, (member(0, "n0"),)),),
        id="an unschedulable gang still holds a member",
    ),
    pytest.param(
        "member_gang",
        [ONE],
        (placed(member(0, "n0", gang="other")),),
        id="a member labelled with another gang's name",
    ),
    pytest.param(
        "member_node_known", [ONE], (placed(member(0, "nowhere")),), id="a member on a node the snapshot lacks"
    ),
    pytest.param(
        "member_group_known",
        [ONE],
        (placed(member(0, "n0", group="chief")),),
        id="a member in a group its gang lacks",
    ),
    pytest.param(
        "member_rank_in_group",
        [TWO],
        (placed(member(0, "n0"), member(5, "n0")),),
        id="a member ranked past its group's count",
    ),
    pytest.param(
        "member_rank_once",
        [TWO],
        (placed(member(0, "n0"), member(0, "n0")),),
        id="two members share one rank",
    ),
    pytest.param("node_cordoned", [ONE], (placed(member(0, "cordoned")),), id="a member on a cordoned node"),
    pytest.param(
        "node_allowed",
        [request(pod(allowed_nodes=frozenset({NodeName("n1")})))],
        (placed(member(0, "n0")),),
        id="a member on a node outside its allowed nodes",
    ),
    pytest.param(
        "node_cpu",
        [request(pod(cpu=2000), 2)],
        (placed(member(0, "n0"), member(1, "n0")),),
        id="two pods on one node exceed its free cpu",
    ),
    pytest.param(
        "node_memory",
        [request(pod(memory=3000), 2)],
        (placed(member(0, "n0"), member(1, "n0")),),
        id="two pods on one node exceed its memory",
    ),
    pytest.param(
        "node_pods",
        [request(pod(cpu=0, memory=0), 5)],
        (placed(*(member(i, "n0") for i in range(5))),),
        id="five pods on a node with four pod slots",
    ),
    pytest.param(
        "node_extended",
        [request(pod(extended=2), 2)],
        (placed(member(0, "n0"), member(1, "n0")),),
        id="two pods on one node take four of its two NICs",
    ),
    pytest.param(
        "node_extended",
        [request(PodShape(Resources(0, 0, 1, (("example.com/fpga", 1),))))],
        (placed(member(0, "n0")),),
        id="a pod takes an extended resource its node lacks",
    ),
    pytest.param("devices_unasked", [ONE], (placed(member(0, "n0", whole(0))),), id="a CPU-only pod gets a GPU"),
    pytest.param(
        "device_count",
        [request(pod(gpu=GpuDemand.whole(2)))],
        (placed(member(0, "n0", whole(0))),),
        id="a two-GPU pod gets one GPU",
    ),
    pytest.param(
        "device_twice",
        [request(pod(gpu=GpuDemand.share(300, count=2)))],
        (placed(member(0, "n0", share(0, 300), share(0, 300))),),
        id="a two-GPU share pod gets both shares on one GPU",
    ),
    pytest.param(
        "device_exists",
        [WHOLE],
        (placed(member(0, "n0", whole(7))),),
        id="a pod on GPU 7 of a node with two GPUs",
    ),
    pytest.param(
        "device_model",
        [request(pod(gpu=GpuDemand.whole(1), gpu_models=frozenset({"H100"})))],
        (placed(member(0, "n0", whole(0))),),
        id="a pod restricted to H100s on an A100",
    ),
    pytest.param(
        "grant_whole",
        [WHOLE],
        (placed(member(0, "n0", share(0, 500))),),
        id="a whole-GPU pod gets half a GPU",
    ),
    pytest.param(
        "grant_share",
        [request(pod(gpu=GpuDemand.share(300)))],
        (placed(member(0, "n0", share(0, 500))),),
        id="a share pod gets more than it asked for",
    ),
    pytest.param(
        "grant_mig",
        [MIG_1G],
        (placed(member(0, "mig", sliced(0, "3g.40gb"))),),
        id="a MIG pod gets a slice of another profile",
    ),
    pytest.param(
        "gpu_whole",
        [WHOLE],
        (placed(member(0, "n0", whole(1))),),
        id="a whole-GPU pod on a GPU someone already shares",
    ),
    pytest.param(
        "gpu_whole",
        [request(pod(gpu=GpuDemand.whole(1)), 2)],
        (placed(member(0, "n0", whole(0)), member(1, "n0", whole(0))),),
        id="two whole-GPU pods on one GPU",
    ),
    pytest.param(
        "gpu_share",
        [SHARE_300],
        (placed(member(0, "n0", share(1, 300)), member(1, "n0", share(1, 300))),),
        id="two share pods on one GPU exceed its free share",
    ),
    pytest.param(
        "gpu_memory",
        [request(pod(gpu=GpuDemand.share(0, 16384)), 2)],
        (placed(member(0, "n0", share(1, 0, 16384)), member(1, "n0", share(1, 0, 16384))),),
        id="two pods on one GPU exceed its free memory",
    ),
    pytest.param(
        "gpu_tflops",
        [request(pod(gpu=GpuDemand.share(100, tflops=30_000)), 2)],
        (placed(member(0, "n0", share(1, 100, 0, 30_000)), member(1, "n0", share(1, 100, 0, 30_000))),),
        id="two pods on one GPU exceed its free TFLOPs",
    ),
    pytest.param(
        "gpu_share_on_mig",
        [request(pod(gpu=GpuDemand.share(300)))],
        (placed(member(0, "mig", share(0, 300))),),
        id="a share pod on a MIG-partitioned GPU",
    ),
    pytest.param(
        "mig_static_slices",
        [request(pod(gpu=GpuDemand.mig("3g.40gb")), 2)],
        (placed(member(0, "mig", sliced(0, "3g.40gb")), member(1, "mig", sliced(0, "3g.40gb"))),),
        id="two 3g.40gb pods on a GPU with one free 3g.40gb slice",
    ),
    pytest.param(
        "mig_static_slices",
        [MIG_1G],
        (placed(member(0, "n0", sliced(0, "1g.10gb"))),),
        id="a static MIG slice taken from a GPU without MIG",
    ),
    pytest.param(
        "mig_partitionable",
        [MIG_1G],
        (placed(member(0, "n0", sliced(0, "1g.10gb", start=0))),),
        id="a slice cut on a GPU that cannot be partitioned",
    ),
    pytest.param(
        "mig_cut_exclusive",
        [MIG_1G],
        (placed(member(0, "h100", sliced(2, "1g.10gb", start=6))),),
        id="a slice cut on a partitionable GPU a share pod holds",
    ),
    pytest.param(
        "mig_cut_exclusive gpu_whole",
        [MIG_1G, request(pod(gpu=GpuDemand.whole(1)), name="w")],
        (
            placed(member(0, "h100", sliced(0, "1g.10gb", start=6))),
            placed(member(0, "h100", whole(0), gang="w"), gang="w"),
        ),
        id="a slice cut on a GPU that a whole-GPU pod takes in the same plan",
    ),
    pytest.param(
        "mig_layout",
        [request(pod(gpu=GpuDemand.mig("4g.40gb")))],
        (placed(member(0, "h100", sliced(1, "4g.40gb", start=4))),),
        id="a 4g.40gb cut at slice 4, over the 3g.40gb already there",
    ),
    pytest.param(
        "mig_layout",
        [MIG_1G_TWICE],
        (placed(member(0, "h100", sliced(0, "1g.10gb", start=3)), member(1, "h100", sliced(0, "1g.10gb", start=3))),),
        id="two slices cut at the same start",
    ),
    pytest.param(
        "topology_required",
        [request(pod(), 2, topology=RACK)],
        (placed(member(0, "n0"), member(1, "n1")),),
        id="a rack-required gang spread over two racks",
    ),
    pytest.param(
        "topology_required",
        [request(pod(), 2, topology=TopologyRequest(required="host"))],
        (placed(member(0, "n0"), member(1, "n1")),),
        id="a gang required on one host (a level not in the paths) on two hosts",
    ),
    pytest.param(
        "topology_slice_whole",
        [request(pod(cpu=0, memory=0), 4, min_count=3, topology=HOST_PAIRS)],
        (placed(member(0, "n0"), member(1, "n0"), member(2, "n0")),),
        id="three members placed in host slices of two",
    ),
    pytest.param(
        "topology_slice_domain",
        [request(pod(), 2, topology=HOST_PAIRS)],
        (placed(member(0, "n0"), member(1, "n1")),),
        id="a host slice of two split across two hosts",
    ),
    pytest.param(
        "subgroup_whole",
        [with_subs(SubGroup("a", ("lead",), 0), SubGroup("b", ("worker",), 1), min_count=2)],
        (placed(member(0, "n0", group="lead"), member(2, "n0"), member(3, "n1")),),
        id="a sub-group of two placed with one member",
    ),
    pytest.param(
        "subgroup_quorum",
        [with_subs(SubGroup("a", ("lead",), 1), SubGroup("b", ("worker",), 1), min_count=1)],
        (placed(member(0, "n0", group="lead")),),
        id="one of two required sub-groups placed",
    ),
    pytest.param(
        "subgroup_required",
        [with_subs(SubGroup("a", ("lead",), 0, RACK), min_count=2)],
        (placed(member(0, "n0", group="lead"), member(1, "n1", group="lead")),),
        id="a rack-required sub-group spread over two racks",
    ),
    pytest.param(
        "subgroup_slice",
        [with_subs(SubGroup("b", ("worker",), 0, HOST_PAIRS), min_count=2, leads=0)],
        (placed(member(0, "n0"), member(1, "n1")),),
        id="a sub-group's host slice of two split across two hosts",
    ),
]


@pytest.mark.parametrize(("checks", "requests", "gangs"), BAD)
def test_a_bad_plan_is_rejected_by_its_check_with_its_reason(
    checks: str, requests: list[GangRequest], gangs: tuple[GangPlan, ...]
) -> None:
    result = PlanResult(SolveStatus.FEASIBLE, gangs)
    found = violations(SNAPSHOT, requests, result)
    assert {v.check for v in found} == set(checks.split())
    reasons = {c.name: c.reason for c in CHECKS}
    assert all(v.reason == reasons[v.check] for v in found)
    assert validate(SNAPSHOT, requests, result) == [v.message for v in found]


def test_every_check_has_a_bad_plan_of_its_own() -> None:
    """A check no bad plan names could be removed without a test noticing."""
    named = {cast(BadCase, p.values)[0].split()[0] for p in BAD}
    assert named == {c.name for c in CHECKS}


def test_checks_have_distinct_names_and_reasons() -> None:
    assert len({c.name for c in CHECKS}) == len({c.reason for c in CHECKS}) == len(CHECKS)


LEADER = EqGroup("leader", pod(allowed_nodes=frozenset({NodeName("n0")})), 1)
WORKERS = EqGroup("worker", pod(), 2)
FILLER = PodShape(Resources(1500, 2048, 2, ((NIC, 1),)))
A100_ONLY = frozenset({"A100"})

# (requests, plan): valid plans, each at the edge of one family of checks.
GOOD = [
    pytest.param(
        [request(pod(), 3, min_count=2), request(pod(), name="late")],
        (placed(member(0, "n0"), member(1, "n0")), GangPlan(GangName("late"), Outcome.UNSCHEDULABLE)),
        id="gangs: one placed at its minCount, one not placed and empty",
    ),
    pytest.param(
        [GangRequest(GangName("g"), (LEADER, WORKERS))],
        (placed(member(0, "n0", group="leader"), member(1, "n1"), member(2, "n1")),),
        id="members: a leader and two workers in their own ranks, the leader on its allowed node",
    ),
    pytest.param(
        [request(FILLER, 2)],
        (placed(member(0, "n0"), member(1, "n0")),),
        id="node scalars: two pods fill a node's cpu, memory, pod slots and NICs exactly",
    ),
    pytest.param(
        [
            request(pod(gpu=GpuDemand.whole(1), gpu_models=A100_ONLY), name="whole"),
            request(pod(gpu=GpuDemand.share(300)), name="share"),
            request(pod(gpu=GpuDemand.share(200, count=2)), name="multi"),
            request(pod(gpu=GpuDemand.mig("1g.10gb")), name="mig"),
        ],
        (
            placed(member(0, "n0", DeviceAssignment(0, 1000, 40960), gang="whole"), gang="whole"),
            placed(member(0, "n0", share(1, 300), gang="share"), gang="share"),
            placed(member(0, "n1", share(0, 200), share(1, 200), gang="multi"), gang="multi"),
            placed(member(0, "mig", sliced(0, "1g.10gb"), gang="mig"), gang="mig"),
        ),
        id="device grants: whole, share, two-GPU share and MIG pods get what they asked for",
    ),
    pytest.param(
        [request(pod(gpu=GpuDemand.share(250, 10240, tflops=25_000)), 2)],
        (placed(member(0, "n0", share(1, 250, 10240, 25_000)), member(1, "n0", share(1, 250, 10240, 25_000))),),
        id="device capacity: two pods fill a shared GPU's share, memory and TFLOPs exactly",
    ),
    pytest.param(
        [request(pod(gpu=GpuDemand.mig("1g.10gb", 2)), name="two"), request(pod(gpu=GpuDemand.mig("3g.40gb")))],
        (
            placed(member(0, "mig", sliced(0, "1g.10gb"), sliced(0, "1g.10gb"), gang="two"), gang="two"),
            placed(member(0, "mig", sliced(0, "3g.40gb"))),
        ),
        id="static MIG: every free slice taken, two of them by one pod",
    ),
    pytest.param(
        [
            request(pod(gpu=GpuDemand.mig("3g.40gb")), name="a"),
            MIG_1G,
            request(pod(gpu=GpuDemand.mig("4g.40gb")), name="b"),
        ],
        (
            placed(member(0, "h100", sliced(0, "3g.40gb", start=4), gang="a"), gang="a"),
            placed(member(0, "h100", sliced(0, "1g.10gb", start=0))),
            placed(member(0, "h100", sliced(1, "4g.40gb", start=0), gang="b"), gang="b"),
        ),
        id="dynamic MIG: slices cut on an idle GPU and beside a slice already there",
    ),
    pytest.param(
        [request(pod(), 4, topology=TopologyRequest(required="block", slices=HOST_PAIRS.slices))],
        (placed(member(0, "n0"), member(1, "n0"), member(2, "n1"), member(3, "n1")),),
        id="topology: a block-required gang in host slices of two",
    ),
    pytest.param(
        [request(pod(), 2, topology=TopologyRequest(required="host"))],
        (placed(member(0, "n1"), member(1, "n1")),),
        id="topology: a gang required on one host (a level not in the paths) on one host",
    ),
]


@pytest.mark.parametrize(("requests", "gangs"), GOOD)
def test_a_valid_plan_passes_every_check(requests: list[GangRequest], gangs: tuple[GangPlan, ...]) -> None:
    """Pins down that no check rejects everything: a check that did would fail here."""
    assert validate(SNAPSHOT, requests, PlanResult(SolveStatus.FEASIBLE, gangs)) == []


@pytest.mark.parametrize("check", [c.name for c in CHECKS])
def test_the_bad_plans_notice_when_a_check_is_disabled(check: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process form of tests/validator_mutations.py on this table: with `check` replaced by
    one that reports nothing (the script's own `disable`), some bad plan is no longer rejected
    as the table says."""
    monkeypatch.setattr(validator, "CHECKS", validator.CHECKS)  # restored after the test
    disable(check)
    assert [c.name for c in validator.CHECKS] == [c.name for c in CHECKS]
    missed = []
    for p in BAD:
        checks, requests, gangs = cast(BadCase, p.values)
        found = {v.check for v in violations(SNAPSHOT, requests, PlanResult(SolveStatus.FEASIBLE, gangs))}
        if found != set(checks.split()):
            missed.append(p.id)
    assert missed
