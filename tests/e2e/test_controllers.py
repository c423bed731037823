"""Real workload controllers create the pods; Phalanx places them.

This module runs a cluster of its own with kube-controller-manager and the JobSet and
LeaderWorkerSet controllers (built from their modules, their CRDs and webhooks installed;
deploy/local/controllers.py).
The session cluster runs without them: its suites make pods by hand, some with owners a
controller would act on. Every pod here is made by the Job, ReplicaSet or JobSet controllers,
in their own order and with their own labels and owner chains, and scheduled by kube-scheduler
calling Phalanx.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.local.cluster import LocalCluster
from deploy.local.components import ControlPlaneOptions
from extender.app import Extender, Options
from extender.kube import RestKube
from extender.objects import DEVICES_ANNOTATION
from tests.e2e.test_extender import wait

pytestmark = pytest.mark.e2e

NS = "default"
RACK = "topology.phalanx.io/rack"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"
PODGROUPS = f"/apis/scheduling.k8s.io/v1beta1/namespaces/{NS}/podgroups"
JOBSETS = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets"
LWSS = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{NS}/leaderworkersets"


@pytest.fixture(scope="module")
def controlled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    state = tmp_path_factory.mktemp("controlled")
    options = ControlPlaneOptions(die_with_parent=True, controllers=("jobset", "lws"))
    local = LocalCluster("controlled", state_dir_path=state, options=options)
    try:
        local.up()
        yield local
    finally:
        local.down()


@pytest.fixture(scope="module")
def kube(controlled: LocalCluster) -> RestKube:
    return RestKube.from_kubeconfig(str(controlled.kubeconfig_path))


@pytest.fixture(scope="module")
def extender(controlled: LocalCluster, kube: RestKube) -> Iterator[Extender]:
    ext = Extender(kube, Options(port=0))
    ext.start()
    wait("extender ready", ext.ready)
    controlled.restart_scheduler(ext.server.url)
    yield ext
    controlled.restart_scheduler(None)
    ext.stop()


def pods(kube: RestKube, selector: str) -> list[dict[str, Any]]:
    return list(kube.request("GET", f"/api/v1/namespaces/{NS}/pods", query={"labelSelector": selector}).body["items"])


def node_labels(kube: RestKube, name: str) -> dict[str, str]:
    return dict(kube.request("GET", f"/api/v1/nodes/{name}").body["metadata"]["labels"])


def template(labels: dict[str, str], *, gpus: str = "", annotations: dict[str, str] | None = None) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": gpus} if gpus else {}
    return {
        "metadata": {"labels": labels, "annotations": annotations or {}},
        "spec": {
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "x", "resources": {"limits": limits, "requests": {"cpu": "1"}}}],
        },
    }


def test_a_job_gang_made_by_the_job_controller_lands_whole_in_one_rack(extender: Extender, kube: RestKube) -> None:
    """An Indexed Job of 8 workers x 8 GPUs (a whole rack's worth) in a v1beta1 PodGroup that
    requires one rack: the Job controller creates the pods; Phalanx holds them until all 8
    exist and binds them into one rack, each on its own node."""
    group = {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "train", "namespace": NS},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 8}}, "schedulingConstraints": {"topology": [{"key": RACK}]}},
    }
    assert kube.request("POST", PODGROUPS, body=group).status == 201
    pod = template({"app": "train"}, gpus="8")
    pod["spec"] |= {"restartPolicy": "Never", "schedulingGroup": {"podGroupName": "train"}}
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": NS},
        "spec": {"completions": 8, "parallelism": 8, "completionMode": "Indexed", "template": pod},
    }
    assert kube.request("POST", JOBS, body=job).status == 201
    try:
        placed = wait(
            "the Job's 8 workers bound",
            lambda: (b := [p for p in pods(kube, "app=train") if p["spec"].get("nodeName")]) and len(b) == 8 and b,
            120,
        )
        owners = {p["metadata"]["ownerReferences"][0]["kind"] for p in placed}
        assert owners == {"Job"}  # made by the controller, not by this test
        nodes = {p["spec"]["nodeName"] for p in placed}
        assert len(nodes) == 8 and len({node_labels(kube, n)[RACK] for n in nodes}) == 1
        assert all(len(json.loads(p["metadata"]["annotations"][DEVICES_ANNOTATION])) == 8 for p in placed)
    finally:
        kube.request("DELETE", f"{JOBS}/train", query={"propagationPolicy": "Background"})
        kube.request("DELETE", f"{PODGROUPS}/train")
    # the garbage collector deletes the workers with their Job; the extender forgets them
    wait("the workers collected", lambda: not pods(kube, "app=train"), 90)
    wait(
        "the cache forgets them",
        lambda: (
            not [
                p
                for p in extender.cache.pod_uids()
                if extender.cache.pod(p) and extender.cache.pod(p).labels.get("app") == "train"
            ]
        ),
        30,
    )


def test_a_deployment_of_gpu_shares_scales_up_and_down(extender: Extender, kube: RestKube) -> None:
    """A Deployment of half-GPU pods: the ReplicaSet controller makes 3, then 6 after a scale-up,
    then 2; Phalanx packs the shares two to a GPU and every bound pod carries its record."""
    labels = {"app": "infer"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "infer", "namespace": NS},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": labels},
            "template": template(labels, annotations={"gpu-fraction": "0.5"}),
        },
    }
    assert kube.request("POST", DEPLOYMENTS, body=deployment).status == 201

    def bound(n: int) -> list[dict[str, Any]] | None:
        live = [p for p in pods(kube, "app=infer") if not p["metadata"].get("deletionTimestamp")]
        ok = len(live) == n and all(p["spec"].get("nodeName") for p in live)
        return live if ok else None

    try:
        wait("3 replicas bound", lambda: bound(3), 90)
        scale = {"spec": {"replicas": 6}}
        r = kube.request("PATCH", f"{DEPLOYMENTS}/infer", body=scale, content_type="application/merge-patch+json")
        assert r.status == 200, r.body
        six = wait("6 replicas bound", lambda: bound(6), 90)
        shares: dict[tuple[str, int], int] = {}
        for p in six:
            (device,) = json.loads(p["metadata"]["annotations"][DEVICES_ANNOTATION])
            assert device["milli"] == 500
            key = (p["spec"]["nodeName"], device["index"])
            shares[key] = shares.get(key, 0) + 1
        assert sorted(shares.values()) == [2, 2, 2]  # packed: no GPU holds a lone half
        r = kube.request(
            "PATCH", f"{DEPLOYMENTS}/infer", body={"spec": {"replicas": 2}}, content_type="application/merge-patch+json"
        )
        assert r.status == 200, r.body
        wait("scaled down to 2", lambda: bound(2), 90)
    finally:
        kube.request("DELETE", f"{DEPLOYMENTS}/infer", query={"propagationPolicy": "Background"})
    wait("the replicas collected", lambda: not pods(kube, "app=infer"), 90)


def test_the_controller_manager_runs_in_the_default_local_cluster(controlled: LocalCluster) -> None:
    """`python -m deploy.local up` (this cluster's options are the defaults) runs it."""
    running = {c.name: c.running for c in controlled.status().components}
    assert running.get("kube-controller-manager") is True, running
    assert Path(controlled.state_dir / "logs" / "kube-controller-manager.log").stat().st_size > 0


def jobset(name: str, workers: int, *, gpus: str = "8") -> dict[str, Any]:
    pod = template({"app": name}, gpus=gpus, annotations={"kai.scheduler/topology-required-placement": RACK})
    pod["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": 2,
                    "template": {
                        "spec": {
                            "parallelism": workers // 2,
                            "completions": workers // 2,
                            "backoffLimit": 0,
                            "template": pod,
                        }
                    },
                }
            ]
        },
    }


