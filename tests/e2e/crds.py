"""Phalanx's Workload and Queue CRDs, installed for a suite that creates those objects."""

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
