"""Fragmentation measures (solver.frag): FGD's formula on hand-computed nodes, the class
builder, Phalanx's CPU cap, the numpy and scalar faces agreeing, and the trace replay's
invariants on a tiny synthetic trace."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from benchmarks import trace_replay
from solver.frag import (
    Demand,
    Policy,
    WorkloadClass,
    node_fragmentation,
    placement_delta,
    workload_classes,
    workload_drift,
)
from solver.frag_arrays import ClassTable, candidate_deltas, fgd_score, fragmentation
from solver.model import GpuDemand, GpuDevice, MigSlice, Node, NodeName, PodShape, Resources

MODEL = "A100"


def node(free: list[int], *, cpu: int = 64_000, mem: int = 256_000, model: str = MODEL) -> Node:
    gpus = tuple(GpuDevice(index=i, model=model, memory_mib=80_000, free_milli=f) for i, f in enumerate(free))
    return Node(NodeName("n"), Resources(cpu_milli=cpu, memory_mib=mem, pods=110), gpus=gpus)


def cls(
    cpu: int, milli: int, num: int, p: float, *, mem: int = 0, models: frozenset[str] | None = None
) -> WorkloadClass:
    return WorkloadClass(cpu, milli, num, models, p, mem)


HALF, WHOLE, CPU_ONLY = cls(1000, 500, 1, 0.5), cls(1000, 1000, 1, 0.25), cls(1000, 0, 0, 0.25)


def shape(cpu: int, gpu: GpuDemand | None = None, *, mem: int = 0) -> PodShape:
    return PodShape(requests=Resources(cpu_milli=cpu, memory_mib=mem, pods=1), gpu=gpu or GpuDemand())


# ------------------------------------------------------------------------------ FGD formula


@pytest.mark.parametrize(
    ("free", "cpu", "classes", "expected"),
    [
        # T = 1300; HALF and WHOLE fit, each strands the 300 device; CPU_ONLY strands all.
        ([1000, 300], 10_000, (HALF, WHOLE, CPU_ONLY), 0.5 * 300 + 0.25 * 300 + 0.25 * 1300),
        # too little CPU for any class: every class strands all 1300
        ([1000, 300], 500, (HALF, WHOLE, CPU_ONLY), 1300),
        # a 2-GPU class needs two devices with a full share: only one, so all is fragment
        ([1000, 600], 10_000, (cls(1000, 1000, 2, 1.0),), 1600),
        # wrong model: the class can use nothing here
        ([1000, 1000], 10_000, (cls(1000, 1000, 1, 1.0, models=frozenset({"V100"})),), 2000),
        # no idle share, no fragment
        ([0, 0], 10_000, (HALF, WHOLE, CPU_ONLY), 0),
    ],
    ids=["mixed classes", "cpu exhausted", "multi-gpu lacks devices", "model mismatch", "full node"],
)
def test_fgd_fragmentation_matches_hand_computation(
    free: list[int], cpu: int, classes: tuple[WorkloadClass, ...], expected: float
) -> None:
    """FGD: fragment is all idle share if a class cannot run, else the devices below its share."""
    assert node_fragmentation(node(free, cpu=cpu), classes, Policy.FGD) == pytest.approx(expected)


def test_phalanx_counts_gpus_the_cpu_cannot_feed_as_fragment() -> None:
    """8 idle GPUs, 24 cores, 12-core 1-GPU pods: FGD sees no fragment, Phalanx sees 6 stranded GPUs."""
    n, classes = node([1000] * 8, cpu=24_000), (cls(12_000, 1000, 1, 1.0),)
    assert node_fragmentation(n, classes, Policy.FGD) == 0
    assert node_fragmentation(n, classes, Policy.PHALANX) == 6000


def test_phalanx_counts_memory_as_a_hard_limit() -> None:
    """A class whose typical memory no longer fits cannot use the node's GPUs."""
    n, classes = node([1000] * 2, mem=10_000), (cls(1000, 1000, 1, 1.0, mem=16_000),)
    assert node_fragmentation(n, classes, Policy.FGD) == 0
    assert node_fragmentation(n, classes, Policy.PHALANX) == 2000


def test_phalanx_sends_cpu_heavy_pods_where_cpu_is_plentiful() -> None:
    """FGD scores both nodes alike (one 12-core pod still fits); Phalanx sees the small node strand GPUs."""
    classes = (cls(12_000, 1000, 1, 0.8), cls(20_000, 0, 0, 0.2))
    pod = shape(20_000)
    small, big = node([1000] * 8, cpu=40_000), node([1000] * 8, cpu=200_000)
    fgd = [placement_delta(n, pod, classes, Policy.FGD).score for n in (small, big)]
    phalanx = [placement_delta(n, pod, classes, Policy.PHALANX).score for n in (small, big)]
    assert fgd[0] == fgd[1]
    assert phalanx[0] < phalanx[1]


