"""HTTP server: the extender verbs, health, readiness, metrics and the REST APIs.

A threading HTTP/1.1 server with keep-alive (kube-scheduler reuses its connections); each
request runs in its own thread, so a bind that waits never blocks a filter. One route table
(`Server.routes`, built in `__init__`) maps method and path to a handler; malformed input gets
400 with a message, an internal fault 500; nothing a client sends can stop the server.
Per-call logging is the handlers' own (one debug line per verb call), not the server's.
Past 400 lines on purpose: the route table and the framing limits of one HTTP/1.1 connection
are one concern, what a client can make this process do; split, each half would need the other.

Every client is bounded (`Limits`): the body size per route (413), the time to read one
request once its first byte arrives (408, then the connection is dropped: a client that
declares more than it sends holds its thread for seconds, not forever), the idle time of a
kept-alive connection, and the number of connections, each holding one thread (past it, a
fast 503 and close). The handler's own time is not bounded here: bind waits at the gang gate.

Every `/api/v1` call needs a Kubernetes token whose user RBAC allows it (`auth.py`).
The verbs are for kube-scheduler: on the pod's loopback by default; on a TLS port with a client
CA (`tls.py`), only for a client whose certificate that CA signed (401 otherwise).
"""

from __future__ import annotations

import contextlib
import io
import os
import queue
import re
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote

import orjson
import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from extender.auth import GROUP, READ_METHODS, WRITE_VERBS, Access, Authorizer, Denied
from extender.errors import BadRequest, NotReady
from extender.metrics import Metrics
from extender.outcomes import Then
from extender.tls import ServerTLS

log = structlog.get_logger("phalanx.server")


@dataclass(frozen=True, slots=True)
class Limits:
    """What one client may take of the server."""

    # Bytes of a verb's body. With nodeCacheCapable kube-scheduler sends names only: a pod
    # (etcd caps an object at 1.5 MiB) plus 15,000 names of up to 253 characters is ~5 MiB, and
    # preempt's victims (max(100, 10% of nodes) candidates x 110 pods) ~3 MiB. More is hostile.
    verb_body: int = 8 * 2**20
    # Bytes of a REST body: a workload type is stored in a ConfigMap, 1 MiB at most.
    api_body: int = 2**20
    # Seconds to read one request (line, headers, body) from its first byte: kube-scheduler
    # on the same host sends a few MiB in milliseconds; a client that lies is gone in seconds.
    read_timeout_s: float = 10.0
    # Seconds a kept-alive connection may wait for its next request: longer than Go's 90 s
    # IdleConnTimeout, so kube-scheduler always closes first and never sends on a connection
    # the server is closing.
    idle_timeout_s: float = 120.0
    # Open connections, one thread each; past it, 503 and close. Every member of a gang holds
    # a bind at the gate at once: room for a 512-member gang twice over.
    connections: int = 1024


#: Bytes read (and dropped) from a body sent where none is expected, to keep the stream framed.
IGNORED_BODY = 64 * 2**10
#: Seconds a connection thread waits for a next connection before it ends, and how many
#: such threads are kept at most (kube-scheduler has 20-30 binds in flight at full speed).
WORKER_IDLE_S = 30.0
KEEP_IDLE = 32
_BUSY_BODY = b'{"Error":"too many connections, retry in a second"}'
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)

#: An extender verb: the request's JSON object -> the reply's JSON (or a `Then`: extender/outcomes.py).
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
    verb: str = ""  # a scheduler verb's reply: its phases are timed (Metrics.observe_phases)
    phases: dict[str, float] | None = None  # decode, work, encode (seconds)
    headers: tuple[tuple[str, str], ...] = ()  # extra response headers (Retry-After, X-RateLimit-*)
    # A stream (server-sent events): written chunk by chunk after the headers, without a
    # length; the connection closes when it ends. `body` is ignored.
    stream: Iterator[bytes] | None = None
    after: Callable[[], None] | None = None  # run once the reply is sent (`Then`)

    @staticmethod
    def json(status: int, body: Any) -> Reply:
        return Reply(status, orjson.dumps(body))


