"""A small HTTP/1.1 client for the API server's writes on the scheduling path.

Every bound pod costs one Binding POST, every planned gang member a nomination PATCH. Through
urllib3 one such call costs about 0.26 ms of CPU in this process (its pool manager, http.client,
and the email package parsing the response's headers), against about 0.04 ms for the same bytes
written and read directly; on a 2-core machine that CPU is taken from filter calls waiting for
the GIL. This client writes each request in one call on a kept-alive connection (TLS with the
kubeconfig's CA and client certificate), reads the status line and the headers it needs, and
the body by Content-Length or chunked transfer. Lists and watches stay with urllib3.

A kept-alive connection the server has closed (readable before anything was sent) is dropped
before use; a reused connection that fails before any byte of the answer came (the server
closed it as the request went out) is retried once on a fresh one. Should the first one have
been applied after all, a repeated Binding gets 409, which the binder reads as bound when the
pod is on its node; patches are idempotent, and an Event or eviction twice is harmless. Any
other failure is an `OSError` (`extender.kube.Unreachable` wraps it), which callers already
treat as transient.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_LINE = 65536  # bytes of a status or header line
MAX_HEADERS = 200
MAX_BODY = 256 * 2**20  # an answer larger than this is not one of ours
HEX_DIGITS = b"0123456789abcdefABCDEF"
USER_AGENT = "phalanx-extender"


def _field_ok(name: str, value: str) -> bool:
    """A header this client may send: no line breaks to smuggle another header or request."""
    return not any(c in name for c in ":\r\n ") and "\r" not in value and "\n" not in value


class ProtocolFault(OSError):
    """The server's answer could not be read as HTTP/1.1."""


class _Stale(OSError):
    """A reused connection failed before any byte of the answer came: safe to send again."""


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """What the connection's TLS context is made of (files are re-read when they change)."""

    verify: bool = True
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


