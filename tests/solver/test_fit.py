"""The fit model (solver.fit, solver.device): how many pods of a shape fit on a node, the one
device rule shared by the snapshot and the solve, and the single-pod reasons built on them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from solver import DeviceState, NodeState, fits, unfit_reason
from solver.fit import node_fit
from solver.mig import MigSlot, load_tables
from solver.model import GpuDemand, GpuDevice, MigSlice, Node, NodeName, PodShape, Resources
from solver.single import INSUFFICIENT_CPU, NO_GPU, SHARE_GPUS, WHOLE_GPUS

H100 = load_tables().table_for("NVIDIA-H100-80GB-HBM3")
assert H100 is not None
CPU_ONLY = Resources(1000, 1024, 1)


def node(*gpus: GpuDevice, cpu: int = 64000, used_cpu: int = 0) -> Node:
    return Node(NodeName("n0"), Resources(cpu, 262144, 110), Resources(used_cpu, 0, 0), gpus=gpus)


def idle(i: int, model: str = "A100") -> GpuDevice:
    return GpuDevice(i, model, 40960)


def shared(i: int, free_milli: int) -> GpuDevice:
    return GpuDevice(i, "A100", 40960, free_milli, 40960 * free_milli // 1000)


FIT_CASES = [
    pytest.param(node(cpu=4000), PodShape(CPU_ONLY), 4, id="CPU-only pod; CPU decides"),
    pytest.param(
        node(idle(0), idle(1), shared(2, 500)),
        PodShape(CPU_ONLY, GpuDemand.whole(1)),
        2,
        id="whole GPUs; only idle devices count",
    ),
    pytest.param(
        node(idle(0), idle(1), idle(2)),
        PodShape(CPU_ONLY, GpuDemand.whole(2)),
        1,
        id="two whole GPUs per pod; three idle devices hold one pod",
    ),
    pytest.param(
        node(shared(0, 500), shared(1, 300)),
        PodShape(CPU_ONLY, GpuDemand.share(250)),
        3,
        id="shares; counted per device",
    ),
    pytest.param(
        node(shared(0, 1000), shared(1, 250)),
        PodShape(CPU_ONLY, GpuDemand.share(250, count=2)),
        1,
        id="a share on two devices; the fuller device limits it",
    ),
    pytest.param(
        node(GpuDevice(0, "A100", 40960, 0, 0, (MigSlice("1g.10gb", 3),))),
        PodShape(CPU_ONLY, GpuDemand.mig("1g.10gb")),
        3,
        id="static MIG; free slices of the profile",
    ),
    pytest.param(
        node(GpuDevice(0, "H100", 81559, partition=H100)),
        PodShape(CPU_ONLY, GpuDemand.mig("3g.40gb")),
        2,
        id="dynamic MIG; what an idle partitionable GPU can still cut",
    ),
    pytest.param(
        node(idle(0, "A100"), idle(1, "H100")),
        PodShape(CPU_ONLY, GpuDemand.whole(1), gpu_models=frozenset({"H100"})),
        1,
        id="a GPU model is named; other models' devices do not count",
    ),
    pytest.param(
        node(idle(0), cpu=500),
        PodShape(CPU_ONLY, GpuDemand.whole(1)),
        0,
        id="an idle GPU but too little CPU; nothing fits",
    ),
]


@pytest.mark.parametrize(("n", "shape", "expected"), FIT_CASES)
def test_node_fit_and_the_solves_capacity_agree(n: Node, shape: PodShape, expected: int) -> None:
    """The snapshot's count (CP-SAT preparation) and the solve's count (placers) are one model."""
    assert node_fit(n, shape) == expected
    assert NodeState(n).capacity(shape) == expected


REASON_CASES = [
    pytest.param(
        node(cpu=500),
        PodShape(CPU_ONLY),
        f"{INSUFFICIENT_CPU}: 500m free, pod needs 1000m",
        id="too little CPU; the numbers that matter",
    ),
    pytest.param(
        node(cpu=4000, used_cpu=5000),
        PodShape(Resources(0, 0, 1), GpuDemand.whole(1)),
        NO_GPU,
        id="overcommitted CPU but the pod asks for none; the GPU is named, not CPU",
    ),
    pytest.param(
        node(shared(0, 500)),
        PodShape(CPU_ONLY, GpuDemand.whole(1)),
        f"{WHOLE_GPUS}: 0 idle, pod needs 1",
        id="whole GPU wanted; no idle device",
    ),
]


@pytest.mark.parametrize(("n", "shape", "expected"), REASON_CASES)
def test_unfit_reason(n: Node, shape: PodShape, expected: str) -> None:
    assert not fits(n, shape)
    assert unfit_reason(n, shape) == expected


def test_a_share_reason_names_the_freest_device() -> None:
    """A share that fits nowhere reports the freest device's share and memory."""
    reason = unfit_reason(node(shared(0, 200), shared(1, 100)), PodShape(CPU_ONLY, GpuDemand.share(300)))
    assert reason.startswith(SHARE_GPUS) and reason.endswith("the freest device has 200m and 8192Mi")


@st.composite
def devices(draw: st.DrawFn) -> GpuDevice:
    kind = draw(st.sampled_from(["idle", "shared", "mig", "dynamic", "cut"]))
    if kind == "idle":
        return GpuDevice(0, "A100", 40960, tflops=draw(st.sampled_from([0, 300_000])))
    if kind == "shared":
        return GpuDevice(0, "A100", 40960, draw(st.integers(0, 1000)), draw(st.integers(0, 40960)))
    if kind == "mig":
        return GpuDevice(0, "A100", 40960, 0, 0, (MigSlice("1g.10gb", draw(st.integers(0, 3))),))
    layout = () if kind == "dynamic" else (MigSlot("1g.10gb", 6),)
    return GpuDevice(0, "H100", 81559, partition=H100, mig_layout=layout)


@given(devices(), st.sampled_from(["1g.10gb", "3g.40gb"]), st.integers(1, 600), st.integers(0, 20000))
def test_a_device_answers_the_same_in_the_snapshot_and_in_a_solve(
    d: GpuDevice, profile: str, milli: int, memory: int
) -> None:
    """GpuDevice and DeviceState share one device rule: idle, MIG mode, shares and slices agree."""
    state = DeviceState.of(d)
    assert (state.is_idle, state.is_mig) == (d.is_idle, d.is_mig)
    assert state.share_fits(milli, memory) == d.share_fits(milli, memory)
    assert state.mig_free(profile) == d.mig_free(profile)
