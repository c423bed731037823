"""Evaluation semantics on the spec's own examples: grouping, defaults, filters, instances, status, reasons."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from benchmarks import ri_samples as samples
from extender.ri import (
    REASON_AMBIGUOUS_COMPONENT,
    REASON_NO_COMPONENT,
    REASON_NO_GANG_SCHEDULING,
    REASON_NO_POD_GROUP,
    REASON_NULL_KEY,
    STATUS_COMPLETED,
    STATUS_FAILED,
    STATUS_INITIALIZING,
    STATUS_PENDING,
    STATUS_RUNNING,
    Evaluation,
    ResourceInterface,
    Unassigned,
    parse,
)

STATUS = {"statusMappings": {"running": {"byConditions": [{"type": "Running", "status": "True"}]}}}
JOB_NAME = '.metadata.labels["training.kubeflow.org/job-name"]'
REPLICA_TYPE = '.metadata.labels["training.kubeflow.org/replica-type"]'


def pytorch_ri(root_name: str, members: list[dict[str, Any]]) -> ResourceInterface:
    def replica(name: str, spec: str) -> dict[str, Any]:
        return {
            "name": name,
            "ownerRef": root_name,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "specDefinition": {"podTemplateSpecPath": f".spec.pytorchReplicaSpecs.{spec}.template"},
            "scaleDefinition": {"replicasPath": f".spec.pytorchReplicaSpecs.{spec}.replicas // 1"},
            "podSelector": {"componentTypeSelector": {"keyPath": REPLICA_TYPE, "value": name}},
        }

    return parse(
        {
            "rootComponent": {
                "name": root_name,
                "kind": {"group": "kubeflow.org", "version": "v1", "kind": "PyTorchJob"},
                "statusDefinition": STATUS,
            },
            "childComponents": [replica("master", "Master"), replica("worker", "Worker")],
            "optimizationInstructions": {"gangScheduling": {"podGroups": [{"name": "job", "members": members}]}},
        }
    )


def shape(ev: Evaluation) -> list[tuple[str, int, int, tuple[str, ...]]]:
    return [(g.key, g.min_count, g.expected, g.members) for g in ev.gangs]


def test_grouping_examples_are_equivalent() -> None:
    """Spec "Grouping examples": members master+worker, or one member naming the root ("job"), same gangs."""
    per_component = pytorch_ri(
        "job",
        [
            {"componentName": "master", "groupByKeyPaths": [JOB_NAME]},
            {"componentName": "worker", "groupByKeyPaths": [JOB_NAME]},
        ],
    )
    via_root = pytorch_ri("job", [{"componentName": "job", "groupByKeyPaths": [JOB_NAME]}])
    cr, pods = samples.pytorchjob(workers=3)
    assert shape(per_component.evaluate(cr, pods)) == shape(via_root.evaluate(cr, pods))
    assert shape(via_root.evaluate(cr, pods))[0][:3] == ("job/bert", 4, 4)


DEFAULTS_RI = """
rootComponent:
  name: lws
  kind: {group: leaderworkerset.x-k8s.io, version: v1, kind: LeaderWorkerSet}
  statusDefinition: {statusMappings: {running: {byConditions: [{type: Available, status: "True"}]}}}
childComponents:
- name: group
  ownerRef: lws
  kind: {group: apps, version: v1, kind: StatefulSet}
  specDefinition: {podTemplateSpecPath: .spec.leaderWorkerTemplate.workerTemplate}
optimizationInstructions:
   gangScheduling:
     podGroups:
     - name: "group"
       members:
       - componentName: "group"
         groupByKeyPaths:
         - '.metadata.labels["leaderworkerset.sigs.k8s.io/name"]'
         - '.metadata.labels["leaderworkerset.sigs.k8s.io/group-index"] // "0"'
