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
runs on its own thread and takes its share of the GIL, reported as refresh time per mode): up to
its reply (what kube-scheduler's serial cycle waits for; the request decoded first, untimed, as
the server does) and, for a GPU pod, its device choice, which the server makes after the reply
is sent. `filter_p50_ms`/`filter_p99_ms` are the two together, as before 2026-11-27. A pod
without GPUs keeps the nodes Phalanx ranks first for it, and its prioritize over them is timed
too (`prioritize_p50_ms`), though kube-scheduler, configured as deploy/local/scheduler_config.py
does it, sends only pods with GPU resources to prioritize (since 2026-11-27 09:00 UTC): the
figure is what a configuration with every verb in one entry costs.
Percentiles over the calls after the first third (warm-up: every node's first measurement).

`--cold` empties the CPU caches before each call (a 64 MiB array walked), as the other
processes of a busy 2-core machine do between two calls in the cluster: there the verbs'
CPU per call is this figure, about three times the hot one.

    python -m benchmarks.filter_tail [--quick] [--nodes N] [--pods N] [--cold] [--no-record]

Each pod's bind is timed too (`bind_p50_ms`: the verb without its API call, which the replay
binder makes in memory), and the watch's event of the bound pod as the cache reads it
(`event_p50_ms`: a freshly decoded object, as from the watch).

Headline keys: filter_p50_ms, filter_p99_ms (sweep mode, reply and choice), reply_p50_ms,
reply_p99_ms, choice_p50_ms (sweep mode, GPU pods), prioritize_p50_ms, bind_p50_ms, event_p50_ms,
filter_p99_filter_measures_ms, refresh_max_ms, nodes, pods, cold.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import orjson
import structlog

from benchmarks.common import finish, parser
from benchmarks.trace_replay import ReplayBinder
from extender.cache import Cache
from extender.config import PhalanxConfig
from extender.metrics import Metrics
from extender.outcomes import Then
from extender.pools import Hardware
from extender.scoring import sample_size
from extender.verbs import Verbs

REFRESH_EVERY = 60
EVICT_BYTES = 64 << 20  # walked before each call with --cold: more than any CPU cache here


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


@dataclass
class Times:
    """One mode's figures (ms) after warm-up (the first third of the stream, every node's first
    measurement): filter (reply and choice), its reply alone, the choice alone (GPU pods),
    prioritize (pods without GPUs, over the nodes their filter passed), bind (without the API
    call), the watch's event of the bound pod; and every refresh."""

    filters: list[float] = field(default_factory=list)
    replies: list[float] = field(default_factory=list)
    choices: list[float] = field(default_factory=list)
    prioritizes: list[float] = field(default_factory=list)
    binds: list[float] = field(default_factory=list)
    events: list[float] = field(default_factory=list)
    refreshes: list[float] = field(default_factory=list)


