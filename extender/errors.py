"""The extender's exceptions (one module, as the style guide asks)."""

from __future__ import annotations


class BadRequest(ValueError):
    """A malformed extender request: answered with HTTP 400 and this message."""
