"""The only code that talks to the API server: plain JSON over urllib3 (and http1.py for writes).

`Kube` is the seam (a Protocol) the cache, binder and config loader use; `RestKube` is the
real one, configured from a kubeconfig or the in-cluster service account through the
kubernetes package's loaders, but sending and decoding plain JSON: the generated models cost
milliseconds per object, which a watch over thousands of pods cannot afford.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlencode

import orjson
import structlog
import urllib3
from kubernetes import client, config

from extender import http1

log = structlog.get_logger("phalanx.kube")

JSON = dict[str, Any]


class ApiError(Exception):
    def __init__(self, status: int, body: Any, what: str) -> None:
        message = body.get("message") if isinstance(body, dict) else str(body)[:200]
        super().__init__(f"{what}: HTTP {status}: {message}")
        self.status = status
        self.body = body


class Unreachable(OSError):
    """The API server could not be reached, or dropped the connection mid-answer. urllib3's
    transport errors (MaxRetryError, ProtocolError) are not OSError; this one is, so every caller
    that treats OSError as transient (the binder's retry, event writers) treats these so too."""


class Expired(Exception):
    """410 Gone: the resourceVersion is too old; the watcher must re-list."""


@dataclass(frozen=True)
class Response:
    status: int
    body: Any


class Kube(Protocol):
    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Response: ...

    def stream(self, path: str, query: Mapping[str, str]) -> Iterator[JSON]: ...


class RestKube:
    """`Kube` over urllib3 with the credentials of a kubeconfig or the pod's service account.

    Credentials are re-read as client-go re-reads them: the source (the kubeconfig, with its
    `tokenFile` or exec plugin, or the in-cluster token file) at most every `REFRESH_S`, and at
    once when the API server answers 401, so a projected service-account token that kubelet
    rotated, or an exec credential that expired, never leaves the watches failing. A source that
    cannot be read keeps the last good credentials (and says so in the log)."""

    def __init__(self, cfg: client.Configuration, reload: Callable[[], client.Configuration] | None = None) -> None:
        self.host = cfg.host.rstrip("/")
        self._reload = reload
        self._lock = threading.Lock()
        self._authorization = _authorization(cfg)
        self._next_refresh = time.monotonic() + REFRESH_S
        self._last_forced = 0.0
        kwargs: dict[str, Any] = {"maxsize": 64, "block": False}
        if self.host.startswith("https"):
            kwargs.update(cert_reqs="CERT_REQUIRED" if cfg.verify_ssl else "CERT_NONE", ca_certs=cfg.ssl_ca_cert)
        # Calls made with a caller's token (`as_caller`) never present this process's client
        # certificate: the API server would authenticate the certificate, not the caller.
        self._caller_pool = urllib3.PoolManager(**kwargs)
        if self.host.startswith("https") and cfg.cert_file:
            kwargs.update(cert_file=cfg.cert_file, key_file=cfg.key_file)
        self.pool = urllib3.PoolManager(**kwargs)
        # The writes on the scheduling path (Bindings, nominations, evictions, events): the
        # same server, CA and client certificate, a fifth of urllib3's CPU per call (http1.py).
        files = http1.TLSFiles(bool(cfg.verify_ssl), cfg.ssl_ca_cert, cfg.cert_file or None, cfg.key_file or None)
        https = self.host.startswith("https://")
        self.writes: http1.Client | None = (
            http1.Client(self.host, files if https else None) if https or self.host.startswith("http://") else None
        )

    @classmethod
    def from_kubeconfig(cls, path: str | None) -> RestKube:
        def load() -> client.Configuration:
            cfg = client.Configuration()
            if path:
                config.load_kube_config(config_file=path, client_configuration=cfg)  # type: ignore[no-untyped-call]
            else:
                # We re-read the token ourselves (the loader's own hook is for its ApiClient).
                config.load_incluster_config(client_configuration=cfg, try_refresh_token=False)  # type: ignore[no-untyped-call]
            return cfg

        return cls(load(), reload=load)

    def as_caller(self, authorization: str) -> CallerKube:
        """This API server, with a caller's own credentials (`Authorization` header): what the
        caller's RBAC allows, nothing more."""
        return CallerKube(self.host, self._caller_pool, authorization)

    @property
    def headers(self) -> dict[str, str]:
        """The headers every request carries (Accept, and Authorization when there is a token)."""
        headers = {"Accept": "application/json"}
        authorization = self._current_authorization()
        if authorization:
            headers["Authorization"] = authorization
        return headers

    def refresh_credentials(self, *, rejected: bool = False) -> bool:
        """Re-read the credentials now; True if they changed. After a 401 (`rejected`) at most
        once a second, however many requests were refused at the same time."""
        if self._reload is None:
            return False
        with self._lock:
            now = time.monotonic()
            if rejected and now - self._last_forced < 1.0:
                return False
            if rejected:
                self._last_forced = now
            self._next_refresh = now + REFRESH_S
            try:
                authorization = _authorization(self._reload())
            except Exception as e:  # a half-written kubeconfig, an exec plugin that failed
                log.warning("cannot re-read credentials; keeping the last ones", error=str(e))
                return False
            changed = authorization != self._authorization
            self._authorization = authorization
        if changed:
            log.info("credentials re-read: the token changed", after_401=rejected)
        return changed

    def _current_authorization(self) -> str | None:
        if self._reload is not None and time.monotonic() >= self._next_refresh:
            self.refresh_credentials()
        return self._authorization

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Response:
        target = path + (f"?{urlencode(query)}" if query else "")
        data = None if body is None else orjson.dumps(body)
        for attempt in (0, 1):
            headers = self.headers
            if data is not None:
                headers["Content-Type"] = content_type
            status, answer = self._send(method, target, headers, data)
            # A token that expired or rotated: re-read it and send once more if it changed.
            if status != 401 or attempt or not self.refresh_credentials(rejected=True):
                break
        return Response(status, _decode(answer))

    def _send(self, method: str, target: str, headers: dict[str, str], data: bytes | None) -> tuple[int, bytes]:
        if self.writes is not None and method in ("POST", "PATCH"):
            try:
                return self.writes.request(method, target, headers, data)
            except OSError as e:
                raise Unreachable(f"{method} {target.split('?', 1)[0]}: {e}") from e
        try:
            r = self.pool.request(
                method, self.host + target, body=data, headers=headers, timeout=urllib3.Timeout(connect=5, read=60)
            )
        except urllib3.exceptions.HTTPError as e:
            raise Unreachable(f"{method} {target.split('?', 1)[0]}: {e}") from e
        return r.status, r.data

    def stream(self, path: str, query: Mapping[str, str]) -> Iterator[JSON]:
        """Watch events, one decoded JSON object per line, until the server closes.

        The response's headers must come within HEADERS_S (kube-apiserver sends them as the
        watch starts; one that accepted the request while restarting may never answer, and a
        reflector waiting out the stream's idle timeout would see nothing for minutes); the
        body may then idle up to the watch's own timeout plus 30 s. No urllib3 retries: the
        reflector retries, with its backoff and its log line."""
        url = f"{self.host}{path}?{urlencode(query)}"
        idle = float(query.get("timeoutSeconds", "300")) + 30
        timeout = urllib3.Timeout(connect=5, read=min(HEADERS_S, idle))
        try:
            r = self.pool.request(
                "GET", url, headers=self.headers, preload_content=False, timeout=timeout, retries=False
            )
        except urllib3.exceptions.HTTPError as e:
            raise Unreachable(f"watch {path}: {e}") from e
        sock = _socket_of(r)
        if sock is not None:
            sock.settimeout(idle)  # headers are in: the body may idle as long as the watch lasts
        try:
            if r.status == 410:
                raise Expired(path)
            if r.status == 401:  # the reflector retries after its backoff, with the token re-read
                self.refresh_credentials(rejected=True)
            if r.status >= 300:
                raise ApiError(r.status, r.data[:500], f"watch {path}")
            yield from _lines(r)
        except urllib3.exceptions.HTTPError as e:  # e.g. "Response ended prematurely": the server died
            raise Unreachable(f"watch {path}: {e}") from e
        finally:
            r.release_conn()


class CallerKube(RestKube):
    """`Kube` with a caller's token: no client certificate, no credentials re-read."""

    def __init__(self, host: str, pool: urllib3.PoolManager, authorization: str) -> None:
        self.host = host
        self.pool = pool
        self._caller_pool = pool
        self.writes = None  # urllib3's pool only: it never presents this process's certificate
        self._reload = None
        self._lock = threading.Lock()
        self._authorization = authorization
        self._next_refresh = float("inf")
        self._last_forced = 0.0


HEADERS_S = 30.0  # a watch's response headers must come within this
REFRESH_S = 60.0  # credentials are re-read at least this often (client-go: token files every minute)


def _authorization(cfg: client.Configuration) -> str | None:
    """The Authorization header a loaded configuration carries, if any."""
    token = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken")
    if not token:
        return None
    if token.lower().startswith("bearer "):
        return "Bearer " + token[7:].strip()
    prefix = cfg.api_key_prefix.get("authorization", "")
    return f"{prefix} {token}".strip()


def _socket_of(r: urllib3.BaseHTTPResponse) -> Any:
    """The socket a streamed response reads from: the connection's, or (once http.client has
    handed it to the response, e.g. for `Connection: close`) the response file's. None if
    neither is reachable; the body then keeps the header wait as its idle timeout (tested:
    tests/extender/test_kube_stream.py)."""
    sock = getattr(getattr(r, "connection", None), "sock", None)
    if sock is None:
        raw = getattr(getattr(getattr(r, "_fp", None), "fp", None), "raw", None)
        sock = getattr(raw, "_sock", None)
    return sock


def _lines(r: urllib3.BaseHTTPResponse) -> Iterator[JSON]:
    """One decoded object per line; a chunk's lines are split once (a watch's chunk is one
    event, a list's many), the unfinished tail kept for the next chunk."""
    tail = b""
    for chunk in r.stream(65536):
        lines = (tail + chunk if tail else chunk).split(b"\n")
        tail = lines.pop()
        for line in lines:
            if line.strip():
                yield orjson.loads(line)


def _decode(data: bytes) -> Any:
    """JSON when it is JSON; otherwise the text (e.g. "404 page not found" for an API that
    is not served), so callers see the status instead of a decoding error."""
    if not data:
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return data.decode("utf-8", "replace")


def check(response: Response, what: str, ok: tuple[int, ...] = (200, 201)) -> Any:
    if response.status not in ok:
        raise ApiError(response.status, response.body, what)
    return response.body
