"""The packing plan in the extender: a device awaiting a share size draws pods of that size
(prioritize 10, bind takes that device), waits end when filled or when the pod that opened
them leaves, and pods steer clear of CPU reserved for awaited pods."""

from __future__ import annotations

import pytest

from extender.app import Extender
from extender.objects import DEVICES_ANNOTATION, encode_devices
from solver.model import DeviceAssignment, GpuDemand, PodShape, Resources
from tests.extender.fakes import FakeKube, bind_devices, extender_on, leader, node, pod, scores


def share(name: str, milli: int, node_name: str = "", device: int = -1, cpu: str = "1") -> dict:  # type: ignore[type-arg]
    annotations = {"gpu-fraction": str(milli / 1000)}
    if device >= 0:
        annotations[DEVICES_ANNOTATION] = encode_devices((DeviceAssignment(device, milli, 0),))
    obj = pod(name, annotations=annotations, node_name=node_name, phase="Running" if node_name else "Pending")
    obj["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
    return obj


@pytest.fixture
def ext() -> Extender:
    """Workload: 650- and 320-milli shares (plan: (650, 320) and (320, 320, 320)) and whole
    GPUs. c0's GPU 1 holds a 650 pod that takes 126 of c0's 128 cores: it awaits a 320."""
    pods = [share("big", 650, "c0", device=1, cpu="126")]
    pods += [share(f"s{i}", 320) for i in range(6)] + [share(f"m{i}", 650) for i in range(4)]
    pods += [pod(f"w{i}", gpus=1) for i in range(4)]
    extender: Extender = extender_on([node("a0", gpus=2), node("b0", gpus=2), node("c0", gpus=2)], pods)
    return extender


def tiers_of(ext: Extender, names: list[str], shape: PodShape) -> dict[str, int]:
    return ext.sharing.tiers(names, shape, ext.cache.node_model)


def shape(milli: int, cpu_milli: int) -> PodShape:
    return PodShape(Resources(cpu_milli, 0, 1), GpuDemand(count=1, milli=milli))


def test_the_plan_comes_from_the_workload_and_the_cache(ext: Extender) -> None:
    packer = ext.sharing.packer()
    assert packer is not None
    assert set(packer.plan.patterns) == {(650, 320), (320, 320, 320)}
    assert packer.awaiting(320) == {("c0", 1)}  # adopted from what c0's GPU 1 holds


def test_a_device_awaiting_the_size_wins_and_bind_fills_it(ext: Extender) -> None:
    got = scores(ext, share("s0", 320), ["a0", "b0", "c0"])
    assert leader(got) == "c0"
    (entry,) = bind_devices(ext, "s0", "c0")
    assert entry["index"] == 1 and entry["milli"] == 320
    packer = ext.sharing.packer()
    assert packer is not None and not packer.awaiting(320)


def test_a_pod_opening_a_pattern_makes_its_device_await_the_rest(ext: Extender) -> None:
    reply = ext.verbs.bind({"PodNamespace": "default", "PodName": "m0", "PodUID": "uid-m0", "Node": "a0"})
    assert reply == {"Error": ""}
    packer = ext.sharing.packer()
    assert packer is not None
    (waiting,) = packer.awaiting(320) - {("c0", 1)}
    assert waiting[0] == "a0"
    assert packer.reserved("a0")[0] == pytest.approx(1000.0)  # one 320 pod's CPU


def test_the_wait_ends_when_the_opening_pod_leaves(ext: Extender) -> None:
    ext.cache.pod_event("DELETED", ext.kube.pods["default/big"])  # type: ignore[attr-defined]
    packer = ext.sharing.packer()
    assert packer is not None and not packer.awaiting(320)
    assert packer.reserved("c0") == (0.0, 0.0)


def test_pods_avoid_cpu_reserved_for_an_awaited_pod(ext: Extender) -> None:
    tiers = tiers_of(ext, ["a0", "b0", "c0"], shape(1000, 2000))
    assert tiers.get("c0") == -1  # 2 cores would leave c0 none for the awaited 320 pod
    assert tiers.get("a0", 0) == 0 and tiers.get("b0", 0) == 0
    assert tiers_of(ext, ["c0"], shape(1000, 1000)).get("c0", 0) == 0  # 1 core leaves its 1
    tiers = tiers_of(ext, ["a0", "c0"], shape(320, 1000))
    assert tiers == {"c0": 2, "a0": 1}  # c0 awaits it; a0 has idle GPUs and room to open a pattern


def test_no_plan_without_fragmentation_scoring(ext: Extender) -> None:
    from extender.config import parse

    ext.apply(parse("gpu: {fragmentationScoring: false}", source="test"))
    assert tiers_of(ext, ["c0"], shape(320, 1000)) == {}


def test_a_failed_bind_does_not_leave_a_device_waiting(ext: Extender) -> None:
    kube = ext.kube
    assert isinstance(kube, FakeKube)
    kube.fail_bind = True
    reply = ext.verbs.bind({"PodNamespace": "default", "PodName": "m0", "PodUID": "uid-m0", "Node": "a0"})
    assert reply["Error"]
    packer = ext.sharing.packer()
    assert packer is not None and packer.awaiting(320) == {("c0", 1)} and packer.reserved("a0") == (0.0, 0.0)


def test_the_sweep_ends_waits_on_devices_that_hold_nothing(ext: Extender) -> None:
    """A pod deleted between bind and the watch seeing it: its assumed device empties without
    a listener call that names the node; the sweep's reconcile notices."""
    assert ext.verbs.bind({"PodNamespace": "default", "PodName": "m0", "PodUID": "uid-m0", "Node": "a0"}) == {
        "Error": ""
    }
    packer = ext.sharing.packer()
    assert packer is not None and any(n == "a0" for n, _ in packer.awaiting(320))
    ext.cache.pod_event("DELETED", share("m0", 650))
    ext.sharing.reconcile()
    assert packer.awaiting(320) == {("c0", 1)} and packer.reserved("a0") == (0.0, 0.0)