class _Connection:
    __slots__ = ("reader", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = sock.makefile("rb", buffering=64 * 2**10)

    def close(self) -> None:
        for closing in (self.reader.close, self.sock.close):
            with contextlib.suppress(OSError):
                closing()

    def __del__(self) -> None:  # a client dropped with connections kept (tests make many)
        self.close()

    def idle_and_open(self) -> bool:
        """Nothing to read on a connection between requests; readable means the server closed
        it (or sent what no request asked for): either way it cannot be used."""
        if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
            return False
        try:
            poller = select.poll()  # any descriptor number (select() stops at 1,024)
            poller.register(self.sock, select.POLLIN)
            return not poller.poll(0)
        except (OSError, ValueError):
            return False


class Client:
    """Requests to one server (`base`: scheme, host and port) on at most `maxsize` connections
    at once, kept alive. A request finding every connection busy waits for one rather than
    opening another: when a 512-member gang's gate opens, its 512 Bindings go out on the
    connections there are, instead of paying 448 TLS handshakes (and closing them after)."""

    def __init__(
        self,
        base: str,
        tls: TLSFiles | None = None,
        *,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 60.0,
        maxsize: int = 64,
    ) -> None:
        parts = urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base!r}")
        self.https = parts.scheme == "https"
        self.hostname = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.host_header = parts.netloc.rsplit("@", 1)[-1]
        self.prefix = parts.path.rstrip("/")  # a server behind a path (a proxy's cluster URL)
        self.tls = tls or TLSFiles()
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.maxsize = maxsize
        self._idle: list[_Connection] = []
        self._slots = threading.BoundedSemaphore(maxsize)  # one per connection in use
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        self._context_key: tuple[float | None, ...] = ()

    def request(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> tuple[int, bytes]:
        """(status, body) of one request; `target` is the path (below the base URL's own) with
        its query."""
        fields = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity", **headers}
        if any(c in target for c in " \r\n\t") or not all(_field_ok(k, v) for k, v in fields.items()):
            raise ProtocolFault(f"refused to send a request line or header with control characters: {target[:64]!r}")
        lines = [f"{method} {self.prefix}{target} HTTP/1.1\r\nHost: {self.host_header}\r\n"]
        lines.extend(f"{name}: {value}\r\n" for name, value in fields.items())
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}\r\n")
        lines.append("\r\n")
        try:
            data = "".join(lines).encode("ascii") + (body or b"")
        except UnicodeEncodeError:
            raise ProtocolFault(
                f"refused to send a request line or header that is not ASCII: {target[:64]!r}"
            ) from None
        if not self._slots.acquire(timeout=self.read_timeout_s):
            raise TimeoutError(f"no connection to {self.host_header} free for {self.read_timeout_s:.0f} s")
        try:
            return self._send(method, data)
        finally:
            self._slots.release()

    def _send(self, method: str, data: bytes) -> tuple[int, bytes]:
        for attempt in (0, 1):
            conn, reused = self._take() if attempt == 0 else (self._connect(), False)
            try:
                status, answer, keep = self._exchange(conn, data, method, reused=reused)
            except _Stale:
                conn.close()
                continue  # once more, on a fresh connection
            except BaseException:
                conn.close()
                raise
            if keep:
                self._give_back(conn)
            else:
                conn.close()
            return status, answer
        raise ProtocolFault("connection closed twice before an answer")  # pragma: no cover

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # ------------------------------------------------------------------ connections

    def _take(self) -> tuple[_Connection, bool]:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._connect(), False
            if conn.idle_and_open():
                return conn, True
            conn.close()

    def _give_back(self, conn: _Connection) -> None:
        with self._lock:
            if len(self._idle) < self.maxsize:
                self._idle.append(conn)
                return
        conn.close()

    def _connect(self) -> _Connection:
        sock = socket.create_connection((self.hostname, self.port), timeout=self.connect_timeout_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.https:
                sock = self._ssl_context().wrap_socket(sock, server_hostname=self.hostname)
            sock.settimeout(self.read_timeout_s)
        except BaseException:
            sock.close()
            raise
        return _Connection(sock)

    def _ssl_context(self) -> ssl.SSLContext:
        """The TLS context, made again when a file it was made from changed (a rotated client
        certificate is used by the next connection, as urllib3 loads it per connection)."""
        files = (self.tls.ca_file, self.tls.cert_file, self.tls.key_file)
        key = tuple(_mtime(f) for f in files)
        with self._lock:
            if self._context is not None and key == self._context_key:
                return self._context
        context = ssl.create_default_context(cafile=self.tls.ca_file)
        context.hostname_checks_common_name = False  # the name in the SAN, as urllib3 2 checks it
        if not self.tls.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.tls.cert_file:
            context.load_cert_chain(self.tls.cert_file, self.tls.key_file)
        with self._lock:
            self._context, self._context_key = context, key
        return context

    # ------------------------------------------------------------------ one exchange

    def _exchange(self, conn: _Connection, data: bytes, method: str, *, reused: bool) -> tuple[int, bytes, bool]:
        """Send `data`, read the answer: (status, body, whether the connection may be kept)."""
        try:
            conn.sock.sendall(data)
            line = conn.reader.readline(MAX_LINE + 1)
        except OSError as e:
            if reused and not isinstance(e, TimeoutError):
                raise _Stale(str(e)) from e
            raise
        if not line and reused:
            raise _Stale("closed by the server")
        while True:
            version, status = _status_line(line)
            length, chunked, close = _headers(conn.reader)
            if not 100 <= status < 200:
                break
            line = conn.reader.readline(MAX_LINE + 1)  # an interim answer (100 Continue): the next
        keep = version == "HTTP/1.1" and not close
        if method == "HEAD" or status in (204, 304):
            return status, b"", keep
        if chunked:
            return status, _chunked(conn.reader), keep
        if length is None:
            return status, _exactly(conn.reader, MAX_BODY, to_end=True), False
        return status, _exactly(conn.reader, length), keep


def _mtime(path: str | None) -> float | None:
    if not path:
        return None
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _status_line(line: bytes) -> tuple[str, int]:
    if not line:
        raise ProtocolFault("connection closed before the status line")
    if len(line) > MAX_LINE:
        raise ProtocolFault("status line too long")
    parts = line.split(None, 2)
    if len(parts) < 2 or parts[0] not in (b"HTTP/1.0", b"HTTP/1.1") or not parts[1].isdigit() or len(parts[1]) != 3:
        raise ProtocolFault(f"not an HTTP/1.x status line: {line[:64]!r}")
    return parts[0].decode("ascii"), int(parts[1])


def _headers(reader: object) -> tuple[int | None, bool, bool]:
    """(Content-Length, chunked, Connection: close) from the header block."""
    readline = reader.readline  # type: ignore[attr-defined]
    length: int | None = None
    chunked = close = False
    for _ in range(MAX_HEADERS):
        line = readline(MAX_LINE + 1)
        if line in (b"\r\n", b"\n"):
            return length, chunked, close
        if not line or len(line) > MAX_LINE:
            raise ProtocolFault("header block ended early or a line is too long")
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            text = value.strip()
            if not text.isdigit() or (length is not None and int(text) != length):
                raise ProtocolFault(f"bad Content-Length {text[:32]!r}")
            length = int(text)
        elif name == b"transfer-encoding":
            if chunked:
                raise ProtocolFault("Transfer-Encoding given twice")
            chunked = value.strip().lower().endswith(b"chunked")
        elif name == b"connection":
            close = close or b"close" in value.lower()
    raise ProtocolFault(f"more than {MAX_HEADERS} headers")


def _exactly(reader: object, length: int, *, to_end: bool = False) -> bytes:
    """`length` bytes (`to_end`: whatever comes before the connection closes, at most that)."""
    if length > MAX_BODY:
        raise ProtocolFault(f"body of {length} bytes")
    data: bytes = reader.read(length + 1 if to_end else length)  # type: ignore[attr-defined]
    if to_end and len(data) > length:
        raise ProtocolFault(f"body past {length} bytes")
    if len(data) < length and not to_end:
        raise ProtocolFault(f"body ended after {len(data)} of {length} bytes")
    return data


def _chunked(reader: object) -> bytes:
    readline = reader.readline  # type: ignore[attr-defined]
    parts: list[bytes] = []
    total = 0
    while True:
        line = readline(MAX_LINE + 1)
        size_text = line.split(b";", 1)[0].strip()
        if not size_text or len(size_text) > 16 or size_text.strip(HEX_DIGITS):
            raise ProtocolFault(f"bad chunk size {line[:32]!r}")
        size = int(size_text, 16)
        if size == 0:
            break
        total += size
        parts.append(_exactly(reader, size))
        if total > MAX_BODY:
            raise ProtocolFault("chunked body too large")
        if readline(3) not in (b"\r\n", b"\n"):
            raise ProtocolFault("chunk not followed by CRLF")
    for _ in range(MAX_HEADERS):  # trailers, up to the empty line
        line = readline(MAX_LINE + 1)
        if line in (b"\r\n", b"\n", b""):
            return b"".join(parts)
    raise ProtocolFault("too many trailers")
