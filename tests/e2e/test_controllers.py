"""Real workload controllers create the pods; Phalanx places them.

This module runs a cluster of its own with kube-controller-manager and the JobSet,
LeaderWorkerSet, Kubeflow Trainer, training-operator (PyTorchJob), MPI operator and KServe (in
RawDeployment mode) controllers (built from their modules, their CRDs and webhooks installed;
deploy/local/controllers.py); KubeRay is started by its test, after the extender, so its CRD arrives while Phalanx runs.
The session cluster runs without them: its suites make pods by hand, some with owners a
controller would act on. Every pod here is made by a controller, in its own order and with its
own labels and owner chains, and scheduled by kube-scheduler calling Phalanx; each shipped
Resource Interface (config/resource-interfaces) is exercised by its real controller, the gang's
size read from the object.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.local.cluster import LocalCluster
from deploy.local.components import ControlPlaneOptions
from extender.app import Extender, Options
from extender.gangs.sources import GangSpec
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
TRAINJOBS = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs"
PYTORCHJOBS = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"
MPIJOBS = f"/apis/kubeflow.org/v2beta1/namespaces/{NS}/mpijobs"
RAYCLUSTERS = f"/apis/ray.io/v1/namespaces/{NS}/rayclusters"
ISVCS = f"/apis/serving.kserve.io/v1beta1/namespaces/{NS}/inferenceservices"
CHAT = "serving.kserve.io/inferenceservice=chat"
WORKLOADS = f"/apis/phalanx.io/v1alpha1/namespaces/{NS}/workloads"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
RACK_REQUIRED = {"kai.scheduler/topology-required-placement": RACK}
# Acceptance: placed within this long of the last object (the user's, the controllers') appearing,
# read from the API server's own clock (creation and PodScheduled times), not the test's.
PLACED_WITHIN_S = 10
PLANNED: dict[str, GangSpec] = {}  # gang key -> its spec, as the extender announced it
STARTED_BY_THE_FIXTURE = ("jobset", "lws", "trainer", "training-operator", "mpi-operator", "kserve")


@pytest.fixture(scope="module")
def controlled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    state = tmp_path_factory.mktemp("controlled")
    options = ControlPlaneOptions(die_with_parent=True, controllers=STARTED_BY_THE_FIXTURE)
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
    notify = ext.gangs.notify

    def recording(spec: GangSpec, reason: str, message: str, kind: str) -> None:
        PLANNED[spec.key] = spec  # KWOK completes Job pods at once: their gang is soon forgotten
        notify(spec, reason, message, kind)

    ext.gangs.notify = recording
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
        assert gang(extender, "llm").min_count == 8  # the size the RI read from the JobSet (2 x 4)
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
            # (a pod seen before its Job or JobSet waits with a reason of its own for a moment)
            lambda: [g for g in extender.gangs.describe() if "huge" in g["key"] and "rack" in g["pendingReason"]],
            90,
        )
        assert explained[0]["minCount"] == 12, explained
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


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def placement_delay_s(kube: RestKube, placed: list[dict[str, Any]], *others: str) -> float:
    """Seconds from the last of ``placed`` and the objects at ``others`` (paths) being created to
    the last of ``placed`` being scheduled, on the API server's clock (1 s resolution)."""
    created = [p["metadata"]["creationTimestamp"] for p in placed]
    created += [kube.request("GET", path).body["metadata"]["creationTimestamp"] for path in others]
    scheduled = [
        c["lastTransitionTime"]
        for p in placed
        for c in p["status"].get("conditions") or []
        if c["type"] == "PodScheduled" and c["status"] == "True"
    ]
    assert len(scheduled) == len(placed), [p["metadata"]["name"] for p in placed]
    return (max(map(_time, scheduled)) - max(map(_time, created))).total_seconds()


def bound_pods(kube: RestKube, selector: str, n: int) -> list[dict[str, Any]] | None:
    """The ``n`` live pods matching ``selector`` once every one is bound (and no more exist)."""
    live = [p for p in pods(kube, selector) if not p["metadata"].get("deletionTimestamp")]
    return live if len(live) == n and all(p["spec"].get("nodeName") for p in live) else None


