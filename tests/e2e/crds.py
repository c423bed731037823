"""Phalanx's Workload and Queue CRDs for the suites that create those objects, and a suite's
clean-up."""

from __future__ import annotations

from pathlib import Path

import yaml

from extender.kube import RestKube
from tests.e2e.test_extender import wait

QUEUES = "/apis/phalanx.io/v1alpha1/queues"


def install(kube: RestKube, namespace: str) -> None:
    """Install both CRDs (already there is fine) and wait until they are served."""
    for path in ("config/crds/phalanx.io_workloads.yaml", "config/crds/phalanx.io_queues.yaml"):
        r = kube.request(
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            body=yaml.safe_load(Path(path).read_text()),
        )
        assert r.status in (201, 409), r.body
    for api in (QUEUES, f"/apis/phalanx.io/v1alpha1/namespaces/{namespace}/workloads"):
        wait(f"{api} served", lambda api=api: kube.request("GET", api).status == 200)


def delete_suite(kube: RestKube, namespace: str, suite: str) -> None:
    """Delete the Workloads and pods labelled suite=<suite>, and wait for the pods to go."""
    query = {"labelSelector": f"suite={suite}"}
    kube.request("DELETE", f"/apis/phalanx.io/v1alpha1/namespaces/{namespace}/workloads", query=query)
    kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods", query={**query, "gracePeriodSeconds": "0"})
    pods = f"/api/v1/namespaces/{namespace}/pods"
    wait(f"pods of {suite} gone", lambda: not kube.request("GET", pods, query=query).body["items"])
