"""Where each policy field lives in a pod: read for the rules, written for the defaults."""

from __future__ import annotations

import json
from typing import Any

import pytest

from extender.policy import fields


def template(
    *, annotations: dict[str, str] | None = None, containers: list[dict[str, Any]] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"annotations": annotations or {}, "labels": {"app": "train"}},
        "spec": {"containers": containers or [{"name": "main", "image": "x"}], **spec},
    }


def container(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": "c", "image": "x", "resources": {"requests": requests or {}, "limits": limits or {}}}


def test_whole_gpus_cpu_and_memory_are_summed_over_containers() -> None:
    pod = template(
        containers=[
            container({"cpu": "500m", "memory": "1Gi"}, {"nvidia.com/gpu": "2", "cpu": "1"}),
            container({"cpu": "1500m", "memory": "512Mi", "example.com/nic": "1"}, {"nvidia.com/gpu": "2"}),
        ]
    )
    values, other = fields.read_pod(pod)
    compute = values["compute"]
    assert compute["gpuDeviceRequest"] == 4 and other  # nvidia.com/gpu: GPU defaults are not written
    assert compute["cpuCoreRequest"] == 2 and compute["cpuCoreLimit"] == 1
    assert compute["cpuMemoryRequest"] == str(1024**3 + 512 * 1024**2)
    assert compute["extendedResources"] == [{"resource": "example.com/nic", "quantity": "1"}]
    assert values["labels"] == [{"name": "app", "value": "train"}]


def test_policy_annotations_kai_and_hami_spellings_read_as_policy_fields() -> None:
    values, other = fields.read_pod(
        template(annotations={"phalanx.io/gpuPortionRequest": "0.5", "phalanx.io/gpuRequestType": "portion"})
    )
    assert values["compute"]["gpuPortionRequest"] == 0.5 and not other
    values, other = fields.read_pod(template(annotations={"gpu-fraction": "0.25", "gpu-memory": "2048"}))
    assert values["compute"]["gpuPortionRequest"] == 0.25 and values["compute"]["gpuMemoryRequest"] == "2048Mi"
    assert other
    values, _ = fields.read_pod(
        template(containers=[container(limits={"nvidia.com/gpumem": "4096", "nvidia.com/gpu": "1"})])
    )
    assert values["compute"]["gpuMemoryRequest"] == "4096Mi" and values["compute"]["gpuDeviceRequest"] == 1
    values, _ = fields.read_pod(template(containers=[container(limits={"nvidia.com/mig-1g.10gb": "1"})]))
    assert values["compute"]["migProfile"] == "1g.10gb"


def test_scheduling_fields_are_read_from_their_pod_fields() -> None:
    pod = template(
        annotations={
            "phalanx.io/node-pools": '["a100", "h100"]',
            "kai.scheduler/topology-required-placement": "topology.phalanx.io/rack",
            "phalanx.io/terminate-after-preemption": "true",
        },
        priorityClassName="train",
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 30}],
    )
    values, _ = fields.read_pod(pod)
    assert values["nodePools"] == ["a100", "h100"]
    assert values["podAffinitySchedulingRule"] == "required"
    assert values["podAffinityTopology"] == "topology.phalanx.io/rack"
    assert values["terminateAfterPreemption"] is True
    assert values["priorityClass"] == "train"
    assert values["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule", "seconds": 30}]
    # What Kubernetes adds itself is not the submitter's: not judged.
    system = template(
        annotations={"kubectl.kubernetes.io/last-applied-configuration": "{}"},
        tolerations=[
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
        ],
    )
    system["metadata"]["labels"] = {"batch.kubernetes.io/job-name": "j"}
    values, _ = fields.read_pod(system)
    assert "tolerations" not in values and "annotations" not in values and "labels" not in values
    # Malformed annotations reach the rules as they are (the rules then report their type).
    values, _ = fields.read_pod(template(annotations={"phalanx.io/node-pools": "a100,h100"}))
    assert values["nodePools"] == "a100,h100"


