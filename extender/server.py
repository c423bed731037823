"""HTTP server: the extender verbs, health, readiness, metrics and the REST APIs.

A threading HTTP/1.1 server with keep-alive (kube-scheduler reuses its connections); each
request runs in its own thread, so a bind that waits never blocks a filter. One route table
(`Server.routes`, built in `__init__`) maps method and path to a handler; malformed input gets
400 with a message, an internal fault 500; nothing a client sends can stop the server.
Per-call logging is the handlers' own (one debug line per verb call), not the server's.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from extender.errors import BadRequest, NotReady
from extender.metrics import Metrics

log = structlog.get_logger("phalanx.server")

MAX_BODY = 64 * 2**20

#: An extender verb: the request's JSON object -> the reply's JSON.
Verb = Callable[[dict[str, Any]], Any]
#: A read: the path below the route's prefix -> (status, JSON body).
Read = Callable[[str], tuple[int, Any]]
#: A REST collection: (method, path below the prefix, raw body) -> (status, JSON body).
Api = Callable[[str, str, bytes], tuple[int, Any]]


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    content_type: str = "application/json"

    @staticmethod
    def json(status: int, body: Any) -> Reply:
        return Reply(status, orjson.dumps(body))


#: A route's handler: (method, path below the route's path, raw body) -> reply.
Handler = Callable[[str, str, bytes], Reply]


@dataclass(frozen=True, slots=True)
class Route:
    methods: frozenset[str]
    path: str
    handler: Handler
    prefix: bool = False  # also serves every path below `path` + "/"
    body: bool = False  # reads the request body

    def matches(self, method: str, path: str) -> bool:
        if method not in self.methods:
            return False
        return path == self.path or (self.prefix and path.startswith(self.path.rstrip("/") + "/"))


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        *,
        verbs: dict[str, Verb],
        metrics: Metrics,
        ready: Callable[[], bool],
        reads: dict[str, Read] | None = None,
        apis: dict[str, Api] | None = None,
    ) -> None:
        super().__init__(address, _Handler)
        self.connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self.metrics = metrics
        self.ready = ready
        get, post, delete = frozenset({"GET"}), frozenset({"POST"}), frozenset({"DELETE"})
        any_ = get | post | delete | {"PUT"}
        # The route table: first match wins.
        self.routes: list[Route] = [
            Route(get, "/healthz", lambda m, p, b: Reply(200, b"ok", "text/plain")),
            Route(get, "/readyz", self._readyz),
            Route(get, "/metrics", lambda m, p, b: Reply(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)),
            Route(get, "/api/v1/stats", lambda m, p, b: Reply.json(200, {"latency": metrics.percentiles()})),
            Route(delete, "/api/v1/stats", self._reset_stats),
            *(Route(any_, prefix, _api(api), prefix=True, body=True) for prefix, api in (apis or {}).items()),
            *(Route(get, prefix, _read(read), prefix=True) for prefix, read in (reads or {}).items()),
            *(
                Route(frozenset({"POST"}), f"/{name}", self._verb(name, verb), body=True)
                for name, verb in verbs.items()
            ),
        ]

    def route(self, method: str, path: str) -> Route | None:
        return next((r for r in self.routes if r.matches(method, path)), None)

    def _readyz(self, method: str, path: str, body: bytes) -> Reply:
        ok = self.ready()
        return Reply(200 if ok else 503, b"ok" if ok else b"cache not synced", "text/plain")

    def _reset_stats(self, method: str, path: str, body: bytes) -> Reply:
        self.metrics.reset_samples()
        return Reply.json(200, {"reset": True})

    def _verb(self, name: str, verb: Verb) -> Handler:
        def handle(method: str, path: str, body: bytes) -> Reply:
            started = time.perf_counter()
            status, reply = self._call(name, verb, body)
            data = orjson.dumps(reply)
            # Recorded before the reply leaves, so a client that reads /metrics next sees this call.
            self.metrics.observe(name, time.perf_counter() - started)
            return Reply(status, data)

        return handle

    def _call(self, name: str, verb: Verb, body: bytes) -> tuple[int, Any]:
        try:
            if not body:
                raise BadRequest(f"{name}: body missing")
            try:
                args = orjson.loads(body)
            except orjson.JSONDecodeError as e:
                raise BadRequest(f"{name}: body is not JSON: {e}") from None
            if not isinstance(args, dict):
                raise BadRequest(f"{name}: body must be a JSON object")
            return 200, verb(args)
        except NotReady as e:
            self.metrics.errors.labels(name, "not-ready").inc()
            return 503, {"Error": str(e)}
        except BadRequest as e:
            self.metrics.errors.labels(name, "bad-request").inc()
            log.warning("bad request", verb=name, error=str(e))
            return 400, {"Error": str(e)}
        except Exception as e:
            self.metrics.errors.labels(name, "internal").inc()
            log.exception("internal error", verb=name)
            return 500, {"Error": f"internal error in {name}: {e}"}

    def track(self, conn: socket.socket, *, open_: bool) -> None:
        with self._connections_lock:
            (self.connections.add if open_ else self.connections.discard)(conn)

    def close_connections(self) -> None:
        """Drop every client connection (shutdown only stops accepting new ones): a stopping
        extender must not keep answering kube-scheduler on kept-alive connections."""
        with self._connections_lock:
            connections = list(self.connections)
        for conn in connections:
            with contextlib.suppress(OSError):  # already closed by the client
                conn.shutdown(socket.SHUT_RDWR)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


def _read(read: Read) -> Handler:
    def handle(method: str, path: str, body: bytes) -> Reply:
        return Reply.json(*read(path))

    return handle


def _api(api: Api) -> Handler:
    def handle(method: str, path: str, body: bytes) -> Reply:
        try:
            return Reply.json(*api(method, path, body))
        except Exception as e:
            log.exception("internal error", path=path, method=method)
            return Reply.json(500, {"error": f"internal error: {e}"})

    return handle


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, the body waits for the
    # client's delayed ACK (40 ms on Linux) on every keep-alive call.
    disable_nagle_algorithm = True
    server: Server

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, open_=True)

    def finish(self) -> None:
        self.server.track(self.connection, open_=False)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one structured line per call is logged by the verbs

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        route = self.server.route(method, path)
        if route is None:
            if method == "POST":
                self._send(Reply.json(404, {"Error": f"unknown verb or route {path!r}"}))
            else:
                self._send(Reply.json(404, {"error": f"no route {method} {path}"}))
            return
        body = b""
        if route.body:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                self.close_connection = True  # the rest of the stream cannot be framed
                self._send(Reply.json(400, {"Error": "Content-Length is not a number"}))
                return
            if length > MAX_BODY or length < 0:
                self.close_connection = True
                self._send(Reply.json(413, {"Error": f"body larger than {MAX_BODY} bytes"}))
                return
            body = self.rfile.read(length) if length else b""
        rest = path[len(route.path.rstrip("/")) :] if route.prefix else ""
        self._send(route.handler(method, rest, body))

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        self.wfile.write(reply.body)
