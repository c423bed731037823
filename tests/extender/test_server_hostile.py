"""The HTTP surface against hostile clients: malformed bodies on every endpoint, broken
framing, slow and lying clients, too many connections. Every case gets a 4xx (or a fast
503) naming what is wrong, never a 5xx, and the server still answers /healthz afterwards.
The server runs in-process with the real routes and small limits (`LIMITS`)."""

from __future__ import annotations

import http.client
import itertools
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from typing import Any

import pytest

from extender.app import Extender, Options
from extender.metrics import Metrics
from extender.server import KEEP_IDLE, Limits, Reply, Server
from extender.verbs import PARSED_POD_BYTES
from tests.extender.fakes import ADMIN, FakeKube, node, pod, serving

VIEWER = {"Authorization": "Bearer viewer-token"}

LIMITS = Limits(verb_body=2**20, api_body=2**16, read_timeout_s=0.5, idle_timeout_s=1.0, connections=16)
SLACK_S = 3.0  # scheduling noise on a shared 2-core machine


@pytest.fixture(scope="module")
def extender() -> Iterator[Extender]:
    """One server for the module, without the shipped workload types (slow to load, and
    nothing here needs them)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("extender.app.Server", partial(Server, limits=LIMITS))
        patch.setattr("extender.workload_types.load_defaults", list)
        kube = FakeKube()
        extender = Extender(kube, Options(port=0))
    extender.cache.replace_nodes([node("n0", gpus=2), node("n1", gpus=8)])
    p = pod("p", gpus=1, uid="u1")
    kube.pods["default/p"] = p
    extender.cache.replace_pods([p])
    with serving(extender):
        yield extender


@pytest.fixture
def server(extender: Extender) -> Server:
    return extender.server


def request(
    server: Server, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    """One call; writes carry the admin's token unless `headers` say otherwise."""
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(str(host), port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=ADMIN if headers is None else headers)
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        conn.close()


