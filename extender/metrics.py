"""Prometheus metrics, in one registry per extender (tests start several in one process)."""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import deque
from collections.abc import Iterator, Sequence
from itertools import accumulate

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

# Quorum to bound: a gang's members arrive, are planned and bind in well under a second when the
# cluster has room; minutes when they wait for capacity.
GANG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
# Extender calls are sub-millisecond to a few ms; gang binds wait up to the gang timeout.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class CallHistogram(Collector):
    """A labelled histogram for the server's per-call timings: a call's observations (its
    latency and its five phases) are counted under one lock with a bisect each, where
    prometheus_client's `Histogram` takes two locks and a Python loop over the buckets per
    observation (on a busy extender, about 4 % of its CPU). Exposed as the same family: the
    buckets (upper bounds inclusive), `_count` and `_sum` of every label set."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name, self.documentation, self.labels = name, documentation, list(labels)
        self.bounds = list(buckets)
        self._series: dict[tuple[str, ...], list[float]] = {}  # labels -> counts per bucket, +Inf, then the sum
        self._lock = threading.Lock()
        registry.register(self)

    def observe(self, observations: Sequence[tuple[tuple[str, ...], float]]) -> None:
        """Count each (label values, seconds) pair."""
        bounds, series = self.bounds, self._series
        with self._lock:
            for labels, seconds in observations:
                counts = series.get(labels)
                if counts is None:
                    counts = series[labels] = [0.0] * (len(bounds) + 2)
                counts[bisect_left(bounds, seconds)] += 1
                counts[-1] += seconds

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        with self._lock:
            snapshot = [(labels, list(counts)) for labels, counts in self._series.items()]
        les = [repr(float(b)) for b in self.bounds] + ["+Inf"]  # as prometheus_client writes bounds below 1e6
        for labels, counts in sorted(snapshot):
            cumulative = list(accumulate(counts[:-1]))
            family.add_metric(list(labels), list(zip(les, cumulative, strict=True)), counts[-1])
        yield family

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labels)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.latency = CallHistogram(
            "phalanx_extender_request_seconds",
            "Extender call latency by verb.",
            ["verb"],
            LATENCY_BUCKETS,
            self.registry,
        )
        self.errors = Counter(
            "phalanx_extender_errors_total",
            "Extender errors by verb and reason.",
            ["verb", "reason"],
            registry=self.registry,
        )
        self.outcomes = Counter(
            "phalanx_extender_outcomes_total",
            "Extender outcomes by verb.",
            ["verb", "outcome"],
            registry=self.registry,
        )
        self.cache_objects = Gauge(
            "phalanx_cache_objects", "Objects in the watch cache.", ["kind"], registry=self.registry
        )
        self.dead_threads = Gauge(
            "phalanx_dead_threads",
            "Background threads (event and status writers) that have stopped; above 0 readiness fails.",
            registry=self.registry,
        )
        self.gang_plans = Counter(
            "phalanx_gang_plans_total",
            "Gang reservations made; replan: the gang had a plan before (released, timed out, outdated).",
            ["kind"],
            registry=self.registry,
        )
        self.solves = Counter(
            "phalanx_solves_total",
            "Joint gang solves by where they ran: remote (the solver service), fallback (in process "
            "because the service was down or slow), refused (the service rejected the input).",
            ["where"],
            registry=self.registry,
        )
        self.gang_timeouts = Counter(
            "phalanx_gang_timeouts_total",
            "Gang reservations released because members did not all reach bind in time.",
            registry=self.registry,
        )
        self.gang_wakeups = Counter(
            "phalanx_gang_wakeups_total",
            "Wake-ups of planned gang members kube-scheduler had parked, by outcome: woken (the "
            "plan's write landed), bound (kube-scheduler retried the member by itself and bound it "
            "first), failed (deleted meanwhile, or kube-apiserver kept refusing).",
            ["outcome"],
            registry=self.registry,
        )
        self.gang_quorum_to_bound = Histogram(
            "phalanx_gang_quorum_to_bound_seconds",
            "From a gang's quorum (as first seen by filter) to its last planned member bound.",
            buckets=GANG_BUCKETS,
            registry=self.registry,
        )
        self.config_rejections = Counter(
            "phalanx_config_rejections_total",
            "Configuration updates rejected (the last good one stays): the ConfigMap, or a workload type.",
            ["source"],
            registry=self.registry,
        )
        self.connections = Counter(
            "phalanx_extender_connections_total",
            "Client connections the extender's HTTP server accepted. kube-scheduler keeps 2 idle "
            "connections to an extender (Go's default): each bind beyond them in flight opens a new one.",
            registry=self.registry,
        )
        # The process's own: CPU, memory, open files, GC (what the default registry carries).
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.leading = Gauge(
            "phalanx_leading",
            "1 while this replica may bind (it leads, or runs without --follow-scheduler-lease), else 0.",
            registry=self.registry,
        )
        self.leading.set(1)
        self.phases = CallHistogram(
            "phalanx_extender_request_phase_seconds",
            "Extender verb calls split by phase: read (first byte to body read), decode (JSON), "
            "work (the verb), encode (JSON), write (reply sent), server (first byte to reply sent); "
            "cpu (the serving thread's own CPU from first byte to reply sent) and queued (its time "
            "waiting for a core from before the request arrived to the reply sent: on a busy node, "
            "what the extender lacks is CPU).",
            ["verb", "phase"],
            LATENCY_BUCKETS,
            self.registry,
        )
        self.solve_seconds = Histogram(
            "phalanx_solver_seconds", "Solver time per plan.", buckets=LATENCY_BUCKETS, registry=self.registry
        )
        self.queue_wait = Histogram(
            "phalanx_queue_wait_seconds",
            "Per queue, from a pod's creation to it being counted on a node (bound or reserved).",
            ["queue"],
            buckets=GANG_BUCKETS,
            registry=self.registry,
        )
        self.queue_evictions = Counter(
            "phalanx_queue_evictions_total",
            "Pods evicted by Phalanx, by the preemptor's queue and why: preemption (priority) or reclaim "
            "(a queue below its deserved quota taking back what others borrowed).",
            ["queue", "kind"],
            registry=self.registry,
        )
        # Raw latencies of the most recent calls per verb, for exact percentiles (/api/v1/stats).
        self._samples: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    # The gang cycle's GangStats (extender/gangs/manager.py).
    def planned(self, again: bool) -> None:
        self.gang_plans.labels("replan" if again else "first").inc()

    def scheduled(self, quorum_to_bound_s: float) -> None:
        self.gang_quorum_to_bound.observe(quorum_to_bound_s)

    def timed_out(self) -> None:
        self.gang_timeouts.inc()

    def observe(self, verb: str, seconds: float) -> None:
        self.latency.observe((((verb,), seconds),))
        with self._lock:
            self._samples.setdefault(verb, deque(maxlen=100_000)).append(seconds)

    def observe_phases(self, verb: str, phases: dict[str, float]) -> None:
        """One verb call's phases (seconds); /api/v1/stats lists them as `verb.phase`."""
        with self._lock:
            for phase, seconds in phases.items():
                self._samples.setdefault(f"{verb}.{phase}", deque(maxlen=100_000)).append(seconds)
        self.phases.observe([((verb, phase), seconds) for phase, seconds in phases.items()])

    def percentiles(self) -> dict[str, dict[str, float]]:
        """Per verb: count, mean, p50 and p99 in ms over the recent calls (nearest rank)."""
        out = {}
        with self._lock:
            snapshot = {verb: sorted(values) for verb, values in self._samples.items()}
        for verb, values in snapshot.items():
            out[verb] = {
                "count": len(values),
                "mean_ms": sum(values) / len(values) * 1000,
                "p50_ms": _nearest_rank(values, 0.50) * 1000,
                "p99_ms": _nearest_rank(values, 0.99) * 1000,
            }
        return out

    def reset_samples(self) -> None:
        with self._lock:
            self._samples.clear()


def _nearest_rank(ordered: list[float], q: float) -> float:
    n = len(ordered)
    return ordered[min(n - 1, max(0, round(q * n + 0.5) - 1))]
