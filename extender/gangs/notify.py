"""Gang Events and status, written off the hot path by one background thread.

Each step of a gang (planned, unschedulable, released, scheduled) becomes an Event on the
defining object, and its status; waiting for quorum (n/m members) is status only, from the
moment the definition appears. A Phalanx Workload gets `status.phase`, `status.placement`,
`status.pendingReason` and three conditions: `Scheduled`, `Unschedulable` (the reason) and
`WaitingForQuorum` (n/m), each with the time it last changed. A scheduling.k8s.io PodGroup gets
the condition kube-scheduler writes, at the object's own version: v1beta1's
`PodGroupInitiallyScheduled` (True once scheduled, then terminal; False with reason
Unschedulable or WaitingForQuorum before that) or v1alpha2's `PodGroupScheduled` (the current
state).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from extender.binder import Binder
from extender.gangs.requests import WAITING_QUORUM
from extender.gangs.sources import INITIALLY_SCHEDULED, NATIVE_POD_GROUP, WORKLOAD, GangSpec

log = structlog.get_logger("phalanx.gangs.notify")


PLAN_ANNOTATION = "phalanx.io/gang-plan"
NUDGERS = 16  # threads writing nominations and wake-ups
WAITING = "WaitingForQuorum"


class Notifier:
    """Also wakes gang members: kube-scheduler parks a pod it could not place (here: a member
    filtered before its gang had quorum) until a cluster event concerns it, and an extender
    cannot activate pods the way an in-process permit plugin does. Writing the plan onto each
    member (annotation `phalanx.io/gang-plan`) is such an event: the member comes back at
    once and finds its reservation."""

    def __init__(self, binder: Binder, counted: Callable[[str], None] = lambda outcome: None) -> None:
        self.binder = binder
        self.counted = counted  # each wake-up's outcome: woken, bound (kube-scheduler was first), failed
        # Each item carries how often it was tried: a write that fails (an API server outage) is
        # queued again, up to RETRIES times, behind the backoff.
        self.queue: queue.Queue[tuple[GangSpec, str, str, str, int]] = queue.Queue(maxsize=10_000)
        # Pods (namespace, name) to nudge, each at most once in the queue: a later nudge of a
        # pod still waiting updates its entry (the latest wake-up value and nomination win), so
        # a burst of watch events for one pod costs one write, and a 512-member plan is not
        # stuck behind them. A pod's nomination and wake-up go out in one write.
        self.nudges: queue.Queue[tuple[str, str]] = queue.Queue(maxsize=100_000)
        self._pending: dict[tuple[str, str], tuple[str | None, str | None, int]] = {}
        self._pending_lock = threading.Lock()
        self._inflight: set[tuple[str, str]] = set()  # being written now
        self._nominate_refused = False
        self._transitions: dict[str, dict[str, tuple[str, str]]] = {}  # gang -> condition -> (status, since)
        # Several writers: a 512-member gang is nominated and woken in well under a second, not
        # one by one (each write mostly waits on kube-apiserver).
        self.nudgers = [
            threading.Thread(target=self._nudge_loop, name=f"gang-nudge-{i}", daemon=True) for i in range(NUDGERS)
        ]
        for t in self.nudgers:
            t.start()
        self.reports: queue.Queue[tuple[dict[str, Any], str, str, int]] = queue.Queue(maxsize=10_000)
        self._reported: dict[tuple[str, str], None] = {}  # (uid, message) already reported, oldest first
        self._reported_lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="gang-notify", daemon=True)
        self.thread.start()
        self.reporter = threading.Thread(target=self._report_loop, name="object-reports", daemon=True)
        self.reporter.start()

    def dead_threads(self) -> list[str]:
        """The names of the writer threads that are not running (none, unless a bug killed one:
        their loops catch every exception)."""
        return [t.name for t in (self.thread, self.reporter, *self.nudgers) if not t.is_alive()]

    def report(self, obj: dict[str, Any], reason: str, message: str) -> None:
        """A Warning Event on `obj` (a Kubernetes object or a reference with kind, apiVersion
        and metadata), once per (uid, message). Safe to call under any lock: it only queues."""
        key = ((obj.get("metadata") or {}).get("uid", "") or str((obj.get("metadata") or {}).get("name")), message)
        with self._reported_lock:
            if key in self._reported:
                return
            self._reported[key] = None
            if len(self._reported) > 50_000:
                self._reported.pop(next(iter(self._reported)))
        try:
            self.reports.put_nowait((obj, reason, message, 0))
        except queue.Full:
            log.warning("report dropped: queue full", reason=reason)

    def __call__(self, spec: GangSpec, reason: str, message: str, kind: str) -> None:
        try:
            self.queue.put_nowait((spec, reason, message, kind, 0))
        except queue.Full:
            log.warning("gang notification dropped: queue full", gang=spec.key, reason=reason)

    def nudge(self, namespace: str, name: str, value: str | None, nominate: str | None = None) -> None:
        self._nudge((namespace, name), value, nominate, 0)

    def _nudge(self, key: tuple[str, str], value: str | None, nominate: str | None, tries: int) -> None:
        with self._pending_lock:
            waiting = self._pending.get(key)
            if waiting is not None:  # queued already: its entry takes what is new
                self._pending[key] = (
                    value if value is not None else waiting[0],
                    nominate if nominate is not None else waiting[1],
                    min(tries, waiting[2]),
                )
                return
            self._pending[key] = (value, nominate, tries)
            if key in self._inflight:
                return  # its writer queues it again when done: one pod's writes never overtake
        self._enqueue(key)

    def _enqueue(self, key: tuple[str, str]) -> None:
        """Queue a pod whose entry is pending (dropped with it when the queue is full)."""
        try:
            self.nudges.put_nowait(key)
        except queue.Full:
            with self._pending_lock:
                self._pending.pop(key, None)
            log.warning("gang member nudge dropped: queue full", pod=f"{key[0]}/{key[1]}")

    # Every loop below survives any exception (an API server outage raises urllib3's errors,
    # not only OSError): it logs, backs off while failures repeat, and goes on.

    def _nudge_loop(self) -> None:
        failures = 0
        while True:
            key = self.nudges.get()
            with self._pending_lock:
                value, nominate, tries = self._pending.pop(key)
                self._inflight.add(key)
            try:
                failures = self._write(key, value, nominate, tries, failures)
            finally:
                with self._pending_lock:
                    self._inflight.discard(key)
                    again = key in self._pending
                if again:  # nudged while being written: the newer entry goes after this write
                    self._enqueue(key)

    def _write(self, key: tuple[str, str], value: str | None, nominate: str | None, tries: int, failures: int) -> int:
        """One pod's nomination and wake-up, in one write; the failures in a row, for the backoff."""
        namespace, name = key
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        try:
            if nominate is not None:
                # The planned node as the pod's nominated node: kube-scheduler then filters
                # the member on that node alone and skips scoring (evaluateNominatedNode),
                # instead of filtering every node. A nomination that no longer holds costs one
                # failed check, after which kube-scheduler clears it and filters as usual.
                # The wake-up rides on the same write (pods/status takes metadata too), so a
                # member woken by it always comes back with its nomination.
                body: dict[str, Any] = {"status": {"nominatedNodeName": nominate or None}}
                if value is not None:
                    body["metadata"] = {"annotations": {PLAN_ANNOTATION: value}}
                r = self.binder.kube.request(
                    "PATCH", f"{path}/status", body=body, content_type="application/merge-patch+json"
                )
                _written(r.status, "nomination")
                if r.status != 403:
                    if value is not None:
                        self._woken(r.status, namespace, name, r.body)
                    return 0
                if not self._nominate_refused:  # the wake-up alone below still works; said once
                    self._nominate_refused = True
                    log.warning(
                        "may not patch pods/status: gang members not nominated; with kube-scheduler's "
                        "default percentageOfNodesToScore they may not be offered their planned nodes "
                        "(grant patch on pods/status, as deploy/kubernetes does)",
                        error=_brief(r.body),
                    )
            if value is not None:
                patch = {"metadata": {"annotations": {PLAN_ANNOTATION: value}}}
                r = self.binder.kube.request("PATCH", path, body=patch, content_type="application/merge-patch+json")
                _written(r.status, "wake-up")
                self.counted("woken" if r.status < 300 else "failed")
            return 0
        except Exception as e:
            failures = _backoff(failures, "could not wake gang member", pod=f"{namespace}/{name}", error=str(e))
            if tries + 1 < RETRIES:
                self._nudge(key, value, nominate, tries + 1)
            elif value is not None:
                self.counted("failed")
            return failures

    def _woken(self, status: int, namespace: str, name: str, body: Any) -> None:
        """Count a wake-up pods/status answered. 422: kube-apiserver refuses a nomination
        for a bound pod. kube-scheduler requeues a pod an extender refused on any cluster event
        (the arrival of the member that completed the quorum, most often), so it may take a
        parked member up again right after the plan, find its planned node and bind it before
        this write lands: nothing to wake then."""
        if status < 300:
            self.counted("woken")
        elif status == 422:
            self.counted("bound")
            log.debug("gang member bound before its wake-up", pod=f"{namespace}/{name}", error=_brief(body))
        else:  # 404: deleted meanwhile
            self.counted("failed")

    def _run(self) -> None:
        failures = 0
        while True:
            spec, reason, message, kind, tries = self.queue.get()
            try:
                if reason != WAITING:
                    self.binder.event(spec.owner, reason=f"Gang{reason}", message=message, kind=kind)
                self._status(spec, reason, message)
                failures = 0
            except Exception as e:
                failures = _backoff(failures, "gang status update failed", gang=spec.key, error=str(e))
                _again(self.queue, (spec, reason, message, kind, tries + 1), tries)

    def _report_loop(self) -> None:
        failures = 0
        while True:
            obj, reason, message, tries = self.reports.get()
            try:
                self.binder.event(obj, reason=reason, message=message, kind="Warning", strict=True)
                failures = 0
            except Exception as e:
                failures = _backoff(failures, "report failed", reason=reason, error=str(e))
                _again(self.reports, (obj, reason, message, tries + 1), tries)

    def _status(self, spec: GangSpec, reason: str, message: str) -> None:
        meta = spec.owner["metadata"]
        if spec.source == WORKLOAD:
            phase = {"Planned": "Planned", "Scheduled": "Scheduled"}.get(reason, "Pending")
            status: dict[str, Any] = {"phase": phase, "pendingReason": "" if phase != "Pending" else message}
            if reason in ("Planned", "Scheduled"):
                status["placement"] = message
            status["conditions"] = self._conditions(spec.key, reason, message)
            path = f"/apis/phalanx.io/v1alpha1/namespaces/{meta['namespace']}/workloads/{meta['name']}/status"
            self.binder.kube.request(
                "PATCH", path, body={"status": status}, content_type="application/merge-patch+json"
            )
        elif spec.source == NATIVE_POD_GROUP and reason in ("Scheduled", "Unschedulable", "Released", WAITING):
            api_version = str(spec.owner.get("apiVersion") or "scheduling.k8s.io/v1beta1")
            if api_version.endswith("/v1alpha2"):
                kind = "PodGroupScheduled"  # 1.36: tracks the current state
            elif spec.initially_scheduled and reason != "Scheduled":
                return  # v1beta1's PodGroupInitiallyScheduled is terminal once True
            else:
                kind = INITIALLY_SCHEDULED
            now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            condition = {
                "type": kind,
                "status": "True" if reason == "Scheduled" else "False",
                "reason": reason if reason in ("Scheduled", WAITING) else "Unschedulable",
                "message": message[:1024],
                "lastTransitionTime": now,
            }
            path = f"/apis/{api_version}/namespaces/{meta['namespace']}/podgroups/{meta['name']}/status"
            # Strategic merge by condition type: other writers' conditions (DisruptionTarget,
            # kube-scheduler's own) are kept.
            self.binder.kube.request(
                "PATCH",
                path,
                body={"status": {"conditions": [condition]}},
                content_type="application/strategic-merge-patch+json",
            )

    def _conditions(self, key: str, reason: str, message: str) -> list[dict[str, str]]:
        """The Workload's three conditions for this step; a condition whose status did not
        change keeps its lastTransitionTime (the whole list is written: merge patch replaces
        lists)."""
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        unschedulable = reason in ("Unschedulable", "Released", "Invalid")
        states = {
            "Scheduled": (reason == "Scheduled", reason, message if reason in ("Planned", "Scheduled") else ""),
            "Unschedulable": (
                unschedulable,
                reason if unschedulable else "Schedulable",
                message if unschedulable else "",
            ),
            WAITING: (reason == WAITING, WAITING if reason == WAITING else "QuorumReached", _members(message)),
        }
        before = self._transitions.setdefault(key, {})
        if len(self._transitions) > 50_000:
            self._transitions.pop(next(iter(self._transitions)))
        conditions = []
        for kind, (on, why, text) in states.items():
            status = "True" if on else "False"
            since = before.get(kind)
            if since is None or since[0] != status:
                since = before[kind] = (status, now)
            conditions.append(
                {"type": kind, "status": status, "reason": why, "message": text[:1024], "lastTransitionTime": since[1]}
            )
        return conditions


