"""Gang scheduling end to end on KWOK nodes: kube-scheduler + the Phalanx extender.

One local control plane (deploy/local) per cluster size with N fake 8-GPU nodes laid out as in
config/cluster.yaml (8 nodes per rack, 4 racks per block; past 64 nodes whole blocks are added;
rack b1-r3 is MIG, so its nodes have only 4 whole GPUs). The Workload CRD is installed, the
extender runs as a subprocess (as a sidecar would) and kube-scheduler is restarted to call it.
One watch on every benchmark pod timestamps (monotonic clock) the first event showing a node.

Phases, on each cluster:

1. Gang latency. Gangs of 8, 64 and 512 pods, each pod asking ``nvidia.com/gpu: 8`` (a whole
   node), one Workload each with ``minCount = count`` and ``preferred: topology.phalanx.io/rack``
   (the 8-pod gang also ``required: topology.phalanx.io/block``; 64 and 512 exceed a 32-node
   block). The Workload is created first, then the members on a thread pool; the last member's
   creation time is taken right after the last POST returns. Latency = last member bound minus
   last member created; p50/p99 over the repetitions (nearest rank: with 5 samples p99 is the
   maximum). Racks used = distinct rack labels of the nodes the members got; on an empty
   cluster the optimum is ceil(count / 8). Pods (and Workloads) are deleted between
   repetitions (collection DELETE, gracePeriodSeconds=0) and we wait until they are gone.
2. Mixed stream. 10 gangs of 8 plus 200 single 1-GPU pods plus 100 CPU-only pods, created
   shuffled at full speed; pods/s = pods bound / (last bind - first creation).
3. Competing-gang trials (first cluster only). Each trial creates 2-4 gangs of 2..24 whole-node
   pods (minCount = count), all pinned by nodeSelector to one 32-node block, so they often do not
   all fit. A trial settles when every gang is either fully bound or has nothing bound, at least
   one gang is bound, and the bound total has not changed for 3 s; or at its 60 s deadline.
   Counted: partial gangs (bound not in {0, count}) and deadlocks (nothing bound at the deadline
   although every gang alone fits the block). Also reported: gangs left unbound although they
   fit the block's free nodes at settle time ("unbound_fitting"; not a correctness failure, the
   scheduler may simply not have retried them yet).

   Trials run in waves of ``--wave`` trials at once, each in its own block (blocks are disjoint,
   so trials of a wave never compete for nodes, only for scheduler time); everything is deleted
   between waves. Why: a trial costs about 1 s of creation and binding plus the 3 s stability
   window plus deletion, i.e. about 5 s alone; 1,000 sequential trials would take about 80 min
   on a 2-core machine, more than the 60 min budget. Waves of 5 cost about 1.8 s per trial
   (measured: 50 trials in 88 s), so the full 1,000 trials take about 30 min, more when trials
   run into their 60 s deadline (a wave waits for its slowest trial). ``--wave 1`` gives
   strictly sequential trials.

    python -m benchmarks.kwok_gangs [--quick] [--nodes 1000,4000] [--trials N] [--wave N]
                                    [--sizes 8,64,512] [--seed N] [--no-record]

Full: clusters of 1,000 and 4,000 nodes (sequentially), gangs of 8/64 (5 repetitions) and 512
(3), 1,000 trials. Quick: 1,000 nodes, gangs of 8 and 64 (3 repetitions each), 50 trials.
The last output line is one JSON object (headline): ``bind_s_p50`` / ``bind_s_p99`` map gang
size to seconds (the worst over the clusters run; ``by_nodes`` has each cluster's figures),
``racks_used`` (worst repetition) / ``racks_optimal`` per size, ``mixed_pods_per_s`` (worst
cluster), ``partial_gangs``, ``deadlocks``, ``trials``, ``nodes``.
"""

from __future__ import annotations

import argparse
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import yaml

from benchmarks.common import finish, median, parser, percentile
from benchmarks.kwok import NS, ROOT, http_json, kwok_session
from deploy.local.versions import KUBERNETES_VERSION
from extender.kube import Expired, RestKube