#: A route's handler: (method, path below the route's path, raw body) -> reply.
Handler = Callable[[str, str, bytes], Reply]


@dataclass(frozen=True, slots=True)
class Request:
    """One call as a handler that needs more than the body sees it (the allocation API)."""

    method: str
    path: str  # below the route's path
    query: dict[str, list[str]]
    headers: Mapping[str, str]  # names lower-cased; the last of repeated ones
    body: bytes
    client: str = ""

    def param(self, name: str, default: str = "") -> str:
        values = self.query.get(name)
        return values[-1] if values else default


#: A handler given the whole request (`Route.on_request`).
RequestHandler = Callable[[Request], Reply]


def _no_handler(method: str, path: str, body: bytes) -> Reply:
    return Reply.json(500, {"error": "route has no handler"})


@dataclass(frozen=True, slots=True)
class Route:
    methods: frozenset[str]
    path: str
    handler: Handler
    prefix: bool = False  # also serves every path below `path` + "/"
    max_body: int = 0  # bytes of body it reads; 0: none expected (up to IGNORED_BODY dropped)
    # The RBAC resource it serves (`auth.py`): every call needs a token whose user RBAC allows
    # the call's verb on it (GET: `get` one object, `list` the collection; writes: create,
    # update, patch, delete). "": open (verbs, health, metrics).
    rbac: str = ""
    group: str = GROUP
    namespaced: bool = False  # the path below the route is <namespace>[/<name>]
    # A verb: on a TLS server with a client CA, only for a client with a verified certificate.
    verb: bool = False
    # The RBAC verb whatever the method (a POST that only reads, e.g. a preview: "get").
    rbac_verb: str = ""
    # Given the whole request instead of (method, path, body); authorises its calls itself.
    on_request: RequestHandler | None = None

    def access(self, method: str, rest: str) -> Access | None:
        if not self.rbac:
            return None
        parts = [unquote(p) for p in rest.strip("/").split("/") if p]
        namespace = parts.pop(0) if self.namespaced and parts else ""
        name = "/".join(parts)
        if self.rbac_verb:
            verb = self.rbac_verb
        elif method in READ_METHODS:
            verb = "get" if name else "list"
        elif method in WRITE_VERBS:
            verb = WRITE_VERBS[method]
        else:
            return None
        return Access(verb, self.rbac, name, self.group, namespace)

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
        limits: Limits = Limits(),
        authorizer: Authorizer | None = None,
        tls: ServerTLS | None = None,
        routes: list[Route] | None = None,
        first_routes: list[Route] | None = None,
        admin: bool = True,
    ) -> None:
        self.limits = limits
        self.authorizer = authorizer
        self.tls = tls
        self._slots = threading.BoundedSemaphore(limits.connections)
        # Connection threads are kept and reused (see `process_request`).
        self._accepted: queue.SimpleQueue[tuple[Any, Any] | None] = queue.SimpleQueue()
        self._workers_lock = threading.Lock()
        self._idle = 0  # workers free for the next connection (waiting, or about to)
        self._workers = 0
        if ":" in address[0]:
            self.address_family = socket.AF_INET6  # e.g. "::" (every address, IPv6 and mapped IPv4)
        super().__init__(address, _Handler)
        self.connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self.metrics = metrics
        self.ready = ready
        get, post, delete = frozenset({"GET"}), frozenset({"POST"}), frozenset({"DELETE"})
        any_ = get | post | delete | {"PUT"}
        # The route table: first match wins. `admin`: health, metrics and stats (a port that
        # serves only `routes`, such as the admission webhooks', goes without).
        admin_routes = [
            Route(get, "/healthz", lambda m, p, b: Reply(200, b"ok", "text/plain")),
            Route(get, "/readyz", self._readyz),
            Route(get, "/metrics", lambda m, p, b: Reply(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)),
            Route(
                get, "/api/v1/stats", lambda m, p, b: Reply.json(200, {"latency": metrics.percentiles()}), rbac="stats"
            ),
            Route(delete, "/api/v1/stats", self._reset_stats, rbac="stats"),
        ]
        # Where the route of a (method, exact path) is in the table: the verbs come last.
        self._exact: dict[tuple[str, str], int] = {}
        self.routes: list[Route] = [
            *(admin_routes if admin else ()),
            *(first_routes or ()),  # before the reads: they serve paths below a read's prefix
            *(
                Route(any_, prefix, _api(api), prefix=True, max_body=limits.api_body, rbac=_resource(prefix))
                for prefix, api in (apis or {}).items()
            ),
            *(_read_route(prefix, read) for prefix, read in (reads or {}).items()),
            *(routes or ()),
            *(
                Route(post, f"/{name}", self._verb(name, verb), max_body=limits.verb_body, verb=True)
                for name, verb in verbs.items()
            ),
        ]

    def route(self, method: str, path: str) -> Route | None:
        at = self._exact.get((method, path))
        if at is not None and at < len(self.routes) and self.routes[at].matches(method, path):
            return self.routes[at]
        at = next((i for i, r in enumerate(self.routes) if r.matches(method, path)), None)
        if at is None:
            return None
        if not self.routes[at].prefix:
            self._exact[(method, path)] = at  # finitely many: a route's own path, its methods
        return self.routes[at]

    def allowed(self, path: str) -> list[str]:
        """The methods some route serves at `path` (for 405's Allow header)."""
        return sorted({m for r in self.routes for m in r.methods if r.matches(m, path)})

    def process_request(self, request: Any, client_address: Any) -> None:
        """One thread per connection, at most `limits.connections` at once: past it the
        connection gets 503 from the accepting thread and is closed, without a thread. The
        threads are kept for the next connections (`_work`): a free one takes it, else a new
        one starts."""
        if not self._slots.acquire(blocking=False):
            self.metrics.errors.labels("server", "too-many-connections").inc()
            with contextlib.suppress(OSError):
                request.setblocking(False)  # a fresh socket's buffer takes it; never wait here
                request.send(_BUSY)
            self.shutdown_request(request)
            return
        self.metrics.connections.inc()
        with self._workers_lock:
            reserved = self._idle > 0
            if reserved:
                self._idle -= 1
            else:
                self._workers += 1
        if not reserved:
            try:
                threading.Thread(target=self._work, name="phalanx-http", daemon=True).start()
            except BaseException:
                with self._workers_lock:
                    self._workers -= 1
                self._slots.release()  # the thread never started
                raise
        self._accepted.put((request, client_address))

    def _work(self) -> None:
        """A connection thread: serves one connection at a time, then waits for the next for
        up to WORKER_IDLE_S. kube-scheduler keeps only two idle connections to an extender, so
        most binds in flight come on a new connection (about 0.7 per scheduled pod); a thread
        started and ended for each cost the acceptor a wait for the thread's start and the
        process a thread's set-up and teardown each time."""
        while True:
            try:
                item = self._accepted.get(timeout=WORKER_IDLE_S)
            except queue.Empty:
                with self._workers_lock:
                    if self._idle > 0:  # still counted free: leave (else a connection is on its way)
                        self._idle -= 1
                        self._workers -= 1
                        return
                continue
            if item is None:  # server_close
                with self._workers_lock:
                    self._workers -= 1
                return
            self.process_request_thread(*item)
            with self._workers_lock:
                if self._idle >= KEEP_IDLE:  # after a burst: keep what a busy scheduler uses
                    self._workers -= 1
                    return
                self._idle += 1

    def server_close(self) -> None:
        super().server_close()
        with self._workers_lock:
            workers = self._workers
        for _ in range(workers):
            self._accepted.put(None)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # a client that reset or left mid-request: nothing to fix here
        log.exception("connection handler failed", client=str(client_address))

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _readyz(self, method: str, path: str, body: bytes) -> Reply:
        ok = self.ready()
        return Reply(200 if ok else 503, b"ok" if ok else b"cache not synced", "text/plain")

    def _stats(self, method: str, path: str, body: bytes) -> Reply:
        return Reply.json(200, {"latency": self.metrics.percentiles()})

    def _reset_stats(self, method: str, path: str, body: bytes) -> Reply:
        self.metrics.reset_samples()
        return Reply.json(200, {"reset": True})

    def _verb(self, name: str, verb: Verb) -> Handler:
        def handle(method: str, path: str, body: bytes) -> Reply:
            clock = [time.perf_counter()]  # started, decoded, worked
            status, reply = self._call(name, verb, body, clock)
            after = None
            if isinstance(reply, Then):
                reply, after = reply.reply, reply.after
            data = orjson.dumps(reply)
            done = time.perf_counter()
            # Recorded before the reply leaves, so a client that reads /metrics next sees this call.
            self.metrics.observe(name, done - clock[0])
            phases = None
            if len(clock) == 3:
                phases = {"decode": clock[1] - clock[0], "work": clock[2] - clock[1], "encode": done - clock[2]}
            return Reply(status, data, verb=name, phases=phases, after=after)

        return handle

    def _call(self, name: str, verb: Verb, body: bytes, clock: list[float]) -> tuple[int, Any]:
        try:
            if not body:
                raise BadRequest(f"{name}: body missing")
            try:
                args = orjson.loads(body)
            except orjson.JSONDecodeError as e:
                raise BadRequest(f"{name}: body is not JSON: {e}") from None
            if not isinstance(args, dict):
                raise BadRequest(f"{name}: body must be a JSON object")
            clock.append(time.perf_counter())
            result = verb(args)
            clock.append(time.perf_counter())
            return 200, result
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
        name = host.decode() if isinstance(host, bytes) else str(host)
        shown = f"[{name}]" if ":" in name else name
        return f"{'https' if self.tls else 'http'}://{shown}:{port}"


