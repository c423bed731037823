"""Queue status: what `kubectl get queues` shows, written by the leader every few seconds.

Each Queue object's status (allocated, deserved, fair share, limit per resource, pending pods and
gangs, the oldest wait, preemptions and reclaims, spec problems) is computed from the queue book
and written with a merge patch to the status subresource, only when it changed (the timestamp
alone never causes a write). A standby replica writes nothing. A failed write is retried on the
next round; it never stops the loop.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from typing import Any

import structlog

from extender.kube import ApiError, Kube
from extender.queues import QueueBook, view_json

log = structlog.get_logger("phalanx.queue-status")

QUEUES_PATH = "/apis/phalanx.io/v1alpha1/queues"


class QueueStatusWriter:
    def __init__(
        self,
        kube: Kube,
        book: QueueBook,
        *,
        leading: Callable[[], bool] = lambda: True,
        counts: Callable[[str], tuple[int, int]] = lambda queue: (0, 0),
    ) -> None:
        self.kube = kube
        self.book = book
        self.leading = leading
        self.counts = counts  # queue -> (preemptions, reclaims) it caused
        self._written: dict[str, dict[str, Any]] = {}
        self._stopping = threading.Event()

    def statuses(self) -> dict[str, dict[str, Any]]:
        """The status of every queue that has a Queue object, as it would be written."""
        out: dict[str, dict[str, Any]] = {}
        if not self.book.active:
            return out  # no Queue object: no status to write, and no views to derive (every pod)
        for view in self.book.views():
            if not self.book.has_object(view.name):
                continue
            body = view_json(view)
            preemptions, reclaims = self.counts(view.name)
            out[view.name] = {
                "allocated": body["allocated"],
                "deserved": body["deserved"],
                "fairShare": body["fairShare"],
                "limit": body["limit"],
                "summary": body["summary"],
                "pendingPods": body["pendingPods"],
                "pendingGangs": body["pendingGangs"],
                "oldestWait": body["oldestWait"],
                "preemptions": preemptions,
                "reclaims": reclaims,
                "problems": body["problems"],
            }
        return out

    def write_once(self) -> int:
        """Write the statuses that changed; the number written."""
        if not self.leading():
            self._written.clear()  # a new leader writes everything once
            return 0
        written = 0
        for name, status in self.statuses().items():
            if self._written.get(name) == status:
                continue
            stamped = {**status, "updated": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
            try:
                self.kube.request(
                    "PATCH",
                    f"{QUEUES_PATH}/{name}/status",
                    body={"status": stamped},
                    content_type="application/merge-patch+json",
                )
            except (ApiError, OSError) as e:
                log.warning("queue status not written", queue=name, error=str(e)[:256])
                continue
            self._written[name] = status
            written += 1
        return written

    def run(self, every_s: Callable[[], float]) -> None:
        while not self._stopping.wait(every_s()):
            try:
                self.write_once()
            except Exception:
                log.exception("queue status round failed")

    def stop(self) -> None:
        self._stopping.set()
