"""The Solver gRPC service against the in-process solver, over a real channel on loopback:
the same plans on the corpus, refusals as the solver's own errors, and the fallback when the
service is down or slow."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import grpc
import pytest

import solver
from rpc import solver_pb2 as pb
from rpc import solver_pb2_grpc
from solverd import codec
from solverd.client import RemoteSolver
from solverd.server import SolverService, serve
from tests.solverd.corpus import EXACT, scenarios

SCENARIOS = scenarios()


def same(a: solver.PlanResult, b: solver.PlanResult) -> bool:
    return replace(a, solve_seconds=0.0) == replace(b, solve_seconds=0.0)


@pytest.fixture
def service() -> Iterator[tuple[grpc.Server, int]]:
    server, port = serve("127.0.0.1:0", threads=2)
    yield server, port
    server.stop(grace=0).wait()


def test_the_service_returns_the_in_process_plans_on_the_corpus(service: tuple[grpc.Server, int]) -> None:
    remote = RemoteSolver(f"127.0.0.1:{service[1]}")
    for name, snapshot, requests, params in SCENARIOS:
        local = solver.plan(snapshot, requests, params=params)
        assert same(solver.plan(snapshot, requests, params=params), local), f"{name}: not deterministic here"
        assert same(remote.plan(snapshot, requests, params=params), local), name
    assert (remote.remote_solves, remote.fallbacks) == (len(SCENARIOS), 0)
    health = remote.health()
    assert health.serving and health.solves == len(SCENARIOS)
    remote.close()


def test_a_malformed_request_is_invalid_argument_naming_the_field(service: tuple[grpc.Server, int]) -> None:
    _, snapshot, requests, params = SCENARIOS[0]
    wire = codec.solve_request(snapshot, requests, params)
    wire.params.placement_mode = "Everywhere"
    with grpc.insecure_channel(f"127.0.0.1:{service[1]}") as channel, pytest.raises(grpc.RpcError) as refused:
        solver_pb2_grpc.SolverStub(channel).Solve(wire, timeout=10)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "'Everywhere' is not a valid PlacementMode" in refused.value.details()


def test_what_the_solver_rejects_raises_in_the_caller_as_it_would_in_process() -> None:
    def rejecting(*_: Any, **__: Any) -> solver.PlanResult:
        raise KeyError("gang 'g' names an unknown level")

    server, port = serve("127.0.0.1:0", service=SolverService(rejecting))
    try:
        remote = RemoteSolver(f"127.0.0.1:{port}")
        _, snapshot, requests, params = SCENARIOS[0]
        with pytest.raises(ValueError, match="KeyError: \"gang 'g' names an unknown level\""):
            remote.plan(snapshot, requests, params=params)
        assert remote.fallbacks == 0  # a refusal is an answer, not an outage
    finally:
        server.stop(grace=0).wait()


def test_with_the_service_down_placements_continue_in_process_and_it_is_asked_again_later() -> None:
    server, port = serve("127.0.0.1:0")
    remote = RemoteSolver(f"127.0.0.1:{port}", retry_after_s=0.5)
    _, snapshot, requests, params = SCENARIOS[0]
    local = solver.plan(snapshot, requests, params=params)
    assert same(remote.plan(snapshot, requests, params=params), local) and remote.remote_solves == 1
    server.stop(grace=0).wait()  # killed
    assert same(remote.plan(snapshot, requests, params=params), local)
    assert remote.fallbacks == 1
    started = time.monotonic()
    assert same(remote.plan(snapshot, requests, params=params), local)  # not asked: no second wait
    assert remote.fallbacks == 2 and time.monotonic() - started < 0.5
    server, _ = serve(f"127.0.0.1:{port}")  # back
    try:
        # once the retry window has passed and the channel has reconnected (backoff at most 2 s),
        # calls go to the service again; until then each is answered in process
        deadline = time.monotonic() + 15
        while remote.remote_solves < 2 and time.monotonic() < deadline:
            assert same(remote.plan(snapshot, requests, params=params), local)
            time.sleep(0.1)
        assert remote.remote_solves == 2
    finally:
        server.stop(grace=0).wait()


def test_a_service_slower_than_the_deadline_is_not_waited_for() -> None:
    def slow(*args: Any, **kwargs: Any) -> solver.PlanResult:
        time.sleep(3)
        return solver.plan(*args, **kwargs)

    server, port = serve("127.0.0.1:0", service=SolverService(slow))
    try:
        remote = RemoteSolver(f"127.0.0.1:{port}", deadline_s=0.3)
        _, snapshot, requests, params = SCENARIOS[0]
        started = time.monotonic()
        result = remote.plan(snapshot, requests, params=params)
        assert time.monotonic() - started < 2.5 and remote.fallbacks == 1
        assert same(result, solver.plan(snapshot, requests, params=params))
    finally:
        server.stop(grace=0).wait()


def test_the_default_deadline_follows_the_solver_time_limit(service: tuple[grpc.Server, int]) -> None:
    remote = RemoteSolver(f"127.0.0.1:{service[1]}", slack_s=1.5)
    seen: list[float | None] = []
    stub = remote.stub

    class Recording:
        def Solve(self, request: pb.SolveRequest, timeout: float | None = None) -> pb.SolveResponse:
            seen.append(timeout)
            return stub.Solve(request, timeout=timeout)

    remote.stub = Recording()  # type: ignore[assignment]
    _, snapshot, requests, _ = SCENARIOS[0]
    remote.plan(snapshot, requests, params=replace(EXACT, time_limit_s=4.0))
    assert seen == [5.5]


def test_the_probe_says_whether_a_service_serves(service: tuple[grpc.Server, int]) -> None:
    from solverd.__main__ import probe

    assert probe(f"127.0.0.1:{service[1]}") == 0
    service[0].stop(grace=0).wait()
    assert probe(f"127.0.0.1:{service[1]}") == 1


def test_a_device_naming_a_table_that_was_not_sent_is_refused(service: tuple[grpc.Server, int]) -> None:
    _, snapshot, requests, params = SCENARIOS[0]
    wire = codec.solve_request(snapshot, requests, params)
    wire.snapshot.nodes[0].gpus[0].partition = -1  # would index the tables from the end
    with grpc.insecure_channel(f"127.0.0.1:{service[1]}") as channel, pytest.raises(grpc.RpcError) as refused:
        solver_pb2_grpc.SolverStub(channel).Solve(wire, timeout=10)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "partition -1 names no table" in refused.value.details()
