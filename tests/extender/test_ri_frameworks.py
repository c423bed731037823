"""The shipped definitions (config/resource-interfaces/) against realistic CRs and controller-made pods."""

from __future__ import annotations

import threading

import pytest

from benchmarks import ri_samples as samples
from extender.ri import (
    REASON_NO_POD_GROUP,
    STATUS_COMPLETED,
    STATUS_FAILED,
    STATUS_INITIALIZING,
    STATUS_PENDING,
    STATUS_RUNNING,
    ResourceInterface,
)
from extender.ri.registry import Registry, load_defaults


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry(load_defaults())


def ri(registry: Registry, api_version: str, kind: str) -> ResourceInterface:
    group, _, version = api_version.rpartition("/")
    found = registry.lookup(group, version, kind)
    assert found is not None
    return found


def sizes(evaluation: object) -> list[tuple[str, int, int, int]]:
    return [(g.key, g.min_count, g.expected, len(g.members)) for g in evaluation.gangs]  # type: ignore[attr-defined]


def test_every_kind_is_shipped(registry: Registry) -> None:
    """One definition per required kind, all valid."""
    assert [(wt.group, wt.name, wt.versions()) for wt in registry.list()] == [
        ("jobset.x-k8s.io", "JobSet", ("v1alpha2",)),
        ("kubeflow.org", "MPIJob", ("v2beta1",)),
        ("kubeflow.org", "PyTorchJob", ("v1",)),
        ("leaderworkerset.x-k8s.io", "LeaderWorkerSet", ("v1",)),
        ("ray.io", "RayCluster", ("v1",)),
        ("serving.kserve.io", "InferenceService", ("v1beta1",)),
        ("trainer.kubeflow.org", "TrainJob", ("v1alpha1",)),
    ]


# --- PyTorchJob ---------------------------------------------------------------------------------


def test_pytorchjob_master_and_workers_form_one_gang(registry: Registry) -> None:
    cr, pods = samples.pytorchjob(workers=3)
    ev = ri(registry, "kubeflow.org/v1", "PyTorchJob").evaluate(cr, pods)
    assert sizes(ev) == [("job/bert", 4, 4, 4)]
    assert ev.gangs[0].members == ("bert-master-0", "bert-worker-0", "bert-worker-1", "bert-worker-2")
    assert ev.unassigned == () and ev.problems == ()


def test_pytorchjob_gang_is_sized_before_workers_exist(registry: Registry) -> None:
    """Only the master is created yet: the gang still expects master + 3 workers."""
    cr, pods = samples.pytorchjob(workers=3, created=1)
    ev = ri(registry, "kubeflow.org/v1", "PyTorchJob").evaluate(cr, pods)
    assert sizes(ev) == [("job/bert", 4, 4, 1)]


def test_pytorchjob_min_available_sets_min_count(registry: Registry) -> None:
    cr, pods = samples.pytorchjob(workers=7, min_available=5)
    ev = ri(registry, "kubeflow.org/v1", "PyTorchJob").evaluate(cr, pods)
    assert sizes(ev) == [("job/bert", 5, 8, 8)]


def test_pytorchjob_elastic_min_replicas_counts_towards_min(registry: Registry) -> None:
    cr, pods = samples.pytorchjob(workers=6, elastic_min=2)
    ev = ri(registry, "kubeflow.org/v1", "PyTorchJob").evaluate(cr, pods)
    assert sizes(ev) == [("job/bert", 3, 7, 7)]
    worker = next(i for i in ev.instances if i.component == "worker")
    assert (worker.replicas, worker.min_replicas, worker.max_replicas) == (6, 2, 6)


def test_pytorchjob_without_master(registry: Registry) -> None:
    cr, pods = samples.pytorchjob(workers=2, master=False)
    ev = ri(registry, "kubeflow.org/v1", "PyTorchJob").evaluate(cr, pods)
    assert sizes(ev) == [("job/bert", 2, 2, 2)]
    assert [i.component for i in ev.instances] == ["worker"]


@pytest.mark.parametrize(
    ("conds", "status"),
    [
        ((), STATUS_PENDING),
        ((("Created", "True"),), STATUS_INITIALIZING),
        ((("Created", "True"), ("Running", "True")), STATUS_RUNNING),
        ((("Created", "True"), ("Running", "False"), ("Succeeded", "True")), STATUS_COMPLETED),
        ((("Created", "True"), ("Running", "True"), ("Failed", "True")), STATUS_FAILED),
        ((("Created", "True"), ("Suspended", "True")), STATUS_INITIALIZING),
    ],
    ids=["no status", "created", "running", "succeeded", "failed wins over running", "created+suspended"],
)
def test_pytorchjob_status(registry: Registry, conds: tuple[tuple[str, str], ...], status: str) -> None:
    cr, _ = samples.pytorchjob()
    cr["status"] = samples.conditions(*conds)
    assert ri(registry, "kubeflow.org/v1", "PyTorchJob").status(cr) == status


