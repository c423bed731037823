"""Scheduling throughput on KWOK nodes: vanilla kube-scheduler vs kube-scheduler + Phalanx.

One local control plane (deploy/local) with N fake 8-GPU nodes; the same pod mix is scheduled
by the vanilla scheduler and by the scheduler calling the Phalanx extender (filter, prioritize,
bind, preempt over HTTP, a separate process as in a sidecar), alternating modes in one run.

Method: pods are created first with a scheduler name no running profile serves, so they wait;
then kube-scheduler restarts with that profile (vanilla, or with the extender) and a watch
records when each pod gets its node. Throughput is the steady rate between 10 % and 90 %
bound, which leaves scheduler start-up out.

Extender latency per verb (p50/p99) comes from the extender's own per-call timings
(/api/v1/stats, reset before each round) and is reported twice: at saturation (the throughput
rounds, where kube-apiserver and kube-scheduler keep both cores of a 2-core machine busy and
every process waits for CPU), and in a paced round where pods arrive at a steady
--paced-rate, as in normal operation. `filter_p99_ms` is the paced figure,
`filter_p99_saturated_ms` the other. kube-scheduler asks prioritize only for GPU pods that
state preferences (a GPU pod is offered one node; a pod without GPUs only the nodes Phalanx
ranks first, and is not sent to prioritize), so in the paced round 1 GPU pod in 5 prefers a
block, and prioritize's figures are theirs; the rounds have none.

    python -m benchmarks.kwok_throughput [--quick] [--nodes N] [--pods N] [--rounds N]
                                         [--paced-rate R] [--extender-nice N]
                                         [--extender-config FILE] [--percentage N]
                                         [--no-record]

Both modes run the same KubeSchedulerConfiguration but for the extender entry
(`percentageOfNodesToScore` unset in both, kube-scheduler's adaptive share; `--percentage N`
sets it for both, e.g. 100 as Phalanx needed before planned gang members were nominated),
with kube-scheduler's client rate limiter lifted (QPS and burst 5,000, as scheduler_perf runs;
deploy/local/scheduler_config.py): the extender binds through its own client, which has none,
so a limited baseline would measure the limiter.

Where each pod's time goes, per round: kube-scheduler's own metrics (scraped from its
/metrics before it restarts: scheduling attempt, algorithm, and framework extension points,
each histogram's sum over the pods scheduled, so a point that runs for some pods only counts
at its share; in Phalanx rounds the algorithm's time beyond the framework's is the extender
calls as kube-scheduler sees them, split into the time in the extender's server, first byte
to reply sent, summed over filter and prioritize per pod, and the rest: kube-scheduler's
encoding, the transfer, and the wait for the extender's thread to run), the extender's time per
verb split into read, decode, work, encode and write, the connections the extender accepted
per pod (kube-scheduler keeps 2 idle per extender: a bind beyond them in flight opens one),
and the CPU seconds the extender, kube-scheduler and kube-apiserver spend per pod.

The extender runs only in Phalanx rounds: it is stopped before each vanilla round and a fresh
one is started (and ready) before each Phalanx round, at the same URL. Runs before 2026-11-27
kept it running through vanilla rounds, where its watches of every pod and node took CPU from
the baseline (0.18-0.41 ms per pod of its own, measured then); `--extender-in-vanilla` runs
that way and reports it as extender_watching_cpu_ms_per_pod.

How much of the gap is CPU contention (this is a 2-core machine, every process waits for a
core): the kernel's run delay (/proc/PID/task/TID/schedstat), per pod, for kube-scheduler and
the extender, and on kube-scheduler's serial cycle the extender's `cpu` and `queued` phases:
the serving threads' own CPU, and their wait for a core from before each request arrived.

Headline keys: vanilla_pods_per_s, phalanx_pods_per_s, ratio (median rounds), round_ratios
(each round pair's), filter_p99_ms, nodes (with ratio_5000 too at 5,000 nodes), rss_mib,
ready_s, extender/kube-scheduler CPU ms per pod, extender_serial_ms_per_pod (server, cpu,
queued), run_delay_ms_per_pod, and extender ("phalanx", or the floor).

`--floor` runs benchmarks/noop_extender.py in place of Phalanx: the same HTTP server and
Binding POST with no work of its own (no cache, no watch). Its ratio is what kube-scheduler's
extender protocol on this server costs by itself; Phalanx's distance from it is its own work.

`--memory` measures the extender at scale instead: N nodes (default 5,000) and M pods
(default 50,000) already bound and Running (KWOK has marked every one) before it starts, 7 in 10
holding a whole GPU with its device record; the extender's RSS once ready, its time from start
to ready (both lists read, the cache built), and when each list ended (from the extender's
log). Headline keys: nodes, pods, rss_mib, ready_s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import ssl
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common import finish, median, parser
from benchmarks.kwok import NS, http_json, kwok_session
from deploy.local.cluster import LocalCluster
from extender.kube import RestKube
from extender.objects import DEVICES_ANNOTATION, encode_devices
from solver import FULL_SHARE, DeviceAssignment

#: In the paced round, the share of GPU pods that prefer a block (preferred node affinity): filter
#: keeps every node for them and kube-scheduler asks prioritize to score them, the only pods of
#: this mix it asks (a pod without GPUs is offered only the nodes Phalanx ranks first, and is not
#: sent to prioritize; deploy/local/scheduler_config.py).
PREFERRING = 0.2
BLOCK_LABEL = "topology.phalanx.io/block"


def pod_body(name: str, scheduler: str, gpu: bool, *, prefers: bool = False) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1"} if gpu else {}
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "tolerations": [{"operator": "Exists"}],
        "containers": [
            {
                "name": "c",
                "image": "x",
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": limits},
            }
        ],
    }
    if prefers:
        term = {"matchExpressions": [{"key": BLOCK_LABEL, "operator": "In", "values": ["b0"]}]}
        spec["affinity"] = {
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "preference": term}]}
        }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"bench": scheduler}}, "spec": spec}


def create_pods(kube: RestKube, scheduler: str, count: int, seed: int) -> None:
    rnd = random.Random(seed)
    post_pods(kube, [pod_body(f"{scheduler}-{i:05d}", scheduler, rnd.random() < 0.7) for i in range(count)])


def post_pods(kube: RestKube, bodies: list[dict[str, Any]]) -> None:
    """Create the pods, 8 at a time (one that exists already is fine)."""

    def post(body: dict[str, Any]) -> None:
        r = kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=body)
        if r.status not in (201, 409):
            raise RuntimeError(f"create pod: HTTP {r.status}: {r.body}")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(post, bodies))


class BindWatch:
    """Records when each pod of one scheduler name first has a node."""

    def __init__(self, kube: RestKube, scheduler: str) -> None:
        self.kube = kube
        self.selector = f"bench={scheduler}"
        self.bound: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            listing = self.kube.request("GET", f"/api/v1/namespaces/{NS}/pods", query={"labelSelector": self.selector})
            rv = listing.body["metadata"]["resourceVersion"]
            for p in listing.body["items"]:
                if p["spec"].get("nodeName"):
                    self.bound.setdefault(p["metadata"]["name"], time.monotonic())
            query = {
                "labelSelector": self.selector,
                "watch": "1",
                "resourceVersion": rv,
                "timeoutSeconds": "60",
            }
            try:
                for event in self.kube.stream(f"/api/v1/namespaces/{NS}/pods", query):
                    obj = event.get("object") or {}
                    if (obj.get("spec") or {}).get("nodeName"):
                        self.bound.setdefault(obj["metadata"]["name"], time.monotonic())
                    if self.stop.is_set():
                        return
            except Exception:
                time.sleep(0.2)


def delete_pods(kube: RestKube, scheduler: str) -> None:
    kube.request(
        "DELETE",
        f"/api/v1/namespaces/{NS}/pods",
        query={"labelSelector": f"bench={scheduler}", "gracePeriodSeconds": "0"},
    )


def rate(times: list[float], total: int) -> float:
    """Pods per second between 10 % and 90 % of `total` bound."""
    ordered = sorted(times)
    lo, hi = ordered[int(0.1 * total)], ordered[int(0.9 * total) - 1]
    return (int(0.9 * total) - int(0.1 * total) - 1) / max(1e-9, hi - lo)


# kube-scheduler histograms read per round: name -> the label filter of the series kept.
SCHEDULER_HISTOGRAMS = (
    "scheduler_scheduling_attempt_duration_seconds",
    "scheduler_scheduling_algorithm_duration_seconds",
    "scheduler_framework_extension_point_duration_seconds",
)
ALGORITHM_POINTS = ("PreFilter", "Filter", "PostFilter", "PreScore", "Score")  # inside the algorithm


def scheduler_means(cluster: LocalCluster, profile: str) -> dict[str, float]:
    """Ms per scheduled pod in each of kube-scheduler's cycle histograms for `profile`
    (scheduled pods only), scraped from its /metrics (open on loopback,
    deploy/local/components.py): a histogram's sum over the pods scheduled, so an extension
    point that runs for some pods only (Score, when filter leaves one node) counts at its
    share, and the points add up to the algorithm's time."""
    port = next(c.port for c in cluster.status().components if c.name == "kube-scheduler")
    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE  # its self-signed serving cert
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=10, context=insecure) as r:
        text = r.read().decode()
    sums: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in SCHEDULER_HISTOGRAMS:
            continue
        for sample in family.samples:
            labels = sample.labels
            if labels.get("profile", profile) != profile or labels.get("result", "scheduled") != "scheduled":
                continue
            if labels.get("status", "Success") != "Success":
                continue
            key = family.name.removeprefix("scheduler_").removesuffix("_duration_seconds")
            if "extension_point" in labels:
                key = labels["extension_point"]
            acc = sums.setdefault(key, [0.0, 0.0])
            if sample.name.endswith("_sum"):
                acc[0] += sample.value
            elif sample.name.endswith("_count"):
                acc[1] += sample.value
    pods = sums.get("scheduling_algorithm", [0.0, 0.0])[1]
    return {k: 1000 * total / pods for k, (total, _) in sums.items() if pods}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (0 if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def run_delay_seconds(pid: int) -> float:
    """Seconds the threads of process `pid` (those alive now) have waited for a core, as the
    kernel counts it (/proc/PID/task/TID/schedstat, second field); 0 if unreadable."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def extender_connections(ext_url: str) -> float:
    """Connections the extender has accepted so far (its /metrics)."""
    with urllib.request.urlopen(f"{ext_url}/metrics", timeout=10) as r:
        for family in text_string_to_metric_families(r.read().decode()):
            if family.name == "phalanx_extender_connections":
                return sum(s.value for s in family.samples if s.name.endswith("_total"))
    return 0.0


def one_round(
    cluster: LocalCluster,
    kube: RestKube,
    *,
    mode: str,
    index: int,
    pods: int,
    ext_url: str,
    ext_pid: int,
    percentage: int | None = None,
) -> dict[str, Any]:
    scheduler = f"bench-{mode}-{index}"
    create_pods(kube, scheduler, pods, seed=index)
    watch = BindWatch(kube, scheduler)
    watch.start()
    if mode == "phalanx":
        http_json("DELETE", f"{ext_url}/api/v1/stats", kube)
    connections = extender_connections(ext_url) if mode == "phalanx" else 0.0
    ext_cpu = cpu_seconds(ext_pid)
    ext_waited = run_delay_seconds(ext_pid)
    apiserver_pid = next(c.pid for c in cluster.status().components if c.name == "kube-apiserver")
    apiserver_cpu = cpu_seconds(apiserver_pid)
    started = time.monotonic()
    cluster.restart_scheduler(
        ext_url if mode == "phalanx" else None,
        scheduler_names=["default-scheduler", scheduler],
        percentage_of_nodes_to_score=percentage,
    )
    sched_pid = next(c.pid for c in cluster.status().components if c.name == "kube-scheduler")
    deadline = started + max(300, pods / 5)
    while len(watch.bound) < pods and time.monotonic() < deadline:
        time.sleep(0.2)
    watch.stop.set()
    bound = len(watch.bound)
    result: dict[str, Any] = {"mode": mode, "pods": pods, "bound": bound, "extender_running": ext_pid != 0}
    result["pods_per_s"] = rate(list(watch.bound.values()), pods) if bound == pods else 0.0
    result["cpu_ms_per_pod"] = {
        "kube-scheduler": 1000 * cpu_seconds(sched_pid) / max(1, bound),  # a fresh process per round
        # In vanilla rounds the extender only watches (pods, nodes): what it costs the baseline.
        "extender": 1000 * (cpu_seconds(ext_pid) - ext_cpu) / max(1, bound),
        "kube-apiserver": 1000 * (cpu_seconds(apiserver_pid) - apiserver_cpu) / max(1, bound),
    }
    result["run_delay_ms_per_pod"] = {  # time the processes' threads waited for a core
        "kube-scheduler": 1000 * run_delay_seconds(sched_pid) / max(1, bound),
        "extender": 1000 * (run_delay_seconds(ext_pid) - ext_waited) / max(1, bound),
    }
    try:
        result["scheduler_ms"] = scheduler_means(cluster, scheduler)
    except (OSError, ValueError, StopIteration) as e:
        print(f"kube-scheduler metrics not read: {e}", flush=True)
        result["scheduler_ms"] = {}
    if mode == "phalanx":
        result["latency"] = http_json("GET", f"{ext_url}/api/v1/stats", kube)["latency"]
        result["connections_per_pod"] = (extender_connections(ext_url) - connections) / max(1, bound)
    delete_pods(kube, scheduler)
    return result


def breakdown(r: dict[str, Any]) -> str:
    """One round's per-pod time, as kube-scheduler and the extender saw it."""
    ms = r.get("scheduler_ms") or {}
    inside = sum(ms.get(p, 0.0) for p in ALGORITHM_POINTS)
    parts = [f"attempt {ms.get('scheduling_attempt', float('nan')):.2f}"]
    parts.append(f"algorithm {ms.get('scheduling_algorithm', float('nan')):.2f}")
    parts += [f"{p} {ms[p]:.2f}" for p in (*ALGORITHM_POINTS, "Reserve", "Permit", "PreBind", "Bind") if p in ms]
    if r["mode"] == "phalanx" and "scheduling_algorithm" in ms:
        calls = ms["scheduling_algorithm"] - inside
        serial = serial_per_pod(r)
        served = serial["server"]
        parts.append(f"extender calls (algorithm - framework) {calls:.2f}")
        parts.append(
            f"of which in the extender's server {served:.2f} (filter + prioritize: the serving threads' own "
            f"CPU {serial['cpu']:.2f}, waiting for a core {serial['queued']:.2f})"
        )
        parts.append(f"outside it (client, transfer, kube-scheduler's encoding) {calls - served:.2f}")
    if "connections_per_pod" in r:
        parts.append(f"extender connections opened per pod {r['connections_per_pod']:.2f}")
    cpu = r["cpu_ms_per_pod"]
    running = r.get("extender_running", True)
    if r["mode"] == "phalanx":
        extender = f"extender {cpu['extender']:.2f}"
    else:
        extender = f"extender (watching only) {cpu['extender']:.2f}" if running else "extender stopped"
    parts.append(
        f"CPU/pod kube-scheduler {cpu['kube-scheduler']:.2f}, {extender}, kube-apiserver {cpu['kube-apiserver']:.2f}"
    )
    waited = dict(r.get("run_delay_ms_per_pod") or {})
    if not running:
        waited.pop("extender", None)
    if waited:
        parts.append("waiting for a core/pod " + ", ".join(f"{w} {v:.2f}" for w, v in waited.items()))
    return f"round {r['mode']:8} mean ms per pod: " + ", ".join(parts)


def serial_per_pod(r: dict[str, Any]) -> dict[str, float]:
    """Per pod, the extender's time on kube-scheduler's serial cycle (filter and prioritize,
    first byte to reply sent) and two of its parts: the serving threads' own CPU, and their wait
    for a core (from before each request arrived: the wake-up for it counts)."""
    latency = r.get("latency") or {}
    pods = max(1, r["bound"])

    def total(phase: str) -> float:
        stats = [latency.get(f"{v}.{phase}", {}) for v in ("filter", "prioritize")]
        return float(sum(s.get("mean_ms", 0.0) * s.get("count", 0) for s in stats))

    return {phase: total(phase) / pods for phase in ("server", "cpu", "queued")}


def paced_round(
    cluster: LocalCluster,
    kube: RestKube,
    *,
    rate_per_s: float,
    seconds: float,
    ext_url: str,
    percentage: int | None = None,
) -> dict[str, Any]:
    """Extender latency at a steady load below saturation: pods arrive at `rate_per_s` while
    the scheduler (with the extender) runs, as in a cluster in normal operation. The same mix
    as the rounds, but a `PREFERRING` share of the GPU pods prefers a block, so prioritize is
    called (and timed) for them."""
    scheduler = "bench-paced"
    cluster.restart_scheduler(
        ext_url, scheduler_names=["default-scheduler", scheduler], percentage_of_nodes_to_score=percentage
    )
    http_json("DELETE", f"{ext_url}/api/v1/stats", kube)
    watch = BindWatch(kube, scheduler)
    watch.start()
    rnd = random.Random(7)
    total = int(rate_per_s * seconds)
    start = time.monotonic()
    for i in range(total):
        time.sleep(max(0.0, start + i / rate_per_s - time.monotonic()))
        gpu = rnd.random() < 0.7
        body = pod_body(f"{scheduler}-{i:05d}", scheduler, gpu, prefers=gpu and rnd.random() < PREFERRING)
        kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=body)
    deadline = time.monotonic() + 120
    while len(watch.bound) < total and time.monotonic() < deadline:
        time.sleep(0.2)
    watch.stop.set()
    latency = http_json("GET", f"{ext_url}/api/v1/stats", kube)["latency"]
    delete_pods(kube, scheduler)
    return {"pods": total, "bound": len(watch.bound), "rate": rate_per_s, "latency": latency}


