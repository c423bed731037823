"""The gang member writer: a nomination and its wake-up annotation go out in one pods/status write."""

from __future__ import annotations

import threading
import time

import pytest

from extender.binder import Binder
from extender.gangs import notify
from extender.gangs.notify import PLAN_ANNOTATION, Notifier
from extender.kube import Response
from tests.extender.fakes import FakeKube, pod


def patches(kube: FakeKube, count: int) -> list[tuple[str, object]]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = [(path, body) for method, path, body in kube.calls if method == "PATCH"]
        if len(got) >= count:
            return got
        time.sleep(0.01)
    raise AssertionError(f"expected {count} patches, saw {kube.calls}")


def test_a_nomination_and_its_wake_up_are_one_write() -> None:
    """pods/status takes metadata too: the member is woken by the write that nominates it, so
    it never comes back without its nomination, and the plan costs one write per member."""
    kube = FakeKube()
    kube.pods["default/a"] = pod("a")
    Notifier(Binder(kube)).nudge("default", "a", "1:n3", nominate="n3")
    assert patches(kube, 1) == [
        (
            "/api/v1/namespaces/default/pods/a/status",
            {"status": {"nominatedNodeName": "n3"}, "metadata": {"annotations": {PLAN_ANNOTATION: "1:n3"}}},
        )
    ]
    time.sleep(0.1)  # nothing follows it
    assert len([c for c in kube.calls if c[0] == "PATCH"]) == 1
    assert kube.pods["default/a"]["metadata"]["annotations"][PLAN_ANNOTATION] == "1:n3"


class Bound(FakeKube):
    """kube-apiserver 1.37 (ClearingNominatedNodeNameAfterBinding): no nomination for a bound pod."""

    def request(self, method: str, path: str, **kw: object) -> Response:  # type: ignore[override]
        if method == "PATCH" and path.endswith("/status"):
            self.calls.append((method, path, kw.get("body")))
            message = 'Pod "a" is invalid: status.nominatedNodeName: Forbidden: may not be set on pods '
            message += "that are already bound to a node"
            return Response(422, {"message": message})
        return super().request(method, path, **kw)  # type: ignore[arg-type]


def outcomes(seen: list[str], count: int) -> list[str]:
    deadline = time.monotonic() + 10
    while len(seen) < count:
        assert time.monotonic() < deadline, seen
        time.sleep(0.01)
    return seen


def test_each_wake_up_is_counted_by_outcome() -> None:
    """Woken when the write lands; bound when kube-scheduler took the member up by itself and
    bound it first (kube-apiserver refuses the nomination then, and nothing more is written);
    failed when the pod is gone. A nomination alone (no wake-up) is not counted."""
    seen: list[str] = []
    kube = FakeKube()
    kube.pods["default/a"] = pod("a")
    notifier = Notifier(Binder(kube), seen.append)
    notifier.nudge("default", "a", None, nominate="n3")
    patches(kube, 1)
    notifier.nudge("default", "a", "1:n3", nominate="n3")
    assert outcomes(seen, 1) == ["woken"]
    notifier.nudge("default", "gone", "1:n3", nominate="n3")
    assert outcomes(seen, 2) == ["woken", "failed"]

    refused: list[str] = []
    bound = Bound()
    bound.pods["default/a"] = pod("a")
    Notifier(Binder(bound), refused.append).nudge("default", "a", "1:n3", nominate="n3")
    assert outcomes(refused, 1) == ["bound"]
    time.sleep(0.1)
    assert len([c for c in bound.calls if c[0] == "PATCH"]) == 1  # no plain write of the annotation after it
    assert PLAN_ANNOTATION not in bound.pods["default/a"]["metadata"].get("annotations", {})


class NoStatus(FakeKube):
    """An extender whose RBAC does not grant patch on pods/status."""

    def request(self, method: str, path: str, **kw: object) -> Response:  # type: ignore[override]
        if method == "PATCH" and path.endswith("/status"):
            self.calls.append((method, path, kw.get("body")))
            return Response(403, {"message": "forbidden"})
        return super().request(method, path, **kw)  # type: ignore[arg-type]


def test_without_rights_on_pods_status_the_wake_up_is_still_written() -> None:
    kube = NoStatus()
    kube.pods["default/a"] = pod("a")
    Notifier(Binder(kube)).nudge("default", "a", "1:n3", nominate="n3")
    assert patches(kube, 2)[1] == (
        "/api/v1/namespaces/default/pods/a",
        {"metadata": {"annotations": {PLAN_ANNOTATION: "1:n3"}}},
    )
    assert kube.pods["default/a"]["metadata"]["annotations"][PLAN_ANNOTATION] == "1:n3"


def test_a_queued_member_is_only_nominated_and_a_release_clears_it() -> None:
    kube = FakeKube()
    kube.pods["default/a"] = pod("a")
    notifier = Notifier(Binder(kube))
    notifier.nudge("default", "a", None, nominate="n3")
    assert patches(kube, 1) == [("/api/v1/namespaces/default/pods/a/status", {"status": {"nominatedNodeName": "n3"}})]
    notifier.nudge("default", "a", None, nominate="")
    assert patches(kube, 2)[1] == ("/api/v1/namespaces/default/pods/a/status", {"status": {"nominatedNodeName": None}})


