"""The extender's exceptions (one module, as the style guide asks)."""

from __future__ import annotations


class BadRequest(ValueError):
    """A malformed extender request: answered with HTTP 400 and this message."""


class NotReady(RuntimeError):
    """The cache has not synced yet: the verb refuses (HTTP 503), and kube-scheduler retries
    the pod later instead of acting on a half-loaded view."""