CRD = ROOT / "config/crds/phalanx.io_workloads.yaml"
WORKLOADS = f"/apis/phalanx.io/v1alpha1/namespaces/{NS}/workloads"
PODS = f"/api/v1/namespaces/{NS}/pods"
BLOCK, RACK = "topology.phalanx.io/block", "topology.phalanx.io/rack"
BENCH_LABEL = "bench"
BENCH_VALUE = "gangs"
GPUS_PER_NODE = 8
NODES_PER_RACK = 8
SETTLE_S = 3.0
TRIAL_DEADLINE_S = 60.0


# ---------------------------------------------------------------------------- objects


def workload_body(name: str, count: int, *, required: str = "", preferred: str = RACK) -> dict[str, Any]:
    group = {
        "name": "workers",
        "minCount": count,
        "scheduleTimeoutSeconds": 120,
        "topologyRequest": {"required": required, "preferred": preferred},
        "rankedGroups": [{"name": "all", "eqGroups": [{"name": "w", "count": count}]}],
    }
    return {
        "apiVersion": "phalanx.io/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": NS, "labels": {BENCH_LABEL: BENCH_VALUE}},
        "spec": {"gangGroups": [group]},
    }


def pod_body(name: str, *, gpus: int, workload: str = "", selector: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {BENCH_LABEL: BENCH_VALUE}
    if workload:
        labels["phalanx.io/workload"] = workload
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "128Mi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "schedulerName": "default-scheduler",
            "nodeSelector": selector or {},
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "x", "resources": resources}],
        },
    }


def members(workload: str, count: int, selector: dict[str, str] | None = None) -> list[dict[str, Any]]:
    return [
        pod_body(f"{workload}-{i:04d}", gpus=GPUS_PER_NODE, workload=workload, selector=selector) for i in range(count)
    ]


def names_of(bodies: Iterable[dict[str, Any]]) -> list[str]:
    return [b["metadata"]["name"] for b in bodies]


# ---------------------------------------------------------------------------- API helpers


def create_workload(kube: RestKube, body: dict[str, Any]) -> None:
    r = kube.request("POST", WORKLOADS, body=body)
    if r.status != 201:
        raise RuntimeError(f"create workload {body['metadata']['name']}: HTTP {r.status}: {r.body}")


def create_pods(pool: ThreadPoolExecutor, kube: RestKube, bodies: list[dict[str, Any]]) -> list[float]:
    """POST every pod on the pool; returns, per pod, the monotonic time its POST returned."""

    def post(body: dict[str, Any]) -> float:
        r = kube.request("POST", PODS, body=body)
        if r.status != 201:
            raise RuntimeError(f"create pod {body['metadata']['name']}: HTTP {r.status}: {r.body}")
        return time.monotonic()

    return list(pool.map(post, bodies))


