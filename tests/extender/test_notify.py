"""The gang member writer: a nomination goes to the pod's status before the wake-up annotation."""

from __future__ import annotations

import time

from extender.binder import Binder
from extender.gangs.notify import PLAN_ANNOTATION, Notifier
from tests.extender.fakes import FakeKube, pod


def patches(kube: FakeKube, count: int) -> list[tuple[str, object]]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = [(path, body) for method, path, body in kube.calls if method == "PATCH"]
        if len(got) >= count:
            return got
        time.sleep(0.01)
    raise AssertionError(f"expected {count} patches, saw {kube.calls}")


def test_nomination_first_then_the_wake_up() -> None:
    kube = FakeKube()
    kube.pods["default/a"] = pod("a")
    Notifier(Binder(kube)).nudge("default", "a", "1:n3", nominate="n3")
    assert patches(kube, 2) == [
        ("/api/v1/namespaces/default/pods/a/status", {"status": {"nominatedNodeName": "n3"}}),
        ("/api/v1/namespaces/default/pods/a", {"metadata": {"annotations": {PLAN_ANNOTATION: "1:n3"}}}),
    ]


def test_a_queued_member_is_only_nominated_and_a_release_clears_it() -> None:
    kube = FakeKube()
    kube.pods["default/a"] = pod("a")
    notifier = Notifier(Binder(kube))
    notifier.nudge("default", "a", None, nominate="n3")
    assert patches(kube, 1) == [("/api/v1/namespaces/default/pods/a/status", {"status": {"nominatedNodeName": "n3"}})]
    notifier.nudge("default", "a", None, nominate="")
    assert patches(kube, 2)[1] == ("/api/v1/namespaces/default/pods/a/status", {"status": {"nominatedNodeName": None}})
