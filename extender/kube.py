"""The only code that talks to the API server: plain JSON over urllib3.

`Kube` is the seam (a Protocol) the cache, binder and config loader use; `RestKube` is the
real one, configured from a kubeconfig or the in-cluster service account through the
kubernetes package's loaders, but sending and decoding plain JSON: the generated models cost
milliseconds per object, which a watch over thousands of pods cannot afford.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlencode

import orjson
import urllib3
from kubernetes import client, config

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
    """`Kube` over urllib3 with the credentials of a kubeconfig or the pod's service account."""

    def __init__(self, cfg: client.Configuration) -> None:
        self.host = cfg.host.rstrip("/")
        self.headers = {"Accept": "application/json"}
        token = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken")
        if token:
            prefix = cfg.api_key_prefix.get("authorization", "")
            self.headers["Authorization"] = f"{prefix} {token}".strip() if not token.startswith("Bearer") else token
        kwargs: dict[str, Any] = {"maxsize": 64, "block": False}
        if self.host.startswith("https"):
            kwargs.update(cert_reqs="CERT_REQUIRED" if cfg.verify_ssl else "CERT_NONE", ca_certs=cfg.ssl_ca_cert)
            if cfg.cert_file:
                kwargs.update(cert_file=cfg.cert_file, key_file=cfg.key_file)
        self.pool = urllib3.PoolManager(**kwargs)

    @classmethod
    def from_kubeconfig(cls, path: str | None) -> RestKube:
        cfg = client.Configuration()
        if path:
            config.load_kube_config(config_file=path, client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return cls(cfg)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Response:
        url = self.host + path + (f"?{urlencode(query)}" if query else "")
        headers = dict(self.headers)
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = orjson.dumps(body)
        try:
            r = self.pool.request(method, url, body=data, headers=headers, timeout=urllib3.Timeout(connect=5, read=60))
        except urllib3.exceptions.HTTPError as e:
            raise Unreachable(f"{method} {path}: {e}") from e
        return Response(r.status, _decode(r.data))

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
            if r.status >= 300:
                raise ApiError(r.status, r.data[:500], f"watch {path}")
            yield from _lines(r)
        except urllib3.exceptions.HTTPError as e:  # e.g. "Response ended prematurely": the server died
            raise Unreachable(f"watch {path}: {e}") from e
        finally:
            r.release_conn()


HEADERS_S = 30.0  # a watch's response headers must come within this


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
    buffer = b""
    for chunk in r.stream(65536):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
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