def wait_for(what: str, check: Callable[[], Any], deadline_s: float, interval_s: float = 0.05) -> Any:
    deadline = time.monotonic() + deadline_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {deadline_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


def wait_until(check: Callable[[], Any], deadline_s: float) -> bool:
    """Like wait_for, but a missed deadline is a result (False), not an error."""
    try:
        wait_for("", check, deadline_s)
    except TimeoutError:
        return False
    return True


def delete_all(kube: RestKube) -> None:
    """Delete every benchmark pod and Workload and wait until the pods are gone."""
    selector = f"{BENCH_LABEL}={BENCH_VALUE}"
    r = kube.request("DELETE", PODS, query={"labelSelector": selector, "gracePeriodSeconds": "0"})
    if r.status != 200:
        raise RuntimeError(f"delete pods: HTTP {r.status}: {r.body}")
    kube.request("DELETE", WORKLOADS, query={"labelSelector": selector})

    def gone() -> bool:
        listing = kube.request("GET", PODS, query={"labelSelector": selector, "limit": "1"})
        return not listing.body["items"]

    wait_for("benchmark pods deleted", gone, 120)


def install_crd(kube: RestKube) -> None:
    r = kube.request(
        "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=yaml.safe_load(CRD.read_text())
    )
    if r.status not in (201, 409):
        raise RuntimeError(f"install Workload CRD: HTTP {r.status}: {r.body}")
    wait_for("Workload API served", lambda: kube.request("GET", WORKLOADS).status == 200, 60, 0.2)


@dataclass(frozen=True)
class Topology:
    rack: dict[str, str]  # node -> rack
    trial_blocks: list[str]  # blocks whose every node offers 8 whole GPUs, full size

    @property
    def block_size(self) -> int:
        return 4 * NODES_PER_RACK


def read_topology(kube: RestKube) -> Topology:
    items = kube.request("GET", "/api/v1/nodes").body["items"]
    rack: dict[str, str] = {}
    whole: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for node in items:
        labels = node["metadata"].get("labels") or {}
        rack[node["metadata"]["name"]] = labels.get(RACK, "")
        block = labels.get(BLOCK, "")
        total[block] += 1
        if (node.get("status") or {}).get("allocatable", {}).get("nvidia.com/gpu") == str(GPUS_PER_NODE):
            whole[block] += 1
    size = max(total.values(), default=0)
    blocks = sorted((b for b in total if b and total[b] == size and whole[b] == size), key=lambda b: int(b[1:]))
    return Topology(rack, blocks)


# ---------------------------------------------------------------------------- the watch


class PodWatch:
    """Every benchmark pod's node and the monotonic time the watch first showed it bound."""

    def __init__(self, kube: RestKube) -> None:
        self.kube = kube
        self.node: dict[str, str] = {}
        self.bound_at: dict[str, float] = {}
        self.synced = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)

    def start(self) -> None:
        self.thread.start()
        if not self.synced.wait(30):
            raise RuntimeError("pod watch did not list within 30 s")

    def _see(self, obj: dict[str, Any]) -> None:
        node = (obj.get("spec") or {}).get("nodeName")
        if node:
            name = obj["metadata"]["name"]
            if name not in self.bound_at:
                self.bound_at[name] = time.monotonic()
                self.node[name] = node

    def _list(self) -> str:
        listing = self.kube.request("GET", PODS, query={"labelSelector": f"{BENCH_LABEL}={BENCH_VALUE}"})
        for p in listing.body["items"]:
            self._see(p)
        self.synced.set()
        return str(listing.body["metadata"]["resourceVersion"])

    def _run(self) -> None:
        rv = ""
        while not self.stop.is_set():
            try:
                rv = rv or self._list()
                query = {
                    "labelSelector": f"{BENCH_LABEL}={BENCH_VALUE}",
                    "watch": "1",
                    "resourceVersion": rv,
                    "allowWatchBookmarks": "true",
                    "timeoutSeconds": "120",
                }
                for event in self.kube.stream(PODS, query):
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        rv = ""
                        break
                    rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._see(obj)
                    if self.stop.is_set():
                        return
            except Expired:
                rv = ""
            except Exception:
                rv = ""
                time.sleep(0.2)

    def count_bound(self, names: Iterable[str]) -> int:
        return sum(1 for n in names if n in self.bound_at)


# ---------------------------------------------------------------------------- phase 1: gang latency


@dataclass
class GangRun:
    size: int
    bind_s: float  # nan when not all members bound by the deadline
    bound: int
    racks: int


@dataclass
class Bench:
    kube: RestKube
    watch: PodWatch
    topo: Topology
    pool: ThreadPoolExecutor
    ext_url: str
    rnd: random.Random
    runs: list[GangRun] = field(default_factory=list)


def gang_once(b: Bench, size: int, rep: int) -> GangRun:
    name = f"g{size}-r{rep}"
    create_workload(b.kube, workload_body(name, size, required=BLOCK if size <= 32 else ""))
    bodies = members(name, size)
    last_created = max(create_pods(b.pool, b.kube, bodies))
    pods = names_of(bodies)
    wait_until(lambda: b.watch.count_bound(pods) == size, 60 + size / 5)
    bound = b.watch.count_bound(pods)
    bind_s = max(b.watch.bound_at[p] for p in pods) - last_created if bound == size else math.nan
    racks = len({b.topo.rack.get(b.watch.node[p], "?") for p in pods if p in b.watch.node})
    delete_all(b.kube)
    return GangRun(size, bind_s, bound, racks)


def gang_latency(b: Bench, sizes: list[int], reps: dict[int, int]) -> list[GangRun]:
    runs = []
    for size in sizes:
        for rep in range(reps[size]):
            run = gang_once(b, size, rep)
            runs.append(run)
            print(
                f"  gang {size:4d} rep {rep}: bound {run.bound}/{size} in {run.bind_s:.3f} s after the last "
                f"creation, {run.racks} racks (optimum {math.ceil(size / NODES_PER_RACK)})",
                flush=True,
            )
    return runs