def _resource(prefix: str) -> str:
    """The RBAC resource of a REST collection: "/api/v1/workload-types" -> "workloadtypes"."""
    return prefix.rstrip("/").rsplit("/", 1)[-1].replace("-", "")


#: What a read of the API server's own objects is checked against; the rest are phalanx.io's.
CORE_READS = {"nodes"}
NAMESPACED_READS = {"gangs"}


def _read_route(prefix: str, read: Read) -> Route:
    resource = _resource(prefix)
    group = "" if resource in CORE_READS else GROUP
    return Route(
        frozenset({"GET"}), prefix, _read(read), prefix=True, rbac=resource, group=group,
        namespaced=resource in NAMESPACED_READS,
    )  # fmt: skip


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


class _Headers:
    """A request's headers as read (`_read_headers`): what `email.message.Message` offers
    the handlers (`get`, `get_all`, `items`), names matched without regard to case."""

    __slots__ = ("_items",)

    def __init__(self, items: list[tuple[str, str]]) -> None:
        self._items = items

    def get(self, name: str, default: Any = None) -> Any:
        name = name.lower()
        return next((v for k, v in self._items if k.lower() == name), default)

    def get_all(self, name: str) -> list[str] | None:
        name = name.lower()
        return [v for k, v in self._items if k.lower() == name] or None

    def items(self) -> list[tuple[str, str]]:
        return list(self._items)


