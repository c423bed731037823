"""Queues, quotas, fair share and gang-aware preemption through the real kube-scheduler.

The cluster (config/cluster.yaml): blocks b0 and b1 of 4 racks x 8 nodes x 8 GPUs. Each test
confines its pods to a few racks with a node selector (the rest of the suite shares the
cluster) and a parent Queue whose limit is that capacity, so "the whole cluster" of a test is
its racks. Every test deletes its pods and queues.
"""

from __future__ import annotations

import io
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from deploy.local.cluster import LocalCluster
from extender import kubectl
from extender.app import Extender, Options
from extender.config import QueuesConfig
from extender.kube import RestKube
from tests.e2e import crds
from tests.e2e.test_extender import wait

pytestmark = pytest.mark.e2e

NS = "default"
QUEUES = "/apis/phalanx.io/v1alpha1/queues"
WORKLOADS = f"/apis/phalanx.io/v1alpha1/namespaces/{NS}/workloads"
RACK, BLOCK = "topology.phalanx.io/rack", "topology.phalanx.io/block"


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster) -> RestKube:
    k = RestKube.from_kubeconfig(str(cluster.kubeconfig_path))
    crds.install(k, NS)
    for name, value in (("e2e-high", 1000), ("e2e-low", 10)):
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        r = k.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body=body)
        assert r.status in (201, 409), r.body
    return k


@pytest.fixture(scope="module")
def extender(cluster: LocalCluster, kube: RestKube) -> Iterator[Extender]:
    ext = Extender(kube, Options(port=0))
    ext.start()
    wait("extender ready", ext.ready)
    cluster.restart_scheduler(ext.server.url)
    yield ext
    cluster.restart_scheduler(None)
    ext.stop()


@pytest.fixture
def cleanup(kube: RestKube) -> Iterator[list[str]]:
    """Labels (suite=...) whose pods and Workloads go at the end, and queues created."""
    suites: list[str] = []
    yield suites
    for suite in suites:
        crds.delete_suite(kube, NS, suite)
        kube.request("DELETE", QUEUES, query={"labelSelector": f"suite={suite}"})


def make_queue(kube: RestKube, name: str, suite: str, **spec: Any) -> None:
    body = {
        "apiVersion": "phalanx.io/v1alpha1",
        "kind": "Queue",
        "metadata": {"name": name, "labels": {"suite": suite}},
    }
    r = kube.request("POST", QUEUES, body={**body, "spec": spec})
    assert r.status == 201, r.body


def patch_queue(kube: RestKube, name: str, spec: dict[str, Any]) -> None:
    r = kube.request("PATCH", f"{QUEUES}/{name}", body={"spec": spec}, content_type="application/merge-patch+json")
    assert r.status == 200, r.body


def racks(*names: str) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": RACK, "operator": "In", "values": list(names)}]}
    return {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    }


def make_pod(
    kube: RestKube,
    name: str,
    suite: str,
    queue: str,
    *,
    gpus: int = 8,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"suite": suite, "phalanx.io/queue": queue, **(labels or {})}},
        "spec": {
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
            **spec,
        },
    }
    r = kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=body)
    assert r.status == 201, r.body


def gang(
    kube: RestKube,
    name: str,
    suite: str,
    queue: str,
    members: int,
    *,
    required: str = "",
    priority_class: str = "",
    **spec: Any,
) -> None:
    """A Workload of `members` 8-GPU pods, all created."""
    group = {
        "name": "workers",
        "minCount": members,
        "scheduleTimeoutSeconds": 120,
        "topologyRequest": {"required": required},
        "rankedGroups": [{"name": "all", "eqGroups": [{"name": "w", "count": members}]}],
    }
    body = {
        "apiVersion": "phalanx.io/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": name, "labels": {"suite": suite}},
        "spec": {"gangGroups": [group]},
    }
    r = kube.request("POST", WORKLOADS, body=body)
    assert r.status == 201, r.body
    extra = {"priorityClassName": priority_class} if priority_class else {}
    for i in range(members):
        make_pod(kube, f"{name}-{i}", suite, queue, labels={"phalanx.io/workload": name, "gang": name}, **spec, **extra)


def pods(kube: RestKube, selector: str) -> list[dict[str, Any]]:
    return list(kube.request("GET", f"/api/v1/namespaces/{NS}/pods", query={"labelSelector": selector}).body["items"])


