"""The Workload Types API on the real control plane: what no real controller can show.

A new workload type registered through the API (a CRD no operator runs, its pods made by the
test with the owner references a controller would set) is gang-scheduled with no restart; the
API's writes need a token the API server accepts and RBAC that allows them. The shipped
Resource Interfaces are exercised by their real controllers in tests/e2e/test_controllers.py.
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
CRDS = {("example.com", "v1", "Widget", "widgets")}
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


def gangs(ext: Extender, prefix: str) -> list[dict[str, Any]]:
    return [g for g in ext.gangs.describe() if g["key"].startswith(prefix)]


def bound(kube: RestKube, names: list[str]) -> bool:
    for n in names:
        p = kube.request("GET", f"/api/v1/namespaces/{NS}/pods/{n}").body
        if not p["spec"].get("nodeName"):
            return False
    return True


def unbound(kube: RestKube, names: list[str]) -> bool:
    return all(not kube.request("GET", f"/api/v1/namespaces/{NS}/pods/{n}").body["spec"].get("nodeName") for n in names)


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