#: http.client's limits on a header block: bytes per line, lines.
MAX_HEADER_LINE, MAX_HEADERS = 65536, 100
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # a header name (RFC 9110 5.1)


def _read_headers(rfile: Any) -> _Headers | tuple[HTTPStatus, str]:
    """The header block up to its empty line, or why it is refused: 431 past the limits; 400
    for a line that is no header (no colon, a name that is not an RFC 9110 token, such as
    "Content-Length : 5", a bare CR): a request two parsers could read two ways is refused,
    never guessed at. A line that starts with white space continues the previous header
    (obsolete folding, replaced by a space as RFC 9112 5.2 allows)."""
    items: list[tuple[str, str]] = []
    for _ in range(MAX_HEADERS + 1):
        line = rfile.readline(MAX_HEADER_LINE + 1)
        if len(line) > MAX_HEADER_LINE:
            return HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Line too long"
        if line in (b"\r\n", b"\n", b""):
            return _Headers(items)
        text = line.decode("iso-8859-1").removesuffix("\n").removesuffix("\r")
        if "\r" in text:
            return HTTPStatus.BAD_REQUEST, "Bare CR in a header line"
        if text[:1] in (" ", "\t"):
            if not items:
                return HTTPStatus.BAD_REQUEST, "Header block starts with a continuation line"
            items[-1] = (items[-1][0], f"{items[-1][1]} {text.strip()}")
            continue
        name, colon, value = text.partition(":")
        if not colon or not _TOKEN.fullmatch(name):
            return HTTPStatus.BAD_REQUEST, f"Bad header line {text[:64]!r}"
        items.append((name, value.strip()))
    return HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Too many headers"