def stream(nodes: int, pods: int, *, sweep: bool, cold: bool = False, seed: int = 1) -> Times:
    """One mode's filter and refresh times."""
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
    evict = np.ones(EVICT_BYTES // 8) if cold else None
    times = Times()
    for i in range(pods):
        obj = pod(f"p{i}", rnd.random() < 0.7)
        binder.pods[obj["metadata"]["name"]] = obj
        cache.pod_event("ADDED", obj)
        offered = (names[start:] + names[:start])[:window]
        start = (start + window) % nodes
        request = orjson.dumps({"Pod": obj, "NodeNames": offered})
        if evict is not None:
            evict.sum()  # every cache line of ours gone, as after the other processes' turn
        args = orjson.loads(request)  # decoded as the server does, before the verb
        began = time.perf_counter()
        answer = verbs.filter_then(args)
        replied = time.perf_counter()
        choice, warm = 0.0, i >= pods // 3
        if isinstance(answer, Then):
            if evict is not None:
                evict.sum()  # the server sends the reply first: kube-scheduler's turn comes between
            chose = time.perf_counter()
            answer.after()
            choice = time.perf_counter() - chose
            if warm:
                times.choices.append(choice * 1000)
            answer = answer.reply
        if warm:
            times.replies.append((replied - began) * 1000)
            times.filters.append((replied - began + choice) * 1000)
        chosen = cast("dict[str, Any]", answer)["NodeNames"]
        if len(chosen) > 1:  # kube-scheduler scores what passed: prioritize (a pod without GPUs)
            request = orjson.dumps({"Pod": obj, "NodeNames": chosen})
            if evict is not None:
                evict.sum()
            args = orjson.loads(request)
            began = time.perf_counter()
            verbs.prioritize(args)
            if warm:
                times.prioritizes.append((time.perf_counter() - began) * 1000)
        name = obj["metadata"]["name"]
        if evict is not None:
            evict.sum()  # kube-scheduler's next cycles and the API server run before the bind
        began = time.perf_counter()
        bound = verbs.bind({"PodNamespace": "r", "PodName": name, "PodUID": name, "Node": chosen[0]})
        if warm:
            times.binds.append((time.perf_counter() - began) * 1000)
        if bound["Error"]:
            raise RuntimeError(f"bind of {name} to {chosen[0]} refused")
        if evict is not None:
            evict.sum()
        event = orjson.loads(orjson.dumps(obj))  # as the watch decodes it: a new object
        began = time.perf_counter()
        cache.pod_event("MODIFIED", event)
        if warm:
            times.events.append((time.perf_counter() - began) * 1000)
        if i == pods // 2:  # a round ends: every pod deleted
            for done in binder.pods.values():
                cache.pod_event("DELETED", done)
            binder.pods.clear()
        if i % REFRESH_EVERY == REFRESH_EVERY - 1 or i == pods // 2:
            began = time.perf_counter()
            refresh()
            times.refreshes.append((time.perf_counter() - began) * 1000)
    return times


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0  # none timed (a stream too short for that kind of call)
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = parser(__doc__, quick="1,000 nodes, 600 pods")
    ap.add_argument("--nodes", type=int)
    ap.add_argument("--pods", type=int)
    ap.add_argument("--cold", action="store_true", help="empty the CPU caches before each call")
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    nodes = args.nodes or (1000 if args.quick else 5000)
    pods = args.pods or (600 if args.quick else 1350)
    lines = [
        f"{nodes} nodes (8 GPUs), {pods} pods (70 % 1-GPU), window {sample_size(nodes)}, reset at {pods // 2}"
        + (", CPU caches emptied before each call" if args.cold else "")
    ]
    figures: dict[str, Times] = {}
    for mode, sweep in (("sweep re-measures", True), ("filter measures", False)):
        t = figures[mode] = stream(nodes, pods, sweep=sweep, cold=args.cold)
        lines.append(
            f"{mode:18} filter p50 {pct(t.filters, 0.5):.2f} ms  p99 {pct(t.filters, 0.99):.2f} ms  "
            f"max {max(t.filters):.2f} ms ({len(t.filters)} calls); refresh max {max(t.refreshes):.1f} ms"
        )
        lines.append(
            f"{'':18} of which the reply p50 {pct(t.replies, 0.5):.3f} ms  p99 {pct(t.replies, 0.99):.2f} ms, "
            f"a GPU pod's device choice after it p50 {pct(t.choices, 0.5):.3f} ms ({len(t.choices)} calls); "
            f"prioritize (pods without GPUs) p50 {pct(t.prioritizes, 0.5):.3f} ms ({len(t.prioritizes)} calls)"
        )
        lines.append(
            f"{'':18} bind (its API call aside) p50 {pct(t.binds, 0.5):.3f} ms  p99 {pct(t.binds, 0.99):.2f} ms, "
            f"the bound pod's watch event p50 {pct(t.events, 0.5):.3f} ms"
        )
    sweep, measures = figures["sweep re-measures"], figures["filter measures"]
    headline = {
        "filter_p50_ms": round(pct(sweep.filters, 0.5), 3),
        "filter_p99_ms": round(pct(sweep.filters, 0.99), 3),
        "reply_p50_ms": round(pct(sweep.replies, 0.5), 3),
        "reply_p99_ms": round(pct(sweep.replies, 0.99), 3),
        "choice_p50_ms": round(pct(sweep.choices, 0.5), 3),
        "prioritize_p50_ms": round(pct(sweep.prioritizes, 0.5), 3),
        "bind_p50_ms": round(pct(sweep.binds, 0.5), 3),
        "event_p50_ms": round(pct(sweep.events, 0.5), 3),
        "filter_p99_filter_measures_ms": round(pct(measures.filters, 0.99), 3),
        "refresh_max_ms": round(max(sweep.refreshes), 1),
        "nodes": nodes,
        "pods": pods,
        "cold": args.cold,
    }
    finish("filter_tail" + (" --cold" if args.cold else ""), args, lines, headline)


if __name__ == "__main__":
    main()
