"""Resource Interface gangs on the real control plane: workload CRDs without a Phalanx Workload.

The CRDs of PyTorchJob, JobSet and LeaderWorkerSet are installed (definitions only: no operator
runs), then each test creates a CR, the child objects its controller would create (Jobs,
StatefulSets) and the pods with the owner references and labels the real controllers set
(benchmarks/ri_samples), and checks that kube-scheduler + Phalanx place each job as one
all-or-nothing gang of the right size. The last test registers a new workload type through the
Workload Types API and shows a previously unknown CRD's pods gang-scheduled with no restart.
"""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from benchmarks import ri_samples
from deploy.local.cluster import LocalCluster
from extender.app import Extender
from extender.config import CONFIGMAP_NAME
from extender.kube import RestKube
from tests.e2e.test_extender import start_extender, wait

pytestmark = pytest.mark.e2e

NS = "default"
SUITE = "e2e-ri"
CRDS = {
    ("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs"),
    ("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"),
    ("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", "leaderworkersets"),
    ("example.com", "v1", "Widget", "widgets"),
}
WIDGET_TYPE = """
name: Widget
group: example.com
resourceInterfaces:
- structureDefinition:
    rootComponent:
      name: widget
      kind: {group: example.com, version: v1, kind: Widget}
      specDefinition: {podTemplateSpecPath: .spec.template}
      scaleDefinition: {replicasPath: .spec.replicas}
      statusDefinition:
        statusMappings:
          running: [{byConditions: [{type: Ready, status: "True"}]}]
  optimizationInstructions:
    gangScheduling:
      podGroups:
      - name: all
        members:
        - componentName: widget
          groupByKeyPaths: ['.metadata.labels["example.com/widget"]']
"""


def crd(group: str, version: str, kind: str, plural: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster) -> RestKube:
    return RestKube.from_kubeconfig(str(cluster.kubeconfig_path))


@pytest.fixture(scope="module")
def extender(cluster: LocalCluster, kube: RestKube) -> Iterator[Extender]:
    for group, version, kind, plural in sorted(CRDS):
        r = kube.request(
            "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd(group, version, kind, plural)
        )
        assert r.status in (201, 409), r.body
    for group, version, _, plural in sorted(CRDS):
        wait(
            f"{plural}.{group} served",
            lambda g=group, v=version, p=plural: kube.request("GET", f"/apis/{g}/{v}/{p}").status == 200,
        )
    # Where the extender persists registered workload types (deploy/kubernetes creates it).
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "phalanx-system"}}
    assert kube.request("POST", "/api/v1/namespaces", body=namespace).status in (201, 409)
    ext = start_extender(kube)
    cluster.restart_scheduler(ext.server.url)
    yield ext
    cluster.restart_scheduler(None)
    ext.stop()
    r = kube.request("GET", f"/api/v1/namespaces/{NS}/pods", query={"labelSelector": f"suite={SUITE}"})
    for p in r.body["items"]:
        kube.request(
            "DELETE", f"/api/v1/namespaces/{NS}/pods/{p['metadata']['name']}", query={"gracePeriodSeconds": "0"}
        )
    kube.request("DELETE", f"/api/v1/namespaces/phalanx-system/configmaps/{CONFIGMAP_NAME}")


def call_extender(
    ext: Extender, method: str, path: str, body: bytes | None = None, token: str | None = None
) -> tuple[int, Any]:
    """One REST call; it carries the admin's token (the extender's own) unless `token` is given."""
    assert isinstance(ext.kube, RestKube)
    authorization = ext.kube.headers.get("Authorization", "") if token is None else f"Bearer {token}"
    headers = {"Authorization": authorization} if authorization else {}
    req = urllib.request.Request(ext.server.url + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def watching(ext: Extender, kind: str) -> bool:
    with ext.dynamic.lock:
        return any(g.kind == kind and r.listed.is_set() for g, r in ext.dynamic.running.items())


def create(kube: RestKube, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = kube.request("POST", path, body=body)
    assert r.status == 201, r.body
    return dict(r.body)


def create_pod(kube: RestKube, fixture_pod: dict[str, Any], owner: dict[str, Any]) -> None:
    """A controller-made pod from the fixtures, owned by a real object (real uid), small enough
    to share nodes with the other suites."""
    pod = copy.deepcopy(fixture_pod)
    meta = pod["metadata"]
    for key in ("uid", "managedFields"):
        meta.pop(key, None)
    meta["namespace"] = NS
    meta["labels"]["suite"] = SUITE
    meta["ownerReferences"] = [ref(owner)]
    pod.pop("status", None)
    pod["spec"]["tolerations"] = [{"operator": "Exists"}]
    for c in pod["spec"]["containers"]:
        c["resources"] = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "100m", "memory": "64Mi"}}
    create(kube, f"/api/v1/namespaces/{NS}/pods", pod)


