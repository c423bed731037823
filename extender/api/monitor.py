"""What the monitoring endpoints report over time: eviction notices, per-tenant usage samples
and scheduling latencies. All in memory, bounded, and rebuilt from what happens after a
restart (a report says how many seconds its figures cover).
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from extender.objects import PodInfo

JSON = dict[str, Any]
NOTICES = 10_000  # eviction notices kept (a watch resumes from any of them)
SAMPLE_S = 60.0  # usage sampling interval
SAMPLES = 24 * 60 * 7  # a week of minutes per tenant
LATENCIES = 10_000
ZERO = {"cpu": 0.0, "memory": 0.0, "gpu": 0.0}  # shared by every idle sample (never changed)


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def created_epoch(text: str) -> float | None:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Notice:
    seq: int
    at: float
    namespace: str
    name: str
    node: str
    reason: str
    grace_s: int

    def json(self) -> JSON:
        return {
            "type": "EVICTION",
            "resourceVersion": str(self.seq),
            "allocation": self.name,
            "namespace": self.namespace,
            "node": self.node,
            "reason": self.reason,
            "gracePeriodSeconds": self.grace_s,
            "deadline": rfc3339(self.at + self.grace_s),
        }


class EvictionLog:
    """Every eviction Phalanx or its API made, numbered; a stream per node resumes after a
    number (`resourceVersion`) and waits for the next."""

    def __init__(self, most: int = NOTICES) -> None:
        self._notices: deque[Notice] = deque(maxlen=most)
        self._seq = itertools.count(1)
        self._changed = threading.Condition()

    def add(self, namespace: str, name: str, node: str, reason: str, grace_s: int = 30) -> Notice:
        with self._changed:
            notice = Notice(next(self._seq), time.time(), namespace, name, node, reason, grace_s)
            self._notices.append(notice)
            self._changed.notify_all()
            return notice

    def since(self, seq: int, node: str = "") -> list[Notice]:
        with self._changed:
            return [n for n in self._notices if n.seq > seq and (not node or n.node == node)]

    def count_since(self, t: float, reason_prefix: str = "") -> int:
        with self._changed:
            return sum(1 for n in self._notices if n.at >= t and n.reason.startswith(reason_prefix))

    def last(self) -> int:
        with self._changed:
            return self._notices[-1].seq if self._notices else 0

    def follow(self, node: str, after: int, until: float, stop: threading.Event) -> Iterator[Notice | None]:
        """Notices for `node` after `after`, then each new one until `until` (monotonic) or
        `stop`; None every 15 s without one (a keep-alive: a client that left is noticed)."""
        while not stop.is_set() and time.monotonic() < until:
            with self._changed:
                newest = self._notices[-1].seq if self._notices else 0
                if newest <= after:
                    self._changed.wait(min(15.0, max(0.0, until - time.monotonic())))
                    newest = self._notices[-1].seq if self._notices else 0
                mine = [n for n in self._notices if n.seq > after and n.node == node]
            after = max(after, newest)  # every notice up to here was seen, whatever its node
            if not mine:
                yield None
            yield from mine


@dataclass
class _Series:
    times: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLES))
    values: deque[dict[str, float]] = field(default_factory=lambda: deque(maxlen=SAMPLES))
    last_held: float = 0.0  # when it last held anything


class UsageHistory:
    """Per tenant (namespace), what its counted pods held, sampled every `SAMPLE_S`: cpu
    (cores), memory (GiB), gpu (devices; a share counts its fraction)."""

    def __init__(self) -> None:
        self._series: dict[str, _Series] = {}
        self._lock = threading.Lock()
        self.started = time.time()

    @staticmethod
    def held(pods: list[PodInfo]) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for p in pods:
            if not p.node or not p.active:
                continue
            u = out.setdefault(p.namespace, {"cpu": 0.0, "memory": 0.0, "gpu": 0.0})
            u["cpu"] += p.requests.cpu_milli / 1000
            u["memory"] += p.requests.memory_mib / 1024
            d = p.demand
            u["gpu"] += d.count * (1.0 if not d.memory_mib and d.milli >= 1000 else d.milli / 1000)
        return out

    def sample(self, pods: list[PodInfo], now: float | None = None) -> None:
        """One sample per tenant holding something now or within the history's span (a
        tenant that held nothing for that long is forgotten: namespaces come and go)."""
        now = time.time() if now is None else now
        held = self.held(pods)
        with self._lock:
            for tenant in set(held) | set(self._series):
                s = self._series.setdefault(tenant, _Series())
                value = held.get(tenant)
                if value is None and now - s.last_held > SAMPLES * SAMPLE_S:
                    del self._series[tenant]
                    continue
                if value is not None:
                    s.last_held = now
                s.times.append(now)
                s.values.append(value if value is not None else ZERO)

    def report(self, tenant: str, period_s: float, current: dict[str, float], now: float | None = None) -> JSON:
        """Peak and average over the period (current usage included), and the seconds covered."""
        now = time.time() if now is None else now
        with self._lock:
            s = self._series.get(tenant, _Series())
            start = bisect.bisect_left(list(s.times), now - period_s)
            values = [*list(s.values)[start:], current]
            covered = now - (s.times[start] if start < len(s.times) else now)
        out = {}
        for k in ("cpu", "memory", "gpu"):
            series = [v.get(k, 0.0) for v in values]
            out[k] = {"peak": max(series), "avg": sum(series) / len(series)}
        return {"resources": out, "coveredSeconds": round(min(covered, period_s), 1)}

    def trend(self, tenant: str, seconds: float, now: float | None = None) -> dict[str, float]:
        """The usage sampled `seconds` ago (the first sample at or after then); {} when the
        history does not reach back that far."""
        now = time.time() if now is None else now
        with self._lock:
            s = self._series.get(tenant)
            if s is None or not s.times or s.times[0] > now - seconds + SAMPLE_S:
                return {}
            i = bisect.bisect_left(list(s.times), now - seconds)
            return dict(s.values[min(i, len(s.values) - 1)])


class Latencies:
    """Pod creation to bound, per bind seen by the watch: rate and percentiles."""

    def __init__(self) -> None:
        self._seen: deque[tuple[float, float, str]] = deque(maxlen=LATENCIES)  # (bound at, seconds, queue)
        self._lock = threading.Lock()

    def bound(self, pod: PodInfo, queue: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        created = created_epoch(pod.created)
        if created is None:
            return
        with self._lock:
            self._seen.append((now, max(0.0, now - created), queue))

    def window(self, seconds: float, queue: str = "", now: float | None = None) -> list[float]:
        now = time.time() if now is None else now
        with self._lock:
            return sorted(s for t, s, q in self._seen if t >= now - seconds and (not queue or q == queue))


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[i]


def period_seconds(text: str) -> float:
    units = {"m": 60, "h": 3600, "d": 86400}
    if len(text) >= 2 and text[:-1].isdigit() and text[-1] in units and len(text) <= 6:
        return float(int(text[:-1]) * units[text[-1]])
    raise ValueError(f"period {text[:16]!r}: use a number and m, h or d (e.g. 24h, 7d)")