def bound(kube: RestKube, selector: str) -> list[dict[str, Any]]:
    return [p for p in pods(kube, selector) if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")]


def bound_gangs(kube: RestKube, selector: str) -> Counter[str]:
    """Per queue, gangs with every member bound."""
    by_gang: dict[str, list[dict[str, Any]]] = {}
    for p in pods(kube, selector):
        by_gang.setdefault(p["metadata"]["labels"]["gang"], []).append(p)
    done: Counter[str] = Counter()
    for members in by_gang.values():
        if all(m["spec"].get("nodeName") for m in members):
            done[members[0]["metadata"]["labels"]["phalanx.io/queue"]] += 1
    return done


def scheduled_message(kube: RestKube, name: str) -> str:
    p = kube.request("GET", f"/api/v1/namespaces/{NS}/pods/{name}").body
    for c in p.get("status", {}).get("conditions") or []:
        if c["type"] == "PodScheduled":
            return str(c.get("message", ""))
    return ""


def test_a_queue_at_its_limit_gets_the_rejection_message_and_binds_once_usage_drops(
    kube: RestKube, extender: Extender, cleanup: list[str]
) -> None:
    cleanup.append("q-limit")
    make_queue(kube, "e2e-limit", "q-limit", limit={"gpu": 16})
    for i in range(2):
        make_pod(kube, f"lim-{i}", "q-limit", "e2e-limit", **racks("b0-r0"))
    wait("two pods bound", lambda: len(bound(kube, "suite=q-limit")) == 2)
    make_pod(kube, "lim-2", "q-limit", "e2e-limit", **racks("b0-r0"))
    message = "queue e2e-limit: gpu limit 16, in use 16, pod needs 8"
    wait("the rejection", lambda: message in scheduled_message(kube, "lim-2"))
    assert len(bound(kube, "suite=q-limit")) == 2
    status = wait("queue status", lambda: kube.request("GET", f"{QUEUES}/e2e-limit").body.get("status"))
    wait(
        "status shows usage",
        lambda: kube.request("GET", f"{QUEUES}/e2e-limit").body["status"]["allocated"].get("gpu") == "16",
    )
    assert status["limit"]["gpu"] == "16"
    kube.request("DELETE", f"/api/v1/namespaces/{NS}/pods/lim-0", query={"gracePeriodSeconds": "0"})
    wait(
        "the third pod bound once usage dropped",
        lambda: kube.request("GET", f"/api/v1/namespaces/{NS}/pods/lim-2").body["spec"].get("nodeName"),
    )
    assert len(bound(kube, "suite=q-limit")) == 2


@pytest.mark.parametrize(("weights", "split"), [((1, 1), (2, 2)), ((3, 1), (3, 1))], ids=["equal weights", "3:1"])
def test_two_queues_wanting_everything_split_it_by_weight_within_one_gang(
    kube: RestKube, extender: Extender, cleanup: list[str], weights: tuple[int, int], split: tuple[int, int]
) -> None:
    """64 GPUs (rack b0-r1) for two queues that each want all of it in gangs of 16 GPUs: all
    pods exist before the parent's limit opens, then the split follows the weights."""
    suite = f"q-fair-{weights[0]}-{weights[1]}"
    cleanup.append(suite)
    make_queue(kube, f"{suite}-org", suite, limit={"gpu": 0})
    make_queue(kube, f"{suite}-a", suite, parent=f"{suite}-org", weight=weights[0])
    make_queue(kube, f"{suite}-b", suite, parent=f"{suite}-org", weight=weights[1])
    for i in range(4):
        for team in ("a", "b"):
            gang(kube, f"{suite}-{team}{i}", suite, f"{suite}-{team}", 2, **racks("b0-r1"))
    wait("every gang refused at the closed limit", lambda: "gpu limit 0" in scheduled_message(kube, f"{suite}-b3-0"))
    patch_queue(kube, f"{suite}-org", {"limit": {"gpu": 64}})
    wait("64 GPUs bound", lambda: len(bound(kube, f"suite={suite}")) == 8, deadline_s=90)
    done = bound_gangs(kube, f"suite={suite}")
    got = (done[f"{suite}-a"], done[f"{suite}-b"])
    assert abs(got[0] - split[0]) <= 1 and abs(got[1] - split[1]) <= 1 and sum(got) == 4, got


def test_borrowed_capacity_is_reclaimed_whole_gangs_within_30_s(
    kube: RestKube, extender: Extender, cleanup: list[str]
) -> None:
    """Queue B deserves 32 of rack b0-r2's 64 GPUs; A deserves none and borrows all 64, which
    puts their parent at its 64-GPU limit. B submits a 16-GPU gang: one of A's gangs goes,
    whole, and B's gang binds, within 30 s."""
    suite = "q-reclaim"
    cleanup.append(suite)
    make_queue(kube, "e2e-reclaim", suite, limit={"gpu": 64})  # at its limit once A holds the rack
    make_queue(kube, "e2e-reclaim-a", suite, parent="e2e-reclaim")
    make_queue(kube, "e2e-reclaim-b", suite, parent="e2e-reclaim", deserved={"gpu": 32})
    for i in range(4):
        gang(kube, f"rec-a{i}", suite, "e2e-reclaim-a", 2, **racks("b0-r2"))
    wait("A holds the rack", lambda: len(bound(kube, f"suite={suite}")) == 8, deadline_s=90)
    started = time.monotonic()
    gang(kube, "rec-b0", suite, "e2e-reclaim-b", 2, **racks("b0-r2"))
    wait("B's gang bound", lambda: len(bound(kube, "gang=rec-b0")) == 2, deadline_s=30)
    assert time.monotonic() - started <= 30
    remaining = Counter(
        p["metadata"]["labels"]["gang"] for p in pods(kube, f"suite={suite},phalanx.io/queue=e2e-reclaim-a")
    )
    assert sorted(remaining.values()) == [2, 2, 2], remaining  # exactly one of A's gangs went, whole


def test_a_high_priority_block_gang_preempts_only_the_chosen_whole_gangs_in_one_block(
    kube: RestKube, extender: Extender, cleanup: list[str]
) -> None:
    """Racks b0-r3 and b1-r0 (one per block, 128 GPUs) full of low-priority 2-pod gangs; a
    high-priority 64-GPU gang with `required: block` evicts four whole gangs of one block
    and binds there; nothing in the other block is touched."""
    suite = "q-preempt"
    cleanup.append(suite)
    where = racks("b0-r3", "b1-r0")
    for i in range(8):  # each within one rack, as a job that cares about its links asks
        gang(kube, f"low{i}", suite, "default", 2, required=RACK, priority_class="e2e-low", **where)
    wait("both racks full", lambda: len(bound(kube, f"suite={suite}")) == 16, deadline_s=120)
    before = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in bound(kube, f"suite={suite}")}
    gang(kube, "high", suite, "default", 8, required=BLOCK, priority_class="e2e-high", **where)
    wait("the high-priority gang bound", lambda: len(bound(kube, "gang=high")) == 8, deadline_s=120)
    nodes = {p["spec"]["nodeName"] for p in bound(kube, "gang=high")}
    block = {n.split("-")[1] for n in nodes}
    assert len(block) == 1, nodes
    left = {p["metadata"]["name"] for p in pods(kube, f"suite={suite}") if not p["metadata"]["name"].startswith("high")}
    gone = set(before) - left
    gone_gangs = Counter(name.rsplit("-", 1)[0] for name in gone)
    assert set(gone_gangs.values()) == {2} and len(gone_gangs) == 4, gone_gangs  # four whole gangs
    assert {before[n].split("-")[1] for n in gone} == block  # evictions only in the chosen block