def test_pytorchjob_pod_root_name_and_key(registry: Registry) -> None:
    _, pods = samples.pytorchjob()
    iface = ri(registry, "kubeflow.org/v1", "PyTorchJob")
    assert iface.pod_root_name(pods[0]) == "bert"
    assert iface.gang_key(pods[1]) == "job/bert"


# --- MPIJob -------------------------------------------------------------------------------------------


def test_mpijob_launcher_and_workers_form_one_gang(registry: Registry) -> None:
    cr, pods = samples.mpijob(workers=4)
    ev = ri(registry, "kubeflow.org/v2beta1", "MPIJob").evaluate(cr, pods)
    assert sizes(ev) == [("job/allreduce", 5, 5, 5)]
    assert {ri(registry, "kubeflow.org/v2beta1", "MPIJob").classify(p).component for p in pods} == {
        "launcher",
        "worker",
    }


def test_mpijob_wait_for_workers_keeps_launcher_out_of_min(registry: Registry) -> None:
    """launcherCreationPolicy WaitForWorkersReady: the launcher comes after the workers run."""
    cr, pods = samples.mpijob(workers=4, wait_for_workers=True)
    ev = ri(registry, "kubeflow.org/v2beta1", "MPIJob").evaluate(cr, pods)
    assert sizes(ev) == [("job/allreduce", 4, 5, 4)]


# --- JobSet ------------------------------------------------------------------------------------------


def test_jobset_is_one_gang_over_all_replicated_jobs(registry: Registry) -> None:
    """Documented choice: the whole JobSet (driver + 2 worker jobs x 4 pods) is one gang."""
    cr, pods = samples.jobset()
    ev = ri(registry, "jobset.x-k8s.io/v1alpha2", "JobSet").evaluate(cr, pods)
    assert sizes(ev) == [("jobset/llm", 9, 9, 9)]
    assert [(i.instance, i.replicas) for i in ev.instances] == [("driver", 1), ("workers", 8)]


def test_jobset_counts_replicated_jobs_without_pods_yet(registry: Registry) -> None:
    cr, pods = samples.jobset(created={"driver"})
    ev = ri(registry, "jobset.x-k8s.io/v1alpha2", "JobSet").evaluate(cr, pods)
    assert sizes(ev) == [("jobset/llm", 9, 9, 1)]


def test_jobset_in_order_startup_counts_only_the_first_job_towards_min(registry: Registry) -> None:
    cr, pods = samples.jobset(in_order=True, created={"driver"})
    ev = ri(registry, "jobset.x-k8s.io/v1alpha2", "JobSet").evaluate(cr, pods)
    assert sizes(ev) == [("jobset/llm", 1, 9, 1)]


def test_jobset_depends_on_keeps_dependent_jobs_out_of_min(registry: Registry) -> None:
    cr, pods = samples.jobset(depends_on={"workers": "driver"})
    ev = ri(registry, "jobset.x-k8s.io/v1alpha2", "JobSet").evaluate(cr, pods)
    assert sizes(ev) == [("jobset/llm", 1, 9, 9)]


def test_jobset_status(registry: Registry) -> None:
    iface = ri(registry, "jobset.x-k8s.io/v1alpha2", "JobSet")
    cr, _ = samples.jobset()
    assert iface.status(cr) == STATUS_RUNNING
    cr["status"] = {"terminalState": "Completed", **samples.conditions(("Completed", "True"))}
    assert iface.status(cr) == STATUS_COMPLETED
    cr["status"] = {"terminalState": "Failed"}
    assert iface.status(cr) == STATUS_FAILED
    cr["status"] = samples.conditions(("Suspended", "True"))
    assert iface.status(cr) == STATUS_PENDING


# --- LeaderWorkerSet ----------------------------------------------------------------------------------