def ref(obj: dict[str, Any]) -> dict[str, Any]:
    m = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": m["name"],
        "uid": m["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def cr_body(cr: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(cr)
    body["metadata"] = {"name": cr["metadata"]["name"], "namespace": NS}
    body.pop("status", None)
    return body


def gangs(ext: Extender, prefix: str) -> list[dict[str, Any]]:
    return [g for g in ext.gangs.describe() if g["key"].startswith(prefix)]


def events(kube: RestKube, kind: str, name: str, reason: str) -> list[str]:
    selector = f"involvedObject.kind={kind},involvedObject.name={name},reason={reason}"
    r = kube.request("GET", f"/api/v1/namespaces/{NS}/events", query={"fieldSelector": selector})
    return [e["message"] for e in r.body["items"]]


def bound(kube: RestKube, names: list[str]) -> bool:
    for n in names:
        p = kube.request("GET", f"/api/v1/namespaces/{NS}/pods/{n}").body
        if not p["spec"].get("nodeName"):
            return False
    return True


def unbound(kube: RestKube, names: list[str]) -> bool:
    return all(not kube.request("GET", f"/api/v1/namespaces/{NS}/pods/{n}").body["spec"].get("nodeName") for n in names)


def test_pytorchjob_is_one_gang_and_waits_for_all_its_members(extender: Extender, kube: RestKube) -> None:
    wait("PyTorchJob watched", lambda: watching(extender, "PyTorchJob"))
    cr, pods = ri_samples.pytorchjob("e2e-bert", workers=3)
    job = create(kube, f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs", cr_body(cr))
    names = [p["metadata"]["name"] for p in pods]
    for p in pods[:3]:
        create_pod(kube, p, job)
    key = f"ri:{NS}/e2e-bert/"
    waiting = wait(
        "gang waits for quorum",
        lambda: [g for g in gangs(extender, key) if "quorum 3/4" in g["pendingReason"]],
    )
    assert waiting[0]["minCount"] == 4 and unbound(kube, names[:3])
    create_pod(kube, pods[3], job)
    wait("all four bound", lambda: bound(kube, names))
    (gang,) = wait("the cache sees them bound", lambda: [g for g in gangs(extender, key) if g["bound"] == 4])
    assert gang["minCount"] == 4 and gang["source"] == "kubeflow.org/PyTorchJob"


def test_jobset_pods_through_jobs_form_one_gang(extender: Extender, kube: RestKube) -> None:
    wait("JobSet and Job watched", lambda: watching(extender, "JobSet") and watching(extender, "Job"))
    cr, pods = ri_samples.jobset("e2e-llm", rjobs=(("driver", 1, 1), ("workers", 2, 2)))
    jobset = create(kube, f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets", cr_body(cr))
    jobs: dict[str, dict[str, Any]] = {}
    for p in pods:
        name = p["metadata"]["labels"]["batch.kubernetes.io/job-name"]
        if name not in jobs:
            body = {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name, "namespace": NS, "ownerReferences": [ref(jobset)]},
                "spec": {
                    "suspend": True,
                    "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}},
                },
            }
            jobs[name] = create(kube, f"/apis/batch/v1/namespaces/{NS}/jobs", body)
    names = []
    for p in pods:
        create_pod(kube, p, jobs[p["metadata"]["labels"]["batch.kubernetes.io/job-name"]])
        names.append(p["metadata"]["name"])
    wait("JobSet pods bound", lambda: bound(kube, names))
    # KWOK completes pods owned by Jobs right after they start, so the gang is read back from
    # the Events Phalanx records on the JobSet itself.
    messages = wait("GangScheduled on the JobSet", lambda: events(kube, "JobSet", "e2e-llm", "GangScheduled"))
    assert any(m.startswith("bound 5 of 5 pending members") for m in messages), messages


def test_lws_with_three_replicas_gives_three_independent_gangs(extender: Extender, kube: RestKube) -> None:
    wait(
        "LWS and StatefulSet watched",
        lambda: watching(extender, "LeaderWorkerSet") and watching(extender, "StatefulSet"),
    )
    cr, pods = ri_samples.leaderworkerset("e2e-vllm", replicas=3, size=2)
    lws = create(kube, f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{NS}/leaderworkersets", cr_body(cr))

    def statefulset(name: str, owner: dict[str, Any]) -> dict[str, Any]:
        labels = {"app": name}
        body = {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": NS, "ownerReferences": [ref(owner)]},
            "spec": {
                "replicas": 0,
                "serviceName": name,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
            },
        }
        return create(kube, f"/apis/apps/v1/namespaces/{NS}/statefulsets", body)

    leader_sts = statefulset("e2e-vllm", lws)
    leaders = [p for p in pods if p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"]
    workers = [p for p in pods if p not in leaders]
    for p in leaders:
        create_pod(kube, p, leader_sts)
    for p in leaders:
        leader = kube.request("GET", f"/api/v1/namespaces/{NS}/pods/{p['metadata']['name']}").body
        sts = statefulset(p["metadata"]["name"], leader)
        for w in workers:
            if (
                w["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"]
                == p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"]
            ):
                create_pod(kube, w, sts)
    wait("all LWS pods bound", lambda: bound(kube, [p["metadata"]["name"] for p in pods]))
    # The pods are bound in the API server; the extender's watch may show them a moment later,
    # gang by gang: wait for all three, not the first.
    found = wait(
        "the cache sees three bound gangs",
        lambda: (
            bound_gangs
            if len(bound_gangs := [g for g in gangs(extender, f"ri:{NS}/e2e-vllm/") if g["bound"] == 2]) == 3
            else None
        ),
    )
    assert sorted(g["key"] for g in found) == [f"ri:{NS}/e2e-vllm/group/e2e-vllm/{i}" for i in range(3)]
    assert all(g["minCount"] == 2 and g["bound"] == 2 for g in found)


def test_registering_a_workload_type_gang_schedules_an_unknown_crd(extender: Extender, kube: RestKube) -> None:
    status, body = call_extender(
        extender, "POST", "/api/v1/workload-types", b"name: Widget\ngroup: example.com\nresourceInterfaces: [{}]"
    )
    assert status == 400 and body["violations"], body
    assert call_extender(extender, "GET", "/api/v1/workload-types/Gadget")[0] == 404
    status, body = call_extender(extender, "POST", "/api/v1/workload-types", WIDGET_TYPE.encode())
    assert status == 201, body
    assert call_extender(extender, "GET", "/api/v1/workload-types/Widget")[0] == 200
    cm = kube.request("GET", f"/api/v1/namespaces/phalanx-system/configmaps/{CONFIGMAP_NAME}").body
    assert yaml.safe_load(cm["data"]["workload-type.example.com.Widget.yaml"])["name"] == "Widget"
    wait("Widget watched", lambda: watching(extender, "Widget"))
    widget = create(
        kube,
        f"/apis/example.com/v1/namespaces/{NS}/widgets",
        {
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "metadata": {"name": "w1", "namespace": NS},
            "spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}},
        },
    )
    template = ri_samples.pod("x", labels={"example.com/widget": "w1"}, owner_ref={})
    names = [f"w1-{i}" for i in range(3)]
    for name in names[:2]:
        p = copy.deepcopy(template)
        p["metadata"]["name"] = name
        create_pod(kube, p, widget)
    wait(
        "Widget gang waits for quorum",
        lambda: [g for g in gangs(extender, f"ri:{NS}/w1/") if "quorum 2/3" in g["pendingReason"]],
    )
    assert unbound(kube, names[:2])
    p = copy.deepcopy(template)
    p["metadata"]["name"] = names[2]
    create_pod(kube, p, widget)
    wait("Widget pods bound", lambda: bound(kube, names))
    status, body = call_extender(extender, "DELETE", "/api/v1/workload-types/Widget")
    assert status == 200
    assert call_extender(extender, "DELETE", "/api/v1/workload-types/Widget")[0] == 404


def test_writes_need_a_token_the_api_server_accepts_and_rbac_that_allows_them(
    extender: Extender, kube: RestKube
) -> None:
    """A service account's real token (TokenRequest): refused (403) until a ClusterRole grants
    `create` on phalanx.io/workloadtypes; no token at all: 401. Checked by the real API
    server's TokenReview and SubjectAccessReview."""
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "wt-editor", "namespace": NS}}
    assert kube.request("POST", f"/api/v1/namespaces/{NS}/serviceaccounts", body=sa).status in (201, 409)
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}}
    r = kube.request("POST", f"/api/v1/namespaces/{NS}/serviceaccounts/wt-editor/token", body=request)
    assert r.status == 201, r.body
    token = r.body["status"]["token"]
    gadget = WIDGET_TYPE.replace("Widget", "Gadget").replace("widget", "gadget").encode()
    status, body = call_extender(extender, "POST", "/api/v1/workload-types", gadget, token="")
    assert status == 401, body
    status, body = call_extender(extender, "POST", "/api/v1/workload-types", gadget, token="not-a-token")
    assert status == 401 and "did not authenticate" in body["Error"], body
    status, body = call_extender(extender, "POST", "/api/v1/workload-types", gadget, token=token)
    assert status == 403 and f"system:serviceaccount:{NS}:wt-editor" in body["Error"], body
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "phalanx-workload-type-editor"},
        "rules": [{"apiGroups": ["phalanx.io"], "resources": ["workloadtypes"], "verbs": ["create", "delete"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "phalanx-workload-type-editor"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]},
        "subjects": [{"kind": "ServiceAccount", "name": "wt-editor", "namespace": NS}],
    }
    assert kube.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", body=role).status in (201, 409)
    r = kube.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", body=binding)
    assert r.status in (201, 409)
    try:
        # A refusal is cached for a few seconds: the grant takes effect within that.
        created = wait(
            "the granted write goes through",
            lambda: call_extender(extender, "POST", "/api/v1/workload-types", gadget, token=token)[0] == 201,
        )
        assert created
        status, body = call_extender(extender, "DELETE", "/api/v1/stats", token=token)
        assert status == 403 and "delete phalanx.io/stats" in body["Error"], body
    finally:
        call_extender(extender, "DELETE", "/api/v1/workload-types/Gadget")
        kube.request("DELETE", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/phalanx-workload-type-editor")
        kube.request("DELETE", "/apis/rbac.authorization.k8s.io/v1/clusterroles/phalanx-workload-type-editor")
