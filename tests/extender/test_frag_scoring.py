"""Fragmentation-aware scoring in the extender: the node where the target workload's
fragmentation grows least gets 10, ties go to the first node by name, and bind takes the
devices the measure chose."""

from __future__ import annotations

import pytest

from extender.app import Extender
from extender.objects import DEVICES_ANNOTATION, encode_devices
from solver.model import DeviceAssignment
from tests.extender.fakes import bind_devices, extender_on, leader, node, pod, scores


def share(name: str, milli: int, node_name: str = "", devices: str | None = None) -> dict:  # type: ignore[type-arg]
    annotations = {"gpu-fraction": str(milli / 1000)}
    if devices:
        annotations[DEVICES_ANNOTATION] = devices
    return pod(name, annotations=annotations, node_name=node_name, phase="Running" if node_name else "Pending")


@pytest.fixture
def ext() -> Extender:
    """a0 has a GPU with 0.5 used; b0 and c0 are idle. The workload: half-GPU and whole-GPU pods."""
    used = encode_devices((DeviceAssignment(1, 500, 0),))
    pods = [share("run", 500, "a0", used)] + [share(f"q{i}", 500) for i in range(5)]
    pods += [pod(f"w{i}", gpus=1) for i in range(4)]
    extender: Extender = extender_on([node("a0", gpus=2), node("b0", gpus=2), node("c0", gpus=2)], pods)
    return extender


def test_the_half_used_gpu_is_filled_first(ext: Extender) -> None:
    """A half-GPU pod on a0's half-used GPU leaves no fragment; on an idle GPU it leaves one."""
    assert ext.sharing.workload(), "the cache's pods define the target workload"
    got = scores(ext, share("q0", 500), ["c0", "b0", "a0"])
    assert leader(got) == "a0"


def test_equal_nodes_tie_to_the_first_name(ext: Extender) -> None:
    got = scores(ext, share("q0", 500), ["c0", "b0"])
    assert leader(got) == "b0"


def test_bind_takes_the_device_the_measure_chose(ext: Extender) -> None:
    """On a0 the half-used GPU 1, not idle GPU 0: cutting GPU 0 in half would strand it for
    the whole-GPU pods of the workload."""
    (entry,) = bind_devices(ext, "q1", "a0")
    assert entry["index"] == 1 and entry["milli"] == 500


def test_fragmentation_scoring_can_be_turned_off(ext: Extender) -> None:
    from extender.config import parse

    ext.apply(parse("gpu: {fragmentationScoring: false}", source="test"))
    assert ext.sharing.workload() == ()


def cpu_pod(name: str, cores: int) -> dict:  # type: ignore[type-arg]
    obj = pod(name)
    obj["spec"]["containers"][0]["resources"]["requests"]["cpu"] = str(cores)
    return obj


def test_a_cpu_heavy_pod_stays_off_the_gpu_nodes_it_would_strand(ext: Extender) -> None:
    """A 127-core pod on a0, b0 or c0 would leave 1 core: the workload's GPU pods (1 core
    each) could use one GPU there at most. A node without GPUs loses nothing."""
    ext.cache.node_event("ADDED", node("cpu0", gpus=0))
    got = scores(ext, cpu_pod("big", 127), ["a0", "b0", "c0", "cpu0"])
    assert leader(got) == "cpu0"


def filtered(ext: Extender, obj: dict, names: list[str]) -> list[str]:  # type: ignore[type-arg]
    reply = ext.verbs.filter({"Pod": obj, "NodeNames": names})
    assert not reply["FailedNodes"] and not reply["FailedAndUnresolvableNodes"]
    return list(reply["NodeNames"])


def test_filter_offers_a_cpu_heavy_pod_only_the_nodes_it_strands_least_on(ext: Extender) -> None:
    """kube-scheduler does not send a pod without GPUs to prioritize (its scorer entry manages
    GPU resources only): filter keeps the nodes prioritize would rank first, in kube-scheduler's
    order, and prioritize over them has nothing left to tell apart."""
    for name in ("cpu0", "cpu1"):
        ext.cache.node_event("ADDED", node(name, gpus=0))
    names = ["a0", "cpu1", "b0", "cpu0", "c0"]
    assert filtered(ext, cpu_pod("big", 127), names) == ["cpu1", "cpu0"]
    assert scores(ext, cpu_pod("big", 127), ["cpu1", "cpu0"]) == {}


def test_filter_offers_a_cpu_pod_phalanx_has_no_opinion_on_every_node(ext: Extender) -> None:
    assert filtered(ext, cpu_pod("small", 1), ["c0", "a0", "b0"]) == ["c0", "a0", "b0"]


def test_a_cpu_pod_with_preferences_keeps_every_node(ext: Extender) -> None:
    """Its preferences are kube-scheduler's to score: filter cuts nothing."""
    ext.cache.node_event("ADDED", node("cpu0", gpus=0))
    obj = cpu_pod("big", 127)
    term = {"weight": 5, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}
    obj["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}
    assert filtered(ext, obj, ["a0", "b0", "cpu0"]) == ["a0", "b0", "cpu0"]


def test_no_opinion_on_a_cpu_pod_when_nodes_look_alike(ext: Extender) -> None:
    """A small CPU pod changes nothing for the workload anywhere: no scores (kube-scheduler's
    own decide), and no tie-break by name that would pile every CPU pod onto one node."""
    assert scores(ext, cpu_pod("small", 1), ["b0", "c0"]) == {}


def test_a_small_drift_in_the_pod_mix_keeps_the_memoised_deltas(ext: Extender) -> None:
    """A big move of the pod mix drops every memoised delta (a new generation); one more pod
    among many moves it a little: the new workload is taken, the per-node deltas stay
    memoised (recomputed as their nodes change)."""
    generation = ext.sharing.workload_generation
    for i in range(40):  # the mix turns to whole GPUs
        ext.cache.pod_event("ADDED", pod(f"x{i}", gpus=1))
    ext.sharing.refresh()
    assert ext.sharing.workload_generation == generation + 1
    before = ext.sharing.workload()
    ext.cache.pod_event("ADDED", share("y", 500))
    ext.sharing.refresh()
    assert ext.sharing.workload() != before
    assert ext.sharing.workload_generation == generation + 1
