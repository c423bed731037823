"""Realistic RI sample workloads: each framework's CR and the pods its real controller creates.

Each builder returns (cr, pods), sized by its arguments (workers, replicas, which pods the
controller has created so far). Labels follow the controllers' source: Kubeflow training-operator
v1 (lower-cased replica type), mpi-operator v2 (job-role), JobSet (jobset.sigs.k8s.io/* plus the
Job controller's batch.kubernetes.io/*), LWS (controller + pod webhook), KServe (component label),
Kubeflow Trainer v2 (via its JobSet), KubeRay (ray.io/*). `kserve_example_text` is the RI spec's
KServe definition, verbatim.

Why here: the unit tests (tests/extender/test_ri_*), the e2e tests and benchmarks/ri_keys.py all
use these builders. Benchmarks may not import tests (an import-linter contract), tests may import
benchmarks, so the one copy lives on the benchmarks side. They are Python rather than YAML under
config/ because every caller sizes them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

JSON = dict[str, Any]
HERE = Path(__file__).resolve().parent
NS = "ml"


def kserve_example_text() -> str:
    """The spec's KServe example, verbatim (it indents with tabs in two places)."""
    return (HERE / "kserve_example.json").read_text()


def _uid(*parts: str) -> str:
    digest = hashlib.sha1("/".join(parts).encode()).hexdigest()
    return f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def root(
    api_version: str, kind: str, name: str, *, spec: JSON, status: JSON, annotations: dict[str, str] | None = None
) -> JSON:
    """A root CR in the samples' namespace."""
    metadata: JSON = {"name": name, "namespace": NS}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec, "status": status}


def owner_of(cr: JSON) -> JSON:
    """The controller reference a CR's controller puts on the objects it creates."""
    return owner(cr["apiVersion"], cr["kind"], cr["metadata"]["name"])


def owner(api_version: str, kind: str, name: str) -> JSON:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": _uid(kind, name),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pod(
    name: str,
    *,
    labels: dict[str, str],
    owner_ref: JSON,
    annotations: dict[str, str] | None = None,
    gpus: int = 0,
    container: str = "main",
) -> JSON:
    limits: dict[str, str] = {"cpu": "8", "memory": "32Gi"}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": _uid("Pod", name),
            "labels": dict(labels),
            "annotations": dict(annotations or {}),
            "ownerReferences": [owner_ref],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "fieldsV1": {"f:x": {}}}],
        },
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [
                {
                    "name": container,
                    "image": "ghcr.io/example/train:2.4.0",
                    "command": ["python", "-m", "train"],
                    "env": [{"name": f"VAR_{i}", "value": "x" * 24} for i in range(8)],
                    "resources": {"limits": limits, "requests": dict(limits)},
                }
            ],
            "restartPolicy": "Never",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "status": {"phase": "Pending"},
    }


def job_labels(job_name: str) -> dict[str, str]:
    """The labels the Job controller puts on its pods (both spellings, as Kubernetes 1.27+ does)."""
    return {
        "batch.kubernetes.io/job-name": job_name,
        "job-name": job_name,
        "batch.kubernetes.io/controller-uid": _uid("Job", job_name),
        "controller-uid": _uid("Job", job_name),
    }


def template(gpus: int = 0, container: str = "main") -> JSON:
    limits: dict[str, Any] = {"cpu": "8"}
    if gpus:
        limits["nvidia.com/gpu"] = gpus
    return {"spec": {"containers": [{"name": container, "image": "img", "resources": {"limits": limits}}]}}


def conditions(*pairs: tuple[str, str]) -> JSON:
    return {
        "conditions": [
            {"type": t, "status": s, "reason": t, "lastTransitionTime": "2025-01-01T00:00:00Z"} for t, s in pairs
        ]
    }


# --- Kubeflow training-operator v1 ---------------------------------------------------------------


