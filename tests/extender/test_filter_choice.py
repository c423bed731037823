"""A single GPU pod offered one node has its devices chosen and counted once its filter reply
is sent, not by its bind (extender/verbs.py `filter_then`, `_choose`): kube-scheduler filters
the next pod before this one's bind arrives, and the next pod must see the devices taken."""

from __future__ import annotations

from typing import Any

import pytest

from extender import verbs as verbs_module
from extender.app import Extender
from extender.config import parse
from extender.outcomes import Then
from tests.extender.fakes import bind_devices, extender_on, node, pod

JSON = dict[str, Any]


def half(name: str, *, uid: str = "") -> JSON:
    return pod(name, uid=uid, annotations={"gpu-fraction": "0.5"})


@pytest.fixture
def ext() -> Extender:
    """Two idle 2-GPU nodes and four pending half-GPU pods (h0..h3)."""
    extender: Extender = extender_on([node("n0", gpus=2), node("n1", gpus=2)], [half(f"h{i}") for i in range(4)])
    return extender


def offered(ext: Extender, obj: JSON, names: list[str]) -> list[str]:
    reply = ext.verbs.filter({"Pod": obj, "NodeNames": names})
    assert not reply["FailedNodes"] and not reply["FailedAndUnresolvableNodes"], reply
    out: list[str] = reply["NodeNames"]
    return out


def counted(ext: Extender, name: str) -> tuple[str, tuple[int, ...]] | None:
    assumed = ext.cache.assumed(f"uid-{name}")
    return (assumed.node, tuple(d.index for d in assumed.devices)) if assumed is not None else None


def test_the_next_pod_is_filtered_with_the_last_ones_devices_taken(ext: Extender) -> None:
    """kube-scheduler rotates where its node list starts; both nodes idle look alike, so h1
    (filtered before h0's bind, its list starting at n1) would have been offered n1 and the
    two halves would hold two GPUs. h0's half counted on n0 makes n0 the better node."""
    assert offered(ext, half("h0"), ["n0", "n1"]) == ["n0"]
    assert counted(ext, "h0") is not None
    assert offered(ext, half("h1"), ["n1", "n0"]) == ["n0"]
    (d0,) = bind_devices(ext, "h0", "n0")
    (d1,) = bind_devices(ext, "h1", "n0")
    assert d0["index"] == d1["index"] == counted(ext, "h0")[1][0]  # type: ignore[index]
    assert not ext.verbs._choices  # the binds took their choices over


def test_the_bind_keeps_the_devices_the_filter_chose(ext: Extender) -> None:
    offered(ext, half("h0"), ["n0", "n1"])
    chosen = counted(ext, "h0")
    assert chosen is not None
    (entry,) = bind_devices(ext, "h0", chosen[0])
    assert entry["index"] == chosen[1][0]


def test_a_refused_bind_gives_the_devices_back(ext: Extender) -> None:
    offered(ext, half("h0"), ["n0", "n1"])
    assert counted(ext, "h0") is not None
    reply = ext.verbs.bind({"PodNamespace": "default", "PodName": "h0", "PodUID": "uid-h0", "Node": "nowhere"})
    assert reply["Error"]
    assert counted(ext, "h0") is None
    assert all(d.free_milli == 1000 for n in ("n0", "n1") for d in ext.cache.node_model(n).gpus)  # type: ignore[union-attr]


def test_a_pod_filtered_again_counts_once(ext: Extender) -> None:
    offered(ext, half("h0"), ["n0", "n1"])
    offered(ext, half("h0"), ["n1"])  # a retry offered only n1: the n0 choice is given back
    assert counted(ext, "h0") == ("n1", counted(ext, "h0")[1])  # type: ignore[index]
    n0 = ext.cache.node_model("n0")
    assert n0 is not None and all(d.free_milli == 1000 for d in n0.gpus)


def test_a_choice_whose_bind_never_comes_expires(ext: Extender, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verbs_module, "CHOICE_TTL_S", 0.0)
    offered(ext, half("h0"), ["n0", "n1"])
    assert counted(ext, "h0") is not None
    assert ext.verbs.expire_choices() == 1
    assert counted(ext, "h0") is None and not ext.verbs._choices
    # A late bind still binds: it chooses again.
    (entry,) = bind_devices(ext, "h0", "n0")
    assert entry["milli"] == 500


def test_a_deleted_pod_leaves_nothing_counted(ext: Extender) -> None:
    offered(ext, half("h0"), ["n0", "n1"])
    ext.cache.pod_event("DELETED", half("h0"))
    assert counted(ext, "h0") is None
    ext.verbs.expire_choices()  # nothing to give back twice
    n0 = ext.cache.node_model("n0")
    assert n0 is not None and all(d.free_milli == 1000 for d in n0.gpus)


def test_a_pod_the_watch_has_not_seen_reserves_nothing(ext: Extender) -> None:
    """A caller cannot hold devices for pods it makes up."""
    assert offered(ext, half("ghost", uid="made-up"), ["n0", "n1"]) == ["n0"]
    assert ext.cache.assumed("made-up") is None and not ext.verbs._choices


def test_pods_offered_several_nodes_choose_nothing_yet(ext: Extender) -> None:
    """With the cut off kube-scheduler picks among the nodes: the bind chooses, as before."""
    ext.apply(parse("filter: {sampleNodes: all}", source="test"))
    assert offered(ext, half("h0"), ["n0", "n1"]) == ["n0", "n1"]
    assert counted(ext, "h0") is None


