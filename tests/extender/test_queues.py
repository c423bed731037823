"""The Kubernetes side of queues: Queue objects read, pods assigned to queues, usage kept in
step with the cache, and the admission answers filter, bind and the gang planner get."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from extender.cache import Cache
from extender.config import QueuesConfig
from extender.gangs.manager import GangManager
from extender.gangs.sources import WORKLOAD, GangObjects
from extender.objects import pod_info
from extender.queues import NO_SUCH_QUEUE, QueueBook, duration, parse_queue, view_json
from solver import SolverParams
from tests.extender.fakes import node, pod
from tests.extender.test_gangs import LEVELS, Recorder, add, member, workload


def queue(name: str, *, parent: str = "", weight: int = 1, **parts: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"parent": parent, "weight": weight, **parts}}


def labelled(p: dict[str, Any], **labels: str) -> dict[str, Any]:
    p["metadata"]["labels"] = {**(p["metadata"].get("labels") or {}), **labels}
    return p


def book_with(nodes: int = 4, *queues: dict[str, Any]) -> tuple[QueueBook, Cache]:
    cache = Cache(LEVELS)
    cache.replace_nodes([node(f"n{i}") for i in range(nodes)])
    book = QueueBook(cache, QueuesConfig(), gang_of=lambda p: "")
    book.replace_queues(queues)
    book.note_scheduler("default-scheduler")
    return book, cache


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"limit": {"gpu": "lots"}}, "queue q: spec.limit.gpu: 'lots' is not a quantity"),
        ({"deserved": {"tpu": 4}}, "queue q: spec.deserved.tpu: unknown resource"),
        ({"limit": {"cpu/A100": 4}}, "queue q: spec.limit.cpu/A100: unknown resource"),
        ({"limit": {"gpu": -1}}, "queue q: spec.limit.gpu: -1 is negative"),
        ({"weight": -2}, "queue q: spec.weight: expected an integer >= 0"),
        ({"limit": ["gpu"]}, "queue q: spec.limit: expected a mapping"),
    ],
    ids=["not a quantity", "unknown resource", "per-model cpu", "negative", "negative weight", "limit not a map"],
)
def test_a_bad_queue_spec_names_the_queue_and_field_and_keeps_the_rest(spec: dict[str, Any], problem: str) -> None:
    parsed, problems = parse_queue({"metadata": {"name": "q"}, "spec": {"deserved": {"cpu": "2"}, **spec}})
    assert len(problems) == 1 and problems[0].startswith(problem), problems
    assert parsed.name == "q"


def test_a_queue_whose_spec_is_not_an_object_is_read_as_empty_with_a_problem() -> None:
    parsed, problems = parse_queue({"metadata": {"name": "q"}, "spec": ["gpu"]})
    assert problems == ["queue q: spec: expected an object, got list"] and parsed.limit == {}


def test_amounts_are_read_in_the_solver_units() -> None:
    """cpu in milli, memory in MiB, gpuShare as decimal GPUs in milli, per-model keys kept."""
    parsed, problems = parse_queue(
        queue("q", limit={"cpu": "1500m", "memory": "2Gi", "gpu": 8, "gpuShare": "2.5", "gpuMemory/A100": "80Gi"})
    )
    assert problems == []
    assert dict(parsed.limit) == {"cpu": 1500, "memory": 2048, "gpu": 8, "gpuShare": 2500, "gpuMemory/A100": 81920}


def test_a_pod_joins_its_label_queue_then_its_namespace_queue_then_the_default() -> None:
    book, _ = book_with()
    book.replace_namespaces([{"metadata": {"name": "ml", "labels": {"phalanx.io/queue": "ml-team"}}}])
    assert book.queue_of(pod_info(labelled(pod("a"), **{"phalanx.io/queue": "a"}))) == "a"
    assert book.queue_of(pod_info(labelled(pod("k"), **{"kai.scheduler/queue": "k"}))) == "k"
    assert book.queue_of(pod_info(labelled(pod("v"), **{"scheduling.volcano.sh/queue-name": "v"}))) == "v"
    assert book.queue_of(pod_info(pod("n", namespace="ml"))) == "ml-team"
    assert book.queue_of(pod_info(pod("d"))) == "default"


def test_usage_follows_binds_and_deletions_and_pending_pods_are_demand() -> None:
    book, cache = book_with(4, queue("a"))
    bound = labelled(pod("b", gpus=4, node_name="n0"), **{"phalanx.io/queue": "a"})
    waiting = labelled(pod("w", gpus=2), **{"phalanx.io/queue": "a"})
    add(cache, bound, waiting)
    (view,) = [v for v in book.views() if v.name == "a"]
    assert view.allocated["gpu"] == 4 and view.demand["gpu"] == 6 and view.pending_pods == 1
    assert view.allocated["gpu/A100"] == 4  # the bound pod's devices say which model
    cache.pod_event("DELETED", bound)
    (view,) = [v for v in book.views() if v.name == "a"]
    assert view.allocated.get("gpu", 0) == 0 and view.demand["gpu"] == 2


def test_queues_are_off_until_a_queue_object_exists() -> None:
    book, cache = book_with(4)
    add(cache, *(labelled(pod(f"p{i}", gpus=8, node_name=f"n{i}"), **{"phalanx.io/queue": "a"}) for i in range(3)))
    assert book.check_pod(pod_info(labelled(pod("x", gpus=8), **{"phalanx.io/queue": "nowhere"}))) == ""


def test_a_queue_at_its_limit_refuses_with_the_queue_resource_limit_usage_and_request() -> None:
    book, cache = book_with(4, queue("team-a", limit={"gpu": 16}))
    add(cache, *(labelled(pod(f"p{i}", gpus=8, node_name=f"n{i}"), **{"phalanx.io/queue": "team-a"}) for i in range(2)))
    asking = pod_info(labelled(pod("x", gpus=8), **{"phalanx.io/queue": "team-a"}))
    assert book.check_pod(asking) == "queue team-a: gpu limit 16, in use 16, pod needs 8"
    cache.pod_event("DELETED", labelled(pod("p0", gpus=8, node_name="n0"), **{"phalanx.io/queue": "team-a"}))
    assert book.check_pod(asking) == ""  # usage dropped: admitted


def test_a_parent_limit_binds_its_children() -> None:
    book, cache = book_with(4, queue("org", limit={"gpu": 8}), queue("team", parent="org"))
    add(cache, labelled(pod("p", gpus=8, node_name="n0"), **{"phalanx.io/queue": "team"}))
    refusal = book.check_pod(pod_info(labelled(pod("x", gpus=1), **{"phalanx.io/queue": "team"})))
    assert refusal == "queue org: gpu limit 8, in use 8, pod needs 1"


def test_a_pod_naming_a_missing_queue_waits_while_queues_are_in_use() -> None:
    book, _ = book_with(4, queue("a"))
    refusal = book.check_pod(pod_info(labelled(pod("x", gpus=1), **{"phalanx.io/queue": "typo"})))
    assert refusal.startswith(f"queue typo: {NO_SUCH_QUEUE}")


def test_binds_racing_past_a_limit_are_stopped_by_the_bind_check() -> None:
    """Two binds at once for the last 8 GPUs of a queue: exactly one gets them."""
    book, cache = book_with(4, queue("a", limit={"gpu": 8}))
    pods = [labelled(pod(f"p{i}", gpus=8), **{"phalanx.io/queue": "a"}) for i in range(2)]
    infos = add(cache, *pods)
    outcomes: list[str] = []

    def bind(info: Any, where: str) -> None:
        with book.bind_lock:
            refusal = book.bind_check(info)
            if not refusal:
                cache.assume(info.uid, where, ())
            outcomes.append(refusal)

    threads = [threading.Thread(target=bind, args=(i, f"n{n}")) for n, i in enumerate(infos)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["", "queue a: gpu limit 8, in use 8, pod needs 8"]


def test_the_view_shows_allocated_deserved_fair_share_and_waits() -> None:
    book, cache = book_with(2, queue("a", deserved={"gpu": 4}, limit={"gpu": 12}))
    add(cache, labelled(pod("b", gpus=4, node_name="n0"), **{"phalanx.io/queue": "a"}))
    (body,) = [view_json(v) for v in book.views() if v.name == "a"]
    assert body["summary"]["gpu"] == {"allocated": "4", "deserved": "4", "fairShare": "4", "limit": "12"}
    assert body["pendingPods"] == 0 and body["oldestWait"] == "0s"
    assert [duration(s) for s in (5, 250, 7380)] == ["5s", "4m10s", "2h3m"]


def test_a_gang_over_its_queue_limit_waits_with_the_message_and_plans_once_usage_drops() -> None:
    cache = Cache(LEVELS)
    cache.replace_nodes([node(f"n{i}", rack=f"b0-r{i // 4}") for i in range(8)])
    objects = GangObjects()
    objects.replace(WORKLOAD, [workload("job", 2)])
    rec = Recorder()
    book = QueueBook(cache, QueuesConfig(), gang_of=lambda p: "")
    book.replace_queues([queue("team-a", limit={"gpu": 24})])
    mgr = GangManager(cache, objects, SolverParams, rec.notify, rec.nudge, bind_wait_cap_s=5, admission=book)
    running = labelled(pod("r", gpus=16, node_name="n7"), **{"phalanx.io/queue": "team-a"})
    add(cache, running)
    members = add(cache, *(labelled(member(f"m{i}", "job"), **{"phalanx.io/queue": "team-a"}) for i in range(2)))
    names = [f"n{i}" for i in range(8)]
    answer = mgr.filter(members[0], names)
    assert answer is not None and not answer.passed
    assert answer.message == "queue team-a: gpu limit 24, in use 16, gang needs 16"
    cache.pod_event("DELETED", running)
    answer = mgr.filter(members[0], names)
    assert answer is not None and len(answer.passed) == 1


def test_without_a_queue_object_the_status_writer_derives_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no Queue object every pod change marks the whole book dirty: a status round that
    derived the views anyway re-read every pod each few seconds for nothing to write."""
    from extender.queue_status import QueueStatusWriter
    from tests.extender.fakes import FakeKube

    book, cache = book_with(2)
    cache.pod_event("ADDED", pod("a", node_name="n0", gpus=1))
    kube = FakeKube()
    writer = QueueStatusWriter(kube, book, leading=lambda: True, counts=lambda q: (0, 0))

    def derived() -> list[Any]:
        raise AssertionError("views derived with no Queue object")

    monkeypatch.setattr(book, "views", derived)
    assert writer.write_once() == 0 and not kube.calls
    monkeypatch.undo()
    book.replace_queues([queue("q")])
    assert writer.write_once() == 1 and [c[1] for c in kube.calls] == ["/apis/phalanx.io/v1alpha1/queues/q/status"]