def pytorchjob(
    name: str = "bert",
    *,
    workers: int = 3,
    master: bool = True,
    min_available: int | None = None,
    elastic_min: int | None = None,
    created: int | None = None,
) -> tuple[JSON, list[JSON]]:
    specs: JSON = {"Worker": {"replicas": workers, "restartPolicy": "OnFailure", "template": template(8, "pytorch")}}
    if master:
        specs["Master"] = {"replicas": 1, "restartPolicy": "OnFailure", "template": template(8, "pytorch")}
    spec: JSON = {"pytorchReplicaSpecs": specs, "runPolicy": {"cleanPodPolicy": "None"}}
    if min_available is not None:
        spec["runPolicy"]["schedulingPolicy"] = {"minAvailable": min_available}
    if elastic_min is not None:
        spec["elasticPolicy"] = {"minReplicas": elastic_min, "maxReplicas": workers, "rdzvBackend": "c10d"}
    cr = root("kubeflow.org/v1", "PyTorchJob", name, spec=spec, status=conditions(("Created", "True")))
    ref = owner_of(cr)
    roles = ([("master", 0)] if master else []) + [("worker", i) for i in range(workers)]
    pods = []
    for rtype, index in roles:
        labels = {
            "training.kubeflow.org/operator-name": "pytorchjob-controller",
            "training.kubeflow.org/job-name": name,
            "training.kubeflow.org/replica-type": rtype,
            "training.kubeflow.org/replica-index": str(index),
        }
        if rtype == "master":
            labels["training.kubeflow.org/job-role"] = "master"
        pods.append(pod(f"{name}-{rtype}-{index}", labels=labels, owner_ref=ref, gpus=8, container="pytorch"))
    return cr, pods[:created] if created is not None else pods


# --- mpi-operator v2 --------------------------------------------------------------------------------


def mpijob(name: str = "allreduce", *, workers: int = 4, wait_for_workers: bool = False) -> tuple[JSON, list[JSON]]:
    spec: JSON = {
        "slotsPerWorker": 8,
        "runPolicy": {"cleanPodPolicy": "Running"},
        "mpiReplicaSpecs": {
            "Launcher": {"replicas": 1, "template": template(0, "launcher")},
            "Worker": {"replicas": workers, "template": template(8, "worker")},
        },
    }
    if wait_for_workers:
        spec["launcherCreationPolicy"] = "WaitForWorkersReady"
    cr = root(
        "kubeflow.org/v2beta1", "MPIJob", name, spec=spec, status=conditions(("Created", "True"), ("Running", "True"))
    )
    base = {"training.kubeflow.org/operator-name": "mpi-operator", "training.kubeflow.org/job-name": name}
    job_name = f"{name}-launcher"
    launcher_labels = {**base, "training.kubeflow.org/job-role": "launcher", **job_labels(job_name)}
    pods = (
        []
        if wait_for_workers
        else [pod(f"{job_name}-x7k2p", labels=launcher_labels, owner_ref=owner("batch/v1", "Job", job_name))]
    )
    ref = owner_of(cr)
    for i in range(workers):
        labels = {**base, "training.kubeflow.org/job-role": "worker", "training.kubeflow.org/replica-index": str(i)}
        pods.append(pod(f"{name}-worker-{i}", labels=labels, owner_ref=ref, gpus=8, container="worker"))
    return cr, pods


# --- JobSet -------------------------------------------------------------------------------------------


