"""Deadline-bounded polling and the HTTP probes used to decide that a component is ready.

Components are synchronised only by observing their state (health endpoints, API objects),
never by fixed sleeps; every wait has a deadline and reports the last failure when it expires.
"""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """A condition did not hold before its deadline."""


def wait_for(
    condition: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.1,
    max_interval: float = 1.0,
) -> T:
    """Poll ``condition`` until it returns a truthy value, and return that value.

    The interval backs off from ``interval`` to ``max_interval``. Exceptions raised by the
    condition count as "not yet" except :class:`FatalWaitError`, which aborts at once.
    """
    deadline = time.monotonic() + timeout
    last_error = ""
    while True:
        try:
            value = condition()
            if value:
                return value
        except FatalWaitError:
            raise
        except Exception as exc:
            last_error = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            suffix = f" (last error: {last_error})" if last_error else ""
            raise WaitTimeout(f"timed out after {timeout:.0f} s waiting for {what}{suffix}")
        time.sleep(interval)
        interval = min(interval * 1.5, max_interval)


class FatalWaitError(RuntimeError):
    """Raised by a condition when waiting longer cannot help (e.g. the process died)."""


def http_ok(
    url: str,
    *,
    context: ssl.SSLContext | None = None,
    token: str | None = None,
    timeout: float = 5.0,
) -> bool:
    """Return True when a GET of ``url`` answers 200 (health endpoints answer ``ok``)."""
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """Return a client TLS context trusting ``ca_file``, or one without verification.

    The unverified form is for kube-scheduler's in-memory self-signed health endpoint only.
    """
    if ca_file is not None:
        return ssl.create_default_context(cafile=ca_file)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context