def test_defaults_are_written_where_the_table_says_and_nothing_else_changes() -> None:
    pod = template(containers=[container({"cpu": "1"})], tolerations=[{"key": "mine", "operator": "Exists"}])
    values = {
        "compute": {
            "cpuCoreRequest": 1,
            "cpuMemoryRequest": "2Gi",
            "gpuDeviceRequest": 1,
            "extendedResources": [{"resource": "example.com/nic", "quantity": "2"}],
        },
        "nodePools": ["a100"],
        "priorityClass": "train",
        "tolerations": [
            {"key": "mine", "operator": "Exists"},
            {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
        ],
        "annotations": [{"name": "team", "value": "research"}],
    }
    defaulted = {
        "compute.cpuMemoryRequest",
        "compute.gpuDeviceRequest",
        "compute.extendedResources[example.com/nic]",
        "nodePools",
        "priorityClass",
        "tolerations[gpu]",
        "annotations[team]",
    }
    out = fields.apply_pod_defaults(pod, values, defaulted, gpu_in_other_spelling=False, priority=(1000, "Never"))
    assert out is not None
    main = out["spec"]["containers"][0]["resources"]
    assert main["requests"] == {"cpu": "1", "memory": "2Gi", "example.com/nic": "2"}
    assert main["limits"] == {"example.com/nic": "2"}
    annotations = out["metadata"]["annotations"]
    assert annotations["phalanx.io/gpuDeviceRequest"] == "1" and annotations["team"] == "research"
    assert json.loads(annotations["phalanx.io/node-pools"]) == ["a100"]
    assert out["spec"]["priorityClassName"] == "train" and out["spec"]["priority"] == 1000
    assert out["spec"]["preemptionPolicy"] == "Never"
    assert out["spec"]["tolerations"] == [
        {"key": "mine", "operator": "Exists"},
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert pod["spec"]["tolerations"] == [{"key": "mine", "operator": "Exists"}]  # the input is not changed
    # A pod asking for GPUs in another spelling gets no phalanx.io GPU annotation.
    out = fields.apply_pod_defaults(pod, values, {"compute.gpuDeviceRequest"}, gpu_in_other_spelling=True)
    assert out is None
    assert fields.apply_pod_defaults(pod, values, set(), gpu_in_other_spelling=False) is None


def test_backoff_limit_lives_where_each_workload_kind_keeps_it() -> None:
    job = {"spec": {"runPolicy": {"backoffLimit": 3}}}
    assert fields.read_workload(job, "kubeflow.org", "PyTorchJob") == {"backoffLimit": 3}
    assert fields.read_workload({"spec": {}}, "kubeflow.org", "PyTorchJob") == {}
    assert fields.read_workload(job, "example.com", "Widget") == {}
    ops = fields.apply_workload_defaults(
        {"spec": {}}, "kubeflow.org", "PyTorchJob", {"backoffLimit": 5}, {"backoffLimit"}
    )
    assert ops == [
        {"op": "add", "path": "/spec/runPolicy", "value": {}},
        {"op": "add", "path": "/spec/runPolicy/backoffLimit", "value": 5},
    ]
    assert fields.pointer(["spec", "a/b", "c~d", 0]) == "/spec/a~1b/c~0d/0"


@pytest.mark.parametrize(
    "template",
    [
        {},
        {"metadata": 5, "spec": []},
        {"metadata": {"annotations": ["a"], "labels": None}, "spec": {"containers": "x", "tolerations": 5}},
        {"spec": {"containers": [5, {"resources": []}, {"resources": {"requests": "1"}}]}},
        {"spec": {"containers": [{"resources": {"requests": {"cpu": "lots", "memory": None}}}]}},
        {"metadata": {"annotations": {"phalanx.io/node-pools": 5, "gpu-fraction": "x"}}},
    ],
)
def test_malformed_templates_read_and_take_defaults_without_raising(template: dict[str, Any]) -> None:
    """Schemaless workload CRDs carry anything where a pod template should be."""
    values, _ = fields.read_pod(template)
    defaults = {"compute": {"cpuCoreRequest": 1, "extendedResources": [{"resource": "x/y", "quantity": "1"}]}}
    defaulted = {"compute.cpuCoreRequest", "compute.extendedResources[x/y]", "tolerations[a]", "annotations[b]"}
    defaults |= {"tolerations": [{"key": "a"}], "annotations": [{"name": "b", "value": "c"}]}
    fields.apply_pod_defaults(template, defaults, defaulted, gpu_in_other_spelling=False)
    assert isinstance(values, dict)
