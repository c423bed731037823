"""Hostile pods, nodes and callers (issue 12's reproduced defects), each pinned in process:
the real-cluster fault suite is benchmarks/chaos.py."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from extender.app import Extender
from extender.errors import BadRequest, NotReady
from extender.gangs.sources import WORKLOAD
from extender.kube import Unreachable
from extender.objects import DEVICES_ANNOTATION, pod_info
from tests.extender.fakes import FakeKube, extender_on, node, pod
from tests.extender.test_gangs import member, workload


def bind(ext: Extender, name: str, node_name: str) -> dict[str, Any]:
    reply: dict[str, Any] = ext.verbs.bind(
        {"PodNamespace": "default", "PodName": name, "PodUID": f"uid-{name}", "Node": node_name}
    )
    return reply


def reported(ext: Extender, reason: str, name: str, deadline_s: float = 10.0) -> bool:
    """Whether a Warning Event with `reason` naming `name` was posted (the writer thread
    posts it shortly)."""
    kube = ext.binder.kube
    assert isinstance(kube, FakeKube)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for method, path, body in list(kube.calls):
            if method == "POST" and path.endswith("/events") and body["reason"] == reason and name in body["message"]:
                return True
        time.sleep(0.02)
    return False


def with_pod(ext: Extender, obj: dict[str, Any]) -> None:
    kube = ext.kube
    assert isinstance(kube, FakeKube)
    kube.pods[f"default/{obj['metadata']['name']}"] = obj
    ext.cache.pod_event("ADDED", obj)


def test_no_verb_answers_before_the_cache_has_synced() -> None:
    ext = extender_on([node("n0")], [])
    for r in ext.reflectors:
        r.listed.clear()
    p = pod("p", gpus=1)
    with_pod(ext, p)
    for verb, args in (
        (ext.verbs.filter, {"Pod": p, "NodeNames": ["n0"]}),
        (ext.verbs.prioritize, {"Pod": p, "NodeNames": ["n0"]}),
        (ext.verbs.preempt, {"Pod": p, "NodeNameToMetaVictims": {}}),
        (ext.verbs.bind, {"PodNamespace": "default", "PodName": "p", "PodUID": "uid-p", "Node": "n0"}),
    ):
        with pytest.raises(NotReady):
            verb(args)


@pytest.mark.parametrize(
    ("case", "node_kw", "pod_spec", "refusal"),
    [
        ("a cordoned node", {"unschedulable": True}, {}, "cordoned"),
        ("a tainted node the pod does not tolerate", {"taint": True}, {}, "tolerations"),
        ("a node outside the pod's node selector", {}, {"nodeSelector": {"zone": "elsewhere"}}, "node selector"),
        ("a node unknown to the cache", {"missing": True}, {}, "unknown"),
    ],
)
def test_bind_refuses_a_node_the_pod_may_not_use_whoever_asks(
    case: str, node_kw: dict[str, bool], pod_spec: dict[str, Any], refusal: str
) -> None:
    n = node("n0", gpus=2)
    if node_kw.get("unschedulable"):
        n["spec"]["unschedulable"] = True
    if node_kw.get("taint"):
        n["spec"]["taints"] = [{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]
    ext = extender_on([] if node_kw.get("missing") else [n], [])
    p = pod("p", gpus=1)
    p["spec"].update(pod_spec)
    with_pod(ext, p)
    reply = bind(ext, "p", "n0")
    assert refusal in reply["Error"], case
    assert not ext.kube.pods["default/p"]["spec"].get("nodeName")  # type: ignore[attr-defined]


def test_a_gang_member_cannot_be_bound_alone() -> None:
    ext = extender_on([node("n0")], [])
    ext.gang_objects.replace(WORKLOAD, [workload("job", 4)])
    with_pod(ext, member("m0", "job"))
    assert "no reservation" in bind(ext, "m0", "n0")["Error"]
    with_pod(ext, member("x0", "undefined"))
    assert "binds only with its gang" in bind(ext, "x0", "n0")["Error"]


def test_a_failed_bind_forgets_the_assumption_whatever_the_client_raises() -> None:
    ext = extender_on([node("n0", gpus=1)], [])

    class Exploding(FakeKube):
        def request(self, method: str, path: str, **kw: Any) -> Any:
            if path.endswith("/binding"):
                raise RuntimeError("MaxRetryError stand-in: not an OSError")
            return super().request(method, path, **kw)

    kube = Exploding(pods=ext.kube.pods)  # type: ignore[attr-defined]
    ext.binder.kube = kube
    with_pod(ext, pod("p", gpus=1))
    assert bind(ext, "p", "n0")["Error"]
    assert ext.cache.assumed("uid-p") is None
    assert ext.cache.node_model("n0").idle_gpus == 1  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("case", "requests"),
    [
        ("memory Infinity", {"memory": "Infinity"}),
        ("cpu 1e999999", {"cpu": "1e999999"}),
        ("memory NaN", {"memory": "NaN"}),
        ("a list where a quantity belongs", {"cpu": [1, 2]}),
        ("GPU count -1", {"nvidia.com/gpu": "-1"}),
    ],
)
def test_an_unparseable_quantity_is_the_pods_error_never_the_caches(case: str, requests: dict[str, Any]) -> None:
    obj = pod("p")
    obj["spec"]["containers"][0]["resources"] = {"requests": requests, "limits": dict(requests)}
    info = pod_info(obj)
    assert info.error, case
    ext = extender_on([node("n0")], [obj, pod("ok", gpus=1, node_name="n0", phase="Running")])
    assert ext.synced() and ext.cache.pod("uid-p") is not None
    assert ext.verbs.filter({"Pod": obj, "NodeNames": ["n0"]})["FailedAndUnresolvableNodes"]
    assert reported(ext, "InvalidGPURequest", "default/p")


@pytest.mark.parametrize(
    ("case", "record", "gpus"),
    [
        ("negative milli", [{"index": 0, "milli": -1000}], 1),
        ("milli above a whole GPU", [{"index": 0, "milli": 5000}], 1),
        ("one device twice", [{"index": 0, "milli": 1000}, {"index": 0, "milli": 1000}], 2),
        ("a record on a pod that asks no GPU", [{"index": 0, "milli": 1000}], 0),
        ("more devices than requested", [{"index": 0, "milli": 1000}, {"index": 1, "milli": 1000}], 1),
        ("not a list", {"index": 0}, 1),
        ("an index no node has", [{"index": 4096, "milli": 1000}], 1),
    ],
)
def test_a_forged_device_record_is_not_trusted_and_is_reported(case: str, record: Any, gpus: int) -> None:
    forged = pod(
        "forged", gpus=gpus, node_name="n0", phase="Running", annotations={DEVICES_ANNOTATION: json.dumps(record)}
    )
    info = pod_info(forged)
    assert info.devices is None and info.device_error, case
    ext = extender_on([node("n0", gpus=2)], [forged])
    free = sum(d.free_milli for d in ext.cache.node_model("n0").gpus)  # type: ignore[union-attr]
    assert free == (2 - gpus) * 1000, case  # counted as its request says, never more free than real
    assert reported(ext, "UntrustedDeviceRecord", "default/forged")


def test_thirty_two_half_gpu_pods_never_fit_on_eight_gpus_with_a_forged_record() -> None:
    """The reproduced attack: a pod with negative milli made devices show 2,000 free."""
    forged = pod(
        "forged",
        gpus=1,
        node_name="n0",
        phase="Running",
        annotations={DEVICES_ANNOTATION: json.dumps([{"index": i, "milli": -1000} for i in range(1)])},
    )
    ext = extender_on([node("n0", gpus=8)], [forged])
    bound = 0
    for i in range(32):
        half = pod(f"h{i}", annotations={"gpu-fraction": "0.5"})
        with_pod(ext, half)
        if ext.verbs.filter({"Pod": half, "NodeNames": ["n0"]})["NodeNames"] and not bind(ext, f"h{i}", "n0")["Error"]:
            bound += 1
    assert bound == 14  # 7 free GPUs x 2 halves: the forged pod holds one


def test_the_status_writer_survives_any_error_and_goes_on() -> None:
    """During an API server outage urllib3 raises errors that are not OSError; the writer
    thread once died of one and no status or event was written again."""
    ext = extender_on([node("n0")], [])
    kube = ext.binder.kube
    assert isinstance(kube, FakeKube)
    real = kube.request
    failures = [RuntimeError("MaxRetryError stand-in"), KeyError("metadata")]

    def flaky(method: str, path: str, **kw: Any) -> Any:
        if path.endswith("/events") and failures:
            raise failures.pop(0)
        return real(method, path, **kw)

    kube.request = flaky  # type: ignore[method-assign]
    for i in range(3):
        ext.notifier.report({"kind": "Pod", "metadata": {"name": f"p{i}", "uid": f"u{i}"}}, "Test", f"message {i}")
    assert reported(ext, "Test", "message 2")
    assert ext.notifier.dead_threads() == []
    assert ext.ready()


def test_bind_to_a_cordoned_node_is_allowed_for_a_pod_that_tolerates_the_cordon() -> None:
    n = node("n0", gpus=2)
    n["spec"]["unschedulable"] = True
    ext = extender_on([n], [])
    p = pod("p", gpus=1)
    p["spec"]["tolerations"] = [
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
    ]
    with_pod(ext, p)
    assert bind(ext, "p", "n0") == {"Error": ""}  # as kube-scheduler's NodeUnschedulable admits it


def test_a_request_cannot_replace_what_the_watch_read_of_a_pod() -> None:
    """A client sending a watched pod's uid and resourceVersion with other content (no GPU
    asked) gets the answer for the pod the watch read (8 GPUs: no node with 2 fits)."""
    real = pod("p", gpus=8)
    real["metadata"]["resourceVersion"] = "7"
    ext = extender_on([node("n0", gpus=2)], [real])
    forged = json.loads(json.dumps(real))
    forged["spec"]["containers"][0]["resources"] = {}
    assert ext.verbs.filter({"Pod": forged, "NodeNames": ["n0"]})["NodeNames"] == []


@pytest.mark.parametrize("namespace", [None, "", 7], ids=["null", "empty", "a number"])
def test_a_gang_members_preempt_with_an_odd_namespace_is_no_500(namespace: Any) -> None:
    ext = extender_on([node("n0")], [])
    ext.gang_objects.replace(WORKLOAD, [workload("g", 2)])
    obj = member("m0", "g")
    obj["metadata"]["namespace"] = namespace
    try:
        reply = ext.verbs.preempt({"Pod": obj, "NodeNameToMetaVictims": {}})
    except BadRequest:
        return  # refused as malformed: fine
    assert reply == {"NodeNameToMetaVictims": {}}


def test_a_filter_naming_far_more_nodes_than_the_cluster_has_is_refused() -> None:
    ext = extender_on([node("n0")], [])
    names = [f"ghost-{i}" for i in range(5_000)]
    with pytest.raises(BadRequest, match="NodeNames lists 5000 nodes; the cluster has 1"):
        ext.verbs.filter({"Pod": pod("p", gpus=1), "NodeNames": names})
    assert ext.verbs.filter({"Pod": pod("p", gpus=1), "NodeNames": names[:1000]})["NodeNames"] == []


class DyingServer(FakeKube):
    """Commits the first Binding, then dies before answering (and stays down until told)."""

    down = False
    died = False

    def request(self, method: str, path: str, **kw: Any) -> Any:
        if self.down:
            raise Unreachable(f"{method} {path}: connection refused")
        reply = super().request(method, path, **kw)
        if method == "POST" and path.endswith("/binding") and reply.status == 201 and not self.died:
            self.died = self.down = True
            raise Unreachable("POST binding: response ended prematurely")
        return reply


def test_a_bind_whose_outcome_is_unknown_keeps_its_devices_counted() -> None:
    """The API server committed the Binding and died before answering: until the watch shows
    the pod, its device must not look free (a second pod was once bound onto it)."""
    ext = extender_on([node("n0", gpus=1)], [pod("p1", gpus=1), pod("p2", gpus=1)])
    kube = DyingServer(pods=ext.kube.pods)  # type: ignore[attr-defined]
    ext.binder.kube = kube
    assert bind(ext, "p1", "n0")["Error"]  # unknown: the answer was lost
    kube.down = False  # back, but our pod watch has not caught up
    assert ext.verbs.filter({"Pod": kube.pods["default/p2"], "NodeNames": ["n0"]})["NodeNames"] == []
    assert "no longer fits" in bind(ext, "p2", "n0")["Error"]


def test_a_bind_whose_answer_was_lost_but_landed_is_reported_bound() -> None:
    """The server is back when the extender checks: the pod is bound where it asked."""
    ext = extender_on([node("n0", gpus=1)], [pod("p1", gpus=1)])
    kube = DyingServer(pods=ext.kube.pods)  # type: ignore[attr-defined]
    ext.binder.kube = kube
    real_get = ext.binder.get_pod

    def get_pod(namespace: str, name: str) -> Any:
        kube.down = False
        return real_get(namespace, name)

    ext.binder.get_pod = get_pod  # type: ignore[method-assign]
    assert bind(ext, "p1", "n0") == {"Error": ""}
    assert ext.cache.assumed("uid-p1") is not None  # counted until the watch shows it bound