def test_a_member_whose_gang_lacks_quorum_evicts_nothing(
    kube: RestKube, extender: Extender, cleanup: list[str]
) -> None:
    """Rack b0-r0 full of low-priority pods; one high-priority member of a 4-member gang (the
    others do not exist yet): 0 evictions."""
    suite = "q-quorum"
    cleanup.append(suite)
    before = extender.preemptor.counts_of("default")
    where = racks("b0-r0")
    for i in range(8):
        make_pod(kube, f"filler-{i}", suite, "default", priorityClassName="e2e-low", **where)
    wait("rack full", lambda: len(bound(kube, f"suite={suite}")) == 8, deadline_s=60)
    body = {
        "apiVersion": "phalanx.io/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": "lonely", "labels": {"suite": suite}},
        "spec": {
            "gangGroups": [
                {"name": "w", "minCount": 4, "rankedGroups": [{"name": "r", "eqGroups": [{"name": "w", "count": 4}]}]}
            ]
        },
    }
    assert kube.request("POST", WORKLOADS, body=body).status == 201
    # Read before the member exists: kube-scheduler may ask at once, and its next attempt after a
    # failed preemption can be minutes away (the unschedulable queue's flush).
    asked = extender.metrics.outcomes.labels("preempt", "gang-own")
    asked_before = asked._value.get()
    make_pod(
        kube,
        "lonely-0",
        suite,
        "default",
        labels={"phalanx.io/workload": "lonely", "gang": "lonely"},
        priorityClassName="e2e-high",
        **where,
    )
    # The rack is full: kube-scheduler's own filters reject every node, its preemption asks the
    # extender (which refuses per-pod victims for gang members and plans the gang: no quorum).
    wait("kube-scheduler's preemption asked for the member", lambda: asked._value.get() > asked_before, deadline_s=90)
    assert extender.preemptor.counts_of("default") == before
    assert len(bound(kube, f"suite={suite}")) == 8
    assert all(not p["metadata"].get("deletionTimestamp") for p in pods(kube, f"suite={suite}"))


