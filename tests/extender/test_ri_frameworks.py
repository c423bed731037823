"""The shipped definitions (config/resource-interfaces/) against realistic CRs and controller-made pods.

One table drives every framework: a CR and the pods its controller has made so far
(benchmarks/ri_samples), and what the definition must make of them - the gangs with their
min/expected sizes and members, each pod's component, the instances and the status. A second
table pins each framework's status mapping. What only one framework has stays a small test below.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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

JSON = dict[str, Any]
Sample = tuple[JSON, list[JSON]]

API_VERSION = {
    "PyTorchJob": "kubeflow.org/v1",
    "MPIJob": "kubeflow.org/v2beta1",
    "JobSet": "jobset.x-k8s.io/v1alpha2",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1",
    "InferenceService": "serving.kserve.io/v1beta1",
    "TrainJob": "trainer.kubeflow.org/v1alpha1",
    "RayCluster": "ray.io/v1",
}


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry(load_defaults())


def ri(registry: Registry, kind: str) -> ResourceInterface:
    group, _, version = API_VERSION[kind].rpartition("/")
    found = registry.lookup(group, version, kind)
    assert found is not None
    return found


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


# --- the table ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One framework's CR and pods, and the evaluation they must give.

    gangs: (key, minCount, expected, members present) per gang, in order. components: each pod's
    component, in pod order. members: gang key -> its member pod names, where the names matter.
    instances: (component, instance, replicas, minReplicas, maxReplicas), where they explain the
    sizes. unassigned: the reason of each pod that joins no gang.
    """

    name: str
    kind: str
    build: Callable[[], Sample]
    gangs: list[tuple[str, int, int, int]]
    components: tuple[str, ...]
    status: str
    members: dict[str, tuple[str, ...]] = field(default_factory=dict)
    instances: list[tuple[str, str, int, int, int | None]] | None = None
    unassigned: tuple[str, ...] = ()


M, W = ("master",), ("worker",)
LWS_GROUP = ("leader", "worker", "worker", "worker")

