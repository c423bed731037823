"""Binds answered before their Binding lands, and their journal (extender/landing.py).

kube-scheduler keeps a pod it was told is bound assumed on its node for good, so each bind
answered early must land whatever fails meanwhile, be counted until it does, and survive a
restart of the extender through the journal."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from extender import landing as landing_module
from extender.app import Extender
from extender.landing import Journal, Landing, Landings
from extender.objects import DEVICES_ANNOTATION
from tests.extender.fakes import FakeKube, extender_on, node, pod


def eventually(check: Callable[[], Any], what: str, deadline_s: float = 20.0) -> Any:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"not within {deadline_s} s: {what}")


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(landing_module, "FIRST_BACKOFF_S", 0.01)
    monkeypatch.setattr(landing_module, "MAX_BACKOFF_S", 0.05)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------ the journal


def test_the_journal_replays_only_the_landings_left_open(tmp_path: Path) -> None:
    path = tmp_path / "binds"
    journal = Journal(path)
    assert journal.load() == []
    a, b = Landing("u-a", "ns", "a", "n0", '[{"index":0}]'), Landing("u-b", "ns", "b", "n1")
    journal.opened(a)
    journal.opened(b)
    journal.ended("u-a")
    journal.ended("u-a")  # twice: written once
    journal.close()
    assert [entry.get("ended") for entry in lines(path)] == [None, None, "u-a"]
    again = Journal(path)
    assert again.load() == [b]
    again.close()
    assert lines(path) == [{"uid": "u-b", "namespace": "ns", "name": "b", "node": "n1", "record": ""}]  # rewritten


def test_lines_that_do_not_read_are_skipped_and_the_rest_kept(tmp_path: Path) -> None:
    path = tmp_path / "binds"
    good = {"uid": "u-1", "namespace": "ns", "name": "p", "node": "n0", "record": ""}
    path.write_text(
        "\n".join(
            [
                "not json",
                json.dumps([1, 2]),
                json.dumps({**good, "uid": 7}),
                json.dumps({**good, "node": ""}),
                json.dumps({"ended": 3}),
                json.dumps({**good, "name": "x" * (landing_module.MAX_LINE + 1)}),
                json.dumps(good),
                '{"uid": "u-2", "namesp',  # cut by a crash
            ]
        )
    )
    journal = Journal(path)
    assert journal.load() == [Landing("u-1", "ns", "p", "n0")]
    journal.close()


def test_a_long_journal_is_rewritten_with_its_open_landings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(landing_module, "COMPACT_LINES", 10)
    path = tmp_path / "binds"
    journal = Journal(path)
    journal.load()
    journal.opened(Landing("keep", "ns", "keep", "n0"))
    for i in range(20):
        journal.opened(Landing(f"u{i}", "ns", f"p{i}", "n0"))
        journal.ended(f"u{i}")
    assert len(lines(path)) < 10
    journal.close()
    again = Journal(path)
    assert again.load() == [Landing("keep", "ns", "keep", "n0")]
    again.close()


# ------------------------------------------------------------------ the pool


def test_a_landing_is_tried_until_it_settles_then_ended_in_the_journal(tmp_path: Path) -> None:
    tries: list[str] = []
    settled = threading.Event()

    def land(landing: Landing) -> bool:
        tries.append(landing.uid)
        if len(tries) < 3:
            return False
        settled.set()
        return True

    landings = Landings(Journal(tmp_path / "binds"), land, lambda landing: True, workers=2)
    landings.start()
    try:
        assert landings.begin(Landing("u", "ns", "p", "n0"))
        assert landings.node_of("u") == "n0"
        assert settled.wait(10)
        eventually(lambda: landings.node_of("u") == "", "the landing ended")
        assert tries == ["u", "u", "u"]
        assert landings.journal.open_count() == 0
    finally:
        landings.stop()


def test_a_journal_that_cannot_be_written_leaves_the_bind_to_land_first(tmp_path: Path) -> None:
    landings = Landings(Journal(tmp_path / "binds"), lambda landing: True, lambda landing: True)
    landings.journal.close()  # as a full or gone volume would: writes fail
    assert not landings.begin(Landing("u", "ns", "p", "n0"))
    assert landings.node_of("u") == ""


# ------------------------------------------------------------------ the extender


@pytest.fixture
def ext(tmp_path: Path) -> Iterator[Extender]:
    """One 1-GPU node, two pending 1-GPU pods (p1, p2) and one CPU pod (c), binds journalled."""
    extender: Extender = extender_on(
        [node("n0", gpus=1), node("n1", gpus=1)],
        [pod("p1", gpus=1), pod("p2", gpus=1), pod("c")],
        bind_journal=tmp_path / "binds",
    )
    assert extender.landings is not None
    extender.landings.start()
    yield extender
    extender.landings.stop()


def kube_of(ext: Extender) -> FakeKube:
    assert isinstance(ext.kube, FakeKube)
    return ext.kube


def bind(ext: Extender, name: str, node_name: str) -> dict[str, Any]:
    reply: dict[str, Any] = ext.verbs.bind(
        {"PodNamespace": "default", "PodName": name, "PodUID": f"uid-{name}", "Node": node_name}
    )
    return reply


def bound_to(ext: Extender, name: str) -> str:
    return str(kube_of(ext).pods[f"default/{name}"]["spec"].get("nodeName") or "")


def test_a_single_pods_bind_is_answered_and_lands_with_its_devices(ext: Extender) -> None:
    assert bind(ext, "p1", "n0") == {"Error": ""}
    assert ext.cache.assumed("uid-p1") is not None  # counted from the answer on
    eventually(lambda: bound_to(ext, "p1") == "n0", "p1 bound to n0")
    record = json.loads(kube_of(ext).pods["default/p1"]["metadata"]["annotations"][DEVICES_ANNOTATION])
    assert [d["index"] for d in record] == [0]
    assert bind(ext, "c", "n1") == {"Error": ""}
    eventually(lambda: bound_to(ext, "c") == "n1", "the CPU pod bound")


def test_a_binding_that_fails_is_retried_and_its_devices_stay_counted(ext: Extender) -> None:
    kube_of(ext).fail_bind = True
    assert bind(ext, "p1", "n0") == {"Error": ""}
    eventually(lambda: sum(1 for c in kube_of(ext).calls if c[1].endswith("/p1/binding")) >= 6, "two tries")
    assert bound_to(ext, "p1") == ""
    # What the PhalanxBindsNotLanding alert reads (deploy/monitoring.py), by its exact name and labels.
    retried = {"verb": "bind-landing", "outcome": "retried"}
    assert (ext.metrics.registry.get_sample_value("phalanx_extender_outcomes_total", retried) or 0) >= 1
    # kube-scheduler counts p1 on n0: so does Phalanx, and the next pod is not offered its GPU.
    assert ext.verbs.filter({"Pod": kube_of(ext).pods["default/p2"], "NodeNames": ["n0"]})["NodeNames"] == []
    assert "no longer fits" in bind(ext, "p2", "n0")["Error"]
    kube_of(ext).fail_bind = False
    eventually(lambda: bound_to(ext, "p1") == "n0", "p1 landed once the server took Bindings again")
    eventually(lambda: ext.landings is not None and ext.landings.node_of("uid-p1") == "", "the landing ended")


def test_a_bind_asked_again_while_it_lands_is_answered_for_its_node_only(ext: Extender) -> None:
    kube_of(ext).fail_bind = True
    assert bind(ext, "p1", "n0") == {"Error": ""}
    assert bind(ext, "p1", "n0") == {"Error": ""}  # a kube-scheduler that restarted: it lands there
    assert "still landing" in bind(ext, "p1", "n1")["Error"]
    kube_of(ext).fail_bind = False
    eventually(lambda: bound_to(ext, "p1") == "n0", "p1 bound to n0")


def test_a_landing_ends_when_the_pod_is_deleted(ext: Extender) -> None:
    kube_of(ext).fail_bind = True
    assert bind(ext, "p1", "n0") == {"Error": ""}
    ext.cache.pod_event("DELETED", kube_of(ext).pods["default/p1"])
    assert ext.landings is not None
    eventually(lambda: ext.landings is not None and ext.landings.node_of("uid-p1") == "", "the landing ended")
    assert ext.cache.assumed("uid-p1") is None


def test_a_node_whose_agent_admits_devices_answers_when_the_binding_lands(ext: Extender) -> None:
    assert ext.binder.agents is not None
    ext.binder.agents.endpoint_of = lambda node: "127.0.0.1:1" if node == "n0" else ""  # type: ignore[method-assign]
    pod_info = ext.cache.pod("uid-p1")
    assert pod_info is not None
    devices = ext.verbs._assume_devices(pod_info, "n0")
    assert devices
    assert not ext.verbs._answer_early(pod_info, "n0", devices)  # the agent's refusal must reach kube-scheduler
    assert ext.verbs._answer_early(pod_info, "n1", ())  # no devices to admit there


def test_a_restarted_extender_lands_what_the_last_one_answered(tmp_path: Path) -> None:
    """The journal holds p1's bind to n0 (answered, not landed) and a bind of a pod since bound:
    the new process counts p1's device before any verb answers, and lands it."""
    path = tmp_path / "binds"
    journal = Journal(path)
    journal.load()
    journal.opened(Landing("uid-p1", "default", "p1", "n0", '[{"index":0,"milli":1000,"memoryMiB":81920}]'))
    journal.opened(Landing("uid-done", "default", "done", "n1"))
    journal.close()
    ext: Extender = extender_on(
        [node("n0", gpus=1), node("n1", gpus=1)],
        [pod("p1", gpus=1), pod("p2", gpus=1), pod("done", node_name="n1")],
        bind_journal=path,
    )
    assert ext.landings is not None
    ext._synced = False
    assert ext.synced()  # resumed here, before a verb's answer
    assumed = ext.cache.assumed("uid-p1")
    assert assumed is not None and assumed.node == "n0" and [d.index for d in assumed.devices] == [0]
    assert ext.verbs.filter({"Pod": kube_of(ext).pods["default/p2"], "NodeNames": ["n0"]})["NodeNames"] == []
    ext.landings.start()
    try:
        eventually(lambda: bound_to(ext, "p1") == "n0", "p1 landed")
        eventually(lambda: ext.landings is not None and ext.landings.journal.open_count() == 0, "journal empty")
        assert not any(c[1].endswith("/done/binding") for c in kube_of(ext).calls)
    finally:
        ext.landings.stop()