def _http_version(version: str) -> tuple[int, int] | None:
    """(major, minor) of "HTTP/x.y", as RFC 2145 reads it; None if it is not one."""
    if not version.startswith("HTTP/"):
        return None
    parts = version[5:].split(".")
    if len(parts) != 2 or not all(p.isdigit() and p.isascii() and len(p) <= 10 for p in parts):
        return None
    return int(parts[0]), int(parts[1])


_PHRASES = {s.value: s.phrase for s in HTTPStatus}
_date = [0, ""]  # (second, its HTTP date): one formatting a second


def _phrase(status: int) -> str:
    return _PHRASES.get(status, "")


def _http_date() -> str:
    now = int(time.time())
    if _date[0] != now:
        _date[:] = [now, formatdate(now, usegmt=True)]
    return str(_date[1])


class _DeadlineReader(io.RawIOBase):
    """The connection as a raw stream whose reads share one deadline: a per-read timeout
    alone lets a client trickle a byte a second forever. No deadline: the idle timeout."""

    def __init__(self, sock: socket.socket, idle_s: float) -> None:
        self.sock = sock
        self.idle_s = idle_s
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        timeout = self.idle_s if self.deadline is None else self.deadline - time.monotonic()
        if timeout <= 0:
            raise TimeoutError("request not read in time")
        self.sock.settimeout(timeout)
        return self.sock.recv_into(buffer)


class _Schedstat:
    """One thread's /proc/thread-self/schedstat, open while the thread lives."""

    __slots__ = ("fd",)

    def __init__(self) -> None:
        self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)

    def __del__(self, _close: Callable[[int], None] = os.close) -> None:  # the thread ended
        with contextlib.suppress(OSError):
            _close(self.fd)  # bound at definition: still there while the interpreter shuts down


class _ThreadClock(threading.local):
    """This thread's time waiting for a core (the kernel's run delay), read through a descriptor
    the thread opens once. On kube-scheduler's serial cycle a verb's time is its own CPU, this
    wait, and the GIL; on a busy node the wait is what grows (a sidecar short of CPU). None
    where the kernel does not keep it."""

    stat: _Schedstat | None = None
    unavailable = False  # set on the class once an open failed: never tried again

    def queued(self) -> float | None:
        stat = self.stat
        if stat is None:
            if _ThreadClock.unavailable:
                return None
            try:
                stat = self.stat = _Schedstat()
            except OSError:
                _ThreadClock.unavailable = True
                return None
        try:
            return int(os.pread(stat.fd, 128, 0).split()[1]) / 1e9  # "on-cpu-ns run-delay-ns slices"
        except (OSError, IndexError, ValueError):
            return None