def queued_pair() -> tuple[Extender, list[JSON]]:
    """Two idle 2-GPU nodes and two pending 1-GPU pods (w0, w1) of queue "team", limited to one GPU."""
    pods = [pod(f"w{i}", gpus=1) for i in range(2)]
    for p in pods:
        p["metadata"]["labels"] = {"phalanx.io/queue": "team"}
    ext: Extender = extender_on([node("n0", gpus=2), node("n1", gpus=2)], pods)
    ext.queues.replace_queues([{"metadata": {"name": "team"}, "spec": {"limit": {"gpu": 1}}}])
    ext.queues.note_scheduler("default-scheduler")
    return ext, pods


def test_a_queue_limit_counts_the_chosen_devices() -> None:
    """Two pods of a queue limited to one GPU, filtered back to back (neither bound yet): the
    first's GPU counts from its filter, so the second is refused by its own filter with the
    queue's reason instead of being offered a node only to be refused at bind."""
    ext, pods = queued_pair()
    assert offered(ext, pods[0], ["n0", "n1"]) == ["n0"]
    reply = ext.verbs.filter({"Pod": pods[1], "NodeNames": ["n0", "n1"]})
    assert reply["NodeNames"] == []
    assert set(reply["FailedNodes"].values()) == {"queue team: gpu limit 1, in use 1, pod needs 1"}
    assert ext.cache.assumed("uid-w1") is None


def test_the_server_sends_the_reply_before_choosing(ext: Extender) -> None:
    """`filter_then` leaves the choice to after the reply; nothing is counted until it runs."""
    answer = ext.verbs.filter_then({"Pod": half("h0"), "NodeNames": ["n0", "n1"]})
    assert isinstance(answer, Then)
    assert answer.reply["NodeNames"] == ["n0"] and counted(ext, "h0") is None
    answer.after()
    assert counted(ext, "h0") is not None


def test_a_pod_without_gpus_has_nothing_to_do_after(ext: Extender) -> None:
    cpu = pod("cpu-only")
    ext.cache.pod_event("ADDED", cpu)
    assert not isinstance(ext.verbs.filter_then({"Pod": cpu, "NodeNames": ["n0", "n1"]}), Then)


def test_over_its_queue_limit_a_pod_gets_nothing_counted_and_its_bind_refuses() -> None:
    """The queue's usage moved between the filter's reply and its choice: nothing is counted,
    and the bind (which checks again) refuses."""
    ext, pods = queued_pair()
    first = ext.verbs.filter_then({"Pod": pods[0], "NodeNames": ["n0", "n1"]})
    second = ext.verbs.filter_then({"Pod": pods[1], "NodeNames": ["n0", "n1"]})
    assert isinstance(first, Then) and isinstance(second, Then)
    first.after()
    second.after()
    assert ext.cache.assumed("uid-w0") is not None and ext.cache.assumed("uid-w1") is None
    reply = ext.verbs.bind({"PodNamespace": "default", "PodName": "w1", "PodUID": "uid-w1", "Node": "n0"})
    assert reply["Error"] == "queue team: gpu limit 1, in use 1, pod needs 1"


def test_a_choice_made_while_its_bind_is_under_way_is_the_binds(ext: Extender, monkeypatch: pytest.MonkeyPatch) -> None:
    """kube-scheduler's bind overtook the work after the filter reply: the late choice keeps the
    bind's devices and records nothing that could expire and forget a bound pod's devices."""
    answer = ext.verbs.filter_then({"Pod": half("h0"), "NodeNames": ["n0", "n1"]})
    assert isinstance(answer, Then)
    checks = ext.verbs._may_bind

    def checks_with_the_choice_late(pod: Any, node: str) -> str:
        answer.after()  # after the bind took what was recorded (nothing), before it chose
        return checks(pod, node)

    monkeypatch.setattr(ext.verbs, "_may_bind", checks_with_the_choice_late)
    (entry,) = bind_devices(ext, "h0", "n0")
    assert not ext.verbs._choices and not ext.verbs._binding
    assert counted(ext, "h0") == ("n0", (entry["index"],))


def test_a_bind_to_another_node_moves_the_pod_there(ext: Extender) -> None:
    """Filter chose n0; a bind naming n1 (another caller, or kube-scheduler after a retry) takes
    devices on n1 and n0 counts nothing of it any more."""
    offered(ext, half("h0"), ["n0", "n1"])
    (entry,) = bind_devices(ext, "h0", "n1")
    assert counted(ext, "h0") == ("n1", (entry["index"],))
    n0 = ext.cache.node_model("n0")
    assert n0 is not None and all(d.free_milli == 1000 for d in n0.gpus)


def test_a_request_cannot_reserve_more_than_the_pod_asks_for(ext: Extender) -> None:
    """A filter request naming a real pod's uid with a bigger request (two whole GPUs instead
    of half of one) is answered for what it says, but what gets counted is the pod as the watch
    read it."""
    forged = pod("h0", gpus=2)
    forged["metadata"]["resourceVersion"] = "forged"
    assert offered(ext, forged, ["n0"]) == ["n0"]
    assumed = ext.cache.assumed("uid-h0")
    assert assumed is not None and [d.milli for d in assumed.devices] == [500]