def test_without_a_journal_a_bind_is_answered_when_it_landed() -> None:
    ext: Extender = extender_on([node("n0", gpus=1)], [pod("p1", gpus=1)])
    assert ext.landings is None
    kube_of(ext).fail_bind = True
    assert "etcd on fire" in bind(ext, "p1", "n0")["Error"]


def test_a_gang_members_bind_is_answered_only_when_its_binding_landed(tmp_path: Path) -> None:
    """Its gate needs the real outcome: a member refused by the API server is told so (and
    kept reserved for kube-scheduler's retry), never answered before."""
    from extender.gangs.sources import WORKLOAD
    from tests.extender.test_gangs import member, workload

    ext: Extender = extender_on([node("n0"), node("n1")], [], bind_journal=tmp_path / "binds")
    ext.gang_objects.replace(WORKLOAD, [workload("g", 1)])
    obj = member("g0", "g")
    kube_of(ext).pods["default/g0"] = obj
    ext.cache.pod_event("ADDED", obj)
    (planned,) = ext.verbs.filter({"Pod": obj, "NodeNames": ["n0", "n1"]})["NodeNames"]
    kube_of(ext).fail_bind = True
    args = {"PodNamespace": "default", "PodName": "g0", "PodUID": "uid-g0", "Node": planned}
    assert "etcd on fire" in ext.verbs.bind(args)["Error"]
    assert ext.landings is not None and ext.landings.journal.open_count() == 0
    assert ext.cache.assumed("uid-g0") is not None
    kube_of(ext).fail_bind = False
    assert ext.verbs.bind(args) == {"Error": ""}
    assert bound_to(ext, "g0") == planned  # landed before the answer
    ext.landings.journal.close()


def test_a_journal_that_cannot_be_written_at_start_answers_binds_when_they_land(tmp_path: Path) -> None:
    """A read-only or full volume: the extender starts, and every bind waits for its Binding."""
    blocked = tmp_path / "a-file-not-a-directory"
    blocked.write_text("")
    ext: Extender = extender_on([node("n0", gpus=1)], [pod("p1", gpus=1)], bind_journal=blocked / "binds")
    assert ext.landings is not None
    kube_of(ext).fail_bind = True
    assert "etcd on fire" in bind(ext, "p1", "n0")["Error"]
    kube_of(ext).fail_bind = False
    assert bind(ext, "p1", "n0") == {"Error": ""}
    assert bound_to(ext, "p1") == "n0"
