"""The REST API's own port (`--api-address`): the APIs over TLS, never the verbs."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from extender.app import ApiListenOptions, Extender, Options
from extender.tls import TLSFiles
from tests import certs
from tests.extender.fakes import ADMIN, FakeKube, mark_listed, node


def _call(url: str, context: ssl.SSLContext, method: str = "GET", body: bytes | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=body, method=method, headers=ADMIN)
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def test_the_api_port_serves_the_apis_over_tls_and_never_the_verbs(tmp_path: Path) -> None:
    authority = certs.ca(tmp_path, "ca")
    server = certs.signed(tmp_path, "api", authority, server=True)
    extender = Extender(
        FakeKube(), Options(port=0, api=ApiListenOptions(("127.0.0.1", 0), TLSFiles(server.cert, server.key)))
    )
    extender.cache.replace_nodes([node("n0", gpus=2)])
    extender.cache.replace_pods([])
    mark_listed(extender)
    assert extender.api_server is not None
    thread = threading.Thread(target=extender.api_server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        base = extender.api_server.url
        assert base.startswith("https://")
        trusted = ssl.create_default_context(cafile=str(authority.cert))
        status, body = _call(f"{base}/api/v1/metrics/queues", trusted)
        assert status == 200 and body["queues"][0]["name"] == "default", body
        status, body = _call(f"{base}/api/v1/nodes/n0", trusted)
        assert status == 200 and body["name"] == "n0", body
        assert _call(f"{base}/openapi.json", trusted)[0] == 200
        for verb in ("/filter", "/bind", "/preempt"):  # kube-scheduler's verbs are not here
            assert _call(base + verb, trusted, "POST", b"{}")[0] == 404
        assert _call(f"{base}/api/v1/stats", trusted)[0] == 404  # nor the operator's stats
        try:  # a client that does not trust the certificate gets no answer
            _call(f"{base}/api/v1/metrics/queues", ssl.create_default_context())
            raise AssertionError("an untrusted certificate was accepted")
        except urllib.error.URLError as e:
            assert isinstance(e.reason, ssl.SSLError)
    finally:
        extender.api_server.shutdown()
        extender.api_server.close_connections()
        extender.api_server.server_close()


def test_the_command_line_refuses_an_exposed_api_port_without_tls() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "extender", "--api-address", "0.0.0.0:8443"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2 and "needs TLS" in run.stderr, run.stderr
