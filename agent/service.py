"""The seed's `NodeAgent` gRPC service (rpc/nodeagent.proto, package `scheduler.v1`).

- `BindAllocation`: the extender calls it before each Binding of a GPU pod here. The record
  (annotation `phalanx.io/gpu-devices`) is checked against the inventory and what the node
  holds (`agent.ledger`); a dynamic MIG slice is cut now, so it exists before the pod reaches
  the kubelet. A refusal names the device and the reason (`failure_reason`), and the extender
  does not bind. The allocation stays pending until the pod shows up here (`agent.node`).
- `EvictAllocation`: an Eviction of the pod (PodDisruptionBudgets apply) with the grace period.
- `GetResourceSnapshot`: inventory, allocations, usage, conditions.
- `Heartbeat`: for each request (the scheduler's view: the allocations it believes are here),
  the directives that follow from the node's view, and the lease within which to look again.

Every call carries the caller's bearer token (`agent.auth`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import structlog

from agent.auth import Reviewer
from agent.contract import DEVICES_ANNOTATION, POD_UID_ANNOTATION, RecordError, decode
from agent.inventory import Inventory
from agent.ledger import INVALID_RECORD, Allocation, BindRefused, Ledger
from agent.node import NodeLoop
from rpc import nodeagent_pb2 as pb
from rpc import nodeagent_pb2_grpc as pb_grpc

log = structlog.get_logger("phalanx.agent")

WRONG_NODE = "WrongNode"
LEASE_S = 10


def _now_ms() -> int:
    return int(time.time() * 1000)


class NodeAgentService(pb_grpc.NodeAgentServicer):  # type: ignore[misc]
    def __init__(self, node: str, ledger: Ledger, loop: NodeLoop, reviewer: Reviewer | None) -> None:
        self.node = node
        self.ledger = ledger
        self.loop = loop
        self.reviewer = reviewer

    def _authorize(self, context: grpc.ServicerContext, verb: str) -> None:
        if self.reviewer is None:
            return
        metadata = dict(context.invocation_metadata())
        verdict = self.reviewer.check(metadata.get("authorization"), verb)
        if not verdict.allowed:
            code = {
                "Unauthenticated": grpc.StatusCode.UNAUTHENTICATED,
                "PermissionDenied": grpc.StatusCode.PERMISSION_DENIED,
            }.get(verdict.code, grpc.StatusCode.UNAVAILABLE)
            context.abort(code, verdict.message)

    def BindAllocation(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context, "create")
        if request.node_id and request.node_id != self.node:
            return pb.BindResponse(
                success=False,
                failure_reason=WRONG_NODE,
                error_message=f"this agent serves {self.node}, not {request.node_id}",
            )
        key = request.allocation_id
        if key.count("/") != 1 or not all(key.split("/")):
            return pb.BindResponse(
                success=False,
                failure_reason=INVALID_RECORD,
                error_message=f"allocation_id {key!r} is not namespace/name",
            )
        try:
            grants = decode(request.annotations.get(DEVICES_ANNOTATION))
        except RecordError as e:
            return pb.BindResponse(
                success=False, failure_reason=INVALID_RECORD, error_message=f"{DEVICES_ANNOTATION}: {e}"
            )
        if grants is None:
            return pb.BindResponse(
                success=False,
                failure_reason=INVALID_RECORD,
                error_message=f"annotation {DEVICES_ANNOTATION} is missing",
            )
        if not self.loop.listed():  # after a restart: what the node holds is not known yet
            context.abort(grpc.StatusCode.UNAVAILABLE, f"the agent on {self.node} is still listing its pods")
        held = self.ledger.get(key)
        if held is not None and held.grants != grants and self.loop.is_pending(key):
            self.ledger.release(key)  # a retry of a Binding that never happened, with new devices
        self.loop.pending(key)  # before the ledger admits it: a relist in between keeps it
        try:
            self.ledger.bind(key, request.annotations.get(POD_UID_ANNOTATION, ""), grants)
        except BindRefused as e:
            log.info("bind refused", pod=key, reason=e.reason, message=e.message)
            return pb.BindResponse(success=False, failure_reason=e.reason, error_message=e.message)
        return pb.BindResponse(success=True)

    def EvictAllocation(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context, "delete")
        key = request.allocation_id
        if key.count("/") != 1:
            return pb.EvictResponse(success=False, error_message=f"allocation_id {key!r} is not namespace/name")
        namespace, name = key.split("/", 1)
        pod = self.loop.pods().get(key)
        if pod is None:
            return pb.EvictResponse(success=False, error_message=f"pod {key} is not on node {self.node}")
        grace = int(request.grace_period_seconds)
        uid = (pod.get("metadata") or {}).get("uid", "")
        r = self.loop.kube.evict(namespace, name, grace_s=grace if grace >= 0 else None, uid=uid)
        if r.status not in (200, 201):
            message = r.body.get("message") if isinstance(r.body, dict) else str(r.body)
            return pb.EvictResponse(success=False, error_message=f"eviction of {key}: HTTP {r.status}: {message}")
        if grace < 0:
            grace = int((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
        log.info("pod evicted", pod=key, reason=request.reason, grace_s=grace)
        return pb.EvictResponse(success=True, deadline=_now_ms() + grace * 1000)

    def GetResourceSnapshot(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._authorize(context, "get")
        return snapshot(self.node, self.ledger, self.loop)

    def Heartbeat(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        self._authorize(context, "get")
        for request in requests:
            yield pb.HeartbeatResponse(directives=directives(request, self.ledger), lease_duration_seconds=LEASE_S)


def snapshot(node: str, ledger: Ledger, loop: NodeLoop) -> Any:
    inventory = ledger.inventory
    allocations = ledger.allocations()
    return pb.ResourceSnapshot(
        node_id=node,
        timestamp=_now_ms(),
        backend=inventory.backend,
        driver_version=inventory.driver_version,
        gpus=[_gpu(g, inventory, allocations) for g in inventory.gpus],
        allocations=[_allocation(a, loop.is_pending) for a in allocations],
        usage=usage(inventory, allocations),
        conditions=conditions(inventory, loop),
    )


def _gpu(g: Any, inventory: Inventory, allocations: list[Allocation]) -> Any:
    holders = {d.mig.uuid: a.key for a in allocations for d in a.devices if d.mig is not None}
    return pb.GpuDevice(
        index=g.index,
        uuid=g.uuid,
        model=g.model,
        memory_mib=g.memory_mib,
        mig_enabled=g.mig_enabled,
        dynamic_mig=inventory.dynamic_mig,
        healthy=g.healthy,
        health_reason=g.health_reason,
        mig_devices=[
            pb.MigDevice(
                uuid=m.uuid, profile=m.profile, start=m.start, size=m.size, allocation_id=holders.get(m.uuid, "")
            )
            for m in g.migs
        ],
    )


def _allocation(a: Allocation, is_pending: Callable[[str], bool]) -> Any:
    return pb.Allocation(
        allocation_id=a.key,
        pod_uid=a.uid,
        phase="Pending" if is_pending(a.key) else "Bound",
        grants=[
            pb.DeviceGrant(
                index=d.grant.index,
                uuid=d.uuid,
                milli=d.grant.milli,
                memory_mib=d.grant.memory_mib,
                mig_profile=d.grant.mig,
                mig_start=d.grant.start,
            )
            for d in a.devices
        ],
    )


def usage(inventory: Inventory, allocations: list[Allocation]) -> Any:
    milli = memory = 0
    for a in allocations:
        for d in a.devices:
            if d.mig is None:
                milli += d.grant.milli
                gpu = inventory.gpu(d.grant.index)
                memory += d.grant.memory_mib or (gpu.memory_mib if gpu and d.grant.whole else 0)
    return pb.ResourceUsage(
        gpus=len(inventory.gpus),
        gpus_healthy=sum(1 for g in inventory.gpus if g.healthy),
        gpu_milli_allocated=milli,
        gpu_memory_mib_allocated=memory,
        allocations=len(allocations),
    )


def conditions(inventory: Inventory, loop: NodeLoop) -> list[Any]:
    sick = [f"GPU {g.index} ({g.uuid}): {g.health_reason}" for g in inventory.gpus if not g.healthy]
    return [
        pb.NodeCondition(
            type="GPUHealthy",
            status="False" if sick else "True",
            reason="DeviceUnhealthy" if sick else "AllHealthy",
            message="; ".join(sick),
            last_transition=_now_ms(),
        ),
        pb.NodeCondition(type="AgentReady", status="True" if loop.ready() else "False"),
    ]


def directives(request: Any, ledger: Ledger) -> list[Any]:
    """What the scheduler should act on, comparing its view (`pod_statuses`) with the node's."""
    inventory = ledger.inventory
    held = {a.key: a for a in ledger.allocations()}
    believed = {s.allocation_id for s in request.pod_statuses}
    out = []
    sick = {g.index: g.health_reason for g in inventory.gpus if not g.healthy}
    for key, a in sorted(held.items()):
        for d in a.devices:
            if d.grant.index in sick:
                out.append(
                    pb.SchedulingDirective(
                        type="DeviceUnhealthy",
                        allocation_id=key,
                        device_index=d.grant.index,
                        reason=sick[d.grant.index],
                    )
                )
        if request.pod_statuses and key not in believed:
            out.append(pb.SchedulingDirective(type="UnknownAllocation", allocation_id=key, reason="held on the node"))
    for key in sorted(believed - held.keys()):
        out.append(pb.SchedulingDirective(type="MissingAllocation", allocation_id=key, reason="not held on the node"))
    return out