def jobset(
    name: str = "llm",
    *,
    rjobs: tuple[tuple[str, int, int], ...] = (("driver", 1, 1), ("workers", 2, 4)),
    in_order: bool = False,
    depends_on: dict[str, str] | None = None,
    created: set[str] | None = None,
) -> tuple[JSON, list[JSON]]:
    """rjobs: (replicatedJob name, replicas, parallelism); created: the replicatedJobs with pods so far."""
    replicated = []
    for rj, replicas, parallelism in rjobs:
        job_spec = {
            "parallelism": parallelism,
            "completions": parallelism,
            "completionMode": "Indexed",
            "template": template(8 if rj != "driver" else 0),
        }
        entry: JSON = {"name": rj, "replicas": replicas, "template": {"spec": job_spec}}
        if depends_on and rj in depends_on:
            entry["dependsOn"] = [{"name": depends_on[rj], "status": "Ready"}]
        replicated.append(entry)
    spec: JSON = {"replicatedJobs": replicated, "failurePolicy": {"maxRestarts": 3}}
    if in_order:
        spec["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
    cr = root(
        "jobset.x-k8s.io/v1alpha2",
        "JobSet",
        name,
        spec=spec,
        status={"replicatedJobsStatus": [{"name": rj, "active": r, "ready": 0} for rj, r, _ in rjobs]},
    )
    total = sum(r for _, r, _ in rjobs)
    pods, global_index = [], 0
    for rj, replicas, parallelism in rjobs:
        for j in range(replicas):
            job_name = f"{name}-{rj}-{j}"
            for k in range(parallelism):
                if created is None or rj in created:
                    pods.append(_jobset_pod(name, rj, replicas, j, k, job_name, total, global_index))
            global_index += 1
    return cr, pods


def _jobset_pod(name: str, rj: str, replicas: int, j: int, k: int, job_name: str, total: int, gi: int) -> JSON:
    js = {
        "jobset.sigs.k8s.io/jobset-name": name,
        "jobset.sigs.k8s.io/replicatedjob-name": rj,
        "jobset.sigs.k8s.io/replicatedjob-replicas": str(replicas),
        "jobset.sigs.k8s.io/job-index": str(j),
        "jobset.sigs.k8s.io/job-global-index": str(gi),
        "jobset.sigs.k8s.io/global-replicas": str(total),
        "jobset.sigs.k8s.io/job-key": hashlib.sha1(f"{NS}/{job_name}".encode()).hexdigest(),
        "jobset.sigs.k8s.io/restart-attempt": "0",
    }
    job = {**job_labels(job_name), "batch.kubernetes.io/job-completion-index": str(k)}
    annotations = {**js, "batch.kubernetes.io/job-completion-index": str(k)}
    return pod(
        f"{job_name}-{k}-{_uid(job_name, str(k))[:5]}",
        labels={**js, **job},
        annotations=annotations,
        owner_ref=owner("batch/v1", "Job", job_name),
        gpus=0 if rj == "driver" else 8,
    )


# --- LeaderWorkerSet ------------------------------------------------------------------------------


def leaderworkerset(
    name: str = "vllm", *, replicas: int = 3, size: int = 4, workers_created: bool = True
) -> tuple[JSON, list[JSON]]:
    cr = root(
        "leaderworkerset.x-k8s.io/v1",
        "LeaderWorkerSet",
        name,
        spec={
            "replicas": replicas,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": size,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": template(8, "vllm-leader"),
                "workerTemplate": template(8, "vllm-worker"),
            },
        },
        status=conditions(("Progressing", "True")),
    )
    members = size if workers_created else 1  # leaders come first: they own the worker StatefulSets
    return cr, [_lws_pod(name, g, w, size) for g in range(replicas) for w in range(members)]


def _lws_pod(name: str, group: int, worker: int, size: int) -> JSON:
    """Worker 0 is the leader (owned by the LWS's StatefulSet); the others belong to the
    leader's own StatefulSet and carry its name."""
    leader = f"{name}-{group}"
    pod_name = leader if worker == 0 else f"{leader}-{worker}"
    role = "vllm-leader" if worker == 0 else "vllm-worker"
    annotations = {"leaderworkerset.sigs.k8s.io/size": str(size)}
    if worker:
        annotations["leaderworkerset.sigs.k8s.io/leader-name"] = leader
    return pod(
        pod_name,
        owner_ref=owner("apps/v1", "StatefulSet", name if worker == 0 else leader),
        gpus=8,
        container=role,
        labels={
            "leaderworkerset.sigs.k8s.io/name": name,
            "leaderworkerset.sigs.k8s.io/template-revision-hash": "5c5fcdfb44",
            "leaderworkerset.sigs.k8s.io/worker-index": str(worker),
            "leaderworkerset.sigs.k8s.io/group-index": str(group),
            "leaderworkerset.sigs.k8s.io/group-key": hashlib.sha1(f"{NS}/{leader}".encode()).hexdigest(),
            "apps.kubernetes.io/pod-index": str(group if worker == 0 else worker),
            "statefulset.kubernetes.io/pod-name": pod_name,
        },
        annotations=annotations,
    )


# --- KServe ---------------------------------------------------------------------------------------


