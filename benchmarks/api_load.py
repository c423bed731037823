"""The allocation API under sustained read load while the extender schedules.

One local control plane (deploy/local) with N KWOK 8-GPU nodes and the extender as a separate
process (as a sidecar runs). Standing allocations are created first, already bound (what the
lists and gets read). Then rounds alternate, in one run: the same pod mix scheduled by
kube-scheduler with the extender while the API is idle ("quiet"), and while clients load it
("loaded"): `--rate` requests a second (default 200; 40 % lists of 100 allocations, 40 % gets of
one, 10 % cluster utilisation, 10 % queue metrics) from keep-alive connections, plus
`--watchers` server-sent-event watches of the namespace's allocations (default 50), which see
every pod of the round placed.

Reported: each endpoint's p50/p99 latency and errors, the request rate achieved, the events the
watchers received, and scheduling throughput quiet vs loaded (the ratio is the API's cost to
scheduling on this machine: on 2 cores the API, the extender's verbs, kube-scheduler and
kube-apiserver share the CPU).

    python -m benchmarks.api_load [--quick] [--nodes N] [--pods N] [--standing N] [--rate R]
                                  [--watchers N] [--rounds N] [--no-record]

Headline keys: api_req_per_s, watchers, list_p99_ms, get_p99_ms, utilization_p99_ms,
queues_p99_ms, errors, quiet_pods_per_s, loaded_pods_per_s, throughput_ratio, nodes.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import random
import socket
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import finish, median, parser, percentile
from benchmarks.kwok import NS, kwok_session
from benchmarks.kwok_throughput import BindWatch, cpu_seconds, delete_pods, pod_body, post_pods, rate
from deploy.local.cluster import LocalCluster
from extender.kube import RestKube

SCHEDULER = "bench-api"  # the profile that calls the extender, and the API's schedulerName
ENDPOINTS = ("list", "get", "utilization", "queues")
WEIGHTS = (4, 4, 1, 1)


def standing(kube: RestKube, count: int) -> list[str]:
    """`count` allocations already bound round-robin over the nodes (a CPU-only pod each)."""
    nodes = sorted(n["metadata"]["name"] for n in kube.request("GET", "/api/v1/nodes").body["items"])
    bodies = []
    for i in range(count):
        body = pod_body(f"standing-{i:05d}", SCHEDULER, False)
        body["metadata"]["labels"] = {"bench": "standing"}
        body["spec"]["nodeName"] = nodes[i % len(nodes)]
        bodies.append(body)
    post_pods(kube, bodies)
    return [b["metadata"]["name"] for b in bodies]


class Load:
    """`rate` requests a second over keep-alive connections, and `watchers` open watches."""

    def __init__(self, url: str, token: str, names: list[str], rate: float, watchers: int) -> None:
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        self.token = token
        self.names = names
        self.rate = rate
        self.watchers = watchers
        self.stop = threading.Event()
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.events = [0] * watchers
        self.sent = 0
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        for i in range(self.watchers):
            self.threads.append(threading.Thread(target=self._watch, args=(i,), daemon=True))
        workers = 16
        for i in range(workers):
            self.threads.append(threading.Thread(target=self._requests, args=(i, workers), daemon=True))
        for t in self.threads:
            t.start()
        self.started = time.monotonic()

    def finish(self) -> float:
        """Stops everything; the request rate achieved."""
        self.stop.set()
        elapsed = time.monotonic() - self.started
        for s in list(self.sockets):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        for t in self.threads:
            t.join(10)
        return self.sent / elapsed

    def _path(self, rnd: random.Random, kind: str) -> str:
        if kind == "list":
            return f"/api/v1/namespaces/{NS}/allocations?limit=100"
        if kind == "get":
            return f"/api/v1/namespaces/{NS}/allocations/{rnd.choice(self.names)}"
        if kind == "utilization":
            return "/api/v1/metrics/cluster/utilization"
        return "/api/v1/metrics/queues"

    def _requests(self, index: int, workers: int) -> None:
        rnd = random.Random(index)
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        headers = {"Authorization": f"Bearer {self.token}"}
        interval = workers / self.rate
        next_at = time.monotonic() + index * interval / workers
        while not self.stop.is_set():
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += interval
            kind = rnd.choices(ENDPOINTS, WEIGHTS)[0]
            started = time.perf_counter()
            try:
                conn.request("GET", self._path(rnd, kind), headers=headers)
                r = conn.getresponse()
                r.read()
                ok = r.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()
                conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            elapsed = time.perf_counter() - started
            with self.lock:
                self.sent += 1
                self.latency[kind].append(elapsed)
                if not ok:
                    self.errors[kind] += 1

    def _watch(self, index: int) -> None:
        path = f"/api/v1/namespaces/{NS}/allocations?watch=true&labelSelector=bench%3D{SCHEDULER}&timeoutSeconds=3600"
        while not self.stop.is_set():
            try:
                sock = socket.create_connection((self.host, self.port), timeout=60)
                self.sockets.append(sock)
                request = f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {self.token}\r\n\r\n"
                sock.sendall(request.encode())
                for line in sock.makefile("rb"):
                    if line.startswith(b"data: "):
                        self.events[index] += 1
                    if self.stop.is_set():
                        break
            except OSError:
                if not self.stop.is_set():
                    time.sleep(0.5)


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


def one_round(
    cluster: LocalCluster, kube: RestKube, session_url: str, *, label: str, pods: int, load: Load | None, ext_pid: int
) -> dict[str, Any]:
    rnd = random.Random(label)
    bodies = []
    for i in range(pods):
        body = pod_body(f"{label}-{i:05d}", SCHEDULER, rnd.random() < 0.7)
        body["metadata"]["labels"] = {"bench": SCHEDULER, "round": label}
        bodies.append(body)
    post_pods(kube, bodies)  # they wait: no profile serves SCHEDULER between rounds
    watch = BindWatch(kube, SCHEDULER)
    watch.selector = f"round={label}"
    watch.start()
    if load is not None:
        load.start()
    started = time.monotonic()
    cpu = (cpu_seconds(ext_pid), _own_cpu())
    cluster.restart_scheduler(session_url, scheduler_names=["default-scheduler", SCHEDULER])
    deadline = started + max(300, pods / 5)
    while len(watch.bound) < pods and time.monotonic() < deadline:
        time.sleep(0.2)
    watch.stop.set()
    achieved = load.finish() if load is not None else 0.0
    bound = len(watch.bound)
    result: dict[str, Any] = {"label": label, "pods": pods, "bound": bound, "req_per_s": achieved}
    result["cpu_s"] = {"extender": cpu_seconds(ext_pid) - cpu[0], "load": _own_cpu() - cpu[1]}
    result["seconds"] = time.monotonic() - started
    result["pods_per_s"] = rate(list(watch.bound.values()), pods) if bound == pods else 0.0
    cluster.restart_scheduler(None, scheduler_names=["default-scheduler"])
    kube.request(
        "DELETE", f"/api/v1/namespaces/{NS}/pods", query={"labelSelector": f"round={label}", "gracePeriodSeconds": "0"}
    )
    return result


def main() -> None:
    ap = parser(__doc__, quick="200 nodes, 400 pods a round, 500 standing allocations, one round each")
    ap.add_argument("--nodes", type=int)
    ap.add_argument("--pods", type=int, help="pods scheduled per round")
    ap.add_argument("--standing", type=int, help="bound allocations the lists and gets read")
    ap.add_argument("--rate", type=float, default=200.0, help="API requests per second while loaded")
    ap.add_argument("--watchers", type=int, default=50, help="open watch streams while loaded")
    ap.add_argument("--rounds", type=int, help="quiet/loaded pairs (default 2, quick 1)")
    args = ap.parse_args()
    nodes = args.nodes or (200 if args.quick else 1000)
    pods = args.pods or (400 if args.quick else 2000)
    count = args.standing or (500 if args.quick else 2000)
    rounds = args.rounds or (1 if args.quick else 2)
    config = Path(tempfile.mkdtemp(prefix="phalanx-api-load-")) / "config.yaml"
    # The benchmark's load is the API's, not the rate limiter's: the limit is lifted.
    config.write_text(
        yaml.safe_dump(
            {
                "api": {
                    "schedulerName": SCHEDULER,
                    "requestsPerMinute": 10_000_000,
                    "burst": 1_000_000,
                    "maxInFlight": 1024,
                    "maxWatchers": 1024,
                }
            }
        )
    )
    results: list[dict[str, Any]] = []
    loads: list[Load] = []
    with kwok_session("bench-api", nodes, extender_config=config) as session:
        kube = session.kube
        token = kube.headers["Authorization"].split(" ", 1)[1]
        names = standing(kube, count)
        print(f"{count} standing allocations bound", flush=True)
        for i in range(rounds):
            for loaded in (False, True):
                load = Load(session.ext_url, token, names, args.rate, args.watchers) if loaded else None
                r = one_round(
                    session.cluster,
                    kube,
                    session.ext_url,
                    label=f"r{i}-{'loaded' if loaded else 'quiet'}",
                    pods=pods,
                    load=load,
                    ext_pid=session.ext_pid,
                )
                if load is not None:
                    loads.append(load)
                    r["watch_events"] = sum(load.events)
                print(
                    f"round {r['label']:10} bound {r['bound']}/{pods}  {r['pods_per_s']:.1f} pods/s"
                    + (f"  API {r['req_per_s']:.0f} req/s, watchers saw {r['watch_events']} events" if loaded else ""),
                    flush=True,
                )
                results.append(r)
        delete_pods(kube, "standing")
    latency: dict[str, list[float]] = defaultdict(list)
    errors = 0
    for load in loads:
        for kind, values in load.latency.items():
            latency[kind] += values
        errors += sum(load.errors.values())
    quiet = [r["pods_per_s"] for r in results if r["label"].endswith("quiet")]
    busy = [r["pods_per_s"] for r in results if r["label"].endswith("loaded")]
    achieved = median([r["req_per_s"] for r in results if r["label"].endswith("loaded")])
    lines = [
        f"{nodes} KWOK nodes, {count} standing allocations, {pods} pods scheduled per round (70 % 1-GPU), "
        f"{rounds} quiet/loaded pairs; load: {args.rate:g} req/s asked ({achieved:.0f} achieved), "
        f"{args.watchers} watchers",
        *(
            f"  {r['label']:10} {r['pods_per_s']:7.1f} pods/s; CPU s over the round's {r['seconds']:.1f} s: "
            f"extender {r['cpu_s']['extender']:.1f}, load generator {r['cpu_s']['load']:.1f}"
            for r in results
        ),
        "endpoint       requests   p50 ms   p99 ms   errors",
        *(
            f"  {kind:12} {len(latency[kind]):8d} {1000 * percentile(latency[kind], 50):8.1f} "
            f"{1000 * percentile(latency[kind], 99):8.1f} {sum(ld.errors[kind] for ld in loads):8d}"
            for kind in ENDPOINTS
        ),
        f"scheduling throughput quiet {median(quiet):.1f} pods/s, loaded {median(busy):.1f} pods/s: "
        f"ratio {median(busy) / max(1e-9, median(quiet)):.3f} (on {os.cpu_count()} cores the load generator, "
        "the API and scheduling share the CPU: see the CPU seconds above)",
    ]
    headline = {
        "nodes": nodes,
        "api_req_per_s": round(achieved, 1),
        "watchers": args.watchers,
        **{f"{kind}_p99_ms": round(1000 * percentile(latency[kind], 99), 1) for kind in ENDPOINTS},
        "errors": errors,
        "quiet_pods_per_s": round(median(quiet), 1),
        "loaded_pods_per_s": round(median(busy), 1),
        "throughput_ratio": round(median(busy) / max(1e-9, median(quiet)), 3),
    }
    finish("api_load", args, lines, headline)


if __name__ == "__main__":
    main()
