"""Prometheus metrics, in one registry per extender (tests start several in one process)."""

from __future__ import annotations

import threading
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Extender calls are sub-millisecond to a few ms; gang binds wait up to the gang timeout.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "phalanx_extender_request_seconds",
            "Extender call latency by verb.",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
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
        self.leading = Gauge(
            "phalanx_leading",
            "1 while this replica may bind (it leads, or runs without --follow-scheduler-lease), else 0.",
            registry=self.registry,
        )
        self.leading.set(1)
        self.phases = Histogram(
            "phalanx_extender_request_phase_seconds",
            "Extender verb calls split by phase: read (first byte to body read), decode (JSON), "
            "work (the verb), encode (JSON), write (reply sent), server (first byte to reply sent).",
            ["verb", "phase"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.solve_seconds = Histogram(
            "phalanx_solver_seconds", "Solver time per plan.", buckets=LATENCY_BUCKETS, registry=self.registry
        )
        # Raw latencies of the most recent calls per verb, for exact percentiles (/api/v1/stats).
        self._samples: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def observe(self, verb: str, seconds: float) -> None:
        self.latency.labels(verb).observe(seconds)
        with self._lock:
            self._samples.setdefault(verb, deque(maxlen=100_000)).append(seconds)

    def observe_phases(self, verb: str, phases: dict[str, float]) -> None:
        """One verb call's phases (seconds); /api/v1/stats lists them as `verb.phase`."""
        with self._lock:
            for phase, seconds in phases.items():
                self._samples.setdefault(f"{verb}.{phase}", deque(maxlen=100_000)).append(seconds)
        for phase, seconds in phases.items():
            self.phases.labels(verb, phase).observe(seconds)

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