def inferenceservice(
    name: str = "llama", *, predictor_min: int | None = 2, transformer: bool = True
) -> tuple[JSON, list[JSON]]:
    predictor: JSON = {
        "model": {"modelFormat": {"name": "huggingface"}, "resources": {"limits": {"nvidia.com/gpu": 1}}},
        "maxReplicas": 4,
    }
    if predictor_min is not None:
        predictor["minReplicas"] = predictor_min
    spec: JSON = {"predictor": predictor}
    if transformer:
        spec["transformer"] = {"containers": [{"name": "kserve-container", "image": "tok:1"}], "minReplicas": 1}
    cr = root(
        "serving.kserve.io/v1beta1",
        "InferenceService",
        name,
        annotations={"serving.kserve.io/deploymentMode": "RawDeployment"},
        spec=spec,
        status=conditions(("PredictorReady", "True"), ("Ready", "True")),
    )
    pods = []
    components = [("predictor", predictor_min or 1)] + ([("transformer", 1)] if transformer else [])
    for component, count in components:
        deployment = f"{name}-{component}"
        rs = f"{deployment}-7d9f8b6c5d"
        for i in range(count):
            labels = {
                "serving.kserve.io/inferenceservice": name,
                "component": component,
                "app": f"isvc.{deployment}",
                "pod-template-hash": "7d9f8b6c5d",
            }
            pods.append(
                pod(
                    f"{rs}-{_uid(rs, str(i))[:5]}",
                    labels=labels,
                    container="kserve-container",
                    owner_ref=owner("apps/v1", "ReplicaSet", rs),
                    gpus=1 if component == "predictor" else 0,
                )
            )
    return cr, pods


# --- Kubeflow Trainer v2 ------------------------------------------------------------------------


def trainjob(
    name: str = "qwen-sft", *, num_nodes: int | None = 4, nodes_created: int | None = None, initializers: bool = True
) -> tuple[JSON, list[JSON]]:
    trainer: JSON = {
        "image": "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
        "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}},
    }
    if num_nodes is not None:
        trainer["numNodes"] = num_nodes
    cr = root(
        "trainer.kubeflow.org/v1alpha1",
        "TrainJob",
        name,
        spec={
            "runtimeRef": {
                "name": "torch-distributed",
                "apiGroup": "trainer.kubeflow.org",
                "kind": "ClusterTrainingRuntime",
            },
            "initializer": {"dataset": {"storageUri": "hf://tatsu-lab/alpaca"}},
            "trainer": trainer,
        },
        status={"jobsStatus": [{"name": "node", "active": 1, "ready": 0, "succeeded": 0, "failed": 0, "suspended": 0}]},
    )
    rjobs = [("dataset-initializer", 1)] if initializers else []
    rjobs.append(("node", num_nodes or 1))
    pods = []
    for rj, parallelism in rjobs:
        made = parallelism if rj != "node" or nodes_created is None else nodes_created
        for k in range(made):
            pods.append(_jobset_pod(name, rj, 1, 0, k, f"{name}-{rj}-0", len(rjobs), 0))
    return cr, pods


# --- KubeRay -----------------------------------------------------------------------------------------


def raycluster(
    name: str = "ray",
    *,
    groups: tuple[tuple[str, int, int, int], ...] = (("cpu", 2, 1, 1), ("gpu", 2, 2, 2)),
    autoscaling: bool = False,
) -> tuple[JSON, list[JSON]]:
    """groups: (groupName, replicas, minReplicas, numOfHosts)."""
    worker_specs = [
        {
            "groupName": g,
            "replicas": r,
            "minReplicas": m,
            "maxReplicas": 10,
            "numOfHosts": h,
            "rayStartParams": {},
            "template": template(8 if g == "gpu" else 0, "ray-worker"),
        }
        for g, r, m, h in groups
    ]
    cr = root(
        "ray.io/v1",
        "RayCluster",
        name,
        spec={
            "rayVersion": "2.41.0",
            "enableInTreeAutoscaling": autoscaling,
            "headGroupSpec": {"rayStartParams": {}, "template": template(0, "ray-head")},
            "workerGroupSpecs": worker_specs,
        },
        status={"state": "ready"},
    )
    ref = owner_of(cr)
    common = {
        "ray.io/cluster": name,
        "ray.io/is-ray-node": "yes",
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
    }
    pods = [
        pod(
            f"{name}-head",
            owner_ref=ref,
            container="ray-head",
            labels={
                **common,
                "ray.io/node-type": "head",
                "ray.io/group": "headgroup",
                "ray.io/identifier": f"{name}-head",
            },
        )
    ]
    for g, r, _m, h in groups:
        for i in range(r * h):
            pods.append(
                pod(
                    f"{name}-{g}-worker-{_uid(g, str(i))[:5]}",
                    owner_ref=ref,
                    container="ray-worker",
                    gpus=8 if g == "gpu" else 0,
                    labels={
                        **common,
                        "ray.io/node-type": "worker",
                        "ray.io/group": g,
                        "ray.io/identifier": f"{name}-worker",
                    },
                )
            )
    return cr, pods


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2)
