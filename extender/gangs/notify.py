"""Gang Events and status, written off the hot path by one background thread.

Each step of a gang (planned, unschedulable, released, scheduled) becomes an Event on the
defining object, and its status: a Phalanx Workload gets `status.phase`, `status.placement`
and `status.pendingReason`; a scheduling.k8s.io PodGroup gets the `PodGroupScheduled`
condition as kube-scheduler writes it (True once scheduled; False with reason Unschedulable).
"""

from __future__ import annotations

import datetime as dt
import queue
import threading
from typing import Any

import structlog

from extender.binder import Binder
from extender.gangs.sources import NATIVE_POD_GROUP, WORKLOAD, GangSpec
from extender.kube import ApiError

log = structlog.get_logger("phalanx.gangs.notify")


PLAN_ANNOTATION = "phalanx.io/gang-plan"


class Notifier:
    """Also wakes gang members: kube-scheduler parks a pod it could not place (here: a member
    filtered before its gang had quorum) until a cluster event concerns it, and an extender
    cannot activate pods the way an in-process permit plugin does. Writing the plan onto each
    member (annotation `phalanx.io/gang-plan`) is such an event: the member comes back at
    once and finds its reservation."""

    def __init__(self, binder: Binder) -> None:
        self.binder = binder
        self.queue: queue.Queue[tuple[GangSpec, str, str, str]] = queue.Queue(maxsize=10_000)
        self.nudges: queue.Queue[tuple[str, str, str]] = queue.Queue(maxsize=100_000)
        # Several writers: a 512-member gang is woken in well under a second, not one by one.
        self.nudgers = [
            threading.Thread(target=self._nudge_loop, name=f"gang-nudge-{i}", daemon=True) for i in range(8)
        ]
        for t in self.nudgers:
            t.start()
        self.thread = threading.Thread(target=self._run, name="gang-notify", daemon=True)
        self.thread.start()

    def __call__(self, spec: GangSpec, reason: str, message: str, kind: str) -> None:
        try:
            self.queue.put_nowait((spec, reason, message, kind))
        except queue.Full:
            log.warning("gang notification dropped: queue full", gang=spec.key, reason=reason)

    def nudge(self, namespace: str, name: str, value: str) -> None:
        try:
            self.nudges.put_nowait((namespace, name, value))
        except queue.Full:
            log.warning("gang member nudge dropped: queue full", pod=f"{namespace}/{name}")

    def _nudge_loop(self) -> None:
        while True:
            namespace, name, value = self.nudges.get()
            patch = {"metadata": {"annotations": {PLAN_ANNOTATION: value}}}
            try:
                self.binder.kube.request(
                    "PATCH",
                    f"/api/v1/namespaces/{namespace}/pods/{name}",
                    body=patch,
                    content_type="application/merge-patch+json",
                )
            except OSError as e:
                log.warning("could not wake gang member", pod=f"{namespace}/{name}", error=str(e))

    def _run(self) -> None:
        while True:
            spec, reason, message, kind = self.queue.get()
            try:
                self.binder.event(spec.owner, reason=f"Gang{reason}", message=message, kind=kind)
                self._status(spec, reason, message)
            except (ApiError, OSError) as e:
                log.warning("gang status update failed", gang=spec.key, error=str(e))

    def _status(self, spec: GangSpec, reason: str, message: str) -> None:
        meta = spec.owner["metadata"]
        if spec.source == WORKLOAD:
            phase = {"Planned": "Planned", "Scheduled": "Scheduled"}.get(reason, "Pending")
            status: dict[str, Any] = {"phase": phase, "pendingReason": "" if phase != "Pending" else message}
            if reason in ("Planned", "Scheduled"):
                status["placement"] = message
            path = f"/apis/phalanx.io/v1alpha1/namespaces/{meta['namespace']}/workloads/{meta['name']}/status"
            self.binder.kube.request(
                "PATCH", path, body={"status": status}, content_type="application/merge-patch+json"
            )
        elif spec.source == NATIVE_POD_GROUP and reason in ("Scheduled", "Unschedulable", "Released"):
            now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            condition = {
                "type": "PodGroupScheduled",
                "status": "True" if reason == "Scheduled" else "False",
                "reason": "Scheduled" if reason == "Scheduled" else "Unschedulable",
                "message": message[:1024],
                "lastTransitionTime": now,
            }
            path = f"/apis/scheduling.k8s.io/v1alpha2/namespaces/{meta['namespace']}/podgroups/{meta['name']}/status"
            self.binder.kube.request(
                "PATCH", path, body={"status": {"conditions": [condition]}}, content_type="application/merge-patch+json"
            )
