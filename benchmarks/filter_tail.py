"""Filter's tail in process: where a stream of pods meets a moving target workload.

The extender's verbs (extender/verbs.py, default configuration) run in this process over a
cache of N 8-GPU nodes, no API server. A stream of pods (70 % 1-GPU, 30 % CPU-only) arrives
one by one; each is filtered over a rotating window of as many names as kube-scheduler offers
by default (500 of 5,000 nodes), then bound to the node filter chose (GPU pods get one) and
seen bound, as the watch would show it. Every 60 pods the target workload is refreshed, as the
sweep does every 10 s; halfway every pod is deleted (a round ends, as between the throughput
benchmark's rounds) and the stream goes on, so the workload empties and fills again.

Two modes, same stream, side by side:

- sweep re-measures: `Verbs.refresh_workload`, the sweep's path: when the workload moved past
  `MEMO_DRIFT`, the memoised fragmentation deltas are measured again there;
- filter measures: `Sharing.refresh` alone, the path before: the next filter of each pod shape
  drops the memo and measures every node it is offered.

Filter's time is the verb call alone (the refresh runs between calls here; in the extender it
runs on its own thread and takes its share of the GIL, reported as refresh time per mode).
Percentiles over the calls after the first third (warm-up: every node's first measurement).

    python -m benchmarks.filter_tail [--quick] [--nodes N] [--pods N] [--no-record]

Headline keys: filter_p99_ms (sweep mode), filter_p99_filter_measures_ms, filter_p50_ms,
refresh_max_ms, nodes, pods.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import structlog

from benchmarks.common import finish, parser
from benchmarks.trace_replay import ReplayBinder
from extender.cache import Cache
from extender.config import PhalanxConfig
from extender.metrics import Metrics
from extender.pools import Hardware
from extender.scoring import sample_size
from extender.verbs import Verbs

REFRESH_EVERY = 60


def node(name: str) -> dict[str, Any]:
    alloc = {"cpu": "128", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"}
    return {"metadata": {"name": name, "labels": {}}, "status": {"allocatable": alloc}}


def pod(name: str, gpu: bool) -> dict[str, Any]:
    resources = {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"nvidia.com/gpu": "1"} if gpu else {}}
    return {
        "metadata": {"name": name, "namespace": "r", "uid": name, "resourceVersion": "1", "annotations": {}},
        "spec": {"containers": [{"name": "c", "resources": resources}]},
        "status": {"phase": "Pending"},
    }


def stream(nodes: int, pods: int, *, sweep: bool, seed: int = 1) -> tuple[list[float], list[float]]:
    """Filter times (ms) after warm-up, and refresh times (ms), for one mode."""
    config = PhalanxConfig()
    cache = Cache(config.topology.levels, Hardware(config.gpu))
    binder = ReplayBinder()
    verbs = Verbs(cache, binder, config, Metrics())
    names = [f"n{i:05d}" for i in range(nodes)]
    cache.replace_nodes(node(n) for n in names)
    refresh = verbs.refresh_workload if sweep else verbs.sharing.refresh
    refresh()
    window, start = sample_size(nodes), 0
    rnd = random.Random(seed)
    filters: list[float] = []
    refreshes: list[float] = []
    for i in range(pods):
        obj = pod(f"p{i}", rnd.random() < 0.7)
        binder.pods[obj["metadata"]["name"]] = obj
        cache.pod_event("ADDED", obj)
        offered = (names[start:] + names[:start])[:window]
        start = (start + window) % nodes
        began = time.perf_counter()
        chosen = verbs.filter({"Pod": obj, "NodeNames": offered})["NodeNames"]
        filters.append((time.perf_counter() - began) * 1000)
        name = obj["metadata"]["name"]
        if verbs.bind({"PodNamespace": "r", "PodName": name, "PodUID": name, "Node": chosen[0]})["Error"]:
            raise RuntimeError(f"bind of {name} to {chosen[0]} refused")
        cache.pod_event("MODIFIED", obj)
        if i == pods // 2:  # a round ends: every pod deleted
            for done in binder.pods.values():
                cache.pod_event("DELETED", done)
            binder.pods.clear()
        if i % REFRESH_EVERY == REFRESH_EVERY - 1 or i == pods // 2:
            began = time.perf_counter()
            refresh()
            refreshes.append((time.perf_counter() - began) * 1000)
    return filters[pods // 3 :], refreshes


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = parser(__doc__, quick="1,000 nodes, 600 pods")
    ap.add_argument("--nodes", type=int)
    ap.add_argument("--pods", type=int)
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    nodes = args.nodes or (1000 if args.quick else 5000)
    pods = args.pods or (600 if args.quick else 1350)
    lines = [f"{nodes} nodes (8 GPUs), {pods} pods (70 % 1-GPU), window {sample_size(nodes)}, reset at {pods // 2}"]
    figures: dict[str, tuple[list[float], list[float]]] = {}
    for mode, sweep in (("sweep re-measures", True), ("filter measures", False)):
        filters, refreshes = figures[mode] = stream(nodes, pods, sweep=sweep)
        lines.append(
            f"{mode:18} filter p50 {pct(filters, 0.5):.2f} ms  p99 {pct(filters, 0.99):.2f} ms  "
            f"max {max(filters):.2f} ms ({len(filters)} calls); refresh max {max(refreshes):.1f} ms"
        )
    sweep_f, sweep_r = figures["sweep re-measures"]
    filter_f, _ = figures["filter measures"]
    headline = {
        "filter_p50_ms": round(pct(sweep_f, 0.5), 3),
        "filter_p99_ms": round(pct(sweep_f, 0.99), 3),
        "filter_p99_filter_measures_ms": round(pct(filter_f, 0.99), 3),
        "refresh_max_ms": round(max(sweep_r), 1),
        "nodes": nodes,
        "pods": pods,
    }
    finish("filter_tail", args, lines, headline)


if __name__ == "__main__":
    main()