def raw(server: Server, data: bytes, *, timeout: float = 5.0) -> bytes:
    """Send `data` on a fresh socket and read until the server closes it (or `timeout`)."""
    with socket.create_connection(server.server_address[:2], timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def healthy(server: Server) -> bool:
    return request(server, "GET", "/healthz") == (200, "ok")


def until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


_UIDS = itertools.count()


def with_pod(**fields: Any) -> dict[str, Any]:
    """A filter request whose pod's metadata or spec has `fields` ("metadata__uid"), under a
    uid of its own (parsed pods are cached by uid and resourceVersion)."""
    p = pod("q", gpus=1, uid=f"uid-{next(_UIDS)}")
    for dotted, value in fields.items():
        part, key = dotted.split("__")
        p[part][key] = value
    return {"Pod": p, "NodeNames": ["n0", "n1"]}


def victims(entry: Any) -> dict[str, Any]:
    return {"Pod": pod("q", gpus=1), "NodeNameToMetaVictims": {"n0": entry}}


BIND = {"PodName": "p", "PodNamespace": "default", "PodUID": "u1", "Node": "n0"}
DEEP_YAML = b"name: X\ngroup: g\nresourceInterfaces:\n- " + b"[" * 5000
BOMB = b"\n".join(
    [b"name: X", b"group: g", b"resourceInterfaces:", b"- structureDefinition:", b"    a: &l0 [x,x,x,x,x,x,x,x,x,x]"]
    + [b"    a%d: &l%d [%s]" % (i, i, b",".join([b"*l%d" % (i - 1)] * 10)) for i in range(1, 8)]
)

CASES: list[tuple[str, str, str, Any, int, str]] = [
    # (case, method, path, body (bytes sent as-is, else JSON), status, fragment of the reply)
    (
        "filter: NodeNames holds a number",
        "POST",
        "/filter",
        {"Pod": pod("q"), "NodeNames": ["n0", 1]},
        400,
        "NodeNames",
    ),
    ("filter: NodeNames is a string", "POST", "/filter", {"Pod": pod("q"), "NodeNames": "n0"}, 400, "NodeNames"),
    ("filter: Pod is a list", "POST", "/filter", {"Pod": [], "NodeNames": []}, 400, "Pod"),
    ("filter: metadata.uid is a list", "POST", "/filter", with_pod(metadata__uid=["u"]), 400, "Pod.metadata.uid"),
    ("filter: metadata.uid is too long", "POST", "/filter", with_pod(metadata__uid="u" * 65), 400, "Pod.metadata.uid"),
    ("filter: metadata.name is a number", "POST", "/filter", with_pod(metadata__name=7), 400, "Pod.metadata.name"),
    (
        "filter: metadata.namespace has a slash",
        "POST",
        "/filter",
        with_pod(metadata__namespace="a/b"),
        400,
        "namespace",
    ),
    ("filter: labels is a list", "POST", "/filter", with_pod(metadata__labels=["a"]), 400, "Pod.metadata.labels"),
    ("filter: a label value is an object", "POST", "/filter", with_pod(metadata__labels={"a": {}}), 400, "labels"),
    ("filter: annotations is a string", "POST", "/filter", with_pod(metadata__annotations="x"), 400, "annotations"),
    (
        "filter: ownerReferences holds a string",
        "POST",
        "/filter",
        with_pod(metadata__ownerReferences=["x"]),
        400,
        "owner",
    ),
    ("filter: nodeName is a number", "POST", "/filter", with_pod(spec__nodeName=1), 400, "Pod.spec.nodeName"),
    ("filter: containers is an object", "POST", "/filter", with_pod(spec__containers={}), 400, "Pod.spec.containers"),
    (
        "filter: affinity nested 1,000 deep",
        "POST",
        "/filter",
        json.dumps(with_pod(spec__affinity="@")).replace('"@"', '{"a":' * 1000 + "1" + "}" * 1000).encode(),
        400,
        "Pod",
    ),
    (
        "filter: Nodes.items holds strings",
        "POST",
        "/filter",
        {"Pod": pod("q"), "Nodes": {"items": ["n0"]}},
        400,
        "Nodes",
    ),
    (
        "filter: Nodes.items[].metadata is a list",
        "POST",
        "/filter",
        {"Pod": pod("q"), "Nodes": {"items": [{"metadata": []}]}},
        400,
        "metadata",
    ),
    ("filter: JSON nested 5,000 deep", "POST", "/filter", b"[" * 5000 + b"]" * 5000, 400, "not JSON"),
    ("filter: the literal Infinity", "POST", "/filter", b'{"Pod": Infinity}', 400, "not JSON"),
    ("filter: NaN in NodeNames", "POST", "/filter", b'{"NodeNames": [NaN]}', 400, "not JSON"),
    ("filter: not UTF-8", "POST", "/filter", b"\xff\xfe{}", 400, "not JSON"),
    (
        "prioritize: NodeNames is an object",
        "POST",
        "/prioritize",
        {"Pod": pod("q", gpus=1), "NodeNames": {}},
        400,
        "NodeNames",
    ),
    ("prioritize: no Pod", "POST", "/prioritize", {"NodeNames": ["n0"]}, 400, "Pod"),
    (
        "preempt: victims is a list",
        "POST",
        "/preempt",
        {"Pod": pod("q", gpus=1), "NodeNameToMetaVictims": []},
        400,
        "NodeNameToMetaVictims",
    ),
    ("preempt: a node's victims is a string", "POST", "/preempt", victims("x"), 400, "NodeNameToMetaVictims['n0']"),
    ("preempt: a node's victims is a list", "POST", "/preempt", victims([{"UID": "u1"}]), 400, "'n0'"),
    ("preempt: Pods is a string", "POST", "/preempt", victims({"Pods": "u1"}), 400, "Pods"),
    ("preempt: Pods holds strings", "POST", "/preempt", victims({"Pods": ["u1"]}), 400, "Pods"),
    ("preempt: a victim's UID is a number", "POST", "/preempt", victims({"Pods": [{"UID": 1}]}), 400, "UID"),
    (
        "preempt: NumPDBViolations is a string",
        "POST",
        "/preempt",
        victims({"Pods": [], "NumPDBViolations": "1"}),
        400,
        "NumPDB",
    ),
    ("bind: PodName climbs the API path", "POST", "/bind", {**BIND, "PodName": "../../secrets?x=1"}, 400, "PodName"),
    ("bind: PodName longer than 253", "POST", "/bind", {**BIND, "PodName": "a" * 254}, 400, "PodName"),
    ("bind: PodName is a number", "POST", "/bind", {**BIND, "PodName": 5}, 400, "PodName"),
    ("bind: PodNamespace in capitals", "POST", "/bind", {**BIND, "PodNamespace": "Default"}, 400, "PodNamespace"),
    ("bind: PodNamespace longer than 63", "POST", "/bind", {**BIND, "PodNamespace": "a" * 64}, 400, "PodNamespace"),
    ("bind: PodUID longer than 64", "POST", "/bind", {**BIND, "PodUID": "u" * 65}, 400, "PodUID"),
    ("bind: PodUID is a list", "POST", "/bind", {**BIND, "PodUID": ["u1"]}, 400, "PodUID"),
    ("bind: Node has a slash", "POST", "/bind", {**BIND, "Node": "n0/../n1"}, 400, "Node"),
    ("bind: Node missing", "POST", "/bind", {k: v for k, v in BIND.items() if k != "Node"}, 400, "Node"),
    ("workload types: YAML nested 5,000 deep", "POST", "/api/v1/workload-types", DEEP_YAML, 400, "nested"),
    (
        "workload types: JSON nested 5,000 deep",
        "POST",
        "/api/v1/workload-types",
        b"[" * 5000 + b"]" * 5000,
        400,
        "levels",
    ),
    ("workload types: a YAML alias bomb", "POST", "/api/v1/workload-types", BOMB, 400, "values"),
    ("workload types: a cyclic YAML alias", "POST", "/api/v1/workload-types", b"a: &a [*a]", 400, "values"),
    ("workload types: a YAML list", "POST", "/api/v1/workload-types", b"- a\n- b", 400, "invalid workload type"),
    ("workload types: not YAML", "POST", "/api/v1/workload-types", b"a: [", 400, "neither JSON nor YAML"),
    (
        "workload types: a python tag",
        "POST",
        "/api/v1/workload-types",
        b"!!python/object/apply:os.system [ls]",
        400,
        "YAML",
    ),
    ("workload types: PUT is not served", "PUT", "/api/v1/workload-types/x", b"{}", 405, "PUT"),
    ("an unknown verb", "POST", "/explode", b"{}", 404, "unknown verb"),
    ("a verb with GET", "GET", "/filter", None, 405, "allowed: POST"),
    ("PATCH, which nothing serves", "PATCH", "/filter", b"{}", 405, "PATCH"),
    ("a read with a body", "GET", "/api/v1/nodes/n0", b"x" * 100, 200, "n0"),
    ("a read of an unknown node", "GET", "/api/v1/nodes/%2e%2e%2f", None, 404, ""),
]


@pytest.mark.parametrize(("case", "method", "path", "body", "status", "fragment"), CASES, ids=[c[0] for c in CASES])
def test_malformed_request_gets_a_4xx_naming_the_field_and_the_server_lives_on(
    server: Server, case: str, method: str, path: str, body: Any, status: int, fragment: str
) -> None:
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    got, text = request(server, method, path, data)
    assert (got, fragment in text) == (status, True), text[:500]
    assert healthy(server)


@pytest.mark.parametrize(
    ("case", "head", "status"),
    [
        ("Content-Length is letters", b"POST /filter HTTP/1.1\r\nContent-Length: abc\r\n\r\n{}", 400),
        ("Content-Length is negative", b"POST /filter HTTP/1.1\r\nContent-Length: -1\r\n\r\n{}", 400),
        ("Content-Length with an underscore", b"POST /filter HTTP/1.1\r\nContent-Length: 1_0\r\n\r\n{}", 400),
        ("Content-Length in Arabic digits", "POST /filter HTTP/1.1\r\nContent-Length: ٢\r\n\r\n{}".encode(), 400),
        (
            "Content-Length with 5,000 digits",
            b"POST /filter HTTP/1.1\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n",
            400,
        ),
        ("two different lengths", b"POST /filter HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400),
        ("Content-Length: abc on a read", b"GET /healthz HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400),
        ("a chunked body", b"POST /filter HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 411),
        ("a verb's body past its bound", b"POST /filter HTTP/1.1\r\nContent-Length: 1048577\r\n\r\n", 413),
        ("a REST body past its bound", b"POST /api/v1/workload-types HTTP/1.1\r\nContent-Length: 65537\r\n\r\n", 413),
        ("a body sent to a read", b"GET /healthz HTTP/1.1\r\nContent-Length: 65537\r\n\r\n", 413),
        ("HTTP/2.0 in the request line", b"GET /healthz HTTP/2.0\r\n\r\n", 400),
        ("an unknown method", b"BREW /filter HTTP/1.1\r\n\r\n", 405),
        ("a request line that is noise", b"\x00\x01\x02 garbage\r\n\r\n", 400),
        ("a header line of 70,000 bytes", b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n", 431),
        ("101 headers", b"GET /healthz HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n", 431),
        ("a length folded onto two lines", b"POST /filter HTTP/1.1\r\ncontent-LENGTH: 1\r\n 2\r\n\r\n{}", 400),
        ("an HTTP version that is no number", b"GET /healthz HTTP/1.x\r\n\r\n", 400),
        ("a POST in HTTP/0.9", b"POST /filter\r\n\r\n", 400),
        ("white space before a header's colon", b"POST /filter HTTP/1.1\r\nContent-Length : 2\r\n\r\n{}", 400),
        ("a header line without a colon", b"POST /filter HTTP/1.1\r\nnoise\r\nContent-Length: 2\r\n\r\n{}", 400),
        ("a bare CR inside a header line", b"POST /filter HTTP/1.1\r\nX: a\rContent-Length: 2\r\n\r\n{}", 400),
        ("a header block that starts folded", b"GET /healthz HTTP/1.1\r\n folded: x\r\n\r\n", 400),
    ],
)
def test_broken_framing_gets_a_4xx_and_the_connection_closes(
    server: Server, case: str, head: bytes, status: int
) -> None:
    started = time.monotonic()
    response = raw(server, head)
    assert status_of(response) == status
    assert time.monotonic() - started < LIMITS.read_timeout_s + SLACK_S  # answered, then closed
    assert healthy(server)


def test_a_client_that_declares_more_than_it_sends_gets_408_within_the_read_timeout(server: Server) -> None:
    started = time.monotonic()
    response = raw(server, b"POST /filter HTTP/1.1\r\nContent-Length: 100\r\n\r\n{}")
    assert status_of(response) == 408
    assert time.monotonic() - started < LIMITS.read_timeout_s + SLACK_S
    assert healthy(server)


def test_a_client_that_trickles_its_request_is_cut_off_by_one_deadline(server: Server) -> None:
    """A byte every 0.1 s never trips a per-read timeout of 0.5 s: the deadline still does."""
    started = time.monotonic()
    with socket.create_connection(server.server_address[:2], timeout=10) as s:
        closed = False
        for byte in b"POST /filter HTTP/1.1\r\nX-Slow: " + b"a" * 200:
            try:
                s.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            time.sleep(0.1)
            if time.monotonic() - started > LIMITS.read_timeout_s + SLACK_S:
                break
        closed = closed or s.recv(1024) == b""
    assert closed and time.monotonic() - started < LIMITS.read_timeout_s + SLACK_S
    assert healthy(server)


def test_fifty_lying_clients_hold_a_bounded_number_of_threads_and_are_all_dropped(server: Server) -> None:
    baseline = threading.active_count()
    sockets = []
    try:
        for _ in range(50):
            s = socket.create_connection(server.server_address[:2], timeout=10)
            s.sendall(b"POST /filter HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{")
            sockets.append(s)
        peak = max(threading.active_count() for _ in range(20) if not time.sleep(0.01))
        assert peak <= baseline + LIMITS.connections
        # Past the cap: a fast 503; the others: 408 once the read timeout passes.
        answers = [status_of(s.recv(4096) or b"x 0 x") for s in sockets]
        assert set(answers) <= {408, 503} and answers.count(503) >= 50 - LIMITS.connections
    finally:
        for s in sockets:
            s.close()
    # No thread is left serving a lying client; the freed ones wait for the next connections.
    assert until(lambda: server._workers == server._idle, LIMITS.read_timeout_s + SLACK_S)
    assert threading.active_count() <= baseline + min(LIMITS.connections, KEEP_IDLE)
    assert healthy(server)


def test_an_idle_kept_alive_connection_is_closed_after_the_idle_timeout(server: Server) -> None:
    started = time.monotonic()
    with socket.create_connection(server.server_address[:2], timeout=10) as s:
        assert s.recv(1) == b""  # the server closed it
    assert LIMITS.idle_timeout_s - 0.2 < time.monotonic() - started < LIMITS.idle_timeout_s + SLACK_S
    assert healthy(server)


def test_keep_alive_serves_many_calls_and_survives_a_malformed_one(server: Server) -> None:
    """kube-scheduler reuses its connections: replies (even 400s) keep the stream framed."""
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(str(host), port, timeout=10)
    try:
        conn.connect()
        first = conn.sock
        good = json.dumps({"Pod": pod("q", gpus=1), "NodeNames": ["n0", "n1"]}).encode()
        for body, status in [(good, 200), (b"{nope", 400), (b'{"NodeNames": 1}', 400)] * 5 + [(good, 200)]:
            conn.request("POST", "/filter", body=body)
            response = conn.getresponse()
            response.read()
            assert response.status == status
        assert conn.sock is first
    finally:
        conn.close()


def test_a_bind_waiting_past_the_read_timeout_still_gets_its_answer(server: Server) -> None:
    """The read timeout bounds reading the request, never the handler (bind waits at the gate)."""
    verb = server.route("POST", "/bind")
    assert verb is not None

    def waiting(method: str, path: str, body: bytes) -> Reply:
        time.sleep(LIMITS.read_timeout_s * 3)
        return verb.handler(method, path, body)

    at = server.routes.index(verb)
    server.routes[at] = replace(verb, handler=waiting)
    try:
        status, text = request(server, "POST", "/bind", json.dumps(BIND).encode())
    finally:
        server.routes[at] = verb
    assert (status, json.loads(text)) == (200, {"Error": ""})


def test_a_large_pod_is_answered_but_never_kept_in_the_parsed_pod_cache(extender: Extender) -> None:
    extender.verbs._parsed.clear()
    big = pod("big", gpus=1, annotations={"x": "a" * PARSED_POD_BYTES})
    for p in (big, pod("small", gpus=1)):
        status, _ = request(extender.server, "POST", "/filter", json.dumps({"Pod": p, "NodeNames": ["n0"]}).encode())
        assert status == 200
    assert [uid for uid, _ in extender.verbs._parsed] == ["uid-small"]


def test_a_pod_the_watch_has_at_that_version_is_read_from_the_watch_alone(extender: Extender) -> None:
    """A request naming a pod's uid and a resourceVersion the watch has is answered from the
    watch's reading: nothing else in the request's pod is read, so it is not checked either (a
    check's walk over the object cost each filter about 20 µs), and a client cannot change what
    the pod asks for. At a version the watch does not have, the request's pod is checked."""
    watched = pod("w", gpus=8, uid="uid-watched")
    watched["metadata"]["resourceVersion"] = "7"
    extender.cache.pod_event("ADDED", watched)
    try:
        claimed = {**watched, "spec": {"containers": "none of yours"}}
        body = json.dumps({"Pod": claimed, "NodeNames": ["n0", "n1"]}).encode()
        status, text = request(extender.server, "POST", "/filter", body)
        assert (status, json.loads(text)["NodeNames"]) == (200, ["n1"])  # 8 GPUs: n0 has 2
        claimed["metadata"] = {**watched["metadata"], "resourceVersion": "8"}
        body = json.dumps({"Pod": claimed, "NodeNames": ["n0", "n1"]}).encode()
        status, text = request(extender.server, "POST", "/filter", body)
        assert status == 400 and "Pod.spec.containers" in text
    finally:
        extender.cache.pod_event("DELETED", watched)


WIDGET = b"name: Widget\ngroup: example.com\nresourceInterfaces: []"


@pytest.mark.parametrize(
    ("case", "method", "path", "headers", "status", "fragment"),
    [
        ("a write without a token", "POST", "/api/v1/workload-types", {}, 401, "Authorization: Bearer"),
        ("a token of another scheme", "POST", "/api/v1/workload-types", {"Authorization": "Basic YTpi"}, 401, "Bearer"),
        ("an empty bearer token", "POST", "/api/v1/workload-types", {"Authorization": "Bearer "}, 401, "Bearer"),
        ("a token nobody issued", "POST", "/api/v1/workload-types", {"Authorization": "Bearer forged"}, 401, "did not"),
        (
            "a user RBAC does not allow",
            "DELETE",
            "/api/v1/workload-types/PyTorchJob",
            {"Authorization": "Bearer viewer-token"},
            403,
            "user 'viewer' may not delete phalanx.io/workloadtypes 'PyTorchJob': no RBAC rule",
        ),
        ("resetting statistics without a token", "DELETE", "/api/v1/stats", {}, 401, "delete phalanx.io/stats"),
        (
            "resetting statistics as a viewer",
            "DELETE",
            "/api/v1/stats",
            {"Authorization": "Bearer viewer-token"},
            403,
            "stats",
        ),
        ("reading without a token", "GET", "/api/v1/workload-types", {}, 401, "list phalanx.io/workloadtypes"),
        ("a viewer reads", "GET", "/api/v1/workload-types", VIEWER, 200, "workloadTypes"),
        ("statistics without a token", "GET", "/api/v1/stats", {}, 401, "list phalanx.io/stats"),
        ("nodes are checked as core nodes", "GET", "/api/v1/nodes/n0", {}, 401, "get nodes 'n0'"),
        ("a viewer reads a node", "GET", "/api/v1/nodes/ghost", VIEWER, 404, "ghost"),
        ("gangs in their namespace", "GET", "/api/v1/gangs/private/g", VIEWER, 403, "gangs 'g' in 'private'"),
        ("a viewer lists gangs", "GET", "/api/v1/gangs", VIEWER, 200, "gangs"),
        ("the admin resets statistics", "DELETE", "/api/v1/stats", ADMIN, 200, "reset"),
    ],
)
def test_every_api_call_is_authenticated_and_authorised(
    server: Server, case: str, method: str, path: str, headers: dict[str, str], status: int, fragment: str
) -> None:
    body = WIDGET if method == "POST" else None
    got, text = request(server, method, path, body, headers=headers)
    assert (got, fragment in text) == (status, True), f"{case}: {text[:300]}"


def fresh_extender(monkeypatch: pytest.MonkeyPatch) -> Extender:
    monkeypatch.setattr("extender.workload_types.load_defaults", list)
    return Extender(FakeKube(), Options(port=0))


def test_a_forged_token_costs_the_api_server_one_review_per_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    ext = fresh_extender(monkeypatch)
    forged = {"Authorization": "Bearer forged"}
    with serving(ext):
        for _ in range(20):
            assert request(ext.server, "POST", "/api/v1/workload-types", WIDGET, forged)[0] == 401
    kube = ext.kube
    assert isinstance(kube, FakeKube)
    assert sum(1 for _, p, _ in kube.calls if p.endswith("/tokenreviews")) == 1


def test_an_authorizer_that_fails_refuses_the_write_and_the_server_lives_on(monkeypatch: pytest.MonkeyPatch) -> None:
    ext = fresh_extender(monkeypatch)
    kube = ext.kube
    assert isinstance(kube, FakeKube)

    def down(*args: Any, **kwargs: Any) -> Any:
        raise OSError("connection refused")

    kube.request = down  # type: ignore[method-assign]
    with serving(ext):
        got, text = request(ext.server, "DELETE", "/api/v1/stats", None)
        assert got == 503 and "cannot verify credentials" in text
        assert healthy(ext.server)


def test_verb_calls_are_timed_by_phase(server: Server) -> None:
    """/api/v1/stats splits each verb call into read, decode, work, encode and write, and the
    whole (server: first byte to reply sent) covers the parts; a refused body is not timed."""
    assert request(server, "DELETE", "/api/v1/stats")[0] == 200
    body = json.dumps({"Pod": pod("p", gpus=1, uid="u1"), "NodeNames": ["n0", "n1"]}).encode()
    for _ in range(3):
        assert request(server, "POST", "/filter", body)[0] == 200
    assert request(server, "POST", "/filter", b"not json")[0] == 400
    phases = ("read", "decode", "work", "encode", "write", "server")
    # A call's phases are counted once its reply is written: maybe after the client has read it.
    deadline = time.monotonic() + 10
    while True:
        stats = json.loads(request(server, "GET", "/api/v1/stats")[1])["latency"]
        if all(stats.get(f"filter.{p}", {}).get("count") == 3 for p in phases) or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert all(stats[f"filter.{p}"]["count"] == 3 for p in phases)
    assert stats["filter"]["count"] == 4  # the refused call is still a call
    parts = sum(stats[f"filter.{p}"]["p50_ms"] for p in phases[:-1])
    assert stats["filter.server"]["p50_ms"] > 0 and parts > 0


def test_header_names_are_read_without_regard_to_case_and_answers_keep_the_connection(server: Server) -> None:
    """The server's own header reading (`_read_headers`): a lower-case Content-Length frames the
    body, `Expect: 100-continue` gets its interim answer, each answer is one HTTP/1.1 response
    with its length, and the connection serves the next request."""
    with socket.create_connection(server.server_address[:2], timeout=10) as s:
        reader = s.makefile("rb")
        for _ in range(2):
            s.sendall(b"POST /filter HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nEXPECT: 100-continue\r\n\r\n")
            assert reader.readline() == b"HTTP/1.1 100 Continue\r\n"
            assert reader.readline() == b"\r\n"
            s.sendall(b"{}")
            status = reader.readline()
            headers = {}
            while (line := reader.readline()) != b"\r\n":
                name, _, value = line.decode().partition(":")
                headers[name.lower()] = value.strip()
            body = reader.read(int(headers["content-length"]))
            assert status.startswith(b"HTTP/1.1 400 "), status  # {} has no Pod: a verb's own refusal
            assert b"Pod" in body and "connection" not in headers and headers["date"].endswith("GMT")
    assert healthy(server)


def test_accepted_connections_are_counted_once_each_whatever_they_carry(server: Server) -> None:
    """`phalanx_extender_connections_total` counts connections, not requests: kube-scheduler's
    new connection per bind in flight beyond its two idle ones shows there (kwok_throughput
    reports it per pod)."""

    def accepted() -> float:
        return server.metrics.registry.get_sample_value("phalanx_extender_connections_total") or 0.0

    before = accepted()
    with socket.create_connection(server.server_address[:2], timeout=10) as s:
        reader = s.makefile("rb")
        for _ in range(3):
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert reader.readline().startswith(b"HTTP/1.1 200 ")
            while reader.readline() != b"\r\n":
                pass
            assert reader.read(2) == b"ok"
    assert accepted() == before + 1
    assert status_of(raw(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")) == 200
    assert accepted() == before + 2


def test_connection_threads_are_reused_and_end_when_the_server_closes() -> None:
    """Connection after connection (as kube-scheduler's binds open them) is served by the
    threads kept from before, not a new thread each; closing the server ends them."""
    server = Server(("127.0.0.1", 0), verbs={}, metrics=Metrics(), ready=lambda: True)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()

    threads_before = threading.active_count()
    try:
        for _ in range(30):
            reply = raw(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert status_of(reply) == 200
        assert server._workers <= 2  # one, or two while the last one finishes up
        assert server.metrics.registry.get_sample_value("phalanx_extender_connections_total") == 30
    finally:
        server.shutdown()
        server.server_close()
    deadline = time.monotonic() + 10
    while server._workers and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server._workers == 0 and threading.active_count() <= threads_before + 1  # + the serving loop's, ending