def test_share_pod_goes_to_the_device_it_leaves_least_fragmented() -> None:
    """A 500 share on [1000, 500]: the 500 device (fills it) beats splitting the whole one."""
    placed = placement_delta(node([1000, 500]), shape(1000, GpuDemand.share(500)), (HALF, WHOLE, CPU_ONLY), Policy.FGD)
    assert placed.fits and placed.devices == (1,)
    assert placed.delta < 0


def test_placement_refuses_what_does_not_fit() -> None:
    """CPU, memory, model, device share and MIG are respected; nothing is placed beyond them."""
    classes = (HALF, WHOLE)
    assert not placement_delta(node([1000], cpu=500), shape(1000), classes).fits
    assert not placement_delta(node([1000], mem=100), shape(1000, mem=200), classes).fits
    assert not placement_delta(node([400, 400]), shape(1000, GpuDemand.share(500)), classes).fits
    assert not placement_delta(node([1000, 600]), shape(1000, GpuDemand.whole(2)), classes).fits
    v100_only = PodShape(requests=Resources(cpu_milli=1000), gpu=GpuDemand.whole(1), gpu_models=frozenset({"V100"}))
    assert not placement_delta(node([1000]), v100_only, classes).fits
    mig = GpuDevice(index=0, model=MODEL, memory_mib=80_000, mig=(MigSlice("1g.10gb", 7),))
    mig_node = Node(NodeName("m"), Resources(cpu_milli=8000, memory_mib=8000), gpus=(mig,))
    assert not placement_delta(mig_node, shape(1000, GpuDemand.mig("1g.10gb")), classes).fits


# ---------------------------------------------------------------------------- class builder


def test_classes_cover_95_percent_of_pods_most_frequent_first() -> None:
    """Top classes by count until 95 % of pods; probabilities renormalized; median memory kept."""
    demands = (
        [Demand(1000, 100, 1, 500)] * 60
        + [Demand(1000, 300, 1, 500)] * 1
        + [Demand(2000, 50, 1, 1000)] * 35
        + [Demand(4000, 10)] * 3
        + [Demand(8000, 10, 8, 1000)] * 1
    )
    classes = workload_classes(demands)
    assert [(c.cpu_milli, c.gpu_milli, c.num_gpu) for c in classes] == [(1000, 500, 1), (2000, 1000, 1)]
    assert sum(c.probability for c in classes) == pytest.approx(1.0)
    assert classes[0].probability == pytest.approx(61 / 96)
    assert classes[0].memory_mib == 100
    phalanx = workload_classes(demands, multi_gpu=True)  # the rare 8-GPU class stays in
    assert [(c.cpu_milli, c.gpu_milli, c.num_gpu) for c in phalanx] == [
        (1000, 500, 1),
        (2000, 1000, 1),
        (8000, 1000, 8),
    ]
    assert phalanx[2].probability == pytest.approx(1 / 97)


def test_classes_keep_gpu_models_apart_and_cpu_only_pods() -> None:
    """gpu_spec is part of the class; a CPU-only pod is a class with no GPU demand."""
    t4 = frozenset({"T4"})
    classes = workload_classes([Demand(1000, 0, 1, 1000, t4), Demand(1000, 0, 1, 1000), Demand(1000)])
    assert {(c.models, c.uses_gpu) for c in classes} == {(t4, True), (None, True), (None, False)}


# ------------------------------------------------------------------------- faces agree


def _random_case(rng: random.Random) -> tuple[list[int], int, int, Demand]:
    g = rng.choice([1, 2, 4, 8])
    free = [rng.choice([0, 90, 190, 300, 470, 530, 810, 1000, 1000]) for _ in range(g)]
    cpu, mem = rng.randrange(0, 64_000, 500), rng.randrange(0, 256_000, 1000)
    kind = rng.choice(["cpu", "share", "whole"])
    if kind == "cpu":
        d = Demand(rng.choice([2000, 8000]), rng.choice([0, 4000]))
    elif kind == "share":
        d = Demand(rng.choice([1000, 4000]), 1000, 1, rng.choice([160, 470, 810]))
    else:
        d = Demand(rng.choice([1000, 12_000]), 1000, rng.choice([1, 2]), 1000)
    return free, cpu, mem, d


CLASSES = (
    cls(3000, 810, 1, 0.2, mem=1000),
    cls(12_000, 1000, 1, 0.3, mem=16_000),
    cls(8000, 470, 1, 0.2, mem=8000),
    cls(12_000, 0, 0, 0.1, mem=4000),
    cls(24_000, 1000, 2, 0.1, mem=32_000),
    cls(4000, 160, 1, 0.1),
)


