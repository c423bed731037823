"""The extender's side of the node agents: the inventory an agent publishes replaces the
guess from labels, the two record parsers agree, and a bind the agent refuses is never sent."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent.contract import RecordError, decode
from extender.agents import AgentRefused, Agents
from extender.binder import Binder
from extender.config import GpuConfig
from extender.objects import INVENTORY_ANNOTATION, DeviceRecordError, decode_devices, devices_of
from extender.pools import Hardware
from solver import DeviceAssignment
from tests.extender.fakes import FakeKube

HARDWARE = Hardware(GpuConfig())
LABELS = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920"}


def inventory(*gpus: dict[str, Any]) -> dict[str, str]:
    return {INVENTORY_ANNOTATION: json.dumps({"backend": "fake", "driver": "fake", "gpus": list(gpus)})}


def gpu(index: int, **extra: Any) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": f"GPU-{index}",
        "model": "NVIDIA-A100-SXM4-80GB",
        "memoryMiB": 81920,
        "healthy": True,
        **extra,
    }


def test_an_unhealthy_gpu_is_left_out_and_the_others_keep_their_indices() -> None:
    annotations = inventory(gpu(0), gpu(1, healthy=False, reason="XID 79"), gpu(2), gpu(3))
    devices = devices_of({"nvidia.com/gpu": "4"}, LABELS, annotations, HARDWARE, "n")
    assert [d.index for d in devices] == [0, 2, 3]


def test_a_static_mig_gpu_offers_the_slices_that_exist() -> None:
    slices = [{"uuid": f"MIG-{i}", "profile": "1g.10gb", "start": i, "size": 1} for i in range(3)]
    slices.append({"uuid": "MIG-x", "profile": "3g.40gb", "start": 4, "size": 4})
    devices = devices_of({}, LABELS, inventory(gpu(0), gpu(1, mig=True, slices=slices)), HARDWARE, "n")
    assert [d.index for d in devices] == [0, 1]
    assert {(s.profile, s.free) for s in devices[1].mig} == {("1g.10gb", 3), ("3g.40gb", 1)}
    assert not devices[0].mig


def test_on_a_dynamic_mig_node_the_cut_slices_are_left_to_the_pods_records() -> None:
    labels = {**LABELS, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "phalanx.io/mig-mode": "dynamic"}
    slices = [{"uuid": "MIG-a", "profile": "1g.10gb", "start": 0, "size": 1}]
    model = {"model": "NVIDIA-H100-80GB-HBM3"}
    devices = devices_of({}, labels, inventory(gpu(0, **model), gpu(1, mig=True, slices=slices, **model)), HARDWARE)
    assert [d.index for d in devices] == [0, 1]
    assert all(d.partition is not None and not d.mig for d in devices)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        json.dumps({"gpus": [{"index": "0", "memoryMiB": 1}]}),
        json.dumps({"gpus": [gpu(0), gpu(0)]}),
        json.dumps({"gpus": [{**gpu(0), "memoryMiB": -1}]}),
        json.dumps({"nogpus": []}),
    ],
    ids=["not JSON", "index not an integer", "an index twice", "negative memory", "no gpus key"],
)
def test_an_unreadable_inventory_falls_back_to_the_labels(text: str) -> None:
    devices = devices_of({"nvidia.com/gpu": "2"}, LABELS, {INVENTORY_ANNOTATION: text}, HARDWARE, "n")
    assert [d.index for d in devices] == [0, 1]


RECORDS = [
    '[{"index":3,"milli":1000,"memoryMiB":81920}]',
    '[{"index":0,"milli":250,"memoryMiB":10240,"tflops":20.5},{"index":1,"milli":250,"memoryMiB":10240}]',
    '[{"index":5,"mig":"1g.10gb"},{"index":5,"mig":"1g.10gb"}]',
    '[{"index":2,"mig":"3g.40gb","start":4}]',
    '[{"index":64,"milli":1000}]',
    '[{"index":1,"milli":1001}]',
    '[{"index":1},{"index":1}]',
    '[{"index":true}]',
    '{"index":1}',
    '[{"index":1,"mig":""}]',
    '[{"index":1,"mig":"3g.40gb","start":64}]',
    '[{"index":1,"tflops":-1}]',
    "[1]",
    "nope",
]


@pytest.mark.parametrize("text", RECORDS)
def test_the_agent_reads_every_record_as_the_extender_does(text: str) -> None:
    """agent/contract.py and extender/objects.py parse the same contract: same verdicts, same values."""
    try:
        theirs = decode_devices(text)
    except DeviceRecordError:
        with pytest.raises(RecordError):
            decode(text)
        return
    ours = decode(text)
    assert theirs is not None and ours is not None
    assert [(g.index, g.milli, g.memory_mib, g.mig, g.start, round(g.tflops * 1000)) for g in ours] == [
        (d.index, d.milli if not d.mig_profile else 0, d.memory_mib, d.mig_profile, d.mig_start, d.tflops)
        for d in theirs
    ]


class Refusing:
    """An Agents stand-in that refuses every bind, to pin the binder's order of calls."""

    def bind(self, **_: Any) -> None:
        raise AgentRefused("n1", "DeviceUnhealthy", "GPU 1 is unhealthy: XID 79")


def test_a_bind_the_agent_refuses_is_never_sent_to_the_api_server() -> None:
    kube = FakeKube()
    binder = Binder(kube, agents=Refusing())  # type: ignore[arg-type]
    with pytest.raises(AgentRefused, match="DeviceUnhealthy"):
        binder.bind("default", "p", "uid-p", "n1", (DeviceAssignment(1),))
    assert not [c for c in kube.calls if c[1].endswith("/binding")]


def test_a_cpu_pod_is_bound_without_asking_the_agent() -> None:
    kube = FakeKube()
    kube.pods["default/p"] = {"metadata": {"name": "p", "namespace": "default", "uid": "uid-p"}, "spec": {}}
    Binder(kube, agents=Refusing()).bind("default", "p", "uid-p", "n1", ())  # type: ignore[arg-type]
    assert [c for c in kube.calls if c[1].endswith("/binding")]


def test_a_node_without_an_agent_is_not_dialled() -> None:
    agents = Agents(lambda node: "", lambda: None)
    agents.bind(namespace="default", name="p", uid="u", node="n1", record="[]")
    assert agents.evict(namespace="default", name="p", node="n1", reason="r") is None  # the caller evicts
    assert not agents._stubs  # no channel was opened


class Evicting:
    """An Agents stand-in whose agent evicts, to pin that the binder then sends nothing."""

    def __init__(self, answer: str | None) -> None:
        self.answer = answer

    def evict(self, **_: Any) -> str | None:
        return self.answer


@pytest.mark.parametrize(("answer", "api_calls"), [("", 0), (None, 1)], ids=["the agent evicted", "no agent"])
def test_a_preemption_eviction_goes_through_the_nodes_agent_first(answer: str | None, api_calls: int) -> None:
    kube = FakeKube()
    binder = Binder(kube, agents=Evicting(answer))  # type: ignore[arg-type]
    assert binder.evict("default", "victim", "uid-v", node="n1") == ""
    assert len([c for c in kube.calls if c[1].endswith("/eviction")]) == api_calls
    binder.evict("default", "victim", "uid-v", dry_run=True, node="n1")  # a dry run never goes to an agent
    assert len([c for c in kube.calls if c[1].endswith("/eviction")]) == api_calls + 1