def test_lws_replicas_3_size_4_gives_3_independent_gangs_of_4(registry: Registry) -> None:
    cr, pods = samples.leaderworkerset(replicas=3, size=4)
    iface = ri(registry, "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    ev = iface.evaluate(cr, pods)
    assert sizes(ev) == [("group/vllm/0", 4, 4, 4), ("group/vllm/1", 4, 4, 4), ("group/vllm/2", 4, 4, 4)]
    assert ev.gangs[1].members == ("vllm-1", "vllm-1-1", "vllm-1-2", "vllm-1-3")
    assert [iface.classify(p).component for p in pods[:2]] == ["leader", "worker"]


def test_lws_gangs_are_sized_before_worker_statefulsets_exist(registry: Registry) -> None:
    """Leaders come first (they own the worker StatefulSets): each gang still expects 4."""
    cr, pods = samples.leaderworkerset(replicas=3, size=4, workers_created=False)
    ev = ri(registry, "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet").evaluate(cr, pods)
    assert sizes(ev) == [("group/vllm/0", 4, 4, 1), ("group/vllm/1", 4, 4, 1), ("group/vllm/2", 4, 4, 1)]
    assert ev.problems == ()


def test_lws_status(registry: Registry) -> None:
    iface = ri(registry, "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    cr, _ = samples.leaderworkerset()
    assert iface.status(cr) == STATUS_INITIALIZING
    cr["status"] = samples.conditions(("Available", "True"), ("Progressing", "False"))
    assert iface.status(cr) == STATUS_RUNNING


# --- KServe ------------------------------------------------------------------------------------------


def test_inferenceservice_predictor_and_transformer_form_one_gang(registry: Registry) -> None:
    cr, pods = samples.inferenceservice(predictor_min=2)
    ev = ri(registry, "serving.kserve.io/v1beta1", "InferenceService").evaluate(cr, pods)
    assert sizes(ev) == [("service/llama", 3, 3, 3)]
    assert [(i.component, i.replicas, i.max_replicas) for i in ev.instances] == [
        ("predictor", 2, 4),
        ("transformer", 1, None),
    ]


def test_inferenceservice_default_min_replicas_is_one(registry: Registry) -> None:
    cr, pods = samples.inferenceservice(predictor_min=None, transformer=False)
    ev = ri(registry, "serving.kserve.io/v1beta1", "InferenceService").evaluate(cr, pods)
    assert sizes(ev) == [("service/llama", 1, 1, 1)]


def test_inferenceservice_status(registry: Registry) -> None:
    iface = ri(registry, "serving.kserve.io/v1beta1", "InferenceService")
    cr, _ = samples.inferenceservice()
    assert iface.status(cr) == STATUS_RUNNING
    cr["status"] = samples.conditions(("Ready", "False"))
    assert iface.status(cr) == STATUS_INITIALIZING


# --- TrainJob ----------------------------------------------------------------------------------------


def test_trainjob_node_pods_form_the_gang_initializers_stay_out(registry: Registry) -> None:
    cr, pods = samples.trainjob(num_nodes=4)
    ev = ri(registry, "trainer.kubeflow.org/v1alpha1", "TrainJob").evaluate(cr, pods)
    assert sizes(ev) == [("trainer/qwen-sft", 4, 4, 4)]
    assert [(u.pod.split("-0-")[0], u.reason) for u in ev.unassigned] == [
        ("qwen-sft-dataset-initializer", REASON_NO_POD_GROUP)
    ]


def test_trainjob_sized_from_num_nodes_before_pods_exist(registry: Registry) -> None:
    cr, pods = samples.trainjob(num_nodes=4, nodes_created=1, initializers=False)
    ev = ri(registry, "trainer.kubeflow.org/v1alpha1", "TrainJob").evaluate(cr, pods)
    assert sizes(ev) == [("trainer/qwen-sft", 4, 4, 1)]


def test_trainjob_status(registry: Registry) -> None:
    iface = ri(registry, "trainer.kubeflow.org/v1alpha1", "TrainJob")
    cr, _ = samples.trainjob()
    assert iface.status(cr) == STATUS_RUNNING
    cr["status"] = samples.conditions(("Complete", "True"))
    assert iface.status(cr) == STATUS_COMPLETED


# --- RayCluster --------------------------------------------------------------------------------------


def test_raycluster_head_and_worker_groups_form_one_gang(registry: Registry) -> None:
    """head 1 + cpu 2x1 + gpu 2x2 hosts = 7."""
    cr, pods = samples.raycluster()
    ev = ri(registry, "ray.io/v1", "RayCluster").evaluate(cr, pods)
    assert sizes(ev) == [("cluster/ray", 7, 7, 7)]
    assert [(i.component, i.instance, i.replicas) for i in ev.instances] == [
        ("head", "", 1),
        ("worker", "cpu", 2),
        ("worker", "gpu", 4),
    ]


def test_raycluster_autoscaling_uses_min_replicas(registry: Registry) -> None:
    """In-tree autoscaling: 1 + cpu 1x1 + gpu 2x2 = 6, as KubeRay's Volcano minMember."""
    cr, pods = samples.raycluster(autoscaling=True)
    ev = ri(registry, "ray.io/v1", "RayCluster").evaluate(cr, pods)
    assert sizes(ev) == [("cluster/ray", 6, 7, 7)]


def test_raycluster_status(registry: Registry) -> None:
    iface = ri(registry, "ray.io/v1", "RayCluster")
    cr, _ = samples.raycluster()
    assert iface.status(cr) == STATUS_RUNNING
    cr["status"] = {"state": "suspended"}
    assert iface.status(cr) == STATUS_PENDING


def test_gang_keys_agree_across_threads(registry: Registry) -> None:
    """Compiled jq programs are shared by every thread that asks."""
    iface = ri(registry, "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    _, pods = samples.leaderworkerset(replicas=8, size=4)
    expected = [iface.gang_key(p) for p in pods]
    mismatches: list[int] = []

    def run() -> None:
        for _ in range(20):
            if [iface.gang_key(p) for p in pods] != expected:
                mismatches.append(1)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert mismatches == []