def create_bound_pods(kube: RestKube, count: int) -> None:
    """`count` pods already bound round-robin over the nodes (KWOK runs them), 7 in 10 holding
    one whole GPU with its device record, as Phalanx's bind writes it (never more than the
    node's 8 GPUs, so every record is valid)."""
    listing = kube.request("GET", "/api/v1/nodes").body["items"]
    nodes = sorted(n["metadata"]["name"] for n in listing)

    def body(i: int) -> dict[str, Any]:
        node, slot = nodes[i % len(nodes)], i // len(nodes)  # slot: the pod's place on its node
        index = (slot // 10) * 7 + slot % 10  # its GPU: 7 of every 10 slots hold one
        gpu = slot % 10 < 7 and index < 8
        obj = pod_body(f"mem-{i:06d}", "default-scheduler", gpu)
        obj["metadata"]["labels"] = {"bench": "memory"}
        obj["spec"]["nodeName"] = node
        if gpu:
            obj["metadata"]["annotations"] = {
                DEVICES_ANNOTATION: encode_devices((DeviceAssignment(index, FULL_SHARE, 0),))
            }
        return obj

    post_pods(kube, [body(i) for i in range(count)])


def start_up(log: Path) -> str:
    """When each list ended, from the extender's log (its first line is its start)."""
    first, marks = None, []
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
            at = datetime.fromisoformat(entry["timestamp"]).timestamp()
        except (ValueError, KeyError, TypeError):
            continue
        first = at if first is None else first
        if entry.get("event") == "listed" and entry.get("resource") in ("nodes", "pods"):
            marks.append(
                f"{entry['resource']} listed ({entry.get('count')} in {entry.get('pages')} pages) at {at - first:.2f}"
            )
    return ", ".join(marks) or "no list logged"


def memory(args: argparse.Namespace) -> None:
    nodes = args.nodes or (1000 if args.quick else 5000)
    pods = args.pods or (10_000 if args.quick else 50_000)
    started = time.monotonic()

    def fill(kube: RestKube) -> None:
        create_bound_pods(kube, pods)
        print(f"{pods} bound pods created in {time.monotonic() - started:.0f} s", flush=True)
        # KWOK then marks each pod Running: 50,000 status updates that would keep kube-apiserver
        # busy through the extender's lists. A restarted extender meets a settled cluster.
        settled = time.monotonic()
        waiting = {"fieldSelector": "status.phase!=Running", "limit": "1"}
        while kube.request("GET", "/api/v1/pods", query=waiting).body["items"]:
            if time.monotonic() - settled > 900:
                raise RuntimeError("KWOK did not mark the pods Running within 15 minutes")
            time.sleep(2)
        print(f"all {pods} pods Running {time.monotonic() - settled:.0f} s later", flush=True)

    with kwok_session("bench-memory", nodes, before_extender=fill) as session:
        ready_s = session.ready_s
        time.sleep(5)  # settled: the sweep and the first refresh have run (RSS is not a condition to wait on)
        rss = rss_mib(session.ext_pid)
        timeline = start_up(session.state / "extender.log")
        with urllib.request.urlopen(f"{session.ext_url}/metrics", timeout=10) as r:
            text = r.read().decode()
    cached = {
        sample.labels.get("kind", ""): int(sample.value)
        for family in text_string_to_metric_families(text)
        if family.name == "phalanx_cache_objects"
        for sample in family.samples
    }
    lines = [
        f"{nodes} KWOK nodes (8 GPUs each), {pods} pods bound and Running before the extender starts "
        "(70 % holding a whole GPU with its device record)",
        f"extender ready {ready_s:.2f} s after start; RSS {rss:.0f} MiB 5 s after ready; cache holds {cached}",
        f"start-up (s from the extender's first log line): {timeline}",
    ]
    finish(
        "kwok_throughput --memory",
        args,
        lines,
        {"nodes": nodes, "pods": pods, "rss_mib": round(rss, 1), "ready_s": round(ready_s, 2)},
    )


def main() -> None:
    ap = parser(__doc__, quick="200 nodes, 400 pods, one round per mode")
    ap.add_argument("--nodes", type=int)
    ap.add_argument("--pods", type=int)
    ap.add_argument("--rounds", type=int, help="rounds per mode, alternating (default 2, quick 1)")
    ap.add_argument(
        "--extender-nice",
        type=int,
        default=0,
        help="run the extender at this nice value (e.g. -5 stands in for a sidecar's reserved CPU)",
    )
    ap.add_argument(
        "--extender-config", type=Path, help="extender config file (A/B, e.g. gpu.fragmentationScoring: false)"
    )
    ap.add_argument("--paced-rate", type=float, default=30.0, help="pods/s of the steady-load latency round")
    ap.add_argument(
        "--percentage",
        type=int,
        help="kube-scheduler's percentageOfNodesToScore in both modes (default: unset, its adaptive share)",
    )
    ap.add_argument(
        "--extender-in-vanilla",
        action="store_true",
        help="keep the extender running (watching) through vanilla rounds, as runs did before 2026-11-27",
    )
    ap.add_argument(
        "--floor",
        action="store_true",
        help="run benchmarks/noop_extender.py (the same HTTP server and Binding POST, no work) in place of "
        "Phalanx: the most any extender on this server could reach here",
    )
    ap.add_argument("--memory", action="store_true", help="RSS and start-up with many bound pods (see above)")
    args = ap.parse_args()
    if args.memory:
        memory(args)
        return
    nodes = args.nodes or (200 if args.quick else 1000)
    pods = args.pods or (400 if args.quick else 2000)
    rounds = args.rounds or (1 if args.quick else 2)
    results: list[dict[str, Any]] = []
    module = "benchmarks.noop_extender" if args.floor else "extender"
    with kwok_session(
        "bench", nodes, extender_nice=args.extender_nice, extender_config=args.extender_config, extender_module=module
    ) as session:
        cluster, kube, ext_url = session.cluster, session.kube, session.ext_url
        for i in range(rounds):
            for mode in ("vanilla", "phalanx"):
                if mode == "phalanx":
                    session.start_extender()
                elif not args.extender_in_vanilla:
                    session.stop_extender()  # the baseline runs without it: its watches cost CPU
                r = one_round(
                    cluster,
                    kube,
                    mode=mode,
                    index=i,
                    pods=pods,
                    ext_url=ext_url,
                    ext_pid=session.ext_pid,
                    percentage=args.percentage,
                )
                print(f"round {i} {mode:8} bound {r['bound']}/{pods}  {r['pods_per_s']:.1f} pods/s", flush=True)
                print(breakdown(r), flush=True)
                results.append(r)
        paced = paced_round(
            cluster,
            kube,
            rate_per_s=args.paced_rate,
            seconds=10 if args.quick else 30,
            ext_url=ext_url,
            percentage=args.percentage,
        )
        print(f"paced    bound {paced['bound']}/{paced['pods']} at {args.paced_rate:g} pods/s", flush=True)
        rss = rss_mib(session.ext_pid)
        ready_s = session.ready_s
        with urllib.request.urlopen(f"{ext_url}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("phalanx_extender_outcomes_total") and 'verb="bind"' in line:
                    print(line, flush=True)  # refused binds (e.g. no-longer-fits) send pods back to the queue
    vanilla = median([r["pods_per_s"] for r in results if r["mode"] == "vanilla"])
    phalanx = median([r["pods_per_s"] for r in results if r["mode"] == "phalanx"])
    latency: dict[str, dict[str, float]] = {}
    for r in results:
        for verb, stats in (r.get("latency") or {}).items():
            cur = latency.setdefault(verb, {"p50_ms": 0.0, "p99_ms": 0.0, "count": 0})
            cur["p50_ms"] = max(cur["p50_ms"], stats["p50_ms"])
            cur["p99_ms"] = max(cur["p99_ms"], stats["p99_ms"])
            cur["count"] += stats["count"]
    lines = [
        *(
            ["THE PROTOCOL'S FLOOR: the 'phalanx' rounds ran benchmarks/noop_extender.py, not Phalanx"]
            if args.floor
            else []
        ),
        f"{nodes} KWOK nodes (8 GPUs each), {pods} pods per round (70 % 1-GPU, 30 % CPU-only), "
        f"{rounds} round(s) per mode, alternating; extender nice {args.extender_nice}; "
        f"percentageOfNodesToScore {args.percentage if args.percentage is not None else 'unset (adaptive)'}"
        + (
            f"; extender config {args.extender_config}: {args.extender_config.read_text().strip()!r}"
            if args.extender_config
            else ""
        ),
    ]
    lines += [
        f"round {i // 2} {r['mode']:8} {r['pods_per_s']:8.1f} pods/s ({r['bound']}/{pods} bound)"
        for i, r in enumerate(results)
    ]
    lines += [breakdown(r) for r in results]
    lines += [
        f"extender at saturation {verb:10} p50 {s['p50_ms']:.2f} ms  p99 {s['p99_ms']:.2f} ms  ({s['count']} calls)"
        for verb, s in sorted(latency.items())
    ]
    lines += [
        f"extender at {paced['rate']:g} pods/s {verb:10} p50 {s['p50_ms']:.2f} ms  p99 {s['p99_ms']:.2f} ms  "
        f"({s['count']} calls)"
        for verb, s in sorted(paced["latency"].items())
    ]
    headline = {
        "vanilla_pods_per_s": round(vanilla, 1),
        "phalanx_pods_per_s": round(phalanx, 1),
        "ratio": round(phalanx / vanilla, 3) if vanilla else 0.0,
        "filter_p99_ms": round(paced["latency"].get("filter", {}).get("p99_ms", float("nan")), 3),
        "filter_p99_saturated_ms": round(latency.get("filter", {}).get("p99_ms", float("nan")), 3),
        "paced_pods_per_s": paced["rate"],
        "nodes": nodes,
        "pods": pods,
        "percentage_of_nodes_to_score": args.percentage,
        "rss_mib": round(rss, 1),
        "ready_s": round(ready_s, 2),
        "extender_cpu_ms_per_pod": round(
            median([r["cpu_ms_per_pod"]["extender"] for r in results if r["mode"] == "phalanx"]), 3
        ),
        "scheduler_cpu_ms_per_pod": {
            mode: round(median([r["cpu_ms_per_pod"]["kube-scheduler"] for r in results if r["mode"] == mode]), 3)
            for mode in ("vanilla", "phalanx")
        },
    }
    phalanx_rounds = [r for r in results if r["mode"] == "phalanx"]
    headline["extender_serial_ms_per_pod"] = {
        phase: round(median([serial_per_pod(r)[phase] for r in phalanx_rounds]), 3)
        for phase in ("server", "cpu", "queued")
    }
    headline["run_delay_ms_per_pod"] = {
        "kube-scheduler": {
            mode: round(median([r["run_delay_ms_per_pod"]["kube-scheduler"] for r in results if r["mode"] == mode]), 3)
            for mode in ("vanilla", "phalanx")
        },
        "extender": round(median([r["run_delay_ms_per_pod"]["extender"] for r in phalanx_rounds]), 3),
    }
    # Each round pair's own ratio (a vanilla round, then a Phalanx one): how far one run's
    # ratio moves on a machine whose speed drifts from minute to minute.
    pairs = zip(results[0::2], results[1::2], strict=True)
    headline["round_ratios"] = [
        round(p["pods_per_s"] / v["pods_per_s"], 3) if v["pods_per_s"] else 0.0 for v, p in pairs
    ]
    if args.extender_in_vanilla:
        headline["extender_watching_cpu_ms_per_pod"] = round(
            median([r["cpu_ms_per_pod"]["extender"] for r in results if r["mode"] == "vanilla"]), 3
        )
    headline["extender"] = "floor (benchmarks/noop_extender.py)" if args.floor else "phalanx"
    if nodes == 5000:
        headline["ratio_5000"] = headline["ratio"]  # issue 14's second target, named as it names it
    lines.append(f"extender RSS {rss:.0f} MiB at the end, ready {ready_s:.1f} s after start")
    kept = ("read", "decode", "work", "encode", "write", "cpu", "queued")  # phases: in the printed lines only
    for verb, s in paced["latency"].items():
        if not verb.endswith(kept):
            headline[f"{verb}_p50_ms"] = round(s["p50_ms"], 3)
            headline[f"{verb}_p99_ms"] = round(s["p99_ms"], 3)
    for verb, s in latency.items():
        if not verb.endswith(kept):
            headline[f"{verb}_p99_saturated_ms"] = round(s["p99_ms"], 3)
    finish("kwok_throughput", args, lines, headline)


if __name__ == "__main__":
    main()
