"""The extender's side of the node agents: `BindAllocation` before each Binding of a GPU pod,
`EvictAllocation` for the pods preemption and reclaim evict.

Where a node agent runs (agent/), its Node carries `phalanx.io/agent-endpoint` (host:port of
the seed's `NodeAgent` gRPC service, rpc/nodeagent.proto). Before the Binding, the binder asks
the agent to admit the device record: the agent checks every device against what NVML reports
and what the node holds, and cuts a dynamic MIG slice, so the slice exists before the pod
reaches the kubelet. A refusal (a device the node does not know, an unhealthy one, one already
held) fails the bind with the agent's reason, and the pod's reservation is released as for any
refused Binding: no pod is ever bound to devices its node refused.

An agent that cannot be reached within `timeout_s` does not stop the bind (`required` false,
the default): the agent re-checks every record when the pod arrives and refuses the container
start of one it cannot honour, with an Event naming why. Calls carry the extender's own bearer
token; the agent reviews it (TokenReview, SubjectAccessReview on `nodeagents.phalanx.io`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc
import structlog

from extender.objects import DEVICES_ANNOTATION
from rpc import nodeagent_pb2 as pb
from rpc import nodeagent_pb2_grpc as pb_grpc

log = structlog.get_logger("phalanx.agents")

ENDPOINT_ANNOTATION = "phalanx.io/agent-endpoint"
POD_UID_ANNOTATION = "phalanx.io/pod-uid"
MAX_CHANNELS = 8192


class AgentRefused(Exception):
    """The node's agent refused the devices; the message carries its reason."""

    def __init__(self, node: str, reason: str, message: str) -> None:
        super().__init__(f"node agent on {node} refused the devices ({reason}): {message}")
        self.reason = reason


class Agents:
    def __init__(
        self,
        endpoint_of: Callable[[str], str],
        authorization: Callable[[], str | None],
        *,
        timeout_s: float = 2.0,
        required: bool = False,
    ) -> None:
        self.endpoint_of = endpoint_of
        self.authorization = authorization
        self.timeout_s = timeout_s
        self.required = required
        self._lock = threading.Lock()
        self._stubs: dict[str, Any] = {}

    def _stub(self, endpoint: str) -> Any:
        with self._lock:
            stub = self._stubs.get(endpoint)
            if stub is None:
                if len(self._stubs) >= MAX_CHANNELS:
                    self._stubs.clear()
                stub = pb_grpc.NodeAgentStub(grpc.insecure_channel(endpoint))
                self._stubs[endpoint] = stub
            return stub

    def bind(self, *, namespace: str, name: str, uid: str, node: str, record: str) -> None:
        """Admit `record` on `node`'s agent; raises `AgentRefused` (and, when `required`,
        OSError for an agent that does not answer). A node without an agent: nothing to do."""
        endpoint = self.endpoint_of(node)
        if not endpoint:
            return
        request = pb.BindRequest(
            allocation_id=f"{namespace}/{name}",
            node_id=node,
            annotations={DEVICES_ANNOTATION: record, POD_UID_ANNOTATION: uid},
        )
        authorization = self.authorization()
        metadata = (("authorization", authorization),) if authorization else ()
        try:
            reply = self._stub(endpoint).BindAllocation(request, timeout=self.timeout_s, metadata=metadata)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            message = f"node agent on {node} ({endpoint}): {code}: {e.details() if hasattr(e, 'details') else e}"
            if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                raise AgentRefused(node, str(code.name), message) from None
            if self.required:
                raise OSError(message) from None
            log.warning("node agent not reached; binding without it", node=node, endpoint=endpoint, error=message)
            return
        if not reply.success:
            raise AgentRefused(node, reply.failure_reason, reply.error_message)

    def evict(self, *, namespace: str, name: str, node: str, reason: str) -> str | None:
        """Evict a pod through its node's agent (`EvictAllocation`: an Eviction with the pod's
        own grace period, so budgets hold). "" when the agent evicted it; None when the node has
        no agent, it does not answer or it did not evict (a budget, a pod it has not seen yet):
        the caller then evicts directly, and the API server's answer is the one reported."""
        endpoint = self.endpoint_of(node) if node else ""
        if not endpoint:
            return None
        request = pb.EvictRequest(
            allocation_id=f"{namespace}/{name}", node_id=node, grace_period_seconds=-1, reason=reason
        )
        authorization = self.authorization()
        metadata = (("authorization", authorization),) if authorization else ()
        try:
            reply = self._stub(endpoint).EvictAllocation(request, timeout=self.timeout_s, metadata=metadata)
        except grpc.RpcError as e:
            log.warning("node agent not reached; evicting directly", node=node, endpoint=endpoint, error=str(e)[:300])
            return None
        if not reply.success:
            log.info("node agent did not evict; evicting directly", node=node, error=reply.error_message)
            return None
        return ""
