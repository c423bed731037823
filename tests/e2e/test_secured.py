"""The verbs on an HTTPS port with client certificates, through the real kube-scheduler: it
presents its certificate (`tlsConfig`) and its pods are bound by the extender; a /bind from
anyone without a certificate the client CA signed is refused and binds nothing."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.local.cluster import LocalCluster
from deploy.local.scheduler_config import ExtenderTLS
from extender.app import Extender, Options
from extender.kube import RestKube
from extender.objects import DEVICES_ANNOTATION
from extender.tls import TLSFiles
from tests import certs
from tests.e2e.test_extender import wait

pytestmark = pytest.mark.e2e

NS = "default"


@pytest.fixture(scope="module")
def secured(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("pki")
    authority = certs.ca(folder, "phalanx-ca")
    server = certs.signed(folder, "extender", authority, server=True)
    scheduler = certs.signed(folder, "kube-scheduler", authority)
    kube = RestKube.from_kubeconfig(str(cluster.kubeconfig_path))
    extender = Extender(kube, Options(port=0, tls=TLSFiles(server.cert, server.key, authority.cert)))
    extender.start()
    try:
        wait("extender ready", extender.ready)
        assert extender.server.url.startswith("https://127.0.0.1:")
        tls = ExtenderTLS(str(scheduler.cert), str(scheduler.key), str(authority.cert))
        cluster.restart_scheduler(extender.server.url, extender_tls=tls)
        yield {"kube": kube, "extender": extender, "ca": authority.cert}
    finally:
        cluster.restart_scheduler(None)
        extender.stop()
        kube.request(
            "DELETE",
            f"/api/v1/namespaces/{NS}/pods",
            query={"labelSelector": "suite=secured", "gracePeriodSeconds": "0"},
        )


def test_kube_scheduler_binds_through_the_https_verbs_and_a_forged_bind_is_refused(
    secured: dict[str, Any], tmp_path: Path
) -> None:
    kube: RestKube = secured["kube"]
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "secured-0", "labels": {"suite": "secured"}},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
    assert kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=body).status == 201
    path = f"/api/v1/namespaces/{NS}/pods/secured-0"
    placed = wait("bound by the extender", lambda: (p := kube.request("GET", path).body)["spec"].get("nodeName") and p)
    assert DEVICES_ANNOTATION in placed["metadata"]["annotations"]  # the extender's bind, not the default binder

    # A forger on the same network: TLS, the right server CA, no client certificate.
    forged = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "forged", "labels": {"suite": "secured"}}}
    forged["spec"] = {"schedulerName": "nobody", "containers": [{"name": "c", "image": "x"}]}
    created = kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=forged).body
    bind = {
        "PodName": "forged",
        "PodNamespace": NS,
        "PodUID": created["metadata"]["uid"],
        "Node": placed["spec"]["nodeName"],
    }
    request = urllib.request.Request(
        secured["extender"].server.url + "/bind", data=json.dumps(bind).encode(), method="POST"
    )
    context = ssl.create_default_context(cafile=str(secured["ca"]))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10, context=context)
    refused.value.close()
    assert refused.value.code == 401
    assert not kube.request("GET", f"/api/v1/namespaces/{NS}/pods/forged").body["spec"].get("nodeName")