def _members(message: str) -> str:
    """ "waiting for gang quorum 3/4" -> "3/4 members" (the n/m of a quorum message)."""
    if not message.startswith(WAITING_QUORUM):
        return ""
    return message.removeprefix(WAITING_QUORUM).strip() + " members"


def _backoff(failures: int, message: str, **fields: Any) -> int:
    """Log a failed write and sleep a little longer each time failures repeat (at most 5 s)."""
    log.warning(message, **fields)
    time.sleep(min(5.0, 0.05 * 2**failures))
    return min(failures + 1, 10)


RETRIES = 5


def _brief(body: Any) -> str:
    """kube-apiserver's reason for a refused write, short enough for one log line."""
    message = body.get("message") if isinstance(body, dict) else None
    return str(message if message else body)[:256]


def _written(status: int, what: str) -> None:
    """A write kube-apiserver did not take for a passing reason (throttled, overloaded, down
    behind a proxy) raises, so the writer backs off and tries again; 403 and 404 are final."""
    if status == 429 or status >= 500:
        raise RuntimeError(f"{what}: HTTP {status}")


def _again(q: queue.Queue[Any], item: Any, tries: int) -> None:
    """Queue a failed write again, unless it has been tried RETRIES times or the queue is full."""
    if tries + 1 < RETRIES:
        with contextlib.suppress(queue.Full):
            q.put_nowait(item)
