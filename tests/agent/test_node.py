"""The node loop's pod rules, in process: the pods are the record (admit, release at the end),
a pending BindAllocation is confirmed by its pod or expires, an edited record is not followed."""

from __future__ import annotations

import json
from typing import Any

from agent.backends import FakeBackend
from agent.contract import Grant
from agent.ledger import Ledger
from agent.node import NodeLoop

NODE = "n1"


class Events:
    """The one API call these rules make: Events."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def event(self, *, pod: dict[str, Any], reason: str, message: str, component: str) -> None:
        self.events.append((reason, message))


def loop(**kw: Any) -> tuple[NodeLoop, Events]:
    node = {
        "metadata": {
            "name": NODE,
            "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "phalanx.io/mig-mode": "dynamic"},
        },
        "status": {"allocatable": {"nvidia.com/gpu": "2"}},
    }
    events = Events()
    return NodeLoop(events, NODE, Ledger(FakeBackend.from_node(node)), **kw), events  # type: ignore[arg-type]


def pod(name: str, record: list[dict[str, Any]] | None, *, phase: str = "Running") -> dict[str, Any]:
    annotations = {"phalanx.io/gpu-devices": json.dumps(record)} if record is not None else {}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": annotations},
        "spec": {"nodeName": NODE},
        "status": {"phase": phase},
    }


MIG = [{"index": 1, "mig": "3g.40gb", "start": 4}]


def test_a_pod_is_admitted_from_its_record_and_its_slice_removed_when_it_ends() -> None:
    agent, _ = loop()
    agent._seen(pod("m", MIG))
    assert [m.profile for m in agent.ledger.inventory.gpus[1].migs] == ["3g.40gb"]
    agent._seen(pod("m", MIG, phase="Succeeded"))
    assert not agent.ledger.allocations() and not agent.ledger.inventory.gpus[1].migs


def test_an_edited_record_is_refused_and_the_first_kept() -> None:
    agent, events = loop()
    agent._seen(pod("w", [{"index": 0, "milli": 1000}]))
    agent._seen(pod("w", [{"index": 1, "milli": 1000}]))
    assert [g.index for a in agent.ledger.allocations() for g in a.grants] == [0]
    assert events.events[0][0] == "DeviceConflict"


def test_a_pending_bind_takes_the_devices_its_binding_carried() -> None:
    agent, _ = loop()
    agent.ledger.bind("ns/p", "uid-p", (Grant(0, milli=1000),))
    agent.pending("ns/p")
    agent._seen(pod("p", [{"index": 1, "milli": 1000}]))  # the retried bind went to GPU 1
    assert [g.index for a in agent.ledger.allocations() for g in a.grants] == [1]
    assert not agent.is_pending("ns/p")


def test_a_pending_bind_whose_pod_never_comes_is_released() -> None:
    agent, _ = loop(pending_grace_s=0.0)
    agent.ledger.bind("ns/p", "uid-p", (Grant(0, milli=1000),))
    agent.pending("ns/p")
    agent._expire_pending()
    assert not agent.ledger.allocations()


def test_a_malformed_record_is_reported_not_served() -> None:
    agent, events = loop()
    agent._seen(
        pod("bad", None)
        | {"metadata": {"name": "bad", "namespace": "ns", "annotations": {"phalanx.io/gpu-devices": "[{"}}}
    )
    assert not agent.ledger.allocations()
    assert events.events[0][0] == "DeviceInvalidRecord" and "not JSON" in events.events[0][1]
