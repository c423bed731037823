"""scheduling.k8s.io PodGroups at the version the API server serves (v1beta1 on Kubernetes 1.37,
v1alpha2 on 1.36): the watch finds it, status goes to it with its condition, and v1beta1's
`disruptionMode` and mutable `minCount` are honoured."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from extender.binder import Binder
from extender.gangs.notify import Notifier
from extender.gangs.sources import NATIVE_POD_GROUP, GangObjects, resolve
from extender.watch import Reflector
from tests.extender.fakes import FakeKube, extender_on, node, pod

V1BETA1 = "/apis/scheduling.k8s.io/v1beta1/podgroups"
V1ALPHA2 = "/apis/scheduling.k8s.io/v1alpha2/podgroups"
BETA, ALPHA = "scheduling.k8s.io/v1beta1", "scheduling.k8s.io/v1alpha2"
INITIALLY = "PodGroupInitiallyScheduled"


def pod_group(name: str, min_count: int, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"pg-{name}"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}, **spec},
    }


@pytest.mark.parametrize(
    ("case", "served", "want_path"),
    [
        ("Kubernetes 1.37 serves v1beta1", V1BETA1, V1BETA1),
        ("Kubernetes 1.36 serves only v1alpha2", V1ALPHA2, V1ALPHA2),
    ],
)
def test_the_watch_lists_the_served_version_and_stamps_its_api_version(case: str, served: str, want_path: str) -> None:
    kube = FakeKube()
    kube.lists[served] = [[pod_group("pg", 2)]]
    kube.list_kinds[served] = (served.split("/apis/")[1].rsplit("/", 1)[0], "PodGroupList")
    listed: list[list[dict[str, Any]]] = []
    done = threading.Event()
    reflector = Reflector(
        kube,
        V1BETA1,
        alternatives=(V1ALPHA2,),
        optional=True,
        name="podgroups",
        on_list=lambda items: (listed.append(items), done.set()),
        on_event=lambda kind, obj: None,
    )
    thread = reflector.start()
    assert done.wait(10), case
    reflector.stop()
    thread.join(5)
    assert reflector.path == want_path, case
    item = listed[0][0]
    assert (item["apiVersion"], item["kind"]) == (want_path.split("/apis/")[1].rsplit("/", 1)[0], "PodGroup"), case


def test_a_v1beta1_pod_group_reads_disruption_mode_condition_and_version() -> None:
    objects = GangObjects()
    group = pod_group("pg", 3, disruptionMode={"all": {}}, schedulingConstraints={"topology": [{"key": "rack"}]})
    group["apiVersion"] = "scheduling.k8s.io/v1beta1"
    group["status"] = {"conditions": [{"type": "PodGroupInitiallyScheduled", "status": "True"}, "junk"]}
    objects.replace(NATIVE_POD_GROUP, [group])
    res = resolve(objects, "ns", {}, {}, "pg")
    assert res is not None and res.spec is not None
    spec = res.spec
    assert (spec.min_count, spec.topology.required, spec.disrupt_together, spec.initially_scheduled) == (
        3,
        "rack",
        True,
        True,
    )
    assert spec.owner["apiVersion"] == "scheduling.k8s.io/v1beta1"
    objects.event(NATIVE_POD_GROUP, "MODIFIED", {**group, "spec": {**group["spec"], "disruptionMode": {"single": {}}}})
    again = resolve(objects, "ns", {}, {}, "pg")
    assert again is not None and again.spec is not None and not again.spec.disrupt_together


def test_min_count_is_read_afresh_after_a_change() -> None:
    """v1beta1 made minCount mutable: the spec follows the object's latest version."""
    objects = GangObjects()
    objects.replace(NATIVE_POD_GROUP, [pod_group("pg", 4)])
    objects.event(NATIVE_POD_GROUP, "MODIFIED", pod_group("pg", 2))
    res = resolve(objects, "ns", {}, {}, "pg")
    assert res is not None and res.spec is not None and res.spec.min_count == 2


@pytest.mark.parametrize(
    ("case", "api_version", "initially", "reason", "want"),
    [
        ("v1beta1 scheduled", BETA, False, "Scheduled", (INITIALLY, "True")),
        ("v1beta1 not yet", BETA, False, "Unschedulable", (INITIALLY, "False")),
        ("v1beta1 waiting for members", BETA, False, "WaitingForQuorum", (INITIALLY, "False")),
        ("v1beta1 terminal once True", BETA, True, "Released", None),
        ("v1alpha2 tracks the state", ALPHA, True, "Released", ("PodGroupScheduled", "False")),
    ],
)
def test_status_goes_to_the_served_version_with_its_condition(
    case: str, api_version: str, initially: bool, reason: str, want: tuple[str, str] | None
) -> None:
    objects = GangObjects()
    group = pod_group("pg", 2)
    group["apiVersion"] = api_version
    if initially:
        group["status"] = {"conditions": [{"type": "PodGroupInitiallyScheduled", "status": "True"}]}
    objects.replace(NATIVE_POD_GROUP, [group])
    res = resolve(objects, "ns", {}, {}, "pg")
    assert res is not None and res.spec is not None
    kube = FakeKube()
    notifier = Notifier(Binder(kube))
    notifier._status(res.spec, reason, "a message")
    patches = [(p, b) for m, p, b in kube.calls if m == "PATCH"]
    if want is None:
        assert patches == [], case
        return
    [(path, body)] = patches
    assert path == f"/apis/{api_version}/namespaces/ns/podgroups/pg/status", case
    [condition] = body["status"]["conditions"]
    assert (condition["type"], condition["status"]) == want, case
    assert condition["reason"] == (reason if reason in ("Scheduled", "WaitingForQuorum") else "Unschedulable"), case


def test_preemption_never_takes_part_of_a_gang_disrupted_only_whole() -> None:
    """Victims on n0 include one member of an `all` gang whose other member runs on n1: n0 is
    dropped as a candidate. A `single` gang's member may be taken alone."""
    members = []
    for i, group in ((0, "whole"), (1, "whole"), (2, "single")):
        p = pod(f"m{i}", gpus=8, node_name=f"n{i}", phase="Running", namespace="ns")
        p["spec"]["schedulingGroup"] = {"podGroupName": group}
        p["spec"]["priority"] = 0
        members.append(p)
    ext = extender_on([node("n0"), node("n1"), node("n2")], members)
    ext.gang_objects.replace(
        NATIVE_POD_GROUP,
        [pod_group("whole", 2, disruptionMode={"all": {}}), pod_group("single", 1, disruptionMode={"single": {}})],
    )
    preemptor = pod("hi", gpus=8)
    preemptor["spec"]["priority"] = 1000
    victims = {
        "n0": {"Pods": [{"UID": "uid-m0"}], "NumPDBViolations": 0},
        "n2": {"Pods": [{"UID": "uid-m2"}], "NumPDBViolations": 0},
    }
    reply = ext.verbs.preempt({"Pod": preemptor, "NodeNameToMetaVictims": victims})
    assert set(reply["NodeNameToMetaVictims"]) == {"n2"}