# ---------------------------------------------------------------------------- phase 2: mixed stream


def mixed_stream(b: Bench, gangs: int = 10, gang_size: int = 8, gpu_pods: int = 200, cpu_pods: int = 100) -> float:
    bodies: list[dict[str, Any]] = []
    for g in range(gangs):
        name = f"mix-g{g}"
        create_workload(b.kube, workload_body(name, gang_size))
        bodies += members(name, gang_size)
    bodies += [pod_body(f"mix-gpu-{i:04d}", gpus=1) for i in range(gpu_pods)]
    bodies += [pod_body(f"mix-cpu-{i:04d}", gpus=0) for i in range(cpu_pods)]
    b.rnd.shuffle(bodies)
    pods = names_of(bodies)
    first = time.monotonic()
    create_pods(b.pool, b.kube, bodies)
    wait_until(lambda: b.watch.count_bound(pods) == len(pods), 180)
    bound = [b.watch.bound_at[p] for p in pods if p in b.watch.bound_at]
    rate = len(bound) / max(1e-9, max(bound) - first) if bound else 0.0
    print(f"  mixed: {len(bound)}/{len(pods)} bound, {rate:.1f} pods/s", flush=True)
    delete_all(b.kube)
    return rate


# ---------------------------------------------------------------------------- phase 3: trials


@dataclass
class TrialResult:
    sizes: list[int]
    bound: list[int]
    partial: int
    deadlock: bool
    unbound_fitting: int
    settle_s: float


def trial_gangs(rnd: random.Random) -> list[int]:
    return [rnd.randint(2, 24) for _ in range(rnd.randint(2, 4))]


def settled(counts: list[int], sizes: list[int]) -> bool:
    return any(counts) and all(c in (0, s) for c, s in zip(counts, sizes, strict=True))


def run_wave(b: Bench, wave: int, blocks: list[str]) -> list[TrialResult]:
    """One trial per block, all at once; returns when every trial settled or hit its deadline."""
    plans = [trial_gangs(b.rnd) for _ in blocks]
    gangs: list[list[list[str]]] = []
    bodies: list[dict[str, Any]] = []
    for t, (sizes, block) in enumerate(zip(plans, blocks, strict=True)):
        gangs.append([])
        for j, size in enumerate(sizes):
            name = f"w{wave}-t{t}-g{j}"
            create_workload(b.kube, workload_body(name, size))
            gang = members(name, size, selector={BLOCK: block})
            gangs[-1].append(names_of(gang))
            bodies += gang
    b.rnd.shuffle(bodies)
    start = time.monotonic()
    create_pods(b.pool, b.kube, bodies)
    results = watch_trials(b, plans, gangs, start)
    delete_all(b.kube)
    return results


def watch_trials(b: Bench, plans: list[list[int]], gangs: list[list[list[str]]], start: float) -> list[TrialResult]:
    done: dict[int, TrialResult] = {}
    last: dict[int, tuple[list[int], float]] = {}
    while len(done) < len(plans):
        now = time.monotonic()
        for t, sizes in enumerate(plans):
            if t in done:
                continue
            counts = [b.watch.count_bound(g) for g in gangs[t]]
            if t not in last or last[t][0] != counts:
                last[t] = (counts, now)
            stable = now - last[t][1] >= SETTLE_S
            if (stable and settled(counts, sizes)) or now - start > TRIAL_DEADLINE_S:
                done[t] = judge(sizes, counts, b.topo.block_size, last[t][1] - start)
        time.sleep(0.05)
    return [done[t] for t in range(len(plans))]


def judge(sizes: list[int], counts: list[int], block: int, settle_s: float) -> TrialResult:
    partial = sum(1 for c, s in zip(counts, sizes, strict=True) if c not in (0, s))
    deadlock = not any(counts) and any(s <= block for s in sizes)
    free = block - sum(counts)
    unbound_fitting = sum(1 for c, s in zip(counts, sizes, strict=True) if c == 0 and s <= free and any(counts))
    return TrialResult(sizes, counts, partial, deadlock, unbound_fitting, settle_s)


