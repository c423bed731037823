"""Binding, with the device assignment riding on it; and Events.

The device annotation is set by the Binding itself (kube-apiserver copies a Binding's
annotations onto the pod in the same update that sets spec.nodeName), so a bound pod always
carries its devices: the node agent and a restarted extender find them, and there is no window
where one write landed without the other. A retried bind of a pod already bound to the same
node succeeds.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Callable
from typing import Any

import structlog

from extender.agents import Agents
from extender.kube import ApiError, Kube, Response, check
from extender.objects import DEVICES_ANNOTATION, encode_devices
from solver import DeviceAssignment

log = structlog.get_logger("phalanx.binder")
COMPONENT = "phalanx"


class Fenced(Exception):
    """A bind refused before it was sent: this replica may not bind now (`leader.py`)."""


class Binder:
    def __init__(self, kube: Kube, fence: Callable[[], str] | None = None, agents: Agents | None = None) -> None:
        self.kube = kube
        # The node agents (extender/agents.py): each admits a GPU pod's devices before its Binding.
        self.agents = agents
        # "" when this process may bind now, else why not (HA: only the confirmed leader).
        self.fence = fence
        # Told of every eviction the API server accepted: (namespace, name, node) (the eviction notices).
        self.on_evict: Callable[[str, str, str], None] | None = None

    def bind(self, namespace: str, name: str, uid: str, node: str, devices: tuple[DeviceAssignment, ...]) -> None:
        """One call: the API server copies a Binding's annotations onto the pod as it sets the
        node, so the device record and the binding land together or not at all. The fencing
        check runs right before it is sent."""
        refusal = self.fence() if self.fence is not None else ""
        if refusal:
            raise Fenced(refusal)
        pod_path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
        if devices:
            record = encode_devices(devices)
            meta["annotations"] = {DEVICES_ANNOTATION: record}
            if self.agents is not None:  # raises AgentRefused: nothing was bound
                self.agents.bind(namespace=namespace, name=name, uid=uid, node=node, record=record)
                # The agent may take up to its timeout: the fence is checked again right
                # before the Binding, so a leader deposed meanwhile binds nothing.
                refusal = self.fence() if self.fence is not None else ""
                if refusal:
                    raise Fenced(refusal)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        response = self._post_with_retry(f"{pod_path}/binding", body)
        if response.status == 409:
            current = check(self.kube.request("GET", pod_path), f"get pod {namespace}/{name}")
            if (current.get("spec") or {}).get("nodeName") == node:
                return  # already bound where we wanted: a retried bind
        check(response, f"bind pod {namespace}/{name} to {node}")

    def _post_with_retry(self, path: str, body: dict[str, Any]) -> Response:
        """Transient failures (5xx, 429, a dropped connection) are retried twice: a gang member
        whose gate has opened should not be lost to one bad response."""
        for attempt in range(3):
            try:
                response = self.kube.request("POST", path, body=body)
            except OSError:
                if attempt == 2:
                    raise
                time.sleep(0.1 * (attempt + 1))
                continue
            if (response.status < 500 and response.status != 429) or attempt == 2:
                return response
            time.sleep(0.1 * (attempt + 1))
        raise AssertionError("unreachable")

    def evict(self, namespace: str, name: str, uid: str, *, dry_run: bool = False, node: str = "") -> str:
        """Evict a pod through the Eviction API (policy/v1), so PodDisruptionBudgets hold; on a
        node with an agent, through the agent's EvictAllocation first (extender/agents.py):
        "" when accepted (or the pod is gone already), else why not (a budget's 429 included).
        The uid precondition keeps a pod recreated under the same name safe. Fenced like a
        bind: a replica that does not lead evicts nothing."""
        refusal = self.fence() if self.fence is not None else ""
        if refusal:
            return f"eviction of {namespace}/{name} not sent: {refusal}"
        if not dry_run and self.agents is not None:  # the node's agent ends it (EvictAllocation)
            answer = self.agents.evict(namespace=namespace, name=name, node=node, reason="preempted by Phalanx")
            if answer is not None:
                return answer
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        if dry_run:
            body["deleteOptions"]["dryRun"] = ["All"]
        try:
            response = self.kube.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body=body)
        except Exception as e:  # OSError, a reply that does not decode: never into a verb
            return f"eviction of {namespace}/{name} failed: {type(e).__name__}: {str(e)[:256]}"
        if response.status in (200, 201, 404):
            if not dry_run and response.status != 404 and self.on_evict is not None:
                self.on_evict(namespace, name, node)
            return ""
        message = response.body.get("message", "") if isinstance(response.body, dict) else ""
        return f"eviction of {namespace}/{name} refused ({response.status}): {str(message)[:256]}"

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        response = self.kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        if response.status == 404:
            return None
        result: dict[str, Any] = check(response, f"get pod {namespace}/{name}")
        return result

    def event(
        self, obj: dict[str, Any], *, reason: str, message: str, kind: str = "Normal", strict: bool = False
    ) -> None:
        """Record an Event on `obj` (a Kubernetes object as JSON); failures are only logged,
        or raised with `strict` (a caller that retries)."""
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta.get('name', 'object')}.{uuid.uuid4().hex[:12]}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", "v1"),
                "kind": obj.get("kind", ""),
                "name": meta.get("name", ""),
                "namespace": meta.get("namespace", ""),
                "uid": meta.get("uid", ""),
            },
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": COMPONENT},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            check(self.kube.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body), "create event")
        except (ApiError, OSError) as e:
            if strict:
                raise
            log.warning("could not record event", reason=reason, error=str(e))
