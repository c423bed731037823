"""The ledger's rules on the fake backend: what a node refuses, all-or-nothing binds, orphan
slices, and static slices that stay with their pods across an agent restart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.backends import FakeBackend
from agent.contract import Grant
from agent.ledger import BindRefused, Ledger
from agent.node import NodeLoop


def node(*, gpus: int = 1, dynamic: bool = False, layout: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    if dynamic:
        labels["phalanx.io/mig-mode"] = "dynamic"
    annotations = {"phalanx.io/mig-layout": json.dumps(layout)} if layout else {}
    return {
        "metadata": {"name": "n1", "labels": labels, "annotations": annotations},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}},
    }


def slices(ledger: Ledger) -> list[tuple[int, str, int]]:
    return [(g.index, m.profile, m.start) for g in ledger.inventory.gpus for m in g.migs]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (Grant(0, tflops=20.0), Grant(0, milli=1000)),
        (Grant(0, memory_mib=1024), Grant(0, mig="1g.10gb", start=0)),
        (Grant(0, mig="1g.10gb", start=6), Grant(0, milli=100, memory_mib=100)),
    ],
    ids=[
        "a TFLOPs-only share, then the whole GPU",
        "a memory-only share, then a dynamic slice",
        "a dynamic slice, then a share",
    ],
)
def test_a_gpu_shared_in_any_way_is_not_given_whole_or_cut(first: Grant, second: Grant) -> None:
    ledger = Ledger(FakeBackend.from_node(node(dynamic=True)))
    ledger.bind("ns/a", "a", (first,))
    with pytest.raises(BindRefused) as refused:
        ledger.bind("ns/b", "b", (second,))
    assert refused.value.reason in ("Oversubscribed", "InvalidRecord")


def test_a_refused_record_leaves_no_slice_behind() -> None:
    """The first grant cuts 7g.80gb, the second names the same cut: refused, and the cut undone."""
    ledger = Ledger(FakeBackend.from_node(node(dynamic=True)))
    with pytest.raises(BindRefused):
        ledger.bind("ns/a", "a", (Grant(0, mig="7g.80gb", start=0), Grant(0, mig="7g.80gb", start=0)))
    assert slices(ledger) == [] and not ledger.allocations()


def test_orphan_slices_are_reaped_and_held_ones_kept() -> None:
    backend = FakeBackend.from_node(node(dynamic=True))
    ledger = Ledger(backend)
    ledger.bind("ns/kept", "k", (Grant(0, mig="3g.40gb", start=4),))
    backend.create_mig(0, "1g.10gb", 0)  # cut by a bind whose pod never came before a restart
    ledger.refresh()
    assert len(ledger.reap()) == 1
    assert slices(ledger) == [(0, "3g.40gb", 4)]


def test_static_slices_stay_with_their_pods_across_a_restart(tmp_path: Path) -> None:
    layout = [{"index": 0, "profile": "1g.10gb", "slices": 3}]
    state = tmp_path / "pins.json"
    first = Ledger(FakeBackend.from_node(node(gpus=0, layout=layout)), state=state)
    first.bind("ns/b", "uid-b", (Grant(0, mig="1g.10gb"),))
    first.bind("ns/a", "uid-a", (Grant(0, mig="1g.10gb"),))
    held = {a.key: a.devices[0].uuid for a in first.allocations()}
    again = Ledger(FakeBackend.from_node(node(gpus=0, layout=layout)), state=state)
    again.rebuild([("ns/a", "uid-a", (Grant(0, mig="1g.10gb"),)), ("ns/b", "uid-b", (Grant(0, mig="1g.10gb"),))])
    assert {a.key: a.devices[0].uuid for a in again.allocations()} == held
    again.release("ns/a")
    assert list(json.loads(state.read_text())) == ["uid-b"]


def test_a_new_pod_of_the_same_name_gets_its_own_record() -> None:
    """A StatefulSet pod recreated during a watch gap: the predecessor's devices are released."""
    loop = NodeLoop(None, "n1", Ledger(FakeBackend.from_node(node(gpus=2))))  # type: ignore[arg-type]

    def pod(uid: str, index: int) -> dict[str, Any]:
        record = json.dumps([{"index": index, "milli": 1000}])
        return {
            "metadata": {
                "name": "s-0",
                "namespace": "ns",
                "uid": uid,
                "annotations": {"phalanx.io/gpu-devices": record},
            },
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Running"},
        }

    loop._seen(pod("old", 0))
    loop._seen(pod("new", 1))
    ((held,),) = [a.grants for a in loop.ledger.allocations()]
    assert held.index == 1 and loop.ledger.get("ns/s-0").uid == "new"  # type: ignore[union-attr]
