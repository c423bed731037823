"""Workload policies on the real control plane: the extender serves its admission webhooks on a
TLS port with a certificate it issued, registers them with the API server itself, and the API
server calls them for every pod and PyTorchJob created in the test's namespace.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import json
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.local.cluster import LocalCluster
from extender.app import Extender, Options
from extender.kube import RestKube
from extender.policy.registration import CONFIG_NAME
from extender.policy.service import webhook_options
from tests.e2e.test_extender import wait
from tests.e2e.test_resource_interfaces import call_extender, crd

pytestmark = pytest.mark.e2e

NS = "policy-e2e"
POLICIES = "/apis/phalanx.io/v1alpha1/workloadpolicies"
PYTORCHJOBS = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"
WEBHOOK_CONFIGS = (
    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
)
POLICY = {
    "apiVersion": "phalanx.io/v1alpha1",
    "kind": "WorkloadPolicy",
    "metadata": {"name": "e2e-team"},
    "spec": {
        "scope": {"namespace": NS},
        "defaults": {
            "compute": {"cpuMemoryRequest": "256Mi"},
            "nodePools": ["pool-a", "pool-b"],
            "tolerations": {
                "instances": [{"key": "phalanx.io/policy-e2e", "operator": "Exists", "effect": "NoSchedule"}]
            },
            "annotations": {"instances": [{"name": "team", "value": "research"}]},
        },
        "rules": {"compute": {"gpuDeviceRequest": {"max": 8}, "cpuCoreRequest": {"required": True}}},
    },
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster) -> RestKube:
    return RestKube.from_kubeconfig(str(cluster.kubeconfig_path))


@pytest.fixture(scope="module")
def policed(cluster: LocalCluster, kube: RestKube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Extender]:
    for path in ("config/crds/phalanx.io_workloadpolicies.yaml",):
        r = kube.request(
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            body=yaml.safe_load(Path(path).read_text()),
        )
        assert r.status in (201, 409), r.body
    r = kube.request(
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        body=crd("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs"),
    )
    assert r.status in (201, 409), r.body
    for ns in ("phalanx-system", NS):
        r = kube.request(
            "POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        )
        assert r.status in (201, 409), r.body
    for api in (POLICIES, PYTORCHJOBS):
        wait(f"{api} served", lambda api=api: kube.request("GET", api).status == 200)
    port = free_port()
    webhook = webhook_options("127.0.0.1", port, None, f"https://127.0.0.1:{port}", tmp_path_factory.mktemp("webhook"))
    ext = Extender(kube, Options(port=0, webhook=webhook))
    ext.start()
    try:
        wait("extender ready", ext.ready)
        assert ext.policy_service is not None
        wait("webhooks registered", ext.policy_service.started.is_set, deadline_s=120)
        r = kube.request("POST", POLICIES, body=POLICY)
        assert r.status in (201, 409), r.body
        wait("policy loaded", lambda: "e2e-team" in ext.policies.names())
        wait("the webhooks cover the policy's namespace", lambda: covers(kube, NS), deadline_s=60)
        assert not covers(kube, "default")  # no policy there: never waits on Phalanx
        yield ext
    finally:
        # The webhooks fail closed: they must not outlive the extender that serves them (stopped
        # first, so its upkeep cannot write them again after they are deleted).
        ext.stop()
        for collection in WEBHOOK_CONFIGS:
            kube.request("DELETE", f"{collection}/{CONFIG_NAME}")
        kube.request("DELETE", f"{POLICIES}/e2e-team")
        for p in kube.request("GET", f"/api/v1/namespaces/{NS}/pods").body.get("items", []):
            kube.request(
                "DELETE", f"/api/v1/namespaces/{NS}/pods/{p['metadata']['name']}", query={"gracePeriodSeconds": "0"}
            )


def covers(kube: RestKube, namespace: str) -> bool:
    """Whether the registered validating webhook is called for `namespace` (its selector's
    name expression; every test namespace lacks the phalanx.io/policies label)."""
    r = kube.request("GET", f"{WEBHOOK_CONFIGS[1]}/{CONFIG_NAME}")
    if r.status != 200:
        return False
    names = r.body["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]
    return names["operator"] == "In" and namespace in names["values"]


def pod(name: str, *, cpu: str | None = "500m", gpus: int = 0) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": cpu} if cpu else {}
    limits: dict[str, str] = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "schedulerName": "no-such-scheduler",  # admission is what is tested: nothing binds it
            "containers": [{"name": "main", "image": "busybox", "resources": {"requests": requests, "limits": limits}}],
        },
    }


def create_pod(kube: RestKube, body: dict[str, Any]) -> Any:
    return kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=body)


def test_a_pod_missing_a_required_field_is_refused_with_the_rule(policed: Extender, kube: RestKube) -> None:
    r = create_pod(kube, pod("no-cpu", cpu=None))
    assert r.status == 403, r.body
    message = r.body["message"]
    assert "compute.cpuCoreRequest" in message and "required" in message, message


def test_defaults_appear_on_an_admitted_pod(policed: Extender, kube: RestKube) -> None:
    r = create_pod(kube, pod("defaulted"))
    assert r.status == 201, r.body
    meta, spec = r.body["metadata"], r.body["spec"]
    assert json.loads(meta["annotations"]["phalanx.io/node-pools"]) == ["pool-a", "pool-b"]
    assert meta["annotations"]["team"] == "research"
    assert spec["containers"][0]["resources"]["requests"] == {"cpu": "500m", "memory": "256Mi"}
    assert {"key": "phalanx.io/policy-e2e", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


def test_sixteen_gpus_under_max_eight_is_refused(policed: Extender, kube: RestKube) -> None:
    r = create_pod(kube, pod("greedy", gpus=16))
    assert r.status == 403, r.body
    message = r.body["message"]
    assert "compute.gpuDeviceRequest" in message and "max" in message and "8" in message, message
    assert create_pod(kube, pod("modest", gpus=8)).status == 201


def pytorchjob(name: str, worker_gpus: int) -> dict[str, Any]:
    def template(gpus: int) -> dict[str, Any]:
        resources = {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": str(gpus)}}
        return {"spec": {"containers": [{"name": "pytorch", "image": "pytorch", "resources": resources}]}}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": template(1)},
                "Worker": {"replicas": 2, "template": template(worker_gpus)},
            }
        },
    }


def test_a_pytorchjob_that_breaks_a_policy_is_refused_at_submission(policed: Extender, kube: RestKube) -> None:
    r = kube.request("POST", PYTORCHJOBS, body=pytorchjob("too-big", 16))
    assert r.status == 403, r.body
    message = r.body["message"]
    assert "spec.pytorchReplicaSpecs.Worker.template" in message and "compute.gpuDeviceRequest" in message, message
    assert "Master" not in message  # the master's template keeps to the rules
    r = kube.request("POST", PYTORCHJOBS, body=pytorchjob("fits", 8))
    assert r.status == 201, r.body
    worker = r.body["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert json.loads(worker["metadata"]["annotations"]["phalanx.io/node-pools"]) == ["pool-a", "pool-b"]
    assert worker["spec"]["containers"][0]["resources"]["requests"]["memory"] == "256Mi"
    kube.request("DELETE", f"{PYTORCHJOBS}/fits")


def test_the_preview_names_the_source_of_each_value(policed: Extender, kube: RestKube) -> None:
    body = json.dumps({"namespace": NS, "workload": {"compute": {"gpuDeviceRequest": 16}}}).encode()
    status, reply = call_extender(policed, "POST", "/api/v1/policies/effective", body)
    assert status == 200, reply
    assert reply["sources"]["nodePools"].startswith("policy e2e-team"), reply["sources"]
    assert reply["sources"]["compute.gpuDeviceRequest"] == "submission"
    assert [v["rule"] for v in reply["violations"]] == ["max", "required"] or {
        v["rule"] for v in reply["violations"]
    } == {"max", "required"}
    status, reply = call_extender(policed, "POST", "/api/v1/policies/effective", body, token="not-a-token")
    assert status == 401, reply


def test_an_invalid_policy_change_keeps_the_last_good_one_and_says_why(policed: Extender, kube: RestKube) -> None:
    current = kube.request("GET", f"{POLICIES}/e2e-team").body
    broken = copy.deepcopy(current)
    broken["spec"]["rules"]["compute"]["gpuDeviceRequest"] = {"max": "eight"}
    r = kube.request("PUT", f"{POLICIES}/e2e-team", body=broken)
    assert r.status == 200, r.body

    def reported() -> bool:
        events = kube.request("GET", "/api/v1/namespaces/default/events").body.get("items", [])
        return any(e.get("reason") == "InvalidWorkloadPolicy" and "e2e-team" in e.get("message", "") for e in events)

    wait("invalid policy reported", reported)
    message = next(
        e["message"]
        for e in kube.request("GET", "/api/v1/namespaces/default/events").body["items"]
        if e.get("reason") == "InvalidWorkloadPolicy"
    )
    assert "rules.compute.gpuDeviceRequest.max" in message, message
    r = create_pod(kube, pod("still-greedy", gpus=16))
    assert r.status == 403 and "max 8" in r.body["message"], r.body
    latest = kube.request("GET", f"{POLICIES}/e2e-team").body
    restored = {
        **current,
        "metadata": {**current["metadata"], "resourceVersion": latest["metadata"]["resourceVersion"]},
    }
    assert kube.request("PUT", f"{POLICIES}/e2e-team", body=restored).status == 200


def test_the_webhooks_cover_the_workload_kinds_and_keep_answering_across_a_certificate_renewal(
    policed: Extender, kube: RestKube
) -> None:
    service = policed.policy_service
    assert service is not None and service.certs.bundle is not None
    validating = kube.request("GET", f"{WEBHOOK_CONFIGS[1]}/{CONFIG_NAME}").body
    hook = validating["webhooks"][0]
    assert ["pytorchjobs"] in [r["resources"] for r in hook["rules"]] and hook["failurePolicy"] == "Fail"
    old = service.certs.bundle
    # Judged 300 days on, the year-long certificate is due: a new CA and certificate are issued.
    service.upkeep(due=True, now=dt.datetime.now(dt.UTC) + dt.timedelta(days=300))
    new = service.certs.bundle
    assert new is not None and new.cert != old.cert
    secret = kube.request("GET", "/api/v1/namespaces/phalanx-system/secrets/phalanx-webhook-tls").body
    assert base64.b64decode(secret["data"]["ca.crt"]).count(b"BEGIN CERTIFICATE") == 2  # the old CA kept
    validating = kube.request("GET", f"{WEBHOOK_CONFIGS[1]}/{CONFIG_NAME}").body
    assert base64.b64decode(validating["webhooks"][0]["clientConfig"]["caBundle"]) == new.ca
    assert service.server is not None
    host, port = service.server.server_address[:2]

    def served() -> bool:
        pem = ssl.get_server_certificate((str(host), int(port)))
        return ssl.PEM_cert_to_DER_cert(pem) == ssl.PEM_cert_to_DER_cert(new.cert.decode())

    wait("the renewed certificate served", served, deadline_s=60)
    r = create_pod(kube, pod("after-renewal", gpus=16))
    assert r.status == 403 and "violates workload policy" in r.body["message"], r.body