_clock = _ThreadClock()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, the body waits for the
    # client's delayed ACK (40 ms on Linux) on every keep-alive call.
    disable_nagle_algorithm = True
    server: Server

    def setup(self) -> None:
        if self.server.tls is not None:
            # The handshake runs here, in the connection's own thread, within the read timeout:
            # a client that never finishes it holds one thread for seconds, never the acceptor.
            raw = self.request
            raw.settimeout(self.server.limits.read_timeout_s)
            tls = self.server.tls.context().wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
            try:
                tls.do_handshake()
            except (OSError, ssl.SSLError):
                self.server.metrics.errors.labels("server", "tls-handshake").inc()
                tls.close()
                raise
            self.request = tls
        super().setup()
        self.rfile.close()  # the socket's own reader: replaced by one with a deadline
        self.reader = _DeadlineReader(self.connection, self.server.limits.idle_timeout_s)
        self.buffered = io.BufferedReader(self.reader, 64 * 2**10)
        self.rfile = self.buffered
        self.first_byte = 0.0  # perf_counter when the current request's first byte arrived
        self.cpu_from = 0.0  # this thread's CPU time then
        self.queued_from: float | None = None  # its run delay before it waited for that byte
        self.server.track(self.connection, open_=True)

    def finish(self) -> None:
        self.server.track(self.connection, open_=False)
        super().finish()
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.close()  # the server closes the plain socket it accepted, not this one

    def handle_one_request(self) -> None:
        """Wait (idle timeout) for the next request's first byte, then read it all by one
        deadline (read timeout); writes get the read timeout too."""
        self.reader.deadline = None
        self.queued_from = _clock.queued()  # before the wait: waking for the request is counted
        try:
            if not self.buffered.peek(1):
                self.close_connection = True  # the client closed a kept-alive connection
                return
        except OSError:  # idle too long (TimeoutError) or reset
            self.close_connection = True
            return
        self.reader.deadline = time.monotonic() + self.server.limits.read_timeout_s
        self.first_byte = time.perf_counter()
        self.cpu_from = time.thread_time()
        super().handle_one_request()

    def parse_request(self) -> bool:
        """The standard library's `parse_request`, but for the headers: its
        `http.client.parse_headers` runs the email package's parser over them (about 0.1 ms a
        call, the largest part of a verb's time in the server); here they are split as read,
        with the same limits (a line of 65,536 bytes, 100 headers: 431)."""
        self.command = ""  # set once the request line is read
        self.request_version = self.default_request_version
        self.close_connection = True
        line = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")  # type: ignore[attr-defined]
        self.requestline = line
        words = line.split()
        if not words:
            return False
        if len(words) >= 3:
            version = words[-1]
            number = _http_version(version)
            if number is None:
                self.send_error(HTTPStatus.BAD_REQUEST, f"Bad request version ({version!r})")
                return False
            if number >= (2, 0):
                self.send_error(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"Invalid HTTP version ({version[5:]})")
                return False
            self.close_connection = number < (1, 1)
            self.request_version = version
        if not 2 <= len(words) <= 3:
            self.send_error(HTTPStatus.BAD_REQUEST, f"Bad request syntax ({line!r})")
            return False
        command, path = words[:2]
        if len(words) == 2:
            self.close_connection = True
            if command != "GET":
                self.send_error(HTTPStatus.BAD_REQUEST, f"Bad HTTP/0.9 request type ({command!r})")
                return False
        self.command, self.path = command, path
        if self.path.startswith("//"):
            self.path = "/" + self.path.lstrip("/")  # gh-87389: never an absolute URI without scheme
        headers = _read_headers(self.rfile)
        if isinstance(headers, tuple):
            self.send_error(*headers)
            return False
        self.headers = headers  # type: ignore[assignment]  # get, get_all, items: what is read here
        connection = headers.get("Connection", "").lower()
        if connection == "close":
            self.close_connection = True
        elif connection == "keep-alive":
            self.close_connection = False
        if headers.get("Expect", "").lower() == "100-continue" and self.request_version >= "HTTP/1.1":
            return self.handle_expect_100()
        return True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's protocol errors; an unknown method (501) or HTTP version
        (505) is the client's fault, not the server's: 405 and 400."""
        if code == HTTPStatus.NOT_IMPLEMENTED:
            code, message = HTTPStatus.METHOD_NOT_ALLOWED, f"method {self.command!r} not allowed"
        elif code >= 500:
            code = HTTPStatus.BAD_REQUEST
        if self.request_version == "HTTP/0.9":
            self.request_version = "HTTP/1.0"  # a request line that is noise still gets a status line
        self.connection.settimeout(self.server.limits.read_timeout_s)
        super().send_error(code, message, explain)

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

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_OPTIONS(self) -> None:
        self._dispatch("OPTIONS")

    def _dispatch(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        route = self.server.route(method, path)
        length = self._length(route.max_body if route else 0)
        if length is None:
            return
        try:
            body = self.rfile.read(length) if length else b""
        except TimeoutError:
            self._refuse(HTTPStatus.REQUEST_TIMEOUT, f"body not received within {self.server.limits.read_timeout_s} s")
            return
        if len(body) < length:  # the client stopped sending (a half-closed socket still reads)
            self._refuse(HTTPStatus.BAD_REQUEST, f"body ended after {len(body)} of {length} bytes")
            return
        self.reader.deadline = None  # read: the handler may take its time (bind waits at the gate)
        read = time.perf_counter()
        if route is None:
            self._send(self._no_route(method, path))
            return
        if route.verb and self.server.tls is not None and not self._verified_client():
            self.server.metrics.errors.labels(path.strip("/"), "no-client-certificate").inc()
            log.warning("verb refused: no client certificate", path=path[:64], client=self.client_address[0])
            self._send(
                Reply.json(401, {"Error": "the verbs need a client certificate the extender's client CA signed"})
            )
            return
        rest = path[len(route.path.rstrip("/")) :] if route.prefix else ""
        access = route.access(method, rest)
        if access is not None:
            denied = self._authorize(access)
            if denied is not None:
                self._send(Reply.json(denied.status, {"Error": denied.message}))
                return
        if route.on_request is not None:
            query = parse_qs(self.path.split("?", 1)[1], keep_blank_values=True) if "?" in self.path else {}
            headers = {k.lower(): v for k, v in self.headers.items()}
            reply = route.on_request(Request(method, rest, query, headers, body, str(self.client_address[0])))
        else:
            reply = route.handler(method, rest, body)
        sending = time.perf_counter()
        self._send(reply)  # raises when the client left: its work after is not done then
        if reply.phases is not None:
            sent = time.perf_counter()
            phases = {"read": read - self.first_byte, **reply.phases, "write": sent - sending}
            phases["server"] = sent - self.first_byte
            phases["cpu"] = time.thread_time() - self.cpu_from
            queued = _clock.queued()
            if queued is not None and self.queued_from is not None:
                phases["queued"] = queued - self.queued_from
            self.server.metrics.observe_phases(reply.verb, phases)
        if reply.after is not None:
            self._after(reply)

    def _after(self, reply: Reply) -> None:
        """A verb's work once its reply is written."""
        assert reply.after is not None
        try:
            reply.after()
        except Exception:
            self.server.metrics.errors.labels(reply.verb or "after", "internal").inc()
            log.exception("work after the reply failed", verb=reply.verb)

    def _verified_client(self) -> bool:
        """A client certificate was sent and verified against the client CA (CERT_OPTIONAL
        fails the handshake for one that does not verify, and `getpeercert` is empty without
        one)."""
        tls = self.server.tls
        return tls is not None and tls.verifies_clients and bool(self.connection.getpeercert())

    def _authorize(self, access: Access) -> Denied | None:
        authorizer = self.server.authorizer
        if authorizer is None:
            return Denied(403, f"the REST API is closed: this server has no authorizer ({access})")
        try:
            denied = authorizer.check(self.headers.get("Authorization"), access)
        except Exception as e:  # an authorizer fault refuses the write, never serves it
            log.exception("authorizer failed", access=str(access))
            denied = Denied(503, f"cannot verify credentials now: {e}")
        if denied is not None:
            self.server.metrics.errors.labels("api", f"auth-{denied.status}").inc()
            log.warning("call refused", access=str(access), status=denied.status, reason=denied.message)
        return denied

    def _length(self, limit: int) -> int | None:
        """The body's length from Content-Length, or None once a refusal is sent. A body
        that cannot be framed (chunked, a length that is no number, two lengths) closes the
        connection: whatever follows on the stream would be read as a request."""
        if self.headers.get("Transfer-Encoding") is not None:
            self._refuse(HTTPStatus.LENGTH_REQUIRED, "Transfer-Encoding is not supported: send Content-Length")
            return None
        values = self.headers.get_all("Content-Length") or []
        if len(set(values)) > 1:
            self._refuse(HTTPStatus.BAD_REQUEST, "Content-Length given twice with different values")
            return None
        text = values[0].strip() if values else "0"
        if not (text.isascii() and text.isdigit() and len(text) <= 18):
            self._refuse(HTTPStatus.BAD_REQUEST, f"Content-Length is not a number: {text[:32]!r}")
            return None
        length = int(text)
        if length > (limit or IGNORED_BODY):
            status = HTTPStatus.REQUEST_ENTITY_TOO_LARGE
            self._refuse(status, f"body of {length} bytes; at most {limit or IGNORED_BODY} here")
            return None
        return length

    def _no_route(self, method: str, path: str) -> Reply:
        allowed = self.server.allowed(path)
        if allowed:
            return Reply.json(405, {"Error": f"{method} not allowed on {path}; allowed: {', '.join(allowed)}"})
        if method == "POST":
            return Reply.json(404, {"Error": f"unknown verb or route {path[:256]!r}"})
        return Reply.json(404, {"error": f"no route {method} {path[:256]}"})

    def _refuse(self, status: HTTPStatus, message: str) -> None:
        self.close_connection = True
        self._send(Reply.json(status, {"Error": message}))

    def _send(self, reply: Reply) -> None:
        self.connection.settimeout(self.server.limits.read_timeout_s)  # a client that never reads
        if reply.stream is not None:
            self._stream(reply)
            return
        # Status line, headers and body in one write: one system call, one wait for the GIL.
        head = [
            f"{self.protocol_version} {reply.status} {_phrase(reply.status)}\r\n"
            f"Server: {self.version_string()}\r\nDate: {_http_date()}\r\n"
            f"Content-Type: {reply.content_type}\r\nContent-Length: {len(reply.body)}\r\n"
        ]
        head.extend(f"{name}: {value}\r\n" for name, value in reply.headers)
        if self.close_connection:
            head.append("Connection: close\r\n")
        head.append("\r\n")
        data = "".join(head).encode("latin-1", "strict")
        self.wfile.write(data if self.command == "HEAD" else data + reply.body)

    def _stream(self, reply: Reply) -> None:
        """A stream's chunks as they come; each write must be taken within the read timeout
        (a watcher that stops reading is dropped), and the source is closed however it ends."""
        assert reply.stream is not None
        self.close_connection = True
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Cache-Control", "no-cache")
            for name, value in reply.headers:
                self.send_header(name, value)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.flush()
            for chunk in reply.stream:
                self.wfile.write(chunk)
                self.wfile.flush()
        finally:
            close = getattr(reply.stream, "close", None)
            if close is not None:
                close()
