"""extender/http1.py against real sockets: kept-alive connections reused, bodies by length and
chunked, a connection the server closed replaced (before use, or once after a send that got no
answer), malformed answers refused as OSError, TLS with a client certificate."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from extender import http1
from extender.kube import RestKube, Unreachable
from tests import certs

#: (connection number, request number on it, the request's bytes) -> bytes to send; None closes;
#: CLOSE_AFTER at the end of the bytes: sent, then the connection closed.
Responder = Callable[[int, int, bytes], bytes | None]
CLOSE_AFTER = b"\x00close"


def _ok(body: bytes = b'{"kind":"Status","code":201}', status: str = "201 Created") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        status.encode(),
        len(body),
        body,
    )


def _read_request(reader: Any) -> bytes | None:
    readline = reader.readline
    head: bytes = b""
    length = 0
    while True:
        line = readline(65536)
        if not line:
            return None
        head += line
        if line in (b"\r\n", b"\n"):
            break
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    data: bytes = reader.read(length)
    return head + data


@contextmanager
def scripted(respond: Responder, tls: ssl.SSLContext | None = None) -> Iterator[tuple[int, list[bytes]]]:
    """A loopback server answering each request as `respond` says; yields (port, requests seen)."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []
    stop = threading.Event()

    def serve(conn: socket.socket, number: int) -> None:
        reader = None
        try:
            if tls is not None:
                conn = tls.wrap_socket(conn, server_side=True)
            reader = conn.makefile("rb")
            for index in range(1000):
                request = _read_request(reader)
                if request is None:
                    return
                seen.append(request)
                answer = respond(number, index, request)
                if answer is None:
                    return
                conn.sendall(answer.removesuffix(CLOSE_AFTER))
                if answer.endswith(CLOSE_AFTER):
                    return
        except (OSError, ssl.SSLError):
            return
        finally:
            if reader is not None:
                reader.close()  # the file holds the socket open past conn.close()
            conn.close()

    def accept() -> None:
        number = 0
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn, number), daemon=True).start()
            number += 1

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1], seen
    finally:
        stop.set()
        listener.close()


