"""Admission reviews as the API server sends them: pods and PyTorchJobs (through the shipped
Resource Interface's template paths), defaults as JSON patches, violations as one message per
rule; the policy store keeping the last good version of a policy; the webhook configurations."""

from __future__ import annotations

import base64
import json
from typing import Any

import orjson

from extender.policy.priorities import Index, PriorityClass
from extender.policy.registration import Endpoint, configurations, namespace_selector
from extender.policy.store import PolicyStore
from extender.policy.webhook import Admission
from extender.ri.model import GVK
from extender.ri.registry import Registry, load_defaults

POLICY = {
    "scope": {"namespace": "team-a"},
    "defaults": {"nodePools": ["a100"], "compute": {"cpuMemoryRequest": "1Gi"}},
    "rules": {"compute": {"gpuDeviceRequest": {"max": 8}, "cpuCoreRequest": {"required": True}}},
}


def policy(name: str, spec: dict[str, Any], version: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version, "uid": f"uid-{name}"}, "spec": spec}


def admission(*specs: dict[str, Any], reports: list[tuple[str, str]] | None = None) -> Admission:
    store = PolicyStore(
        report=lambda obj, reason, message: (reports if reports is not None else []).append((reason, message))
    )
    store.replace([policy(f"p{i}", spec) for i, spec in enumerate(specs)])
    return Admission(store, Registry(load_defaults()), queue_of=lambda ns, labels: labels.get("phalanx.io/queue", ""))


def pod(*, cpu: str | None = "1", gpus: int = 0, namespace: str = "team-a") -> dict[str, Any]:
    requests = {"cpu": cpu} if cpu else {}
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    container = {"name": "main", "image": "x", "resources": {"requests": requests, "limits": limits}}
    return {"metadata": {"name": "p", "namespace": namespace}, "spec": {"containers": [container]}}


def review(
    adm: Admission, obj: dict[str, Any], kind: tuple[str, str, str], *, mutate: bool, old: dict[str, Any] | None = None
) -> dict[str, Any]:
    group, version, name = kind
    request = {
        "uid": "u1",
        "kind": {"group": group, "version": version, "kind": name},
        "namespace": obj["metadata"].get("namespace"),
        "operation": "CREATE" if old is None else "UPDATE",
        "object": obj,
        **({"oldObject": old} if old is not None else {}),
    }
    status, body = (adm.mutate if mutate else adm.validate)(orjson.dumps({"request": request}))
    assert status == 200 and body["response"]["uid"] == "u1"
    response: dict[str, Any] = body["response"]
    return response


def patched(obj: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """The object after the response's JSON patch, applied as RFC 6902 says: `replace` needs the
    member to exist, `add` its parent (the API server refuses the patch otherwise)."""
    out = json.loads(json.dumps(obj))
    for op in json.loads(base64.b64decode(response["patch"])):
        assert op["op"] in ("add", "replace"), op
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].strip("/").split("/")]
        target = out
        for part in parts[:-1]:
            target = target[int(part)] if isinstance(target, list) else target[part]  # KeyError: no parent
        assert isinstance(target, dict), op
        if op["op"] == "replace":
            assert parts[-1] in target, f"replace of a missing member: {op['path']}"
        target[parts[-1]] = op["value"]
    return out


POD = ("", "v1", "Pod")
PYTORCHJOB = ("kubeflow.org", "v1", "PyTorchJob")


