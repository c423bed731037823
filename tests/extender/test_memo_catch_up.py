"""The memos' catch-up: nodes pods moved on are checked again off the verbs' path, so the next
filter and prioritize find them memoised (no node model rebuilt, no delta measured in the call)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from extender.app import Extender
from extender.objects import DEVICES_ANNOTATION, encode_devices
from solver import placement_delta
from solver.model import DeviceAssignment
from tests.extender.fakes import extender_on, node, pod

NAMES = [f"n{i}" for i in range(8)]


def share(name: str, node_name: str = "", index: int = 0) -> dict[str, Any]:
    annotations = {"gpu-fraction": "0.5"}
    if node_name:
        annotations[DEVICES_ANNOTATION] = encode_devices((DeviceAssignment(index, 500, 0),))
    return pod(name, annotations=annotations, node_name=node_name, phase="Running" if node_name else "Pending")


@pytest.fixture
def ext() -> Extender:
    pods = [share(f"q{i}") for i in range(4)] + [pod(f"w{i}", gpus=1) for i in range(4)]
    extender: Extender = extender_on([node(n, gpus=2) for n in NAMES], pods)
    return extender


def calls(ext: Extender, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of node-model builds and fragmentation measurements from here on."""
    counted = {"models": 0, "deltas": 0}
    cache, memo_module = ext.cache, __import__("extender.memo", fromlist=["placement_delta"])
    build, measure = cache._build, memo_module.placement_delta

    def counting_build(*a: Any, **k: Any) -> Any:
        counted["models"] += 1
        return build(*a, **k)

    def counting_measure(*a: Any, **k: Any) -> Any:
        counted["deltas"] += 1
        return measure(*a, **k)

    monkeypatch.setattr(cache, "_build", counting_build)
    monkeypatch.setattr(memo_module, "placement_delta", counting_measure)
    return counted


def test_after_pods_move_the_next_call_finds_their_nodes_checked_and_measured(
    ext: Extender, monkeypatch: pytest.MonkeyPatch
) -> None:
    pending = share("p")
    ext.verbs.filter({"Pod": pending, "NodeNames": NAMES})  # memoises every node for the shape
    for i, name in enumerate(NAMES[:5]):  # a burst: pods land on five nodes
        ext.cache.pod_event("ADDED", share(f"r{i}", name))
    assert ext.verbs.catch_up() == 5
    counted = calls(ext, monkeypatch)
    ext.verbs.filter({"Pod": pending, "NodeNames": NAMES})
    assert counted == {"models": 0, "deltas": 0}  # all of it done by the catch-up
    assert ext.verbs.catch_up() == 0  # nothing moved since


def test_without_the_catch_up_the_call_does_the_work(ext: Extender, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same burst, no catch-up: the work lands on the next call (what the catch-up saves)."""
    pending = share("p")
    ext.verbs.filter({"Pod": pending, "NodeNames": NAMES})
    for i, name in enumerate(NAMES[:5]):
        ext.cache.pod_event("ADDED", share(f"r{i}", name))
    counted = calls(ext, monkeypatch)
    ext.verbs.filter({"Pod": pending, "NodeNames": NAMES})
    assert counted["models"] == 5 and counted["deltas"] == 1  # five nodes now in one state


def test_nodes_in_one_state_are_measured_once(ext: Extender, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node's fragmentation growth is a function of what `solver.node_state` reads: nodes
    that pods left in equal states are measured once (per shape and target workload), a node
    in another state on its own, and every node's memoised growth is what measuring it gives."""
    pending = share("p")
    ext.verbs.filter({"Pod": pending, "NodeNames": NAMES})
    ext.cache.pod_event("ADDED", share("r0", "n0", index=0))
    ext.cache.pod_event("ADDED", share("r1", "n1", index=0))
    ext.cache.pod_event("ADDED", share("r2", "n2", index=1))
    counted = calls(ext, monkeypatch)
    ext.verbs.prioritize({"Pod": pending, "NodeNames": NAMES})
    assert counted["deltas"] == 2  # n0 and n1 alike, n2 apart; the others unchanged since the filter
    memo = next(m for m in ext.verbs._memo.values() if m.deltas)
    assert memo.shape is not None
    workload = ext.verbs.sharing.workload()
    for name in NAMES:
        model = ext.cache.node_model(name)
        assert model is not None
        verdict = placement_delta(model, memo.shape, workload)
        assert memo.deltas[name] == (verdict.delta if verdict.fits else math.inf), name


def test_the_catch_up_answers_as_the_call_would(ext: Extender) -> None:
    """Fit, failures and ranking after a catch-up are those of a cold memo."""
    pending = share("p")
    ext.verbs.filter({"Pod": pending, "NodeNames": NAMES})
    full = [share(f"f{i}", "n1", index=i // 2) for i in range(4)]  # n1 full: 4 halves on 2 GPUs
    for p in full:
        ext.cache.pod_event("ADDED", p)
    ext.cache.pod_event("ADDED", share("r", "n2"))
    ext.verbs.catch_up()
    warm = ext.verbs.filter({"Pod": pending, "NodeNames": NAMES})
    cold = extender_on(
        [node(n, gpus=2) for n in NAMES],
        [share(f"q{i}") for i in range(4)] + [pod(f"w{i}", gpus=1) for i in range(4)] + [*full, share("r", "n2")],
    ).verbs.filter({"Pod": pending, "NodeNames": NAMES})
    assert warm == cold and "n1" in warm["FailedNodes"]


def test_a_shape_only_prioritize_measures_is_caught_up_too(ext: Extender, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod without GPUs passes filter untouched; only prioritize ranks it (fragmentation
    deltas), so its memo holds deltas and no checked nodes: those are caught up as well."""
    cpu = pod("c", resources={"cpu": "4", "memory": "8Gi"})
    ext.verbs.prioritize({"Pod": cpu, "NodeNames": NAMES})
    for i, name in enumerate(NAMES[:3]):
        ext.cache.pod_event("ADDED", share(f"r{i}", name))
    assert ext.verbs.catch_up() == 3
    counted = calls(ext, monkeypatch)
    ext.verbs.prioritize({"Pod": cpu, "NodeNames": NAMES})
    assert counted == {"models": 0, "deltas": 0}


def test_the_catch_up_sleeps_between_batches(ext: Extender, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a mass deletion the catch-up re-checks hundreds of nodes in pure Python: it gives
    the GIL up between batches (a call waiting for it runs at once, not at the next switch
    interval), and still checks every node."""
    import extender.memo as memo_module

    pending = share("p")
    ext.verbs.filter({"Pod": pending, "NodeNames": NAMES})
    moved = NAMES[:7]
    for i, name in enumerate(moved):
        ext.cache.pod_event("ADDED", share(f"r{i}", name))
    pauses: list[float] = []
    monkeypatch.setattr(memo_module, "BATCH", 2)
    monkeypatch.setattr(memo_module.time, "sleep", pauses.append)
    assert ext.verbs.catch_up() == len(moved)
    assert pauses == [memo_module.BATCH_PAUSE_S] * 3  # between four batches, not after the last