def racks(kube: RestKube, placed: list[dict[str, Any]]) -> set[str]:
    return {node_labels(kube, p["spec"]["nodeName"])[RACK] for p in placed}


def gang(extender: Extender, name: str) -> GangSpec:
    """The gang of the object `name` as the extender last announced it (Planned, Scheduled,
    Unschedulable: its Events), which outlives the gang itself."""
    (found,) = [spec for key, spec in PLANNED.items() if key.split("/")[1:2] == [name]]
    return found


def gpu_template(name: str, labels: dict[str, str], *, gpus: str = "8") -> dict[str, Any]:
    """A pod template with one container ``name`` (the operators look for theirs by name)."""
    pod = template(labels, gpus=gpus, annotations=RACK_REQUIRED)
    pod["spec"]["containers"][0]["name"] = name
    return pod


def test_a_pytorchjob_is_one_gang_in_one_rack_through_an_operator_restart(
    controlled: LocalCluster, extender: Extender, kube: RestKube
) -> None:
    """A PyTorchJob of a master and 7 workers x 8 GPUs: the training-operator makes the pods
    (owned by the job, labelled with its replica types), restarted while it makes them. The
    Resource Interface makes one gang of 8 (1 + 7, from the object); all 8 land whole in one
    rack, no pod twice; deleting the job takes the pods and the gang with it."""
    labels = {"app": "pt"}
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "pt", "namespace": NS},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": gpu_template("pytorch", labels)},
                "Worker": {"replicas": 7, "restartPolicy": "OnFailure", "template": gpu_template("pytorch", labels)},
            }
        },
    }
    r = kube.request("POST", PYTORCHJOBS, body=job)
    assert r.status == 201, r.body
    try:
        controlled.restart_controller("training-operator")
        placed = wait("the PyTorchJob's 8 pods bound", lambda: bound_pods(kube, "app=pt", 8), 120)
        assert {p["metadata"]["ownerReferences"][0]["kind"] for p in placed} == {"PyTorchJob"}
        types = sorted(p["metadata"]["labels"]["training.kubeflow.org/replica-type"] for p in placed)
        assert types == ["master"] + ["worker"] * 7
        assert len({p["spec"]["nodeName"] for p in placed}) == 8 and len(racks(kube, placed)) == 1
        assert gang(extender, "pt").min_count == 8
    finally:
        kube.request("DELETE", f"{PYTORCHJOBS}/pt", query={"propagationPolicy": "Foreground"})
    wait("the PyTorchJob's pods collected", lambda: not pods(kube, "app=pt"), 90)
    wait("the gang forgotten", lambda: not [g for g in extender.gangs.describe() if "pt" in g["key"]], 30)


def test_an_mpijob_launcher_and_workers_are_one_gang_and_survive_an_operator_restart(
    controlled: LocalCluster, extender: Extender, kube: RestKube
) -> None:
    """An MPIJob (v2beta1) of a CPU launcher and 4 workers x 8 GPUs: the MPI operator makes the
    workers' pods and the launcher's Job (the Job controller its pod). One gang of 5, from the
    object; the workers whole in one rack. The operator restarted after placement adopts what
    exists: no pod is made again or moved."""
    labels = {"app": "mpi"}
    launcher = template(labels)
    launcher["spec"]["containers"][0]["name"] = "launcher"
    job = {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": "mpi", "namespace": NS},
        "spec": {
            "slotsPerWorker": 8,
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": launcher},
                "Worker": {"replicas": 4, "template": gpu_template("worker", labels)},
            },
        },
    }
    r = kube.request("POST", MPIJOBS, body=job)
    assert r.status == 201, r.body
    try:
        placed = wait("the MPIJob's 5 pods bound", lambda: bound_pods(kube, "app=mpi", 5), 120)
        workers = [p for p in placed if p["metadata"]["labels"].get("training.kubeflow.org/job-role") == "worker"]
        assert len(workers) == 4 and len(racks(kube, workers)) == 1
        assert gang(extender, "mpi").min_count == 5
        before = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in placed}
        log = controlled.layout.log("mpi-operator")
        leading = log.read_text().count("Leading started")
        controlled.restart_controller("mpi-operator")
        # it elects itself (its old lease runs out first), then syncs the job it finds
        wait("the new operator leading", lambda: log.read_text().count("Leading started") > leading, 90)
        wait(
            "the new operator synced the job",
            lambda: "Successfully synced 'default/mpi'" in log.read_text().split("Leading started")[-1],
            60,
        )
        after = bound_pods(kube, "app=mpi", 5)
        assert after is not None and {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in after} == before
    finally:
        kube.request("DELETE", f"{MPIJOBS}/mpi", query={"propagationPolicy": "Foreground"})
    wait("the MPIJob's pods collected", lambda: not pods(kube, "app=mpi"), 90)