"""


def test_grouping_with_default_values() -> None:
    """Spec "Using default values": a pod without group-index lands in group 0."""
    ri = parse(DEFAULTS_RI)
    _, pods = samples.leaderworkerset(replicas=2, size=2)
    assert [ri.gang_key(p) for p in pods] == ["group/vllm/0", "group/vllm/0", "group/vllm/1", "group/vllm/1"]
    del pods[2]["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"]
    assert ri.gang_key(pods[2]) == "group/vllm/0"
    del pods[2]["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/name"]
    assert ri.gang_key(pods[2]) is None
    assert ri.classify(pods[2]).reason == REASON_NULL_KEY


def jobs_ri(filters: tuple[str, str], *, map_instances: bool = False) -> ResourceInterface:
    """A CRD with an array (or map) of jobs, all under one "job" component (the spec's filter example)."""
    ids = ".spec.jobs | to_entries[] | .key" if map_instances else ".spec.jobs[].name"
    return parse(
        {
            "rootComponent": {
                "name": "batch",
                "kind": {"group": "example.com", "version": "v1", "kind": "MultiJob"},
                "statusDefinition": STATUS,
            },
            "childComponents": [
                {
                    "name": "job",
                    "ownerRef": "batch",
                    "kind": {"group": "batch", "version": "v1", "kind": "Job"},
                    "instanceIdPath": ids,
                    "specDefinition": {"podTemplateSpecPath": ".spec.jobs[].template"},
                    "scaleDefinition": {"replicasPath": ".spec.jobs[].replicas"},
                    "podSelector": {"componentInstanceSelector": {"idPath": '.metadata.labels["example.com/job"]'}},
                }
            ],
            "optimizationInstructions": yaml.safe_load(
                f"""
  gangScheduling:
    podGroups:
    - name: "gpu-jobs"
      members:
      - componentName: "job"
        filters:
        - '{filters[0]}'
        groupByKeyPaths:
        - 'gpu'
    - name: "no-gpu-jobs"
      members:
      - componentName: "job"
        filters:
        - '{filters[1]}'
        groupByKeyPaths:
        - 'no-gpu'
"""
            ),
        }
    )


SPEC_FILTERS = (
    'any(.spec.jobs[].spec.containers[]; (.resources.limits["nvidia.com/gpu"] // 0) > 0)',
    'any(.spec.jobs[].spec.containers[]; (.resources.limits["nvidia.com/gpu"] // 0) == 0)',
)
POD_FILTERS = (
    'any(.spec.containers[]; (.resources.limits["nvidia.com/gpu"] // 0 | tonumber) > 0)',
    'all(.spec.containers[]; (.resources.limits["nvidia.com/gpu"] // 0 | tonumber) == 0)',
)


def multijob(
    jobs: list[tuple[str, int, int]], created: set[str], *, as_map: bool = False
) -> tuple[dict[str, Any], list]:
    """jobs: (name, replicas, gpus per pod)."""
    specs = [{"name": n, "replicas": r, "template": samples.template(g)} for n, r, g in jobs]
    cr = {
        "apiVersion": "example.com/v1",
        "kind": "MultiJob",
        "metadata": {"name": "mj", "namespace": samples.NS},
        "spec": {"jobs": {s["name"]: s for s in specs} if as_map else specs},
    }
    ref = samples.owner("example.com/v1", "MultiJob", "mj")
    pods = [
        samples.pod(f"mj-{n}-{i}", labels={"example.com/job": n}, owner_ref=ref, gpus=g)
        for n, r, g in jobs
        if n in created
        for i in range(r)
    ]
    return cr, pods


@pytest.mark.parametrize("as_map", [False, True], ids=["array of jobs", "map of jobs"])
def test_filters_by_gpu_demand_split_instances_into_pod_groups(as_map: bool) -> None:
    """Spec "Filters": GPU pods to gpu-jobs, the others to no-gpu-jobs, keys are literal words."""
    ri = jobs_ri(POD_FILTERS, map_instances=as_map)
    cr, pods = multijob([("train", 3, 8), ("eval", 2, 1), ("prep", 2, 0)], created={"train", "prep"}, as_map=as_map)
    ev = ri.evaluate(cr, pods)
    assert [(i.instance, i.replicas) for i in ev.instances] == [("train", 3), ("eval", 2), ("prep", 2)]
    # "eval" has no pods yet; its template's GPU demand sends it to the gpu gang.
    assert shape(ev) == [
        ("gpu-jobs/gpu", 5, 5, ("mj-train-0", "mj-train-1", "mj-train-2")),
        ("no-gpu-jobs/no-gpu", 2, 2, ("mj-prep-0", "mj-prep-1")),
    ]


def test_spec_filter_example_reads_the_cr_so_it_matches_no_pod() -> None:
    """The spec's filters address `.spec.jobs[]`, a CR path: on a pod they are null, so no pod group takes it."""
    ri = jobs_ri(SPEC_FILTERS)
    cr, pods = multijob([("train", 1, 8)], created={"train"})
    ev = ri.evaluate(cr, pods)
    assert ev.gangs == () and ev.unassigned == (Unassigned("mj-train-0", REASON_NO_POD_GROUP),)


def test_array_and_map_instance_ids_align_with_specs() -> None:
    for as_map in (False, True):
        cr, _ = multijob([("b", 1, 0), ("a", 4, 0)], created=set(), as_map=as_map)
        instances, problems = jobs_ri(POD_FILTERS, map_instances=as_map).instances(cr)
        assert [(i.instance, i.replicas, i.min_replicas) for i in instances] == [("b", 1, 1), ("a", 4, 4)]
        assert problems == []


def test_pod_with_unknown_instance_counts_as_seen() -> None:
    """A pod of an instance the CR does not list counts itself; "train" (no pods) joins by its template."""
    ri = jobs_ri(POD_FILTERS)
    cr, _ = multijob([("train", 2, 8)], created=set())
    stray = samples.pod("stray-0", labels={"example.com/job": "ghost"}, owner_ref=samples.owner("v1", "X", "x"), gpus=1)
    assert shape(ri.evaluate(cr, [stray])) == [("gpu-jobs/gpu", 3, 3, ("stray-0",))]


SPEC_STATUS = """
rootComponent:
  name: job
  kind: {group: example.com, version: v1, kind: Job}
  statusDefinition:
        conditionsDefinition:
          path: ".status.conditions"
          typeFieldName: "type"
          statusFieldName: "status"
        phaseDefinition:
          path: ".status.phase"
        statusMappings:
          initializing:
          - byConditions:
            - type: "Created"
              status: "True"
            - type: "Running"
              status: "False"
          - byPhase: Starting
          running:
          - byConditions:
            - type: "Running"
              status: "True"
            - type: "Succeeded"
              status: "False"
            - type: "Failed"
              status: "False"
          completed:
          - byConditions:
            - type: "Succeeded"
              status: "True"
          failed:
          - byConditions:
            - type: "Failed"
              status: "True"
            byPhase: Error
"""


@pytest.mark.parametrize(
    ("conds", "phase", "status"),
    [
        ((("Created", "True"), ("Running", "False")), None, STATUS_INITIALIZING),
        ((("Created", "True"),), None, STATUS_PENDING),
        ((), "Starting", STATUS_INITIALIZING),
        ((("Running", "True"), ("Succeeded", "False"), ("Failed", "False")), None, STATUS_RUNNING),
        ((("Running", "True"),), None, STATUS_PENDING),
        ((("Running", "True"), ("Succeeded", "True"), ("Failed", "False")), None, STATUS_COMPLETED),
        ((("Failed", "True"),), None, STATUS_PENDING),
        ((("Failed", "True"),), "Error", STATUS_FAILED),
    ],
    ids=[
        "created, not running",
        "AND: Running=False missing",
        "by phase",
        "running",
        "AND: absent conditions do not count as False",
        "completed wins over running",
        "conditions and phase: both must hold",
        "failed by conditions and phase",
    ],
)
def test_status_definition_from_the_spec(conds: tuple[tuple[str, str], ...], phase: str | None, status: str) -> None:
    obj: dict[str, Any] = {"status": samples.conditions(*conds)}
    if phase:
        obj["status"]["phase"] = phase
    assert parse(SPEC_STATUS).status(obj) == status


def test_minimal_ri_puts_pods_under_the_root_without_gangs() -> None:
    ri = parse(
        {
            "rootComponent": {
                "name": "m",
                "kind": {"group": "m.org", "version": "v1", "kind": "M"},
                "statusDefinition": STATUS,
            }
        }
    )
    pod = samples.pod("m-0", labels={}, owner_ref=samples.owner("m.org/v1", "M", "m"))
    assert ri.classify(pod).component == "m"
    ev = ri.evaluate({"status": samples.conditions(("Running", "True"))}, [pod])
    assert ev.gangs == () and ev.unassigned == (Unassigned("m-0", REASON_NO_GANG_SCHEDULING),)
    assert ev.status == STATUS_RUNNING


def test_unassigned_reasons() -> None:
    ri = pytorch_ri("pytorchjob", [{"componentName": "worker", "groupByKeyPaths": [JOB_NAME]}])
    cr, pods = samples.pytorchjob(workers=1)
    stranger = samples.pod("stranger", labels={}, owner_ref=samples.owner("v1", "X", "x"))
    ev = ri.evaluate(cr, [*pods, stranger, {"metadata": {}}])
    assert shape(ev) == [("job/bert", 1, 1, ("bert-worker-0",))]
    assert ev.unassigned == (
        Unassigned("bert-master-0", REASON_NO_POD_GROUP),
        Unassigned("stranger", REASON_NO_COMPONENT),
        Unassigned("", "the pod has no metadata.name"),
    )


def test_overlapping_selectors_leave_the_pod_unassigned_as_ambiguous() -> None:
    doc = yaml.safe_load(DEFAULTS_RI)
    doc["childComponents"][0]["podSelector"] = {"componentTypeSelector": {"keyPath": ".metadata.labels.a"}}
    second = {**doc["childComponents"][0], "name": "other", "kind": {"group": "batch", "version": "v1", "kind": "Job"}}
    second["podSelector"] = {"componentTypeSelector": {"keyPath": ".metadata.labels.b"}}
    doc["childComponents"].append(second)
    ri = parse(doc)
    both = samples.pod("p", labels={"a": "1", "b": "1"}, owner_ref=samples.owner("v1", "X", "x"))
    assert ri.classify(both).reason == REASON_AMBIGUOUS_COMPONENT


def test_one_component_split_over_keys_shares_its_count() -> None:
    """No instance ids: 2 LWS groups of 2 in one "group" component (replicas 4) → ceil(4/2) each."""
    doc = yaml.safe_load(DEFAULTS_RI)
    doc["childComponents"][0]["scaleDefinition"] = {"replicasPath": ".spec.replicas * .spec.leaderWorkerTemplate.size"}
    cr, pods = samples.leaderworkerset(replicas=2, size=2)
    assert [(k, m, e) for k, m, e, _ in shape(parse(doc).evaluate(cr, pods))] == [
        ("group/vllm/0", 2, 2),
        ("group/vllm/1", 2, 2),
    ]


def test_kserve_example_evaluates_verbatim() -> None:
    ri = parse(samples.kserve_example_text())
    cr, pods = samples.inferenceservice(predictor_min=2)
    ev = ri.evaluate(cr, pods)
    assert [(k, m, e, len(members)) for k, m, e, members in shape(ev)] == [("service/llama", 3, 3, 3)]
    cr["status"] = samples.conditions(
        ("PredictorReady", "True"), ("RoutesReady", "True"), ("LatestDeploymentReady", "True")
    )
    assert ri.status(cr) == STATUS_RUNNING


def test_filters_naming_status_see_the_pod_status() -> None:
    """Pods are cut down before jq sees them, but a field an expression names is kept."""
    doc = yaml.safe_load(DEFAULTS_RI)
    doc["optimizationInstructions"]["gangScheduling"]["podGroups"][0]["members"][0]["filters"] = [
        '.status.phase == "Pending"'
    ]
    ri = parse(doc)
    _, pods = samples.leaderworkerset(replicas=1, size=1)
    assert ri.gang_key(pods[0]) == "group/vllm/0"
    pods[0]["status"]["phase"] = "Running"
    assert ri.gang_key(pods[0]) is None


def test_min_member_path_overrides_and_is_capped_by_expected() -> None:
    ri = pytorch_ri("pytorchjob", [{"componentName": "pytorchjob", "groupByKeyPaths": [JOB_NAME]}])
    doc = ri.document()
    doc["optimizationInstructions"]["gangScheduling"]["podGroups"][0]["minMemberPath"] = ".spec.min"
    ri = parse(doc)
    cr, pods = samples.pytorchjob(workers=3)
    cr["spec"]["min"] = 2
    assert shape(ri.evaluate(cr, pods))[0][1:3] == (2, 4)
    cr["spec"]["min"] = 99
    assert shape(ri.evaluate(cr, pods))[0][1:3] == (4, 4)
