"""HTTP server: the extender verbs, health, readiness, metrics and the read API.

A threading HTTP/1.1 server with keep-alive (kube-scheduler reuses its connections); each
request runs in its own thread, so a bind that waits never blocks a filter. Malformed input
gets 400 with a message, an internal fault 500; nothing a client sends can stop the server.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from extender.metrics import Metrics
from extender.verbs import BadRequest

log = structlog.get_logger("phalanx.server")

MAX_BODY = 64 * 2**20

Route = Callable[[dict[str, Any]], Any]
#: A REST collection: (method, path below the prefix, raw body) -> (status, JSON body).
Api = Callable[[str, str, bytes], tuple[int, Any]]


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        *,
        verbs: dict[str, Route],
        metrics: Metrics,
        ready: Callable[[], bool],
        reads: dict[str, Callable[[str], tuple[int, Any]]] | None = None,
        apis: dict[str, Api] | None = None,
    ) -> None:
        super().__init__(address, _Handler)
        self.verbs = verbs
        self.connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self.metrics = metrics
        self.ready = ready
        self.reads = reads or {}
        self.apis = apis or {}

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
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._send(200, b"ok", "text/plain")
        elif path == "/readyz":
            ok = self.server.ready()
            self._send(200 if ok else 503, b"ok" if ok else b"cache not synced", "text/plain")
        elif path == "/metrics":
            self._send(200, generate_latest(self.server.metrics.registry), CONTENT_TYPE_LATEST)
        elif path == "/api/v1/stats":
            self._json(200, {"latency": self.server.metrics.percentiles()})
        elif not self._api("GET", path):
            for prefix, read in self.server.reads.items():
                if path.startswith(prefix):
                    status, body = read(path[len(prefix) :])
                    self._json(status, body)
                    return
            self._json(404, {"error": f"no route {path}"})

    def do_DELETE(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/api/v1/stats":
            self.server.metrics.reset_samples()
            self._json(200, {"reset": True})
        elif not self._api("DELETE", path):
            self._json(404, {"error": f"no route {self.path}"})

    def do_PUT(self) -> None:
        if not self._api("PUT", self.path.split("?", 1)[0]):
            self._json(404, {"error": f"no route {self.path}"})

    def _api(self, method: str, path: str) -> bool:
        """Serve `path` from a REST collection if one owns it; False if none does."""
        for prefix, api in self.server.apis.items():
            if path == prefix or path.startswith(prefix + "/"):
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                    if length > MAX_BODY:
                        self._json(413, {"error": f"body larger than {MAX_BODY} bytes"})
                        return True
                    body = self.rfile.read(length) if length > 0 else b""
                    status, reply = api(method, path[len(prefix) :], body)
                except Exception as e:
                    log.exception("internal error", path=path, method=method)
                    status, reply = 500, {"error": f"internal error: {e}"}
                self._json(status, reply)
                return True
        return False

    def do_POST(self) -> None:
        if self._api("POST", self.path.split("?", 1)[0]):
            return
        verb = self.path.strip("/").split("?", 1)[0]
        route = self.server.verbs.get(verb)
        if route is None:
            self._json(404, {"Error": f"unknown verb {verb!r}"})
            return
        started = time.perf_counter()
        status, reply = self._call(verb, route)
        body = orjson.dumps(reply)
        # Recorded before the reply leaves, so a client that reads /metrics next sees this call.
        self.server.metrics.observe(verb, time.perf_counter() - started)
        self._send(status, body, "application/json")

    def _call(self, verb: str, route: Route) -> tuple[int, Any]:
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length <= 0 or length > MAX_BODY:
                raise BadRequest(f"{verb}: body missing or larger than {MAX_BODY} bytes")
            try:
                args = orjson.loads(self.rfile.read(length))
            except orjson.JSONDecodeError as e:
                raise BadRequest(f"{verb}: body is not JSON: {e}") from None
            if not isinstance(args, dict):
                raise BadRequest(f"{verb}: body must be a JSON object")
            return 200, route(args)
        except BadRequest as e:
            self.server.metrics.errors.labels(verb, "bad-request").inc()
            log.warning("bad request", verb=verb, error=str(e))
            return 400, {"Error": str(e)}
        except Exception as e:
            self.server.metrics.errors.labels(verb, "internal").inc()
            log.exception("internal error", verb=verb)
            return 500, {"Error": f"internal error in {verb}: {e}"}

    def _json(self, status: int, body: Any) -> None:
        self._send(status, orjson.dumps(body), "application/json")

    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
