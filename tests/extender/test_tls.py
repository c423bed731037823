"""Verbs on a TLS port: only a client whose certificate the client CA signed may call them (a
forged /bind without one gets 401, one signed by another CA fails the handshake); health,
metrics and the REST API need no client certificate; a client that never finishes its
handshake does not hold up anyone else."""

from __future__ import annotations

import json
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from extender.app import Extender, Options
from extender.tls import TLSFiles
from tests import certs
from tests.extender.fakes import FakeKube, node, pod, serving


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("pki")
    authority = certs.ca(folder, "phalanx-ca")
    rogue = certs.ca(folder, "rogue-ca")
    return {
        "ca": authority,
        "server": certs.signed(folder, "extender", authority, server=True),
        "scheduler": certs.signed(folder, "kube-scheduler", authority),
        "forger": certs.signed(folder, "forger", rogue),
    }


@pytest.fixture
def ext(pki: dict[str, Any]) -> Iterator[tuple[Extender, FakeKube]]:
    kube = FakeKube()
    tls = TLSFiles(pki["server"].cert, pki["server"].key, pki["ca"].cert)
    extender = Extender(kube, Options(port=0, tls=tls))
    extender.cache.replace_nodes([node("n0", gpus=2)])
    extender.cache.replace_pods([pod("p", gpus=1)])
    with serving(extender):
        yield extender, kube


def context(pki: dict[str, Any], client: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki["ca"].cert))
    if client:
        ctx.load_cert_chain(str(pki[client].cert), str(pki[client].key))
    return ctx


def post(url: str, body: Any, ctx: ssl.SSLContext) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10, context=ctx) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


BIND = {"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n0"}


def test_kube_schedulers_certificate_may_bind(ext: tuple[Extender, FakeKube], pki: dict[str, Any]) -> None:
    extender, kube = ext
    assert extender.server.url.startswith("https://")
    status, reply = post(extender.server.url + "/bind", BIND, context(pki, "scheduler"))
    assert status == 200, reply
    assert any(path.endswith("/pods/p/binding") for _, path, _ in kube.calls)


def test_a_forged_bind_without_a_client_certificate_is_refused(
    ext: tuple[Extender, FakeKube], pki: dict[str, Any]
) -> None:
    extender, kube = ext
    status, reply = post(extender.server.url + "/bind", BIND, context(pki, None))
    assert status == 401 and "client certificate" in reply["Error"]
    assert not any(path.endswith("/binding") for _, path, _ in kube.calls)
    # Reads and health need none (Prometheus scrapes /metrics; the REST API takes tokens).
    with urllib.request.urlopen(extender.server.url + "/healthz", timeout=10, context=context(pki, None)) as r:
        assert r.status == 200


def test_a_certificate_from_another_ca_fails_the_handshake(ext: tuple[Extender, FakeKube], pki: dict[str, Any]) -> None:
    extender, kube = ext
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        post(extender.server.url + "/bind", BIND, context(pki, "forger"))
    assert not any(path.endswith("/binding") for _, path, _ in kube.calls)
    status, _ = post(extender.server.url + "/bind", BIND, context(pki, "scheduler"))
    assert status == 200  # the server lives on


def test_plain_http_and_a_silent_client_do_not_hold_up_the_server(
    ext: tuple[Extender, FakeKube], pki: dict[str, Any]
) -> None:
    extender, _ = ext
    host, port = extender.server.server_address[:2]
    with socket.create_connection((host, port)), socket.create_connection((host, port)) as plain:
        # The first connects and never says hello; the second speaks plain HTTP.
        plain.sendall(b"POST /bind HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
        plain.settimeout(15)
        try:
            answer = plain.recv(4096)
        except ConnectionResetError:
            answer = b""
        assert b"HTTP/1.1 200" not in answer  # a TLS alert or a reset, never a bind
        status, _ = post(extender.server.url + "/bind", BIND, context(pki, "scheduler"))
        assert status == 200


def test_tls_files_are_read_again_when_they_change(
    pki: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from extender import tls as tls_module

    monkeypatch.setattr(tls_module, "RECHECK_S", 0.0)
    other = certs.signed(tmp_path, "extender-2", pki["ca"], server=True)
    cert, key = tmp_path / "serving.crt", tmp_path / "serving.key"
    cert.write_bytes(pki["server"].cert.read_bytes())
    key.write_bytes(pki["server"].key.read_bytes())
    server = tls_module.ServerTLS(TLSFiles(cert, key, pki["ca"].cert))
    first = server.context()
    assert server.context() is first  # unchanged files: the same context
    cert.write_bytes(other.cert.read_bytes())
    key.write_bytes(other.key.read_bytes())
    import os

    os.utime(cert, (1, 1))  # a distinct mtime even within the file system's granularity
    assert server.context() is not first
    key.write_text("half-written")
    os.utime(key, (2, 2))
    assert server.context() is not None  # a broken file keeps the last good context
