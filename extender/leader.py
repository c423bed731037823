"""High availability: the extender follows its own kube-scheduler's leadership.

Two replicas of the pod (kube-scheduler + extender) run; kube-scheduler elects a leader on its
Lease and only the leader schedules, so only the leader's extender is called. The extender does
not elect on its own (two elections could pick different pods): it asks its sibling, on the
pod's loopback, whether it leads (`leader_election_master_status{name=<lease>}` on
kube-scheduler's `/metrics`, read with the extender's token), and reads the Lease for the
holder, its renew time and duration, and its transition count.

A bind goes ahead only while leadership is confirmed (`check`, right before the Binding is
sent, after any wait at the gang gate): the sibling said it leads, and less than the lease's
duration (minus `MARGIN_S` for clocks and the request's own time) has passed since a renewal
this process saw. A standby that took over must itself wait out a full lease duration after the
last renewal it saw, so a deposed leader, even one paused and resumed, refuses its binds before
the new one can start (the fencing check). When confirmation lapses, every gang reservation is
released at once (`on_lost`): members waiting at the gate are answered and requeued, and the
new leader plans them again, next to members already bound.
"""

from __future__ import annotations

import datetime as dt
import re
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from extender.kube import Kube

log = structlog.get_logger("phalanx.leader")

MARGIN_S = 2.0  # of a lease's duration kept back from binding: clock skew, the request's own time
POLL_S = 1.0


@dataclass(frozen=True, slots=True)
class LeaderOptions:
    lease_namespace: str
    lease_name: str
    scheduler_metrics_url: str = "https://127.0.0.1:10259/metrics"


@dataclass(frozen=True, slots=True)
class Observation:
    leads: bool  # the sibling kube-scheduler says it holds the lease
    holder: str
    transitions: int
    valid_until: float  # monotonic: binds allowed before this
    why: str = ""  # why not, when not
    certain: bool = True  # False: the sibling or the lease could not be read (say nothing for sure)


class Leadership:
    def __init__(
        self,
        kube: Kube,
        options: LeaderOptions,
        on_lost: Callable[[str], None],
        gauge: Callable[[float], None] = lambda value: None,
    ) -> None:
        self.kube = kube
        self.options = options
        self.on_lost = on_lost
        self.gauge = gauge  # 1 while binds are allowed (the phalanx_leading metric)
        self._lock = threading.Lock()
        self._seen = Observation(False, "", -1, 0.0, "leadership not confirmed yet")
        self._stop = threading.Event()
        self._metric = re.compile(
            # kube-scheduler names its elector "kube-scheduler" whatever the lease is called.
            r'^leader_election_master_status\{[^}]*name="kube-scheduler"[^}]*\}\s+(\S+)',
            re.MULTILINE,
        )
        # kube-scheduler serves its metrics with a self-signed certificate on loopback.
        self._tls = ssl.create_default_context()
        self._tls.check_hostname = False
        self._tls.verify_mode = ssl.CERT_NONE
        self.thread = threading.Thread(target=self._run, name="leadership", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()

    def check(self) -> str:
        """ "" when this process may bind now; else why not."""
        with self._lock:
            seen = self._seen
        if not seen.leads:
            return f"not the leader: {seen.why}"
        left = seen.valid_until - time.monotonic()
        if left <= 0:
            return f"leadership of lease {self._lease} not confirmed for {-left + MARGIN_S:.1f} s"
        return ""

    @property
    def leading(self) -> bool:
        return not self.check()

    @property
    def _lease(self) -> str:
        return f"{self.options.lease_namespace}/{self.options.lease_name}"

    def _run(self) -> None:
        """Poll every POLL_S. Binds need a fresh confirmation (`check`). Reservations are
        dropped when the sibling says it no longer leads, or when nothing could be confirmed for
        a whole lease duration; not when one poll failed or was slow (a busy node): a lapse alone
        refuses binds until the next confirmation."""
        led = False
        holder = ""  # the lease's holder while this replica leads (its kube-scheduler's identity)
        confirmed = 0.0  # monotonic time of the last confirmation
        duration = 15.0  # the lease's, as last read
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                seen = self._observe(started)
            except Exception as e:  # any fault: leadership unconfirmed, never assumed
                seen = Observation(False, "", -1, 0.0, f"cannot confirm leadership: {e}", certain=False)
            if led and seen.leads and holder and seen.holder != holder:
                # Another identity holds the lease: whatever the sibling says, the lead moved
                # (or the sibling restarted and won it again: its reservations start afresh).
                seen = Observation(False, seen.holder, seen.transitions, 0.0, f"the lease moved to {seen.holder!r}")
            with self._lock:
                self._seen = seen
            self.gauge(0.0 if self.check() else 1.0)
            if seen.leads:
                confirmed = started
                duration = max(1.0, seen.valid_until + MARGIN_S - started)
            lost = led and not seen.leads and (seen.certain or started - confirmed > duration)
            if seen.leads != led and (seen.leads or lost):
                log.info("leadership", leading=seen.leads, lease=self._lease, holder=seen.holder, why=seen.why)
                if lost:
                    self.on_lost(f"this replica no longer leads {self._lease}: {seen.why}")
                led = seen.leads
                holder = seen.holder if led else ""
            elif led and not seen.leads:
                log.warning("leadership not confirmed; binds wait", lease=self._lease, why=seen.why)
            self._stop.wait(max(0.0, POLL_S - (time.monotonic() - started)))
        if led:
            self.on_lost("the extender is stopping")

    def _observe(self, started: float) -> Observation:
        leads = self._sibling_leads()
        path = (
            f"/apis/coordination.k8s.io/v1/namespaces/{self.options.lease_namespace}/leases/{self.options.lease_name}"
        )
        r = self.kube.request("GET", path)
        if r.status != 200:
            return Observation(False, "", -1, 0.0, f"lease {self._lease}: HTTP {r.status}", certain=False)
        spec = r.body.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        transitions = int(spec.get("leaseTransitions") or 0)
        if not leads:
            why = f"the kube-scheduler beside it does not lead; {holder!r} holds the lease"
            return Observation(False, holder, transitions, 0.0, why)
        duration = float(spec.get("leaseDurationSeconds") or 15)
        renewed = _time(spec.get("renewTime"))
        age = max(0.0, dt.datetime.now(dt.UTC).timestamp() - renewed) if renewed else duration
        return Observation(True, holder, transitions, started + duration - age - MARGIN_S)

    def _sibling_leads(self) -> bool:
        request = urllib.request.Request(self.options.scheduler_metrics_url)
        authorization = getattr(self.kube, "headers", {}).get("Authorization")
        if authorization:
            request.add_header("Authorization", authorization)
        with urllib.request.urlopen(request, timeout=POLL_S * 2, context=self._tls) as r:
            text = r.read().decode(errors="replace")
        m = self._metric.search(text)
        return m is not None and float(m.group(1)) == 1.0


def _time(value: object) -> float:
    """RFC 3339 (with micro-seconds, as a Lease's renewTime) to a Unix timestamp; 0 if absent."""
    if not isinstance(value, str) or not value:
        return 0.0
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