def test_nudges_of_a_pod_still_queued_become_one_write_with_the_latest(monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst of nudges for one pod (watch events while its nomination is on its way) is one
    queue entry: one write, with the latest nomination and wake-up."""
    monkeypatch.setattr(notify, "NUDGERS", 0)  # no writer yet: everything stays queued
    kube = FakeKube()
    kube.pods["default/a"] = pod("a")
    kube.pods["default/b"] = pod("b")
    notifier = Notifier(Binder(kube))
    notifier.nudge("default", "a", None, nominate="n1")
    notifier.nudge("default", "b", None, nominate="n7")
    for node in ("n2", "n3"):
        notifier.nudge("default", "a", None, nominate=node)
    notifier.nudge("default", "a", "2:n3")
    assert notifier.nudges.qsize() == 2
    threading.Thread(target=notifier._nudge_loop, daemon=True).start()
    assert patches(kube, 2) == [
        (
            "/api/v1/namespaces/default/pods/a/status",
            {"status": {"nominatedNodeName": "n3"}, "metadata": {"annotations": {PLAN_ANNOTATION: "2:n3"}}},
        ),
        ("/api/v1/namespaces/default/pods/b/status", {"status": {"nominatedNodeName": "n7"}}),
    ]
    time.sleep(0.1)
    assert len([c for c in kube.calls if c[0] == "PATCH"]) == 2


class Throttled(FakeKube):
    """kube-apiserver answering the first nomination writes 503, then 429."""

    refusals = 2

    def request(self, method: str, path: str, **kw: object) -> Response:  # type: ignore[override]
        if method == "PATCH" and path.endswith("/status") and self.refusals:
            self.refusals -= 1
            return Response(503 if self.refusals else 429, {"message": "try later"})
        return super().request(method, path, **kw)  # type: ignore[arg-type]


def test_a_nomination_refused_for_now_is_written_again() -> None:
    """429 and 5xx come back as answers, not exceptions: the writer must still back off and
    write again, or a member that failed its cycle waits for kube-scheduler's 5-minute flush."""
    kube = Throttled()
    kube.pods["default/a"] = pod("a")
    Notifier(Binder(kube)).nudge("default", "a", None, nominate="n3")
    deadline = time.monotonic() + 10
    while kube.pods["default/a"]["status"].get("nominatedNodeName") != "n3":
        assert time.monotonic() < deadline, kube.calls
        time.sleep(0.02)
    assert kube.refusals == 0


class Slow(FakeKube):
    """The first nomination write of each pod waits until `go` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.seen: set[str] = set()

    def request(self, method: str, path: str, **kw: object) -> Response:  # type: ignore[override]
        if method == "PATCH" and path.endswith("/status") and path not in self.seen:
            self.seen.add(path)
            self.go.wait(10)
        return super().request(method, path, **kw)  # type: ignore[arg-type]


def test_a_pods_writes_never_overtake_each_other(monkeypatch: pytest.MonkeyPatch) -> None:
    """A release nudged while the plan's nomination is being written must land after it (a
    second writer taking it at once could finish first and leave the old nomination)."""
    monkeypatch.setattr(notify, "NUDGERS", 0)
    kube = Slow()
    kube.pods["default/a"] = pod("a")
    notifier = Notifier(Binder(kube))
    for _ in range(2):
        threading.Thread(target=notifier._nudge_loop, daemon=True).start()
    notifier.nudge("default", "a", None, nominate="n3")
    deadline = time.monotonic() + 10
    while not kube.seen:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    notifier.nudge("default", "a", None, nominate="")  # the release, while n3 is on its way
    time.sleep(0.2)  # a window in which the idle writer would take it if it could
    kube.go.set()
    statuses = [body for _, body in patches(kube, 2)]
    assert statuses == [{"status": {"nominatedNodeName": "n3"}}, {"status": {"nominatedNodeName": None}}]
    assert "nominatedNodeName" not in kube.pods["default/a"]["status"]


WORKLOAD_OBJ = {
    "apiVersion": "phalanx.io/v1alpha1",
    "kind": "Workload",
    "metadata": {"name": "w", "namespace": "default", "uid": "uid-w"},
    "spec": {"gangGroups": [{"name": "g", "minCount": 4, "rankedGroups": [{"name": "r", "eqGroups": [{"count": 4}]}]}]},
}


def conditions(body: object) -> dict[str, dict[str, str]]:
    assert isinstance(body, dict)
    return {c["type"]: c for c in body["status"]["conditions"]}


def test_a_workload_says_how_many_members_it_waits_for_the_moment_it_is_seen() -> None:
    from extender.app import Extender, Options
    from extender.gangs.sources import WORKLOAD

    kube = FakeKube()
    ext = Extender(kube, Options(port=0))
    try:
        ext._definition_event(WORKLOAD, "ADDED", WORKLOAD_OBJ)  # no member exists yet
        path, body = patches(kube, 1)[0]
        assert path == "/apis/phalanx.io/v1alpha1/namespaces/default/workloads/w/status"
        waiting = conditions(body)["WaitingForQuorum"]
        assert (waiting["status"], waiting["reason"], waiting["message"]) == ("True", "WaitingForQuorum", "0/4 members")
        assert conditions(body)["Scheduled"]["status"] == "False"
        assert not [c for c in kube.calls if c[1].endswith("/events")]  # status only: no Event per member
        ext._definition_event(WORKLOAD, "ADDED", {**WORKLOAD_OBJ, "status": {"phase": "Scheduled"}})
        time.sleep(0.2)
        assert len(patches(kube, 1)) == 1  # one with a status already (a restart's re-list) is left alone
    finally:
        ext.server.server_close()


def test_conditions_keep_their_transition_time_until_their_status_changes() -> None:
    from extender.gangs.sources import WORKLOAD, GangObjects, _workload

    kube = FakeKube()
    objects = GangObjects()
    objects.event(WORKLOAD, "ADDED", WORKLOAD_OBJ)
    spec = _workload(objects, "default", {"phalanx.io/workload": "w"}).spec
    assert spec is not None
    notifier = Notifier(Binder(kube))
    notifier(spec, "WaitingForQuorum", "waiting for gang quorum 3/4", "Normal")
    first = conditions(patches(kube, 1)[0][1])
    notifier._transitions[spec.key] = {
        k: (v[0], "2020-01-01T00:00:00Z") for k, v in notifier._transitions[spec.key].items()
    }
    notifier(spec, "Scheduled", "bound: 4 members in rack r1", "Normal")
    second = conditions(patches(kube, 2)[1][1])
    assert first["WaitingForQuorum"]["message"] == "3/4 members"
    assert second["WaitingForQuorum"]["status"] == "False" and second["Scheduled"]["status"] == "True"
    assert second["Scheduled"]["lastTransitionTime"] != "2020-01-01T00:00:00Z"  # changed: now
    assert second["Unschedulable"]["lastTransitionTime"] == "2020-01-01T00:00:00Z"  # False before and after
    assert [c[1] for c in kube.calls if c[1].endswith("/events")] == ["/api/v1/namespaces/default/events"]


def test_only_a_definition_change_a_gang_reads_wakes_its_members(monkeypatch: pytest.MonkeyPatch) -> None:
    """Phalanx writes a Workload's status at every quorum step; before, each write's event woke
    every member created so far (thousands of writes for a 512-pod gang still being created)."""
    from extender.app import Extender, Options
    from extender.gangs.sources import WORKLOAD

    kube = FakeKube()
    ext = Extender(kube, Options(port=0))
    woken: list[tuple[str, str]] = []
    monkeypatch.setattr(ext.gangs, "definition_changed", lambda ns, name: woken.append((ns, name)))
    try:
        first = {**WORKLOAD_OBJ, "metadata": {**WORKLOAD_OBJ["metadata"], "resourceVersion": "1"}}
        ext._definition_event(WORKLOAD, "ADDED", first)
        assert woken == [("default", "w")]
        status_only = {
            **WORKLOAD_OBJ,
            "metadata": {**WORKLOAD_OBJ["metadata"], "resourceVersion": "2", "managedFields": [{"manager": "phalanx"}]},
            "status": {"phase": "Pending", "pendingReason": "waiting for gang quorum 3/4"},
        }
        ext._definition_event(WORKLOAD, "MODIFIED", status_only)
        assert woken == [("default", "w")]
        spec = {**status_only, "spec": {**WORKLOAD_OBJ["spec"], "timeoutSeconds": 30}}
        ext._definition_event(WORKLOAD, "MODIFIED", spec)
        labelled = {**spec, "metadata": {**spec["metadata"], "labels": {"team": "a"}}}
        ext._definition_event(WORKLOAD, "MODIFIED", labelled)
        assert woken == [("default", "w")] * 3
    finally:
        ext.server.server_close()


def test_a_native_pod_group_wakes_on_the_condition_it_reads() -> None:
    from extender.gangs.sources import NATIVE_POD_GROUP, WORKLOAD, same_definition

    def group(*conditions: tuple[str, str]) -> dict[str, object]:
        listed = [{"type": t, "status": s} for t, s in conditions]
        return {"metadata": {"name": "pg", "namespace": "default"}, "spec": {}, "status": {"conditions": listed}}

    scheduled = group(("PodGroupInitiallyScheduled", "True"))
    assert not same_definition(NATIVE_POD_GROUP, group(), scheduled)
    assert same_definition(NATIVE_POD_GROUP, scheduled, group(("PodGroupInitiallyScheduled", "True"), ("Other", "x")))
    assert same_definition(WORKLOAD, group(), scheduled)  # a Workload's status is read by nothing
    assert not same_definition(WORKLOAD, group(), {**group(), "metadata": {"name": "pg"}})  # namespace gone