@pytest.mark.parametrize("policy", list(Policy))
def test_numpy_and_scalar_faces_agree_on_random_nodes(policy: Policy) -> None:
    """Same F, same ΔF and same device choice from both faces, on 300 random node states."""
    rng = random.Random(7)
    table = ClassTable.build(CLASSES, policy)
    for _ in range(300):
        free, cpu, mem, d = _random_case(rng)
        n = node(free, cpu=cpu, mem=mem)
        arr = np.array([free], dtype=np.int64)
        cpu_a, mem_a = np.array([cpu]), np.array([mem])
        access = table.access([MODEL])
        assert node_fragmentation(n, CLASSES, policy) == pytest.approx(
            float(fragmentation(cpu_a, mem_a, arr, access, table)[0])
        )
        placed = placement_delta(n, _shape_of(d), CLASSES, policy)
        feasible = cpu >= d.cpu_milli and mem >= d.memory_mib and sum(f >= d.gpu_milli for f in free) >= d.num_gpu
        assert placed.fits == feasible
        if not feasible:
            continue
        deltas = candidate_deltas(cpu_a, mem_a, arr, access, table, d)[0]
        scores = fgd_score(deltas)
        best = int(np.argmax(scores))
        assert placed.delta == pytest.approx(float(deltas[best]))
        assert placed.score == int(scores[best])
        if d.is_share:
            assert placed.devices == (best,)


def _shape_of(d: Demand) -> PodShape:
    if not d.uses_gpu:
        gpu = GpuDemand()
    elif d.is_share:
        gpu = GpuDemand.share(d.gpu_milli)
    else:
        gpu = GpuDemand.whole(d.num_gpu)
    return PodShape(requests=Resources(cpu_milli=d.cpu_milli, memory_mib=d.memory_mib, pods=1), gpu=gpu)


@pytest.mark.parametrize("policy", list(Policy))
def test_chosen_devices_always_have_the_share(policy: Policy) -> None:
    """Whatever the policy picks, each device has the per-device share free and counts match."""
    rng = random.Random(11)
    for _ in range(300):
        free, cpu, mem, d = _random_case(rng)
        placed = placement_delta(node(free, cpu=cpu, mem=mem), _shape_of(d), CLASSES, policy)
        if placed.fits and d.uses_gpu:
            assert len(placed.devices) == d.num_gpu == len(set(placed.devices))
            assert all(free[i] >= d.gpu_milli for i in placed.devices)


# --------------------------------------------------------------------------- trace replay


NODES_CSV = "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,2,T4\nn1,16000,65536,1,P100\nn2,64000,262144,4,T4\n"
PODS_CSV = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
    "p0,4000,8192,1,500,\np1,8000,16384,1,1000,\np2,2000,4096,0,0,\np3,4000,8192,1,300,T4\n"
    "p4,16000,32768,2,1000,\np5,1000,2048,1,810,P100\np6,30000,60000,1,1000,\n"
)


@pytest.mark.parametrize("policy", trace_replay.POLICIES + trace_replay.EXTRA)
def test_replay_keeps_invariants_on_a_tiny_trace(policy: str, tmp_path: Path) -> None:
    """alloc never exceeds arrived, both only grow, capacity is never exceeded (State.place checks;
    for `extender`, the extender's own device choices checked by the replay's accounting)."""
    (tmp_path / "nodes.csv").write_text(NODES_CSV)
    (tmp_path / "pods.csv").write_text(PODS_CSV)
    cluster = trace_replay.load_cluster(tmp_path / "nodes.csv")
    pods = trace_replay.load_pods(tmp_path / "pods.csv")
    run = trace_replay.replay(cluster, pods, workload_classes(pods), policy, seed=3)
    assert run.arrived[-1] >= trace_replay.INFLATION * 100
    assert np.all(run.alloc <= run.arrived + 1e-9)
    assert np.all(np.diff(run.arrived) >= 0) and np.all(np.diff(run.alloc) >= 0)
    at = run.at(trace_replay.BUCKETS)
    assert at.shape == (131,) and np.all(np.diff(at) >= 0)


def test_replay_state_rejects_overcommit() -> None:
    """Placing past a node's capacity is a bug the replay refuses, not a silent negative."""
    cluster = trace_replay.Cluster(("n",), np.array([1000]), np.array([1000]), np.array([1]), ("T4",), 1)
    state = trace_replay.State.fresh(cluster)
    with pytest.raises(ValueError, match="over capacity"):
        state.place(0, Demand(2000, 0, 1, 1000), -1)


def test_workload_drift_is_total_variation() -> None:
    a = workload_classes([Demand(1000, 0, 1, 500)] * 3 + [Demand(2000, 0, 1, 1000)])
    b = workload_classes([Demand(1000, 0, 1, 500)] * 1 + [Demand(2000, 0, 1, 1000)])
    c = workload_classes([Demand(4000)])
    assert workload_drift(a, a) == 0.0
    assert workload_drift(a, b) == pytest.approx(0.25)  # 3/4 vs 1/2 on each class
    assert workload_drift(a, c) == pytest.approx(1.0)
    assert workload_drift((), ()) == 0.0 and workload_drift(a, ()) == 1.0