def test_a_pod_gets_its_defaults_and_a_violating_one_is_refused_naming_field_rule_and_limit() -> None:
    adm = admission(POLICY)
    response = review(adm, pod(), POD, mutate=True)
    assert response["allowed"] and response["patchType"] == "JSONPatch"
    after = patched(pod(), response)
    assert json.loads(after["metadata"]["annotations"]["phalanx.io/node-pools"]) == ["a100"]
    assert after["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}
    assert review(adm, after, POD, mutate=False) == {"allowed": True, "uid": "u1"}
    refused = review(adm, pod(gpus=16, cpu=None), POD, mutate=False)
    assert not refused["allowed"] and refused["status"]["code"] == 403
    message = refused["status"]["message"]
    assert "compute.gpuDeviceRequest" in message and "max 8" in message
    assert "compute.cpuCoreRequest" in message and "required" in message
    # The mutating webhook never refuses: the validating one sees the object after every mutation.
    assert review(adm, pod(gpus=16), POD, mutate=True)["allowed"]


def test_outside_the_scope_and_without_policies_nothing_is_looked_at() -> None:
    adm = admission(POLICY)
    assert review(adm, pod(gpus=16, namespace="team-b"), POD, mutate=False) == {"allowed": True, "uid": "u1"}
    assert review(admission(), pod(gpus=16), POD, mutate=True) == {"allowed": True, "uid": "u1"}


def test_fields_no_policy_governs_are_not_judged() -> None:
    adm = admission({"rules": {"compute": {"gpuDeviceRequest": {"max": 8}}}})
    obj = pod()
    obj["spec"]["tolerations"] = [{"key": "a", "effect": "NoSchedule"}, {"key": "a", "effect": "NoExecute"}]
    obj["metadata"]["annotations"] = {"phalanx.io/node-pools": "not json"}
    assert review(adm, obj, POD, mutate=False)["allowed"]


def pytorchjob(worker_gpus: int) -> dict[str, Any]:
    def template(gpus: int) -> dict[str, Any]:
        resources = {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": str(gpus)}}
        return {"spec": {"containers": [{"name": "pytorch", "image": "x", "resources": resources}]}}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "job", "namespace": "team-a"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": template(1)},
                "Worker": {"replicas": 4, "template": template(worker_gpus)},
            }
        },
    }


def test_a_pytorchjob_is_checked_and_defaulted_through_its_templates() -> None:
    adm = admission({**POLICY, "defaults": {**POLICY["defaults"], "backoffLimit": 3}})
    refused = review(adm, pytorchjob(16), PYTORCHJOB, mutate=False)
    message = refused["status"]["message"]
    assert not refused["allowed"] and "spec.pytorchReplicaSpecs.Worker.template: compute.gpuDeviceRequest" in message
    assert "Master" not in message
    response = review(adm, pytorchjob(8), PYTORCHJOB, mutate=True)
    after = patched(pytorchjob(8), response)
    for role in ("Master", "Worker"):
        template = after["spec"]["pytorchReplicaSpecs"][role]["template"]
        assert json.loads(template["metadata"]["annotations"]["phalanx.io/node-pools"]) == ["a100"]
        assert template["spec"]["containers"][0]["resources"]["requests"]["memory"] == "1Gi"
    assert after["spec"]["runPolicy"]["backoffLimit"] == 3
    # A kind without a Resource Interface is not the webhook's.
    assert review(adm, pytorchjob(16), ("example.com", "v1", "Widget"), mutate=False)["allowed"]


def test_queue_scoped_policies_follow_the_queue_label() -> None:
    adm = admission({"scope": {"queue": "research"}, "rules": {"compute": {"gpuDeviceRequest": {"max": 2}}}})
    obj = pod(gpus=4)
    assert review(adm, obj, POD, mutate=False)["allowed"]
    obj["metadata"]["labels"] = {"phalanx.io/queue": "research"}
    assert not review(adm, obj, POD, mutate=False)["allowed"]


def test_an_invalid_policy_update_is_reported_once_and_the_last_good_version_stays() -> None:
    reports: list[tuple[str, str]] = []
    adm = admission(POLICY, reports=reports)
    broken = {**POLICY, "rules": {"compute": {"gpuDeviceRequest": {"max": "eight"}}}}
    adm.store.event("MODIFIED", policy("p0", broken, version="2"))
    adm.store.event("MODIFIED", policy("p0", broken, version="2"))  # a resync: not reported again
    assert len(reports) == 1 and reports[0][0] == "InvalidWorkloadPolicy"
    assert "spec.rules.compute.gpuDeviceRequest.max" in reports[0][1] and "previous version stays" in reports[0][1]
    assert not review(adm, pod(gpus=16), POD, mutate=False)["allowed"]  # still max 8
    adm.store.event("DELETED", policy("p0", POLICY))
    assert review(adm, pod(gpus=16), POD, mutate=False)["allowed"]


def test_a_malformed_review_is_a_400_and_an_internal_fault_an_answer_not_a_crash() -> None:
    adm = admission(POLICY)
    assert adm.validate(b"not json")[0] == 400
    assert adm.validate(b'{"request": {}}')[0] == 400
    request = {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "object": {"metadata": 5, "spec": []}}
    status, body = adm.validate(orjson.dumps({"request": request}))
    assert status == 200 and body["response"]["uid"] == "u"


