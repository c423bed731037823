"""What every allocation-API handler shares: Status errors, bodies read into pydantic models,
selectors, paging tokens and the per-tenant rate limit.

Errors are Kubernetes `Status` objects (`{"kind": "Status", "code": 403, "reason":
"Forbidden", "message": ...}`), so a client that speaks to the API server speaks to this API:
400 names every invalid field (`details.causes`, one per field), 422 carries the solver's proof
that a request can never be placed, 429 the rate limit's headers.
"""

from __future__ import annotations

import base64
import math
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from extender.selectors import Selector, SelectorError
from extender.selectors import parse as parse_selector
from extender.server import Reply

M = TypeVar("M", bound=BaseModel)

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Unschedulable",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


class ApiError(Exception):
    """A refusal, as the Status the client gets."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str = "",
        causes: list[dict[str, str]] | None = None,
        details: Mapping[str, Any] | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.causes = causes or []
        self.details = dict(details or {})
        self.headers = headers

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": self.code,
            "reason": self.reason,
            "message": self.message,
        }
        details = dict(self.details)
        if self.causes:
            details["causes"] = self.causes
        if details:
            out["details"] = details
        return out

    def reply(self) -> Reply:
        return Reply(self.code, orjson.dumps(self.status()), headers=self.headers)


def ok(status: int, body: Any, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(status, orjson.dumps(body), headers=headers)


def read_body(model: type[M], body: bytes, what: str, *, empty_ok: bool = False) -> M:
    """The body as `model`; 400 naming every invalid field (JSON path and why)."""
    if not body.strip():
        if empty_ok:
            return model()
        raise ApiError(400, f"{what}: body missing: send a JSON object")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ApiError(400, f"{what}: body is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"{what}: body must be a JSON object, not {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise invalid(what, e) from None


def invalid(what: str, e: ValidationError) -> ApiError:
    causes = [
        {"field": ".".join(str(p) for p in err["loc"]) or "(body)", "reason": err["type"], "message": err["msg"]}
        for err in e.errors()[:64]
    ]
    text = "; ".join(f"{c['field']}: {c['message']}" for c in causes)
    return ApiError(400, f"{what}: invalid: {text}", reason="Invalid", causes=causes)


def selector(text: str, what: str) -> Selector | None:
    if not text:
        return None
    try:
        return parse_selector(text)
    except SelectorError as e:
        raise ApiError(400, f"labelSelector {text[:128]!r}: {e}", causes=[{"field": what, "message": str(e)}]) from None


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    path: str
    value: str
    equal: bool


def field_selector(text: str, allowed: Mapping[str, str]) -> list[FieldRequirement]:
    """`a=b,c!=d` over the fields in `allowed` (name -> what it means), as Kubernetes parses them."""
    out = []
    for part in (p.strip() for p in text.split(",")) if text else ():
        if not part:
            continue
        if "!=" in part:
            key, _, value = part.partition("!=")
            equal = False
        elif "==" in part:
            key, _, value = part.partition("==")
            equal = True
        elif "=" in part:
            key, _, value = part.partition("=")
            equal = True
        else:
            raise ApiError(400, f"fieldSelector: {part[:64]!r} is not field=value or field!=value")
        key = key.strip()
        if key not in allowed:
            fields = ", ".join(sorted(allowed))
            raise ApiError(400, f"fieldSelector: field {key[:64]!r} is not supported; use one of {fields}")
        out.append(FieldRequirement(key, value.strip(), equal))
    return out


def encode_continue(reading: str, after: str) -> str:
    """A continue token: the reading the list was served from, and the last key it gave."""
    raw = orjson.dumps({"reading": reading, "after": after})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str) -> tuple[str, str]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = orjson.loads(raw)
        return str(data["reading"]), str(data["after"])
    except (ValueError, KeyError, TypeError, orjson.JSONDecodeError):
        raise ApiError(400, f"continue: {token[:64]!r} is not a token this API issued") from None


def int_param(text: str, name: str, *, low: int, high: int, default: int) -> int:
    if text == "":
        return default
    if not (text.isascii() and text.isdigit() and len(text) <= 9) or not low <= int(text) <= high:
        raise ApiError(400, f"{name}: expected an integer from {low} to {high}, got {text[:32]!r}")
    return int(text)


def dry_run(value: str) -> bool:
    """`dryRun=All` (Kubernetes' one value); anything else is refused, as the API server does."""
    if value == "":
        return False
    if value != "All":
        raise ApiError(400, f"dryRun: {value[:32]!r} is not supported; the only value is All")
    return True


@dataclass
class _Bucket:
    tokens: float
    updated: float


@dataclass
class RateLimiter:
    """A token bucket per tenant: `per_minute` requests a minute on average, `burst` at once.
    Past it, 429 with `X-RateLimit-*` and `Retry-After` (seconds until one request is allowed)."""

    per_minute: int
    burst: int
    most_tenants: int = 10_000
    _buckets: dict[str, _Bucket] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, tenant: str, now: float | None = None) -> tuple[tuple[str, str], ...]:
        """The headers of an allowed request; raises the 429 of a refused one."""
        now = time.monotonic() if now is None else now
        rate = self.per_minute / 60.0
        with self._lock:
            bucket = self._buckets.get(tenant)
            if bucket is None:
                if len(self._buckets) >= self.most_tenants:  # forget those full again (idle long enough)
                    self._buckets = {
                        k: b for k, b in self._buckets.items() if b.tokens + (now - b.updated) * rate < self.burst
                    }
                    if len(self._buckets) >= self.most_tenants:  # every one busy: forget the oldest half
                        keep = sorted(self._buckets.items(), key=lambda kv: kv[1].updated)[self.most_tenants // 2 :]
                        self._buckets = dict(keep)
                bucket = self._buckets[tenant] = _Bucket(float(self.burst), now)
            bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.updated) * rate)
            bucket.updated = now
            reset = int(time.time() + (self.burst - bucket.tokens) / rate) if rate else 0
            if bucket.tokens < 1.0:
                wait = math.ceil((1.0 - bucket.tokens) / rate) if rate else 60
                headers = (
                    ("X-RateLimit-Limit", str(self.per_minute)),
                    ("X-RateLimit-Remaining", "0"),
                    ("X-RateLimit-Reset", str(reset)),
                    ("Retry-After", str(max(1, wait))),
                )
                raise ApiError(
                    429,
                    f"Rate limit exceeded. Tenant {tenant!r} (namespace/caller) limited to {self.per_minute} req/min "
                    f"(bursts of {self.burst}); retry in {max(1, wait)} s.",
                    headers=headers,
                )
            bucket.tokens -= 1.0
            return (
                ("X-RateLimit-Limit", str(self.per_minute)),
                ("X-RateLimit-Remaining", str(int(bucket.tokens))),
                ("X-RateLimit-Reset", str(reset)),
            )


class Slotted:
    """A response stream holding one of a limited number of slots (open watches): taken
    before the stream is answered, released exactly once however it ends: finished, closed
    by the server after the client left, or never started because the headers failed."""

    def __init__(self, source: Iterator[bytes], slot: threading.Semaphore) -> None:
        self.source = source
        self.slot = slot
        self._released = False
        self._lock = threading.Lock()

    @staticmethod
    def take(source: Iterator[bytes], slot: threading.Semaphore) -> Slotted:
        if not slot.acquire(blocking=False):
            close = getattr(source, "close", None)
            if close is not None:
                close()
            raise ApiError(503, "too many watch streams open; retry later", headers=(("Retry-After", "5"),))
        return Slotted(source, slot)

    def __iter__(self) -> Slotted:
        return self

    def __next__(self) -> bytes:
        try:
            return next(self.source)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        try:
            close = getattr(self.source, "close", None)
            if close is not None:
                close()
        finally:
            self.slot.release()