def test_a_trainjob_rendered_by_its_runtime_is_one_gang_in_one_rack(extender: Extender, kube: RestKube) -> None:
    """A TrainJob on Trainer's own torch-distributed ClusterTrainingRuntime, 4 nodes x 8 GPUs,
    the rack requirement given as a pod template override: Trainer renders a JobSet, JobSet the
    Job, the Job controller the pods. One gang of 4, its size read from spec.trainer.numNodes."""
    body = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "tj", "namespace": NS},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {
                "numNodes": 4,
                "resourcesPerNode": {"limits": {"nvidia.com/gpu": "8"}, "requests": {"cpu": "1"}},
            },
            "podTemplateOverrides": [
                {
                    "targetJobs": [{"name": "node"}],
                    "metadata": {"labels": {"app": "tj"}, "annotations": RACK_REQUIRED},
                    "spec": {"tolerations": [{"operator": "Exists"}]},
                }
            ],
        },
    }
    r = kube.request("POST", TRAINJOBS, body=body)
    assert r.status == 201, r.body
    try:
        placed = wait("the TrainJob's 4 nodes bound", lambda: bound_pods(kube, "app=tj", 4), 120)
        assert {p["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] for p in placed} == {"tj"}
        assert len({p["spec"]["nodeName"] for p in placed}) == 4 and len(racks(kube, placed)) == 1
        assert gang(extender, "tj").min_count == 4
    finally:
        kube.request("DELETE", f"{TRAINJOBS}/tj", query={"propagationPolicy": "Foreground"})
    wait("the TrainJob's pods collected", lambda: not pods(kube, "app=tj"), 90)


def test_a_jobset_whose_jobs_appear_one_by_one_is_placed_as_they_come(extender: Extender, kube: RestKube) -> None:
    """A JobSet whose workers depend on its driver being ready (dependsOn): the JobSet
    controller makes the driver's Job, and the 2 worker Jobs (4 pods x 8 GPUs each) only once
    the driver's pod runs. The driver is placed alone; the workers, who join the gang later and
    do not count to its minimum, land whole in one rack within 10 s of their Jobs appearing."""
    driver = template({"app": "seq", "role": "driver"})
    worker = template({"app": "seq", "role": "worker"}, gpus="8", annotations=RACK_REQUIRED)
    for pod in (driver, worker):
        pod["spec"]["restartPolicy"] = "Never"

    def replicated(name: str, replicas: int, pods_each: int, pod: dict[str, Any]) -> dict[str, Any]:
        spec = {"parallelism": pods_each, "completions": pods_each, "backoffLimit": 0, "template": pod}
        return {"name": name, "replicas": replicas, "template": {"spec": spec}}

    workers = replicated("workers", 2, 4, worker) | {"dependsOn": [{"name": "driver", "status": "Ready"}]}
    body = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "seq", "namespace": NS},
        "spec": {"replicatedJobs": [replicated("driver", 1, 1, driver), workers]},
    }
    r = kube.request("POST", JOBSETS, body=body)
    assert r.status == 201, r.body
    try:
        placed = wait("the driver and 8 workers bound", lambda: bound_pods(kube, "app=seq", 9), 150)
        assert gang(extender, "seq").min_count == 1  # the driver: the workers come later
        workers_placed = [p for p in placed if p["metadata"]["labels"]["role"] == "worker"]
        assert len(racks(kube, workers_placed)) == 1
        jobs = kube.request("GET", f"{JOBS}", query={"labelSelector": "jobset.sigs.k8s.io/jobset-name=seq"}).body
        by_role = {j["spec"]["template"]["metadata"]["labels"]["role"]: j for j in jobs["items"]}
        worker_jobs = [j for j in jobs["items"] if j["spec"]["template"]["metadata"]["labels"]["role"] == "worker"]
        assert len(jobs["items"]) == 3 and len(worker_jobs) == 2 and "driver" in by_role
        # the worker Jobs came once the driver ran: none was made before its pod was scheduled
        (driver_pod,) = [p for p in placed if p["metadata"]["labels"]["role"] == "driver"]
        (scheduled,) = [c for c in driver_pod["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert all(
            _time(j["metadata"]["creationTimestamp"]) >= _time(scheduled["lastTransitionTime"]) for j in worker_jobs
        )
        last_jobs = [f"{JOBS}/{j['metadata']['name']}" for j in worker_jobs]
        assert placement_delay_s(kube, workers_placed, *last_jobs) <= PLACED_WITHIN_S
    finally:
        kube.request("DELETE", f"{JOBSETS}/seq", query={"propagationPolicy": "Foreground"})
    wait("the JobSet's pods collected", lambda: not pods(kube, "app=seq"), 90)


def test_pods_made_before_their_workload_wait_and_are_placed_when_it_appears(
    extender: Extender, kube: RestKube
) -> None:
    """A Job's 4 pods x 8 GPUs name a Phalanx Workload (phalanx.io/workload) that does not exist
    yet, nor does its CRD: they wait, none bound. Then the CRD is installed and the Workload
    created at once (a Workload created while its CRD is still being discovered): the 4 are
    placed whole in one rack within 10 s of the Workload appearing."""
    crd = yaml.safe_load(Path("config/crds/phalanx.io_workloads.yaml").read_text())
    pod = template({"app": "late", "phalanx.io/workload": "late"}, gpus="8")
    pod["spec"]["restartPolicy"] = "Never"
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "late", "namespace": NS},
        "spec": {"completions": 4, "parallelism": 4, "completionMode": "Indexed", "template": pod},
    }
    assert (
        kube.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/workloads.phalanx.io").status
        == 404
    )
    assert kube.request("POST", JOBS, body=job).status == 201
    workload = {
        "apiVersion": "phalanx.io/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": "late", "namespace": NS},
        "spec": {
            "gangGroups": [
                {
                    "name": "workers",
                    "minCount": 4,
                    "topologyRequest": {"required": RACK},
                    "rankedGroups": [{"name": "all", "eqGroups": [{"name": "w", "count": 4}]}],
                }
            ]
        },
    }
    try:
        made = wait("the Job's 4 pods made", lambda: len(pods(kube, "app=late")) == 4 and pods(kube, "app=late"), 60)
        assert not [p for p in made if p["spec"].get("nodeName")]
        r = kube.request("POST", CRDS, body=crd)
        assert r.status == 201, r.body
        wait("the Workload created", lambda: kube.request("POST", WORKLOADS, body=workload).status == 201, 30)
        placed = wait("the 4 placed", lambda: bound_pods(kube, "app=late", 4), 60)
        assert len(racks(kube, placed)) == 1
        assert placement_delay_s(kube, placed, f"{WORKLOADS}/late") <= PLACED_WITHIN_S
    finally:
        kube.request("DELETE", f"{JOBS}/late", query={"propagationPolicy": "Background"})
        kube.request("DELETE", f"{WORKLOADS}/late")
    wait("the Job's pods collected", lambda: not pods(kube, "app=late"), 90)