def test_the_webhook_configurations_cover_pods_jobs_and_workload_kinds_and_fail_closed() -> None:
    mutating, validating = configurations(
        Endpoint(service_namespace="phalanx-system", service_name="phalanx-webhook"),
        b"CA",
        [(GVK("kubeflow.org", "v1", "PyTorchJob"), "pytorchjobs")],
        "phalanx-system",
    )
    hook = validating["webhooks"][0]
    assert hook["failurePolicy"] == "Fail" and hook["timeoutSeconds"] == 5 and hook["sideEffects"] == "None"
    assert hook["clientConfig"]["service"] == {
        "namespace": "phalanx-system",
        "name": "phalanx-webhook",
        "port": 443,
        "path": "/validate",
    }
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == b"CA"
    assert [r["resources"] for r in hook["rules"]] == [["pods"], ["jobs"], ["pytorchjobs"]]
    excluded = hook["namespaceSelector"]["matchExpressions"][0]["values"]
    assert {"kube-system", "phalanx-system"} <= set(excluded)
    assert mutating["webhooks"][0]["clientConfig"]["service"]["path"] == "/mutate"


def test_an_update_is_never_defaulted_and_only_what_it_changes_is_judged() -> None:
    adm = admission({**POLICY, "defaults": {"nodePools": ["a100"]}})
    admitted_before = pytorchjob(16)  # admitted before the policy existed
    relabelled = json.loads(json.dumps(admitted_before))
    relabelled["metadata"]["labels"] = {"team": "x"}
    assert review(adm, relabelled, PYTORCHJOB, mutate=True, old=admitted_before) == {"allowed": True, "uid": "u1"}
    assert review(adm, relabelled, PYTORCHJOB, mutate=False, old=admitted_before)["allowed"]
    grown = json.loads(json.dumps(admitted_before))
    grown["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"]["limits"] = {
        "nvidia.com/gpu": "12"
    }
    refused = review(adm, grown, PYTORCHJOB, mutate=False, old=admitted_before)
    assert not refused["allowed"] and "Master" in refused["status"]["message"]
    assert "Worker" not in refused["status"]["message"]  # unchanged: not judged again


def test_until_the_policies_are_listed_admission_refuses_rather_than_lets_through() -> None:
    adm = admission(POLICY)
    adm.ready = lambda: False
    refused = review(adm, pod(), POD, mutate=True)
    assert not refused["allowed"] and refused["status"]["code"] == 503


def test_a_priority_class_default_comes_with_its_value_and_the_global_default_counts_as_none() -> None:
    adm = admission({"scope": {"namespace": "team-a"}, "defaults": {"priorityClass": "train"}})
    classes = {"train": PriorityClass(1000, "Never"), "normal": PriorityClass(0)}
    adm.priorities = lambda: Index(classes, global_default="normal")
    obj = pod()
    obj["spec"] |= {"priorityClassName": "normal", "priority": 0}  # what the Priority admission wrote
    after = patched(obj, review(adm, obj, POD, mutate=True))
    assert after["spec"]["priorityClassName"] == "train" and after["spec"]["priority"] == 1000
    assert after["spec"]["preemptionPolicy"] == "Never"
    adm = admission({"scope": {"namespace": "team-a"}, "defaults": {"priorityClass": "gone", "nodePools": ["a"]}})
    adm.priorities = lambda: Index(classes)
    response = review(adm, pod(), POD, mutate=True)
    assert response["allowed"] and "'gone' is not a PriorityClass" in response["warnings"][0]
    after = patched(pod(), response)
    assert "priorityClassName" not in after["spec"] and "phalanx.io/node-pools" in after["metadata"]["annotations"]


def test_the_webhooks_cover_only_the_namespaces_policies_cover() -> None:
    store = PolicyStore()
    assert store.namespaces() == frozenset()
    assert namespace_selector(store.namespaces(), "phalanx-system") == {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "DoesNotExist"}]
    }
    store.replace(
        [policy("a", {"scope": {"namespace": "team-a"}}), policy("b", {"scope": {"namespace": "kube-system"}})]
    )
    expressions = namespace_selector(store.namespaces(), "phalanx-system")["matchExpressions"]
    assert expressions[0] == {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]}
    store.event("ADDED", policy("c", {"scope": {"queue": "research"}}))
    assert store.namespaces() is None  # a queue's workloads may be anywhere


def test_a_policy_with_a_node_pool_list_the_scheduler_cannot_read_is_invalid() -> None:
    reports: list[tuple[str, str]] = []
    adm = admission({"defaults": {"nodePools": ["gpu in ("]}}, reports=reports)
    assert adm.store.names() == [] and "spec.defaults.nodePools" in reports[0][1]
