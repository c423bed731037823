"""The allocation API's route table, limits and OpenAPI document, without a cluster."""

from __future__ import annotations

import threading
from typing import Any, cast

import orjson

from extender.api.context import Context
from extender.api.core import ApiError, RateLimiter, Slotted
from extender.api.service import AllocationApi
from extender.config import ApiConfig
from extender.server import Request


def api() -> AllocationApi:
    nothing = cast(Any, None)
    ctx = Context(nothing, nothing, nothing, nothing, lambda a: nothing, nothing, ApiConfig, lambda: "1")
    return AllocationApi(ctx)


def request(method: str, path: str = "", body: bytes = b"") -> Request:
    return Request(method, path, {}, {}, body)


def test_paths_match_their_endpoint_with_named_segments() -> None:
    a = api()
    endpoint, args = a._match("GET", "namespaces/team-a/jobs/train/status")
    assert endpoint.handler == a.allocations.job_status and args == {"namespace": "team-a", "name": "train"}
    endpoint, args = a._match("POST", "namespaces/team-a/allocations/bulk-release")
    assert endpoint.handler == a.allocations.bulk_release and args == {"namespace": "team-a"}
    endpoint, args = a._match("GET", "metrics/tenants/ml/usage")
    assert args == {"tenant": "ml"}


def test_unknown_paths_and_methods_are_statuses() -> None:
    a = api()
    reply = a.handle(request("GET"), "namespaces/a/widgets")
    body = orjson.loads(reply.body)
    assert reply.status == 404 and body["kind"] == "Status" and "widgets" in body["message"]
    reply = a.handle(request("PUT"), "namespaces/a/jobs")
    assert reply.status == 405 and "allowed: POST" in orjson.loads(reply.body)["message"]
    reply = a.handle(request("GET"), "namespaces/Not_A_Name/jobs/x")
    assert reply.status == 404


def test_past_the_in_flight_limit_the_api_answers_503_and_past_the_rate_429() -> None:
    a = api()
    a.in_flight = threading.BoundedSemaphore(1)
    a.in_flight.acquire()
    reply = a.handle(request("GET"), "metrics/queues")
    assert reply.status == 503 and ("Retry-After", "1") in reply.headers
    a.in_flight.release()
    a.limiter = RateLimiter(per_minute=60, burst=1)
    a.limiter.take("team/anonymous")  # per namespace and caller (here without an authorizer)
    reply = a.handle(request("GET"), "namespaces/team/allocations")
    assert reply.status == 429 and dict(reply.headers)["X-RateLimit-Remaining"] == "0"


def test_the_openapi_document_describes_every_endpoint_and_its_bodies() -> None:
    a = api()
    doc = orjson.loads(a.openapi())
    assert doc["openapi"].startswith("3.")
    ops = [(m, p) for p, item in doc["paths"].items() for m in item]
    assert len(ops) == len(a.endpoints)
    schemas = doc["components"]["schemas"]
    for item in doc["paths"].values():
        for op in item.values():
            ref = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {}).get("$ref")
            if ref:
                assert ref.rsplit("/", 1)[-1] in schemas
            assert "422" in op["responses"] and "429" in op["responses"]
    text = a.openapi().decode()
    for ref in {part.split('"')[0] for part in text.split('"$ref":"#/components/schemas/')[1:]}:
        assert ref in schemas, ref


def test_a_watch_slot_is_released_once_however_the_stream_ends() -> None:
    slots = threading.BoundedSemaphore(1)

    def frames() -> Any:
        yield b"a"
        yield b"b"

    never_started = Slotted.take(frames(), slots)
    try:
        Slotted.take(frames(), slots)
        raise AssertionError("a second stream got the only slot")
    except ApiError as e:
        assert e.code == 503
    never_started.close()  # the server closes a stream whose headers failed: the slot comes back
    never_started.close()  # and only once
    finished = Slotted.take(frames(), slots)
    assert list(finished) == [b"a", b"b"]
    finished.close()
    Slotted.take(frames(), slots).close()


def test_the_openapi_document_is_made_once() -> None:
    a = api()
    assert a.openapi() is a.openapi()


class _Pods:
    """The two cache calls a reading makes."""

    def __init__(self, pods: list[Any]) -> None:
        self.by_uid = {p.uid: p for p in pods}

    def pod_uids(self) -> list[str]:
        return list(self.by_uid)

    def pods(self, uids: list[str]) -> list[Any]:
        return [self.by_uid[u] for u in uids]


def test_a_paged_list_reads_its_later_pages_from_the_first_pages_reading(monkeypatch: Any) -> None:
    from extender.api import context as module
    from extender.objects import pod_info

    def pod(name: str) -> Any:
        meta = {"name": name, "namespace": "ns", "uid": name}
        return pod_info({"metadata": meta, "spec": {"schedulerName": "default-scheduler", "containers": []}})

    nothing = cast(Any, None)
    cache = _Pods([pod("a"), pod("b")])
    ctx = Context(cast(Any, cache), nothing, nothing, nothing, lambda a: nothing, nothing, ApiConfig, lambda: "1")
    ctx.events.reset("5")
    first = ctx.read()
    assert first.rv == "5" and [p.name for p in first.pods] == ["a", "b"]
    monkeypatch.setattr(module, "READ_S", 0.0)  # the next read is a new reading
    cache.by_uid["c"] = pod("c")
    ctx.events.add("ADDED", cache.by_uid["c"], "6")
    second = ctx.read()
    assert second.rv == "6" and len(second.pods) == 3
    assert ctx.reading_at(str(first.id)) is None  # not kept: no list paged from it
    ctx.keep(first)
    assert ctx.reading_at(str(first.id)) is first and ctx.reading_at(str(second.id)) is None
    assert ctx.reading_at("x") is None