def test_a_raycluster_whose_operator_and_crd_arrive_after_phalanx_is_one_gang_and_scales(
    controlled: LocalCluster, extender: Extender, kube: RestKube
) -> None:
    """KubeRay starts (its CRDs installed) while Phalanx runs, and a RayCluster is created as
    soon as the API serves it: KubeRay makes a CPU head and 3 workers x 8 GPUs. One gang of 4
    (1 + 3, from the object), whole in one rack, within 10 s of the last pod appearing; scaled
    to 5 workers, the 2 new ones are placed too; deleted, everything goes."""
    controlled.start_controller("kuberay")
    head = template({"app": "ray"}, annotations=RACK_REQUIRED)
    head["spec"]["containers"][0]["name"] = "ray-head"
    body = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "ray", "namespace": NS},
        "spec": {
            "headGroupSpec": {"rayStartParams": {}, "template": head},
            "workerGroupSpecs": [
                {
                    "groupName": "gpu",
                    "replicas": 3,
                    "minReplicas": 0,
                    "maxReplicas": 8,
                    "rayStartParams": {},
                    "template": gpu_template("ray-worker", {"app": "ray"}),
                }
            ],
        },
    }
    wait("the RayCluster created", lambda: kube.request("POST", RAYCLUSTERS, body=body).status == 201, 30)
    try:
        placed = wait("the RayCluster's 4 pods bound", lambda: bound_pods(kube, "app=ray", 4), 120)
        assert {p["metadata"]["ownerReferences"][0]["kind"] for p in placed} == {"RayCluster"}
        assert len(racks(kube, placed)) == 1
        assert gang(extender, "ray").min_count == 4
        assert placement_delay_s(kube, placed) <= PLACED_WITHIN_S
        scale = [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 5}]
        r = kube.request("PATCH", f"{RAYCLUSTERS}/ray", body=scale, content_type="application/json-patch+json")
        assert r.status == 200, r.body
        wait("the RayCluster's 6 pods bound", lambda: bound_pods(kube, "app=ray", 6), 120)
    finally:
        kube.request("DELETE", f"{RAYCLUSTERS}/ray", query={"propagationPolicy": "Foreground"})
    wait("the RayCluster's pods collected", lambda: not pods(kube, "app=ray"), 90)