def test_requests_share_one_kept_alive_connection_and_bodies_arrive_whole() -> None:
    connections: set[int] = set()

    def respond(conn: int, index: int, request: bytes) -> bytes:
        connections.add(conn)
        return _ok(request.split(b"\r\n\r\n", 1)[1])

    with scripted(respond) as (port, seen):
        c = http1.Client(f"http://127.0.0.1:{port}")
        for i in range(5):
            status, body = c.request("POST", f"/p/{i}?x=1", {"Content-Type": "application/json"}, b'{"i":%d}' % i)
            assert (status, body) == (201, b'{"i":%d}' % i)
    assert connections == {0}
    assert seen[0].startswith(b"POST /p/0?x=1 HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nContent-Length: 7\r\n" in seen[0]


def test_a_burst_waits_for_the_connections_there_are_instead_of_opening_more() -> None:
    """32 requests at once on a client of 4 connections: at most 4 exist, all kept and reused
    (a gang's 512 Bindings when its gate opens, without 448 TLS handshakes)."""
    connections: set[int] = set()
    busy = [0, 0]  # requests being answered now, the most at once
    lock = threading.Lock()

    def respond(conn: int, index: int, request: bytes) -> bytes:
        with lock:
            connections.add(conn)
            busy[0] += 1
            busy[1] = max(busy)
        time.sleep(0.02)
        with lock:
            busy[0] -= 1
        return _ok()

    with scripted(respond) as (port, seen):
        c = http1.Client(f"http://127.0.0.1:{port}", maxsize=4)
        threads = [threading.Thread(target=c.request, args=("POST", f"/p/{i}", {}, b"{}")) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert len(seen) == 32
    assert len(connections) <= 4 and busy[1] <= 4
    assert len(c._idle) == len(connections)  # every one kept for the next burst


def test_a_request_that_finds_no_connection_free_in_time_fails_as_an_os_error() -> None:
    with scripted(lambda conn, index, request: _ok()) as (port, seen):
        c = http1.Client(f"http://127.0.0.1:{port}", maxsize=1, read_timeout_s=0.3)
        assert c._slots.acquire(timeout=1)  # the one connection busy (another request's)
        with pytest.raises(OSError, match=r"no connection to 127\.0\.0\.1:\d+ free"):
            c.request("POST", "/next", {}, b"{}")
        c._slots.release()
        assert c.request("POST", "/next", {}, b"{}")[0] == 201
    assert len(seen) == 1


def test_a_base_url_with_a_path_prefixes_every_request() -> None:
    # kube-apiserver behind a proxy's per-cluster path, as urllib3 requests it (host + path).
    with scripted(lambda c, i, r: _ok(b"")) as (port, seen):
        http1.Client(f"http://127.0.0.1:{port}/k8s/clusters/c-1/").request("PATCH", "/api/v1/x?a=b", {}, b"{}")
    assert seen[0].startswith(b"PATCH /k8s/clusters/c-1/api/v1/x?a=b HTTP/1.1\r\n")


def test_a_chunked_answer_with_trailers_is_joined_and_close_is_honoured() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\nabcd\r\n3\r\nefg\r\n0\r\nX-T: 1\r\n\r\n"
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    connections: set[int] = set()

    def respond(conn: int, index: int, request: bytes) -> bytes:
        connections.add(conn)
        return chunked if b"/chunked" in request else closing

    with scripted(respond) as (port, _):
        c = http1.Client(f"http://127.0.0.1:{port}")
        assert c.request("PATCH", "/chunked", {}, b"{}") == (200, b"abcdefg")
        assert c.request("POST", "/close", {}, b"{}") == (200, b"ok")  # same connection, then closed
        assert c.request("POST", "/chunked", {}, b"{}") == (200, b"abcdefg")  # a new one
    assert connections == {0, 1}


def test_an_interim_100_continue_is_skipped() -> None:
    with scripted(lambda c, i, r: b"HTTP/1.1 100 Continue\r\n\r\n" + _ok(b"x")) as (port, _):
        assert http1.Client(f"http://127.0.0.1:{port}").request("POST", "/", {}, b"") == (201, b"x")


def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    # The server answers one request per connection and closes it after, without saying so.
    with scripted(lambda conn, i, r: _ok(b"%d" % conn) + CLOSE_AFTER) as (port, seen):
        c = http1.Client(f"http://127.0.0.1:{port}")
        assert c.request("POST", "/", {}, b"") == (201, b"0")
        kept = c._idle[0]
        deadline = time.monotonic() + 10
        while kept.idle_and_open() and time.monotonic() < deadline:  # until the close reaches us
            threading.Event().wait(0.02)
        assert not kept.idle_and_open()  # seen closed while idle: never written to
        assert c.request("POST", "/", {}, b"") == (201, b"1")
    assert len(seen) == 2


def test_the_retry_after_a_dead_connection_never_takes_another_kept_one() -> None:
    # Two kept-alive connections, both dying at their next request without an answer: the
    # first attempt takes one, the retry opens a third instead of taking the other.
    def respond(conn: int, index: int, request: bytes) -> bytes | None:
        return None if conn < 2 and index == 1 else _ok(b"%d" % conn)

    with scripted(respond) as (port, _):
        c = http1.Client(f"http://127.0.0.1:{port}")
        results: list[tuple[int, bytes]] = []
        threads = [threading.Thread(target=lambda: results.append(c.request("POST", "/", {}, b""))) for _ in range(2)]
        barrier = threading.Barrier(2)
        originals = c._exchange

        def slow(*args: object, **kwargs: object) -> tuple[int, bytes, bool]:  # both in flight at once
            barrier.wait(5)
            return originals(*args, **kwargs)  # type: ignore[arg-type]

        c._exchange = slow  # type: ignore[method-assign]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        del c._exchange  # the class's own again (an instance attribute would make a cycle)
        assert sorted(results) == [(201, b"0"), (201, b"1")] and len(c._idle) == 2
        assert c.request("POST", "/", {}, b"") == (201, b"2")
        c.close()


def test_a_reused_connection_that_dies_before_answering_is_retried_once_on_a_fresh_one() -> None:
    # Connection 0 answers once, then reads the next request and closes without an answer.
    def respond(conn: int, index: int, request: bytes) -> bytes | None:
        return None if conn == 0 and index == 1 else _ok(b"%d.%d" % (conn, index))

    with scripted(respond) as (port, seen):
        c = http1.Client(f"http://127.0.0.1:{port}")
        assert c.request("POST", "/a", {}, b"") == (201, b"0.0")
        assert c.request("POST", "/b", {}, b"") == (201, b"1.0")
    assert [r.split(b" ")[1] for r in seen] == [b"/a", b"/b", b"/b"]


@pytest.mark.parametrize(
    "answer",
    [
        b"SMTP ready\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXX",
        b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 300 + b"\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nabcde\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"HTTP/1.\xff 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"",  # closed at once on a fresh connection
    ],
)
def test_a_malformed_answer_is_an_os_error_and_the_connection_is_not_kept(answer: bytes) -> None:
    with scripted(lambda c, i, r: answer or None) as (port, _):
        c = http1.Client(f"http://127.0.0.1:{port}", read_timeout_s=2)
        with pytest.raises(OSError):
            c.request("POST", "/", {}, b"{}")
        assert c._idle == []


def test_tls_with_the_cas_verification_and_a_client_certificate(tmp_path: Path) -> None:
    ca = certs.ca(tmp_path, "ca")
    server = certs.signed(tmp_path, "server", ca, server=True)
    user = certs.signed(tmp_path, "user", ca)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca.cert))
    context.load_cert_chain(str(server.cert), str(server.key))
    context.verify_mode = ssl.CERT_REQUIRED
    with scripted(lambda c, i, r: _ok(b"tls"), tls=context) as (port, _):
        files = http1.TLSFiles(True, str(ca.cert), str(user.cert), str(user.key))
        assert http1.Client(f"https://127.0.0.1:{port}", files).request("POST", "/", {}, b"") == (201, b"tls")
        url = f"https://127.0.0.1:{port}"
        with pytest.raises(OSError):  # no client certificate: the server refuses the handshake
            http1.Client(url, http1.TLSFiles(True, str(ca.cert))).request("POST", "/", {}, b"")
        other = certs.ca(tmp_path, "other")
        with pytest.raises(ssl.SSLCertVerificationError):  # a server the CA did not sign
            http1.Client(url, http1.TLSFiles(True, str(other.cert))).request("POST", "/", {}, b"")


