"""The extender's remote solver: `RemoteSolver.plan` has `solver.plan`'s signature and answers
from the Solver service, within a deadline, or from the in-process solver.

* The deadline is the parameters' CP-SAT time limit plus `slack_s` (the service needs about
  that long at most, plus the transfer), unless `deadline_s` fixes it.
* A refused request (INVALID_ARGUMENT) raises ValueError with the service's message, as the
  in-process solver would raise: the gang manager then isolates the bad gang as it does today.
* Anything else (unreachable, deadline exceeded, an internal error) falls back to the
  in-process solver for that call, and for the next `retry_after_s` the service is not asked
  at all, so a dead service costs one deadline, not one per solve; after that, the next call
  tries it again. `fallbacks` counts the calls answered in process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import grpc
import structlog

import solver
from rpc import solver_pb2 as pb
from rpc import solver_pb2_grpc
from solver import ClusterSnapshot, GangRequest, PlanResult, SolverParams
from solverd import codec
from solverd.server import MESSAGE_LIMITS

log = structlog.get_logger("phalanx.solver-client")

Planner = Callable[..., PlanResult]
DEFAULT_PARAMS = SolverParams()


class RemoteSolver:
    def __init__(
        self,
        address: str,
        *,
        deadline_s: float | None = None,
        slack_s: float = 2.0,
        retry_after_s: float = 10.0,
        fallback: Planner = solver.plan,
        on_solve: Callable[[str], None] = lambda where: None,
    ) -> None:
        self.address = address
        self.deadline_s = deadline_s
        self.slack_s = slack_s
        self.retry_after_s = retry_after_s
        self.fallback = fallback
        self.on_solve = on_solve  # "remote", "fallback" or "refused", once per call (metrics)
        self.channel = grpc.insecure_channel(
            address,
            options=[
                *MESSAGE_LIMITS,
                # reconnect within a few seconds of the service coming back (gRPC's default
                # backoff grows to 2 minutes: the fallback would outlive the outage by that much)
                ("grpc.initial_reconnect_backoff_ms", 200),
                ("grpc.min_reconnect_backoff_ms", 200),
                ("grpc.max_reconnect_backoff_ms", 2000),
            ],
        )
        self.stub = solver_pb2_grpc.SolverStub(self.channel)
        self._lock = threading.Lock()
        self._skip_until = 0.0
        self.remote_solves = 0
        self.fallbacks = 0

    def plan(
        self, snapshot: ClusterSnapshot, requests: Sequence[GangRequest], *, params: SolverParams = DEFAULT_PARAMS
    ) -> PlanResult:
        with self._lock:
            skip = time.monotonic() < self._skip_until
        if not skip:
            deadline = self.deadline_s if self.deadline_s is not None else params.time_limit_s + self.slack_s
            try:
                reply = self.stub.Solve(codec.solve_request(snapshot, requests, params), timeout=deadline)
                with self._lock:
                    self.remote_solves += 1
                self.on_solve("remote")
                return codec.from_plan(reply.result)
            except grpc.RpcError as e:
                code = e.code() if isinstance(e, grpc.Call) else grpc.StatusCode.UNKNOWN
                details = e.details() if isinstance(e, grpc.Call) else str(e)
                if code is grpc.StatusCode.INVALID_ARGUMENT:
                    self.on_solve("refused")
                    raise ValueError(details) from None
                with self._lock:
                    self._skip_until = time.monotonic() + self.retry_after_s
                log.warning(
                    "remote solver failed; solving in process",
                    address=self.address,
                    code=code.name,
                    error=(details or "")[:256],
                    retry_after_s=self.retry_after_s,
                )
        with self._lock:
            self.fallbacks += 1
        self.on_solve("fallback")
        return self.fallback(snapshot, requests, params=params)

    def health(self, timeout_s: float = 2.0) -> pb.HealthResponse:
        reply: pb.HealthResponse = self.stub.Health(pb.HealthRequest(), timeout=timeout_s)
        return reply

    def close(self) -> None:
        self.channel.close()
