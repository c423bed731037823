"""benchmarks/noop_extender.py, the protocol's floor kwok_throughput --floor measures: its verbs
answer as Phalanx's default cut does (a GPU pod one node, any other its first 100), and its REST API
serves the benchmark's stats, to the holder of its kubeconfig's token, and nothing else."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from benchmarks.noop_extender import server
from extender.server import Server
from tests.extender.fakes import FakeKube, pod

TOKEN = "Bearer floor-token"


class TokenKube(FakeKube):
    """The headers a kubeconfig with a token gives (binds are not called here)."""

    headers: ClassVar[dict[str, str]] = {"Authorization": TOKEN}


@pytest.fixture
def floor() -> Iterator[Server]:
    srv = server(TokenKube(), 0)  # type: ignore[arg-type]
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def call(srv: Server, method: str, path: str, body: Any = None, token: str = TOKEN) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=10)
    try:
        headers = {"Authorization": token} if token else {}
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def test_a_gpu_pod_gets_one_node_and_any_other_pod_its_first_100(floor: Server) -> None:
    names = [f"n{i}" for i in range(150)]
    status, reply = call(floor, "POST", "/filter", {"Pod": pod("g", gpus=1), "NodeNames": names})
    assert status == 200 and reply["NodeNames"] == ["n0"]
    status, reply = call(floor, "POST", "/filter", {"Pod": pod("c", gpus=0), "NodeNames": names})
    assert status == 200 and reply["NodeNames"] == names[:100]
    assert call(floor, "POST", "/prioritize", {"Pod": pod("c", gpus=0), "NodeNames": names}) == (200, [])


def test_its_api_serves_the_stats_to_its_tokens_holder_and_nothing_else(floor: Server) -> None:
    assert call(floor, "DELETE", "/api/v1/stats", token="")[0] == 401
    assert call(floor, "DELETE", "/api/v1/stats", token="Bearer another")[0] == 401
    assert call(floor, "DELETE", "/api/v1/stats")[0] == 200
    assert call(floor, "POST", "/filter", {"Pod": pod("g", gpus=1), "NodeNames": ["n0"]})[0] == 200
    status, stats = call(floor, "GET", "/api/v1/stats")
    assert status == 200 and stats["latency"]["filter"]["count"] == 1
    assert call(floor, "GET", "/api/v1/nodes")[0] in (403, 404)


@pytest.mark.parametrize(
    ("verb", "body", "fragment"),
    [
        ("filter", {"Pod": pod("g", gpus=1), "NodeNames": 3}, "NodeNames"),
        ("filter", {"Pod": [], "NodeNames": ["n0"]}, "Pod"),
        ("bind", {"PodNamespace": "default", "PodName": "../../nodes/n0", "PodUID": "u", "Node": "n0"}, "PodName"),
        ("bind", {"PodNamespace": "default", "PodName": "p"}, "PodUID"),
    ],
)
def test_a_malformed_call_gets_a_400_naming_the_field(floor: Server, verb: str, body: Any, fragment: str) -> None:
    """Bad input gets Phalanx's own checks (extender/wire.py), never an internal error, and a
    bind's names reach no API path unchecked."""
    status, reply = call(floor, "POST", f"/{verb}", body)
    assert status == 400 and fragment in reply["Error"]