CASES = [
    Case(
        "PyTorchJob: master and 3 workers form one gang of 4",
        "PyTorchJob",
        lambda: samples.pytorchjob(workers=3),
        [("job/bert", 4, 4, 4)],
        M + W * 3,
        STATUS_INITIALIZING,
        members={"job/bert": ("bert-master-0", "bert-worker-0", "bert-worker-1", "bert-worker-2")},
    ),
    Case(
        "PyTorchJob: only the master exists yet; the gang still expects master + 3 workers",
        "PyTorchJob",
        lambda: samples.pytorchjob(workers=3, created=1),
        [("job/bert", 4, 4, 1)],
        M,
        STATUS_INITIALIZING,
    ),
    Case(
        "PyTorchJob: schedulingPolicy.minAvailable 5 sets the gang's minimum",
        "PyTorchJob",
        lambda: samples.pytorchjob(workers=7, min_available=5),
        [("job/bert", 5, 8, 8)],
        M + W * 7,
        STATUS_INITIALIZING,
    ),
    Case(
        "PyTorchJob: elasticPolicy.minReplicas 2 counts towards the minimum (master + 2)",
        "PyTorchJob",
        lambda: samples.pytorchjob(workers=6, elastic_min=2),
        [("job/bert", 3, 7, 7)],
        M + W * 6,
        STATUS_INITIALIZING,
        instances=[("master", "", 1, 1, None), ("worker", "", 6, 2, 6)],
    ),
    Case(
        "PyTorchJob: without a master, the workers alone are the gang",
        "PyTorchJob",
        lambda: samples.pytorchjob(workers=2, master=False),
        [("job/bert", 2, 2, 2)],
        W * 2,
        STATUS_INITIALIZING,
        instances=[("worker", "", 2, 2, None)],
    ),
    Case(
        "MPIJob: launcher and 4 workers form one gang of 5",
        "MPIJob",
        lambda: samples.mpijob(workers=4),
        [("job/allreduce", 5, 5, 5)],
        ("launcher",) + W * 4,
        STATUS_RUNNING,
    ),
    Case(
        "MPIJob: WaitForWorkersReady keeps the launcher (made after the workers run) out of the minimum",
        "MPIJob",
        lambda: samples.mpijob(workers=4, wait_for_workers=True),
        [("job/allreduce", 4, 5, 4)],
        W * 4,
        STATUS_RUNNING,
        instances=[("launcher", "", 1, 0, None), ("worker", "", 4, 4, None)],
    ),
    Case(
        "JobSet: documented choice, the whole JobSet (driver + 2 worker jobs x 4 pods) is one gang",
        "JobSet",
        lambda: samples.jobset(),
        [("jobset/llm", 9, 9, 9)],
        ("job",) * 9,
        STATUS_RUNNING,
        instances=[("job", "driver", 1, 1, None), ("job", "workers", 8, 8, None)],
    ),
    Case(
        "JobSet: replicated jobs without pods yet still count",
        "JobSet",
        lambda: samples.jobset(created={"driver"}),
        [("jobset/llm", 9, 9, 1)],
        ("job",),
        STATUS_RUNNING,
    ),
    Case(
        "JobSet: InOrder startup counts only the first job towards the minimum",
        "JobSet",
        lambda: samples.jobset(in_order=True, created={"driver"}),
        [("jobset/llm", 1, 9, 1)],
        ("job",),
        STATUS_RUNNING,
        instances=[("job", "driver", 1, 1, None), ("job", "workers", 8, 0, None)],
    ),
    Case(
        "JobSet: dependsOn keeps the dependent jobs out of the minimum",
        "JobSet",
        lambda: samples.jobset(depends_on={"workers": "driver"}),
        [("jobset/llm", 1, 9, 9)],
        ("job",) * 9,
        STATUS_RUNNING,
    ),
    Case(
        "LeaderWorkerSet: replicas 3 x size 4 gives 3 independent gangs of 4",
        "LeaderWorkerSet",
        lambda: samples.leaderworkerset(replicas=3, size=4),
        [("group/vllm/0", 4, 4, 4), ("group/vllm/1", 4, 4, 4), ("group/vllm/2", 4, 4, 4)],
        LWS_GROUP * 3,
        STATUS_INITIALIZING,
        members={"group/vllm/1": ("vllm-1", "vllm-1-1", "vllm-1-2", "vllm-1-3")},
    ),
    Case(
        "LeaderWorkerSet: leaders come first (they own the worker StatefulSets); each gang still expects 4",
        "LeaderWorkerSet",
        lambda: samples.leaderworkerset(replicas=3, size=4, workers_created=False),
        [("group/vllm/0", 4, 4, 1), ("group/vllm/1", 4, 4, 1), ("group/vllm/2", 4, 4, 1)],
        ("leader",) * 3,
        STATUS_INITIALIZING,
    ),
    Case(
        "InferenceService: 2 predictors and the transformer form one gang of 3",
        "InferenceService",
        lambda: samples.inferenceservice(predictor_min=2),
        [("service/llama", 3, 3, 3)],
        ("predictor", "predictor", "transformer"),
        STATUS_RUNNING,
        instances=[("predictor", "", 2, 2, 4), ("transformer", "", 1, 1, None)],
    ),
    Case(
        "InferenceService: minReplicas defaults to one",
        "InferenceService",
        lambda: samples.inferenceservice(predictor_min=None, transformer=False),
        [("service/llama", 1, 1, 1)],
        ("predictor",),
        STATUS_RUNNING,
    ),
    Case(
        "TrainJob: the node pods form the gang; the dataset initializer stays out",
        "TrainJob",
        lambda: samples.trainjob(num_nodes=4),
        [("trainer/qwen-sft", 4, 4, 4)],
        ("dataset-initializer",) + ("node",) * 4,
        STATUS_RUNNING,
        unassigned=(REASON_NO_POD_GROUP,),
    ),
    Case(
        "TrainJob: sized from numNodes before the node pods exist",
        "TrainJob",
        lambda: samples.trainjob(num_nodes=4, nodes_created=1, initializers=False),
        [("trainer/qwen-sft", 4, 4, 1)],
        ("node",),
        STATUS_RUNNING,
    ),
    Case(
        "RayCluster: head + cpu 2x1 + gpu 2x2 hosts form one gang of 7",
        "RayCluster",
        lambda: samples.raycluster(),
        [("cluster/ray", 7, 7, 7)],
        ("head",) + W * 6,
        STATUS_RUNNING,
        instances=[("head", "", 1, 1, None), ("worker", "cpu", 2, 2, 10), ("worker", "gpu", 4, 4, 20)],
    ),
    Case(
        "RayCluster: in-tree autoscaling sizes the minimum from minReplicas (1 + 1x1 + 2x2 = 6, as KubeRay's "
        "Volcano minMember)",
        "RayCluster",
        lambda: samples.raycluster(autoscaling=True),
        [("cluster/ray", 6, 7, 7)],
        ("head",) + W * 6,
        STATUS_RUNNING,
        instances=[("head", "", 1, 1, None), ("worker", "cpu", 2, 1, 10), ("worker", "gpu", 4, 4, 20)],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_framework(registry: Registry, case: Case) -> None:
    iface = ri(registry, case.kind)
    cr, pods = case.build()
    ev = iface.evaluate(cr, pods)
    assert [(g.key, g.min_count, g.expected, len(g.members)) for g in ev.gangs] == case.gangs
    assert {g.key: g.members for g in ev.gangs if g.key in case.members} == case.members
    assert tuple(c.component if (c := iface.classify(p)) else "" for p in pods) == case.components
    if case.instances is not None:
        assert [(i.component, i.instance, i.replicas, i.min_replicas, i.max_replicas) for i in ev.instances] == (
            case.instances
        )
    assert tuple(u.reason for u in ev.unassigned) == case.unassigned
    assert ev.problems == ()
    assert ev.status == iface.status(cr) == case.status


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_pod_finds_its_root_and_gang_alone(registry: Registry, case: Case) -> None:
    """What the extender asks per pod on every watch event agrees with the whole-root evaluation."""
    iface = ri(registry, case.kind)
    cr, pods = case.build()
    by_name = {p["metadata"]["name"]: p for p in pods}
    assert {iface.pod_root_name(p) for p in pods} == {cr["metadata"]["name"]}
    for gang in iface.evaluate(cr, pods).gangs:
        assert {iface.gang_key(by_name[m]) for m in gang.members} == {gang.key}


STATUS_CASES = [
    ("PyTorchJob: no conditions -> Pending", "PyTorchJob", samples.conditions(), STATUS_PENDING),
    ("PyTorchJob: Created -> Initializing", "PyTorchJob", samples.conditions(("Created", "True")), STATUS_INITIALIZING),
    (
        "PyTorchJob: Created + Running -> Running",
        "PyTorchJob",
        samples.conditions(("Created", "True"), ("Running", "True")),
        STATUS_RUNNING,
    ),
    (
        "PyTorchJob: Succeeded -> Completed",
        "PyTorchJob",
        samples.conditions(("Created", "True"), ("Running", "False"), ("Succeeded", "True")),
        STATUS_COMPLETED,
    ),
    (
        "PyTorchJob: Failed wins over Running",
        "PyTorchJob",
        samples.conditions(("Created", "True"), ("Running", "True"), ("Failed", "True")),
        STATUS_FAILED,
    ),
    (
        "PyTorchJob: Created + Suspended -> Initializing",
        "PyTorchJob",
        samples.conditions(("Created", "True"), ("Suspended", "True")),
        STATUS_INITIALIZING,
    ),
    (
        "JobSet: terminalState Completed -> Completed",
        "JobSet",
        {"terminalState": "Completed", **samples.conditions(("Completed", "True"))},
        STATUS_COMPLETED,
    ),
    ("JobSet: terminalState Failed -> Failed", "JobSet", {"terminalState": "Failed"}, STATUS_FAILED),
    ("JobSet: Suspended -> Pending", "JobSet", samples.conditions(("Suspended", "True")), STATUS_PENDING),
    (
        "LeaderWorkerSet: Available, no longer Progressing -> Running",
        "LeaderWorkerSet",
        samples.conditions(("Available", "True"), ("Progressing", "False")),
        STATUS_RUNNING,
    ),
    (
        "InferenceService: Ready False -> Initializing",
        "InferenceService",
        samples.conditions(("Ready", "False")),
        STATUS_INITIALIZING,
    ),
    ("TrainJob: Complete -> Completed", "TrainJob", samples.conditions(("Complete", "True")), STATUS_COMPLETED),
    ("RayCluster: state suspended -> Pending", "RayCluster", {"state": "suspended"}, STATUS_PENDING),
]
DEFAULT_SAMPLE: dict[str, Callable[[], Sample]] = {
    "PyTorchJob": samples.pytorchjob,
    "JobSet": samples.jobset,
    "LeaderWorkerSet": samples.leaderworkerset,
    "InferenceService": samples.inferenceservice,
    "TrainJob": samples.trainjob,
    "RayCluster": samples.raycluster,
}


@pytest.mark.parametrize(
    ("kind", "status", "expected"), [c[1:] for c in STATUS_CASES], ids=[c[0] for c in STATUS_CASES]
)
def test_status(registry: Registry, kind: str, status: JSON, expected: str) -> None:
    cr, _ = DEFAULT_SAMPLE[kind]()
    cr["status"] = status
    assert ri(registry, kind).status(cr) == expected


# --- what only one framework has ------------------------------------------------------------------


def test_trainjob_initializer_is_the_unassigned_pod(registry: Registry) -> None:
    """The pod left out of the TrainJob's gang is the dataset initializer, for want of a pod group."""
    cr, pods = samples.trainjob(num_nodes=4)
    ev = ri(registry, "TrainJob").evaluate(cr, pods)
    assert [(u.pod.split("-0-")[0], u.reason) for u in ev.unassigned] == [
        ("qwen-sft-dataset-initializer", REASON_NO_POD_GROUP)
    ]


def test_gang_keys_agree_across_threads(registry: Registry) -> None:
    """Compiled jq programs are shared by every thread that asks."""
    iface = ri(registry, "LeaderWorkerSet")
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