def test_the_read_api_and_kubectl_phalanx_list_queues(
    cluster: LocalCluster, kube: RestKube, extender: Extender, cleanup: list[str]
) -> None:
    cleanup.append("q-read")
    make_queue(kube, "e2e-read", "q-read", deserved={"gpu": 8}, limit={"gpu": "16", "cpu": "64"})
    body = wait(
        "the queue in the read API",
        lambda: next((q for q in extender.read_api.queues_("")[1]["queues"] if q["name"] == "e2e-read"), None),
    )
    assert body["summary"]["gpu"]["limit"] == "16" and body["limit"]["cpu"] == "64"
    status, one = extender.read_api.queues_("/e2e-read")
    assert status == 200 and one["deserved"] == {"gpu": "8"}
    out = io.StringIO()
    argv = ["--kubeconfig", str(cluster.kubeconfig_path), "--extender", extender.server.url, "queues"]
    assert kubectl.main(argv, out) == 0
    row = next(line.split() for line in out.getvalue().splitlines() if line.startswith("e2e-read "))
    assert row[3:7] == ["0", "8", "0", "16"]  # GPUs used, deserved, fair share (nothing wanted), limit


def test_a_starving_gang_gets_its_nodes_held_with_backfill_and_then_binds(
    kube: RestKube, extender: Extender, cleanup: list[str]
) -> None:
    """Rack b1-r1 full of priority-100 pods; an 8-node priority-50 gang cannot preempt them.
    After starvationSeconds it gets the rack held: as pods leave, a priority-100 newcomer is
    kept off the held nodes, a priority-10 backfill pod may use one; once every filler is gone
    the backfill pod is preempted and the gang binds whole."""
    suite = "q-starve"
    cleanup.append(suite)
    before = extender.config
    extender.apply(before.model_copy(update={"queues": QueuesConfig(starvation_seconds=10, reservation_seconds=300)}))
    try:
        for name, value in (("e2e-mid", 100), ("e2e-gang", 50)):
            body = {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
            }
            assert kube.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body=body).status in (201, 409)
        where = racks("b1-r1")
        for i in range(8):
            make_pod(kube, f"busy-{i}", suite, "default", priorityClassName="e2e-mid", **where)
        wait("rack full", lambda: len(bound(kube, f"suite={suite}")) == 8, deadline_s=60)
        gang(kube, "starving", suite, "default", 8, priority_class="e2e-gang", **where)
        wait(
            "a hold for the starving gang", lambda: "wl:default/starving" in extender.gangs.holds.by_gang, deadline_s=60
        )
        for i in range(2):
            kube.request("DELETE", f"/api/v1/namespaces/{NS}/pods/busy-{i}", query={"gracePeriodSeconds": "0"})
        make_pod(kube, "rival", suite, "default", priorityClassName="e2e-mid", **where)
        wait("the newcomer kept off held nodes", lambda: "capacity held" in scheduled_message(kube, "rival"))
        make_pod(kube, "filler", suite, "default", priorityClassName="e2e-low", **where)
        wait(
            "backfill on a held node",
            lambda: (
                bound(kube, "suite=q-starve")
                and any(p["metadata"]["name"] == "filler" for p in bound(kube, f"suite={suite}"))
            ),
        )
        kube.request("DELETE", f"/api/v1/namespaces/{NS}/pods/rival", query={"gracePeriodSeconds": "0"})
        for i in range(2, 8):
            kube.request("DELETE", f"/api/v1/namespaces/{NS}/pods/busy-{i}", query={"gracePeriodSeconds": "0"})
        wait("the gang bound whole", lambda: len(bound(kube, "gang=starving")) == 8, deadline_s=90)
        assert not any(p["metadata"]["name"] == "filler" for p in pods(kube, f"suite={suite}"))  # its first victim
    finally:
        extender.apply(before)