def test_an_inferenceservice_in_raw_deployment_mode_is_one_gang_and_scales(extender: Extender, kube: RestKube) -> None:
    """A KServe InferenceService whose predictor is 2 replicas x 4 GPUs: KServe makes its
    Deployment (RawDeployment mode), the ReplicaSet controller the pods, which KServe's pod
    webhook labels. One gang of 2 (its minReplicas, from the object), in one rack; raised to 3
    replicas, the third is placed too; deleted, everything goes."""

    def isvc(replicas: int) -> dict[str, Any]:
        return {
            "apiVersion": "serving.kserve.io/v1beta1",
            "kind": "InferenceService",
            "metadata": {"name": "chat", "namespace": NS, "annotations": {"serving.kserve.io/autoscalerClass": "none"}},
            "spec": {
                "predictor": {
                    "minReplicas": replicas,
                    "maxReplicas": replicas,
                    "annotations": RACK_REQUIRED,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [
                        {
                            "name": "kserve-container",
                            "image": "registry.example/chat:latest",
                            "resources": {"limits": {"nvidia.com/gpu": "4"}, "requests": {"cpu": "1"}},
                        }
                    ],
                }
            },
        }

    r = kube.request("POST", ISVCS, body=isvc(2))  # KServe sets the pods' app label: select by its own
    assert r.status == 201, r.body
    try:
        placed = wait("the predictor's 2 replicas bound", lambda: bound_pods(kube, CHAT, 2), 120)
        assert {p["metadata"]["labels"]["serving.kserve.io/inferenceservice"] for p in placed} == {"chat"}
        assert {p["metadata"]["labels"]["component"] for p in placed} == {"predictor"}
        assert len(racks(kube, placed)) == 1
        assert gang(extender, "chat").min_count == 2
        scale = {"spec": {"predictor": {"minReplicas": 3, "maxReplicas": 3}}}
        r = kube.request("PATCH", f"{ISVCS}/chat", body=scale, content_type="application/merge-patch+json")
        assert r.status == 200, r.body
        wait("the predictor's 3 replicas bound", lambda: bound_pods(kube, CHAT, 3), 120)
    finally:
        kube.request("DELETE", f"{ISVCS}/chat", query={"propagationPolicy": "Foreground"})
    wait("the InferenceService's pods collected", lambda: not pods(kube, CHAT), 90)