def trials(b: Bench, total: int, wave: int) -> list[TrialResult]:
    results: list[TrialResult] = []
    width = max(1, min(wave, len(b.topo.trial_blocks)))
    started = time.monotonic()
    index = 0
    while len(results) < total:
        n = min(width, total - len(results))
        blocks = [b.topo.trial_blocks[(index * width + k) % len(b.topo.trial_blocks)] for k in range(n)]
        for r in run_wave(b, index, blocks):
            results.append(r)
            if r.partial or r.deadlock:
                print(f"  trial {len(results) - 1}: sizes {r.sizes} bound {r.bound} PARTIAL/DEADLOCK", flush=True)
        index += 1
        if index % 10 == 0 or len(results) == total:
            elapsed = time.monotonic() - started
            print(
                f"  trials {len(results)}/{total} in {elapsed:.0f} s; partial {sum(r.partial for r in results)}, "
                f"deadlocks {sum(r.deadlock for r in results)}",
                flush=True,
            )
    return results


# ---------------------------------------------------------------------------- one cluster


@dataclass
class ClusterResult:
    nodes: int
    runs: list[GangRun]
    mixed_pods_per_s: float
    trials: list[TrialResult]
    trials_s: float
    gang_stats: dict[str, Any]


def run_cluster(
    nodes: int, sizes: list[int], reps: dict[int, int], n_trials: int, wave: int, seed: int
) -> ClusterResult:
    t0 = time.monotonic()
    with kwok_session("gangs", nodes, before_extender=install_crd) as session:
        kube, ext_url = session.kube, session.ext_url
        session.cluster.restart_scheduler(ext_url, scheduler_names=["default-scheduler"])
        watch = PodWatch(kube)
        try:
            watch.start()
            topo = read_topology(kube)
            print(
                f"{nodes} nodes up in {time.monotonic() - t0:.0f} s; {len(topo.trial_blocks)} whole 8-GPU blocks; "
                f"extender log {session.state / 'extender.log'}",
                flush=True,
            )
            with ThreadPoolExecutor(8) as pool:
                b = Bench(kube, watch, topo, pool, ext_url, random.Random(seed))
                runs = gang_latency(b, sizes, reps)
                mixed = mixed_stream(b)
                started = time.monotonic()
                results = trials(b, n_trials, wave)
                trials_s = time.monotonic() - started
                gang_stats = http_json("GET", f"{ext_url}/api/v1/stats", kube)
        finally:
            watch.stop.set()
    return ClusterResult(nodes, runs, mixed, results, trials_s, gang_stats)


# ---------------------------------------------------------------------------- report


