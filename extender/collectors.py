"""Metrics read from the extender's state when Prometheus scrapes (nothing to keep in step):
gangs by what they wait for, reservations held, GPU allocation and fragmentation per pool and
model, and the watch cache's lists and restarts.

Labels are bounded: a pending reason is reduced to its class (the solver's and the gang
cycle's fixed prefixes), pools and GPU models come from the configuration and the nodes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from extender.cache import Cache
from extender.gangs.manager import GangManager
from extender.gangs.requests import WAITING_QUORUM
from extender.queues import QueueBook
from extender.watch import Reflector

#: Pending-reason classes, by the start of the reason the gang cycle or the solver wrote.
REASONS = (
    (WAITING_QUORUM, "WaitingForQuorum"),
    ("waiting for Workload", "WaitingForDefinition"),
    ("waiting for", "WaitingForDefinition"),
    ("gang timed out", "TimedOut"),
    ("required topology does not fit", "RequiredTopology"),
    ("not enough capacity", "Capacity"),
    ("slices do not fit", "Slices"),
    ("groups do not fit together", "SubGroups"),
    ("it fits the free capacity alone", "Contention"),
    ("invalid", "Invalid"),
    ("minCount exceeds", "Invalid"),
)
FULL = 1000


def reason_class(reason: str) -> str:
    lowered = reason.lower()
    for prefix, name in REASONS:
        if lowered.startswith(prefix.lower()):
            return name
    return "Other" if reason else "None"


class StateCollector(Collector):
    def __init__(
        self,
        cache: Cache,
        gangs: GangManager,
        reflectors: Callable[[], Iterable[Reflector]],
        queues: QueueBook | None = None,
    ) -> None:
        self.cache = cache
        self.gangs = gangs
        self.reflectors = reflectors
        self.queues = queues

    def collect(self) -> Iterator[Metric]:
        yield from self._gangs()
        yield from self._gpus()
        yield from self._watches()
        yield from self._queues()

    def _queues(self) -> Iterator[Metric]:
        """Per queue and resource: allocated, deserved, fair share (the solver's units: cpu in
        milli-cores, memory in MiB, gpuShare in milli-GPU); pending pods and gangs. Queues and
        resources come from Queue objects (bounded by what administrators create)."""
        if self.queues is None or not self.queues.active:
            return
        families = {
            "allocated": GaugeMetricFamily(
                "phalanx_queue_allocated", "Held by the queue and its children.", labels=["queue", "resource"]
            ),
            "deserved": GaugeMetricFamily("phalanx_queue_deserved", "Guaranteed quota.", labels=["queue", "resource"]),
            "fair": GaugeMetricFamily(
                "phalanx_queue_fair_share", "Fair share of the cluster now.", labels=["queue", "resource"]
            ),
        }
        pods = GaugeMetricFamily("phalanx_queue_pending_pods", "Pods waiting, by queue.", labels=["queue"])
        gangs = GaugeMetricFamily("phalanx_queue_pending_gangs", "Gangs waiting, by queue.", labels=["queue"])
        oldest = GaugeMetricFamily(
            "phalanx_queue_oldest_wait_seconds", "The oldest waiting pod's age, by queue.", labels=["queue"]
        )
        for view in self.queues.views():
            for name, amounts in (
                ("allocated", view.allocated),
                ("deserved", view.spec.deserved),
                ("fair", view.fair_share),
            ):
                for resource, amount in sorted(amounts.items()):
                    families[name].add_metric([view.name, resource], amount)
            pods.add_metric([view.name], view.pending_pods)
            gangs.add_metric([view.name], view.pending_gangs)
            oldest.add_metric([view.name], view.oldest_wait_s)
        yield from (*families.values(), pods, gangs, oldest)

    def _gangs(self) -> Iterator[Metric]:
        pending: dict[str, int] = defaultdict(int)
        reserved = 0
        for g in self.gangs.describe():
            reserved += len(g["plan"])
            if g["phase"] != "Scheduled" and not g["plan"] and g["members"]:
                pending[reason_class(g["pendingReason"])] += 1
        family = GaugeMetricFamily(
            "phalanx_gangs_pending",
            "Gangs with members waiting and no reservation, by reason class.",
            labels=["reason"],
        )
        for reason, count in sorted(pending.items()):
            family.add_metric([reason], count)
        yield family
        yield GaugeMetricFamily(
            "phalanx_gang_reservations",
            "Gang members holding a reserved node and devices, not bound yet.",
            value=reserved,
        )

    def _gpus(self) -> Iterator[Metric]:
        hardware = self.cache.hardware
        devices: dict[tuple[str, str], list[Any]] = defaultdict(list)
        for node in self.cache.snapshot().nodes:
            found = hardware.pool_of(node.name, node.labels)
            for d in node.gpus:
                devices[(found.name if found is not None else "-", d.model)].append(d)
        total = GaugeMetricFamily("phalanx_gpu_devices", "GPUs, by pool and model.", labels=["pool", "model"])
        share = GaugeMetricFamily(
            "phalanx_gpu_allocated", "GPUs allocated (shares summed: 0.5 + 0.5 = 1).", labels=["pool", "model"]
        )
        memory = GaugeMetricFamily(
            "phalanx_gpu_memory_allocated_ratio", "GPU memory allocated / total.", labels=["pool", "model"]
        )
        stranded = GaugeMetricFamily(
            "phalanx_gpu_fragmentation_ratio",
            "Free GPU share stranded on partly used GPUs / all free share (0: every free share is a whole idle GPU).",
            labels=["pool", "model"],
        )
        for (pool, model), ds in sorted(devices.items()):
            labels = [pool, model]
            free = sum(d.free_milli for d in ds)
            partial = sum(d.free_milli for d in ds if 0 < d.free_milli < FULL)
            mem_total = sum(d.memory_mib for d in ds)
            total.add_metric(labels, len(ds))
            share.add_metric(labels, (len(ds) * FULL - free) / FULL)
            memory.add_metric(labels, (mem_total - sum(d.free_memory_mib for d in ds)) / mem_total if mem_total else 0)
            stranded.add_metric(labels, partial / free if free else 0.0)
        yield from (total, share, memory, stranded)

    def _watches(self) -> Iterator[Metric]:
        lists = CounterMetricFamily(
            "phalanx_watch_lists", "Full lists by the watch cache, by resource.", labels=["resource"]
        )
        restarts = CounterMetricFamily(
            "phalanx_watch_restarts", "Watches that failed and were started again, by resource.", labels=["resource"]
        )
        for r in self.reflectors():
            lists.add_metric([r.name], r.lists)
            restarts.add_metric([r.name], r.restarts)
        yield lists
        yield restarts
