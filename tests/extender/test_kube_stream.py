"""RestKube.stream against a real socket: a server that never sends the response headers is
given up on within HEADERS_S (the reflector then retries), while a watch whose body idles
longer than that is kept."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from kubernetes import client

from extender import kube
from extender.kube import RestKube, Unreachable


@contextmanager
def server(answer: bytes | None, *, pause_s: float = 0.0, then: bytes = b"") -> Iterator[int]:
    """A one-connection HTTP server on loopback: reads the request, then sends `answer` (None:
    nothing, ever), waits `pause_s` and sends `then`. Yields its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            if answer is not None:
                conn.sendall(answer)
                time.sleep(pause_s)
                conn.sendall(then)
            done.wait(10)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        done.set()
        thread.join(10)
        listener.close()


def rest(port: int) -> RestKube:
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{port}"
    return RestKube(cfg)


def test_a_watch_without_response_headers_is_given_up_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube, "HEADERS_S", 0.5)
    with server(None) as port:
        started = time.monotonic()
        with pytest.raises(Unreachable):
            list(rest(port).stream("/api/v1/pods", {"watch": "1", "timeoutSeconds": "300"}))
        assert time.monotonic() - started < 5  # not the 330 s the body may idle


def test_a_watch_body_may_idle_longer_than_the_header_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube, "HEADERS_S", 0.5)
    headers = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    event = b'{"type":"ADDED","object":{"metadata":{"name":"p"}}}\n'
    chunk = b"%x\r\n%s\r\n" % (len(event), event)  # as kube-apiserver streams a watch
    with server(headers, pause_s=1.5, then=chunk) as port:
        events = rest(port).stream("/api/v1/pods", {"watch": "1", "timeoutSeconds": "300"})
        assert next(events)["object"]["metadata"]["name"] == "p"


def test_watch_lines_are_framed_across_chunks_and_within_one() -> None:
    """Events as kube-apiserver streams them (one chunk each), several in one chunk, one split
    across chunks, blank lines between: each decoded once, in order; a last line without its
    newline (the stream cut mid-event) is not."""
    events = [b'{"type":"ADDED","object":{"n":%d}}' % i for i in range(5)]
    pieces = [
        events[0] + b"\n",
        events[1] + b"\n" + events[2] + b"\n\n",
        events[3][:9],
        events[3][9:] + b"\n",
        events[4],
    ]
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    headers = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    with server(headers + body) as port:
        got = list(rest(port).stream("/api/v1/pods", {"watch": "1", "timeoutSeconds": "5"}))
    assert [e["object"]["n"] for e in got] == [0, 1, 2, 3]
