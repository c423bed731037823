"""The Solver gRPC service: `solver.plan` behind `rpc/solver.proto`.

Stateless: every Solve carries its snapshot, requests and parameters, and the answer is what
the in-process solver returns for them. Input the solver rejects (its ValueError, KeyError or
IndexError) is INVALID_ARGUMENT with the solver's message, so a caller can tell a bad request
from a failed service. Calls are served by a small thread pool (CP-SAT runs its own workers);
messages up to MAX_MESSAGE_BYTES (a 5,000-node snapshot is about 5 MB).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures
from importlib.metadata import PackageNotFoundError, version

import grpc
import structlog

import solver
from rpc import solver_pb2 as pb
from rpc import solver_pb2_grpc
from solver import PlanResult
from solverd import codec

log = structlog.get_logger("phalanx.solverd")

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
MESSAGE_LIMITS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]  # the server's and the client's channel options
REJECTED = (ValueError, KeyError, IndexError)


def _version() -> str:
    try:
        return version("phalanx")
    except PackageNotFoundError:
        return "dev"


class SolverService(solver_pb2_grpc.SolverServicer):  # type: ignore[misc]
    def __init__(self, planner: Callable[..., PlanResult] = solver.plan) -> None:
        self.planner = planner
        self._lock = threading.Lock()
        self.solves = 0

    def Solve(self, request: pb.SolveRequest, context: grpc.ServicerContext) -> pb.SolveResponse:
        try:
            snapshot = codec.from_snapshot(request.snapshot)
            asks = [codec.from_request(r) for r in request.requests]
            params = codec.from_params(request.params)
        except REJECTED as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {type(e).__name__}: {e}"[:2048])
        try:
            result = self.planner(snapshot, asks, params=params)
        except REJECTED as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{type(e).__name__}: {e}"[:2048])
        with self._lock:
            self.solves += 1
        return pb.SolveResponse(result=codec.plan(result))

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthResponse:
        with self._lock:
            return pb.HealthResponse(serving=True, version=_version(), solves=self.solves)


def serve(address: str, *, threads: int = 4, service: SolverService | None = None) -> tuple[grpc.Server, int]:
    """Start serving on `address` ("host:port"; port 0 picks one); return the server and port."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="solve"),
        options=MESSAGE_LIMITS,
    )
    solver_pb2_grpc.add_SolverServicer_to_server(service or SolverService(), server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    server.start()
    log.info("solver service listening", address=address, port=port)
    return server, port
