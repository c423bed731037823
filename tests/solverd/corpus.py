"""Solver inputs covering every field of the model, for the codec and the service: whole,
share (memory, TFLOPs), static and dynamic MIG, model and node restrictions, preferred-node
tiers, sub-groups, slices, balanced and invalid topology requests, fragmentation workload."""

from __future__ import annotations

from dataclasses import replace

from benchmarks.solver_scale import SIZES, Case, planted_slices, random_instance
from solver import (
    ClusterSnapshot,
    EqGroup,
    GangName,
    GangRequest,
    GpuDemand,
    GpuDevice,
    MigSlice,
    MigSlot,
    Node,
    NodeName,
    PlacementMode,
    PodShape,
    Resources,
    ScoreBand,
    SolverParams,
    SubGroup,
    TopologyRequest,
    UnlabeledNodes,
    WorkloadClass,
    load_tables,
)
from tests.solver.builders import drawn, gang, share, whole

H100 = load_tables().table_for("NVIDIA-H100-80GB-HBM3")
Scenario = tuple[str, ClusterSnapshot, list[GangRequest], SolverParams]
# One search worker: with several, CP-SAT may return another of several optimal plans.
EXACT = SolverParams(workers=1)


def mig_cluster() -> ClusterSnapshot:
    """Two H100 nodes with dynamic MIG (one with a slice cut) and one A100 node with static
    slices, TFLOPs and an extended resource."""
    nodes = []
    for n in range(2):
        layout = {0: (MigSlot("1g.10gb", 0),)} if n == 0 else {}
        gpus = tuple(
            GpuDevice(i, "H100-80GB-HBM3", 81559, partition=H100, mig_layout=layout.get(i, ())) for i in range(4)
        )
        labels = {"rack": "r0", "kubernetes.io/hostname": f"h{n}"}
        nodes.append(
            Node(NodeName(f"h{n}"), Resources(64000, 512000, 110), labels=labels, topology=("r0", f"h{n}"), gpus=gpus)
        )
    half = GpuDevice(1, "A100-SXM4-80GB", 81920, 500, 40960, tflops=312000, free_tflops=150000)
    sliced = GpuDevice(3, "A100-SXM4-80GB", 81920, mig=(MigSlice("1g.10gb", 7),), tflops=312000)
    static = (GpuDevice(0, "A100-SXM4-80GB", 81920, tflops=312000), half, GpuDevice(2, "A100-SXM4-80GB", 81920), sliced)
    used = Resources(8000, 64000, 3, (("example.com/nic", 1),))
    allocatable = Resources(64000, 512000, 110, (("example.com/nic", 4),))
    nodes.append(
        Node(NodeName("a0"), allocatable, used, {"rack": "r1"}, ("dedicated=x:NoSchedule",), ("r1", "a0"), static, True)
    )
    return ClusterSnapshot(tuple(nodes), ("rack", "hostname"), generation=7)


def scenarios() -> list[Scenario]:
    small = drawn()
    pinned = PodShape(
        Resources(500, 512, 1, (("example.com/nic", 1),)),
        GpuDemand.share(250, 10240, tflops=50000),
        allowed_nodes=frozenset({NodeName("a0"), NodeName("h1")}),
        gpu_models=frozenset({"A100-SXM4-80GB", "H100-80GB-HBM3"}),
    )
    tiered = GangRequest(
        GangName("tiered"),
        (
            EqGroup("leader", whole(1), 1, node_scores=((NodeName(small.nodes[0].name), 100),), tiers=(ScoreBand(50),)),
            EqGroup("worker", whole(4), 3, tiers=(ScoreBand(10, 90, rank=1),)),
        ),
        min_count=3,
        topology=TopologyRequest(required="block", preferred="rack", balanced=True),
        priority=2_000_000_000,
        subgroups=(SubGroup("pair", ("leader", "worker"), 2, TopologyRequest(required="rack")),),
        min_subgroups=1,
    )
    workload = SolverParams(
        workers=1,
        placement_mode=PlacementMode.LOW_LOAD_FIRST,
        unlabeled_nodes=UnlabeledNodes.EMPTY_DOMAIN,
        workload=(
            WorkloadClass(1000, 500, 1, None, 0.6, 8192),
            WorkloadClass(4000, 1000, 2, frozenset({"H100-80GB-HBM3"}), 0.4),
        ),
    )
    case = Case("big", 1024, 64, 8, "required+preferred")
    assert case.nodes in SIZES
    return [
        ("whole and shares", small, [gang("a", whole(8), 4, required="rack"), gang("b", share(500, 4096), 6)], EXACT),
        ("slices, a minimum", small, [gang("s", whole(2), 8, required="block", slices=(("rack", 4),), min_count=4)], EXACT),  # noqa: E501
        ("an unknown level (its own unresolvable plan)", small, [gang("x", whole(1), 2, required="galaxy")], EXACT),
        ("tiers, sub-groups, balanced", small, [tiered], EXACT),
        ("MIG, TFLOPs, models, node lists", mig_cluster(), [
            gang("mig", PodShape(Resources(100, 256, 1), GpuDemand.mig("1g.10gb", 2)), 3),
            gang("pinned", pinned, 2),
            gang("cut", PodShape(Resources(100, 256, 1), GpuDemand.mig("3g.40gb")), 2),
        ], workload),
        ("1,024 nodes, 64 x 8 GPUs", *random_instance(case, 1), EXACT),
        ("planted slices", *planted_slices(replace(case, kind="slices"), 2), EXACT),
    ]  # fmt: skip