def test_rest_kube_sends_writes_through_it_and_reads_through_urllib3() -> None:
    def respond(conn: int, index: int, request: bytes) -> bytes:
        if request.startswith(b"GET"):
            return _ok(b'{"kind":"Pod"}', "200 OK")
        return _ok(b'{"kind":"Status","code":201}')

    with scripted(respond) as (port, seen):
        cfg = client.Configuration()
        cfg.host = f"http://127.0.0.1:{port}"
        cfg.api_key = {"authorization": "Bearer t0ken"}
        kube = RestKube(cfg)
        response = kube.request("POST", "/api/v1/namespaces/a/pods/b/binding", body={"kind": "Binding"})
        assert (response.status, response.body) == (201, {"kind": "Status", "code": 201})
        assert kube.request("GET", "/api/v1/namespaces/a/pods/b").body == {"kind": "Pod"}
    post = next(r for r in seen if r.startswith(b"POST"))
    assert b"\r\nAuthorization: Bearer t0ken\r\n" in post
    assert b"\r\nContent-Type: application/json\r\n" in post
    assert post.endswith(b'{"kind":"Binding"}')


def test_rest_kube_reports_a_write_to_a_server_that_is_gone_as_unreachable() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{port}"
    with pytest.raises(Unreachable):
        RestKube(cfg).request("POST", "/api/v1/namespaces/a/events", body={})


def test_a_repeated_connection_header_keeps_its_close() -> None:
    answer = b"HTTP/1.1 200 OK\r\nConnection: close\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok"
    with scripted(lambda c, i, r: answer) as (port, _):
        c = http1.Client(f"http://127.0.0.1:{port}")
        assert c.request("POST", "/", {}, b"") == (200, b"ok")
        assert c._idle == []


@pytest.mark.parametrize(
    ("target", "headers"),
    [
        ("/a HTTP/1.1\r\nX-Smuggled: 1", {}),
        ("/a", {"Authorization": "Bearer t\r\nX-Smuggled: 1"}),
        ("/a", {"X-Bad Name": "v"}),
        ("/pods/caf\u00e9", {}),
    ],
)
def test_a_request_that_would_carry_line_breaks_or_non_ascii_is_never_sent(
    target: str, headers: dict[str, str]
) -> None:
    with scripted(lambda c, i, r: _ok()) as (port, seen), pytest.raises(http1.ProtocolFault):
        http1.Client(f"http://127.0.0.1:{port}").request("POST", target, headers, b"")
    assert seen == []
