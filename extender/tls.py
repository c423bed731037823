"""TLS for a verb port that leaves the pod: a serving certificate and the CA of the clients
allowed to call the verbs (kube-scheduler's `tlsConfig.certFile`).

The client certificate is asked for, not demanded, in the handshake (`CERT_OPTIONAL`: a
certificate that is sent must verify against the client CA, else the handshake fails), so
Prometheus may scrape `/metrics` and the REST API may take a bearer token; the verbs then
refuse a connection without a verified certificate (`Server`: 401). Certificate files are
re-read when they change (cert-manager and kubelet rotate them in place), checked at most every
`RECHECK_S` seconds, on the accepting thread's next connection.
"""

from __future__ import annotations

import os
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger("phalanx.tls")

RECHECK_S = 10.0


@dataclass(frozen=True, slots=True)
class TLSFiles:
    cert: Path
    key: Path
    client_ca: Path | None = None  # None: no client certificates (the verbs stay closed)


class ServerTLS:
    """The server's SSLContext, rebuilt when one of its files changes."""

    def __init__(self, files: TLSFiles) -> None:
        self.files = files
        self._lock = threading.Lock()
        self._stamp = self._mtimes()
        self._context = self._build()  # a bad file at start is an error the operator sees
        self._checked = time.monotonic()

    @property
    def verifies_clients(self) -> bool:
        return self.files.client_ca is not None

    def context(self) -> ssl.SSLContext:
        now = time.monotonic()
        if now - self._checked < RECHECK_S:
            return self._context
        with self._lock:
            self._checked = now
            stamp = self._mtimes()
            if stamp != self._stamp:
                try:
                    self._context = self._build()
                    self._stamp = stamp
                    log.info("TLS files re-read", cert=str(self.files.cert))
                except (OSError, ssl.SSLError) as e:  # half-written: keep serving the last good ones
                    log.warning("cannot re-read TLS files; keeping the last ones", error=str(e))
        return self._context

    def _mtimes(self) -> tuple[float, ...]:
        paths = [self.files.cert, self.files.key, *([self.files.client_ca] if self.files.client_ca else [])]
        stamps = []
        for path in paths:
            try:
                stamps.append(os.stat(path).st_mtime)
            except OSError:
                stamps.append(-1.0)
        return tuple(stamps)

    def _build(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(self.files.cert), str(self.files.key))
        if self.files.client_ca is not None:
            context.load_verify_locations(cafile=str(self.files.client_ca))
            context.verify_mode = ssl.CERT_OPTIONAL
        return context