def size_figures(runs: list[GangRun]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for size in sorted({r.size for r in runs}):
        mine = [r for r in runs if r.size == size]
        times = [r.bind_s for r in mine if not math.isnan(r.bind_s)]
        out[str(size)] = {
            # None when a repetition did not end fully bound: its latency is unknown (> deadline).
            "p50": round(percentile(times, 50), 3) if len(times) == len(mine) else None,
            "p99": round(percentile(times, 99), 3) if len(times) == len(mine) else None,
            "median": round(median(times), 3),
            "reps": len(mine),
            "complete": len(times),
            "racks_used": max(r.racks for r in mine),
            "racks_optimal": math.ceil(size / NODES_PER_RACK),
        }
    return out


def report(results: list[ClusterResult], args: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    lines: list[str] = []
    by_nodes: dict[str, Any] = {}
    for c in results:
        sizes = size_figures(c.runs)
        lines.append(
            f"{c.nodes} KWOK nodes (8 GPUs each), kube-scheduler {KUBERNETES_VERSION} + Phalanx extender subprocess"
        )
        for size, f in sizes.items():
            lines.append(
                f"  gang {size:>4}: last created -> all bound p50 {fmt(f['p50'])} s  p99 {fmt(f['p99'])} s "
                f"({f['complete']}/{f['reps']} reps complete); racks used max {f['racks_used']} "
                f"(optimum {f['racks_optimal']})"
            )
        lines.append(f"  mixed stream (10 gangs x 8 + 200 1-GPU + 100 CPU pods): {c.mixed_pods_per_s:.1f} pods/s")
        if c.trials:
            t = c.trials
            settle = [r.settle_s for r in t]
            lines.append(
                f"  trials {len(t)} (waves of {args.wave}, {c.trials_s:.0f} s): partial gangs "
                f"{sum(r.partial for r in t)}, deadlocks {sum(r.deadlock for r in t)}, gangs left unbound though "
                f"they fit the free nodes {sum(r.unbound_fitting for r in t)}, gangs {sum(len(r.sizes) for r in t)}, "
                f"fully bound {sum(1 for r in t for c_, s in zip(r.bound, r.sizes, strict=True) if c_ == s)}, "
                f"settle p50 {median(settle):.2f} s p99 {percentile(settle, 99):.2f} s"
            )
        latency = c.gang_stats.get("latency", {})
        for verb, s in sorted(latency.items()):
            lines.append(
                f"  extender (whole run) {verb:10} p50 {s['p50_ms']:.2f} ms  p99 {s['p99_ms']:.2f} ms "
                f"({s['count']} calls)"
            )
        by_nodes[str(c.nodes)] = {
            "bind_s_p50": {k: v["p50"] for k, v in sizes.items()},
            "bind_s_p99": {k: v["p99"] for k, v in sizes.items()},
            "racks_used": {k: v["racks_used"] for k, v in sizes.items()},
            "mixed_pods_per_s": round(c.mixed_pods_per_s, 1),
        }
    all_trials = [t for c in results for t in c.trials]
    headline: dict[str, Any] = {
        "bind_s_p50": worst(by_nodes, "bind_s_p50"),
        "bind_s_p99": worst(by_nodes, "bind_s_p99"),
        "racks_used": worst(by_nodes, "racks_used"),
        "racks_optimal": {k: math.ceil(int(k) / NODES_PER_RACK) for k in worst(by_nodes, "racks_used")},
        "mixed_pods_per_s": min((v["mixed_pods_per_s"] for v in by_nodes.values()), default=0.0),
        "partial_gangs": sum(t.partial for t in all_trials),
        "deadlocks": sum(t.deadlock for t in all_trials),
        "unbound_fitting": sum(t.unbound_fitting for t in all_trials),
        "trials": len(all_trials),
        "nodes": [c.nodes for c in results],
        "by_nodes": by_nodes,
    }
    if "512" in headline["bind_s_p99"]:
        p99 = headline["bind_s_p99"]["512"]
        headline["gang512_within_10s"] = p99 is not None and p99 <= 10.0
    return lines, headline


def fmt(value: float | None) -> str:
    return "incomplete" if value is None else f"{value:.3f}"


def worst(by_nodes: dict[str, Any], key: str) -> dict[str, Any]:
    """Per size, the worst figure over the clusters (None, i.e. incomplete, beats any number)."""
    out: dict[str, Any] = {}
    for figures in by_nodes.values():
        for size, value in figures[key].items():
            old = out.get(size, value)
            out[size] = None if old is None or value is None else max(old, value)
    return out


def main() -> None:
    ap = parser(__doc__, quick="1,000 nodes, gangs of 8 and 64 (3 reps), 50 trials")
    ap.add_argument("--nodes", help="comma-separated cluster sizes (default 1000,4000; quick 1000)")
    ap.add_argument("--trials", type=int, help="competing-gang trials on the first cluster (default 1000; quick 50)")
    ap.add_argument("--wave", type=int, default=5, help="trials run at once, each in its own block (default 5)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sizes", help="comma-separated gang sizes of phase 1 (default 8,64,512; quick 8,64)")
    args = ap.parse_args()
    nodes = [int(n) for n in (args.nodes or ("1000" if args.quick else "1000,4000")).split(",")]
    sizes = [int(n) for n in (args.sizes or ("8,64" if args.quick else "8,64,512")).split(",")]
    reps = {8: 3, 64: 3} if args.quick else {8: 5, 64: 5, 512: 3}
    n_trials = args.trials if args.trials is not None else (50 if args.quick else 1000)
    results = []
    for i, n in enumerate(nodes):
        results.append(run_cluster(n, sizes, reps, n_trials if i == 0 else 0, args.wave, args.seed + i))
    lines, headline = report(results, args)
    finish("kwok_gangs", args, lines, headline)


if __name__ == "__main__":
    main()
