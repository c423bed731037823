"""Binding: write the device assignment on the pod, then create its Binding; and Events.

The annotation goes first so that the node agent and a restarted extender always find the
devices of a bound pod. Both writes are idempotent: a retried bind of a pod already bound to
the same node succeeds, and the annotation patch is a merge patch.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import structlog

from extender.kube import ApiError, Kube, check
from extender.objects import DEVICES_ANNOTATION, encode_devices
from solver.model import DeviceAssignment

log = structlog.get_logger("phalanx.binder")
COMPONENT = "phalanx"


class Binder:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def bind(self, namespace: str, name: str, uid: str, node: str, devices: tuple[DeviceAssignment, ...]) -> None:
        pod_path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        if devices:
            patch = {"metadata": {"annotations": {DEVICES_ANNOTATION: encode_devices(devices)}}}
            check(
                self.kube.request("PATCH", pod_path, body=patch, content_type="application/merge-patch+json"),
                f"annotate pod {namespace}/{name}",
            )
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        response = self.kube.request("POST", f"{pod_path}/binding", body=body)
        if response.status == 409:
            current = check(self.kube.request("GET", pod_path), f"get pod {namespace}/{name}")
            if (current.get("spec") or {}).get("nodeName") == node:
                return  # already bound where we wanted: a retried bind
        check(response, f"bind pod {namespace}/{name} to {node}")

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        response = self.kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        if response.status == 404:
            return None
        result: dict[str, Any] = check(response, f"get pod {namespace}/{name}")
        return result

    def event(self, obj: dict[str, Any], *, reason: str, message: str, kind: str = "Normal") -> None:
        """Record an Event on `obj` (a Kubernetes object as JSON); failures are only logged."""
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
            log.warning("could not record event", reason=reason, error=str(e))