def test_a_jobset_made_by_its_controller_is_one_gang_in_one_rack(extender: Extender, kube: RestKube) -> None:
    """A real JobSet (its controller makes 2 Jobs, the Job controller their 8 pods of 8 GPUs):
    the Resource Interface makes them one gang of 8, taken from the object (2 replicas x 4),
    placed whole in one rack; deleting the JobSet takes the Jobs and pods with it."""
    r = kube.request("POST", JOBSETS, body=jobset("llm", 8))
    assert r.status == 201, r.body
    try:
        placed = wait(
            "the JobSet's 8 pods bound",
            lambda: (b := [p for p in pods(kube, "app=llm") if p["spec"].get("nodeName")]) and len(b) == 8 and b,
            120,
        )
        assert {p["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] for p in placed} == {"llm"}
        assert {p["metadata"]["ownerReferences"][0]["kind"] for p in placed} == {"Job"}
        nodes = {p["spec"]["nodeName"] for p in placed}
        assert len(nodes) == 8 and len({node_labels(kube, n)[RACK] for n in nodes}) == 1
        gangs = [g for g in extender.gangs.describe() if "llm" in g["key"]]
        assert gangs and gangs[0]["minCount"] == 8, gangs  # the size the RI read from the JobSet (2 x 4)
    finally:
        kube.request("DELETE", f"{JOBSETS}/llm", query={"propagationPolicy": "Foreground"})
    wait("the JobSet's pods collected", lambda: not pods(kube, "app=llm"), 90)


def test_a_jobset_too_big_for_any_rack_waits_whole_with_its_reason(extender: Extender, kube: RestKube) -> None:
    """12 pods of 8 GPUs must share one rack of 8 nodes: none is bound, and the gang says why."""
    r = kube.request("POST", JOBSETS, body=jobset("huge", 12))
    assert r.status == 201, r.body
    try:
        explained = wait(
            "the gang's reason",
            lambda: [g for g in extender.gangs.describe() if "huge" in g["key"] and g.get("pendingReason")],
            90,
        )
        assert "rack" in str(explained[0]["pendingReason"]) and explained[0]["minCount"] == 12, explained
        assert not [p for p in pods(kube, "app=huge") if p["spec"].get("nodeName")]
    finally:
        kube.request("DELETE", f"{JOBSETS}/huge", query={"propagationPolicy": "Foreground"})
    wait("the JobSet's pods collected", lambda: not pods(kube, "app=huge"), 90)


def test_leaderworkersets_groups_are_gangs_each_in_one_rack_and_scale_up(extender: Extender, kube: RestKube) -> None:
    """A LeaderWorkerSet of 2 groups of 4 pods x 8 GPUs: the LWS controller makes the leader
    StatefulSet, each leader its workers' StatefulSet (the StatefulSet controller makes the pods,
    the LWS pod webhook labels them). Each group is one gang, whole in one rack; scaled to 3
    groups, the third is placed the same way."""
    pod = template({"app": "serve"}, gpus="8", annotations={"kai.scheduler/topology-required-placement": RACK})
    lws = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "serve", "namespace": NS},
        "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 4, "workerTemplate": pod}},
    }
    r = kube.request("POST", LWSS, body=lws)
    assert r.status == 201, r.body

    def groups(n: int) -> dict[str, list[dict[str, Any]]] | None:
        bound = [p for p in pods(kube, "app=serve") if p["spec"].get("nodeName")]
        by_group: dict[str, list[dict[str, Any]]] = {}
        for p in bound:
            by_group.setdefault(p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"], []).append(p)
        return by_group if len(bound) == 4 * n and len(by_group) == n else None

    try:
        for n in (2, 3):
            placed = wait(f"{n} groups of 4 bound", lambda n=n: groups(n), 120)
            for members in placed.values():
                nodes = {p["spec"]["nodeName"] for p in members}
                assert len(nodes) == 4 and len({node_labels(kube, x)[RACK] for x in nodes}) == 1
            if n == 2:
                r = kube.request(
                    "PATCH",
                    f"{LWSS}/serve",
                    body={"spec": {"replicas": 3}},
                    content_type="application/merge-patch+json",
                )
                assert r.status == 200, r.body
        assert {p["metadata"]["ownerReferences"][0]["kind"] for p in pods(kube, "app=serve")} == {"StatefulSet"}
    finally:
        kube.request("DELETE", f"{LWSS}/serve", query={"propagationPolicy": "Foreground"})
    wait("the groups collected", lambda: not pods(kube, "app=serve"), 120)
