"""Fault suite (issue 12): creation orders, extender and kube-apiserver kills, hostile pods,
malformed and slow HTTP, on the real local control plane with the extender as a subprocess.

The extender runs as `python -m extender` on a fixed port (kube-scheduler keeps calling the same
URL), so the suite can SIGKILL it and start a fresh one at any moment. Every wait is on a
condition with a deadline; the only sleeps are the fault schedule itself (a random delay before
a kill, the length of an outage). Phases, each returning counts:

1. Creation orders. A gang of 4 pods x 1 GPU (a Workload with minCount 4) whose objects - the
   Workload CRD (C), the Workload (W), the pods (P) and an extender restart (R) - come in every
   order that makes sense: C before W; "(C)" means the CRD was installed long before. A step
   that leaves the gang waiting is followed by a wait until kube-scheduler has tried and parked
   the pods, so each order really exercises the "parked, then woken" path. Time to bound = all
   members bound minus the end of the last step (for R: the new extender ready). A gang that
   fits must bind within 10 s.
2. Extender kills. Each trial creates 3 gangs (4 x whole, half and quarter GPUs) and 4 half-GPU
   singles pinned to two nodes, SIGKILLs the extender (a third of the trials at once, a third
   after 0-0.3 s, a third right after the first bind), restarts it (at once or after a gap of up
   to 3 s), and waits up to 120 s until everything is bound. Partial gangs, gangs left unbound
   and device over-use are counted; a failed trial leaves an evidence file (the extender's view
   of the nodes and gangs, the pods as the API server has them) beside the extender log.
3. kube-apiserver kills: the same trial, but kube-apiserver is SIGKILLed and restarted on the
   same port after an outage of 1-5 s (LocalCluster.restart_apiserver). Recovery includes
   kube-scheduler's own (its informers back off for up to a minute).
4. Hostile pods: unparseable and extreme quantities, forged and malformed device records (on
   pods bound by nodeName, so the record counts), huge label sets. Each is created (the API
   server rejects some at admission: counted as rejected); accepted ones that carry a problem
   must get a Warning Event (InvalidGPURequest / UntrustedDeviceRecord); good pods and a gang
   must still bind; the extender is restarted with them present and must be ready again; half-
   GPU pods pinned to the node that holds the forged records must not over-commit it.
5. Malformed HTTP: bounded requests over raw sockets to every endpoint: a catalogue of fixed
   cases (raw bodies: Infinity, NaN, 1e999999, 100k-deep nesting; framing: `Content-Length: abc`,
   negative, huge, truncated bodies; reads with odd names; every method on every path; hostile
   workload-type bodies; 100,000 unknown node names), then draws from a seeded generator
   (verb bodies with one field replaced by a wrong type, a hostile quantity or annotation),
   then slow clients that declare a longer body than they send. Counted: crashes (the process
   gone), 5xx answers (by case), timeouts, answers never sent, the slowest request, /healthz
   latency during the phase, RSS (VmRSS) after the catalogue's warm-up and at the end, threads.

Double booking, after every phase: the `milli` of every Phalanx-written `phalanx.io/gpu-devices`
record summed per (node, device index) must be <= 1000 (a whole GPU is 1000: at most once).

    python -m benchmarks.chaos [--quick] [--no-record] [--seed N] [--kills N] [--apiserver-kills N]
                               [--requests N] [--phases orders,kills,apiserver,hostile,http]

Full: 23 creation orders, 50 extender kills, 10 kube-apiserver kills, 10,000 requests. Quick
(also tests/e2e/test_chaos.py): 5 orders, 2 kills, 1 apiserver kill, 600 requests. The last
line is one JSON object: trials, partial_gangs, double_booked_devices, gangs_not_bound_in_10s,
crashes, http_5xx, max_rss_growth_mib, and `phases` with each phase's figures.

This module is past 600 lines on purpose: five phases share one harness (extender process,
object builders, waits, the device check), and the suite is one command.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import finish, parser, percentile
from deploy.local.cluster import LocalCluster
from deploy.local.components import ControlPlaneOptions, free_port
from extender.kube import RestKube

ROOT = Path(__file__).resolve().parent.parent
NS = "default"
CRD_FILE = ROOT / "config/crds/phalanx.io_workloads.yaml"
CRD_NAME = "workloads.phalanx.io"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
WORKLOADS = f"/apis/phalanx.io/v1alpha1/namespaces/{NS}/workloads"
PODS = f"/api/v1/namespaces/{NS}/pods"
SUITE = "phalanx-chaos"  # label key on every object the suite creates
FORGED = "phalanx-chaos-forged"  # label on pods whose device record the suite wrote itself
DEVICES = "phalanx.io/gpu-devices"
REPORT_REASONS = ("InvalidGPURequest", "UntrustedDeviceRecord")
BIND_WITHIN_S = 10.0
# Deadline for a trial's pods to bind after a fault: kube-scheduler's own informers take up to
# ~60 s to recover from a kube-apiserver restart (client-go backoff), so 10 s would measure them.
SETTLE_S = 120.0
HOSTNAME = "kubernetes.io/hostname"


# ---------------------------------------------------------------------------- waiting


def until(check: Callable[[], Any], deadline_s: float, interval_s: float = 0.1) -> Any:
    """Poll `check` until it returns something true (returned) or the deadline passes (None)."""
    end = time.monotonic() + deadline_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            return None
        time.sleep(interval_s)


def wait_for(what: str, check: Callable[[], Any], deadline_s: float, interval_s: float = 0.1) -> Any:
    value = until(check, deadline_s, interval_s)
    if not value:
        raise TimeoutError(f"timed out after {deadline_s:.0f} s waiting for {what}")
    return value


def http_status(url: str, timeout: float = 5.0) -> int:
    """The HTTP status of a GET, 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


class Laps:
    """Seconds per named step of a phase, for the report."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.monotonic()

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self.laps[name] = round(now - self._last, 2)
        self._last = now


# ---------------------------------------------------------------------------- the extender process


class ExtenderExited(RuntimeError):
    """The extender process ended before it was ready."""


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


class ExtenderProcess:
    """`python -m extender` on a fixed port, killable and restartable; logs append to `log`."""

    def __init__(self, kubeconfig: Path, log: Path, port: int | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.log = log
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.start_failures: list[str] = []  # starts where the process exited before ready

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, *, ready_within_s: float = 120.0, attempts: int = 3) -> float:
        """Start it and wait for /readyz 200; returns the seconds that took. A process that exits
        before it is ready is recorded in `start_failures` and started again (`attempts` in all);
        past the deadline it raises."""
        for attempt in range(attempts):
            try:
                return self._start_once(ready_within_s)
            except ExtenderExited as e:
                self.start_failures.append(str(e))
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _start_once(self, ready_within_s: float) -> float:
        started = time.monotonic()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        argv = [sys.executable, "-m", "extender", "--kubeconfig", str(self.kubeconfig), "--port", str(self.port)]
        # As the chart runs it: single pods' binds answered once counted, journalled (kept across
        # kills, as the pod's emptyDir keeps it across the container's restarts).
        argv += ["--bind-journal", str(self.log.with_suffix(".binds"))]
        with self.log.open("ab") as out:
            out.write(f"\n=== chaos: start {self.starts} at {time.strftime('%H:%M:%S')}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        self.starts += 1
        until(lambda: self.ready() or not self.alive(), ready_within_s, 0.05)
        took = time.monotonic() - started
        if not self.alive():
            raise ExtenderExited(f"start {self.starts - 1} exited after {took:.0f} s: {_last_line(self.log)}")
        if not self.ready():
            raise RuntimeError(f"extender not ready after {took:.0f} s; see {self.log}")
        return took

    def ready(self) -> bool:
        return http_status(f"{self.url}/readyz", timeout=2.0) == 200

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill would."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def restart(self, gap_s: float = 0.0) -> float:
        self.kill()
        time.sleep(gap_s)  # the outage itself, not a synchronisation
        return self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def status(self, field_name: str) -> int:
        """A number from /proc/<pid>/status (VmRSS in kB, Threads), 0 when the process is gone."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
        except OSError:
            pass
        return 0

    def rss_mib(self) -> float:
        return self.status("VmRSS") / 1024


# ---------------------------------------------------------------------------- harness


@dataclass
class Harness:
    """What every phase needs: the cluster, an API client, the extender, and the GPU nodes."""

    cluster: LocalCluster
    kube: RestKube
    ext: ExtenderProcess
    nodes: list[str]  # nodes with 8 whole GPUs, sorted
    rng: random.Random = field(default_factory=lambda: random.Random(12))
    runs: int = 0

    def run_id(self, phase: str) -> str:
        self.runs += 1
        return f"{phase}{self.runs}"


def gpu_nodes(kube: RestKube) -> list[str]:
    items = kube.request("GET", "/api/v1/nodes").body["items"]
    whole = [
        n["metadata"]["name"]
        for n in items
        if (n["status"].get("allocatable") or {}).get("nvidia.com/gpu") == "8"
        and "nvidia.com/mig.strategy" not in (n["metadata"].get("labels") or {})
    ]
    return sorted(whole)


@contextlib.contextmanager
def attach(cluster: LocalCluster, log_dir: Path, seed: int = 12) -> Iterator[Harness]:
    """Run the extender beside a running cluster and point kube-scheduler at it; restore the
    stock scheduler and remove the suite's objects afterwards (tests/e2e/test_chaos.py)."""
    kube = RestKube.from_kubeconfig(str(cluster.kubeconfig_path))
    ensure_namespace(kube, "phalanx-system")  # where workload-type writes persist
    install_crd(kube)
    ext = ExtenderProcess(cluster.kubeconfig_path, log_dir / "extender.log")
    try:
        ext.start()
        cluster.restart_scheduler(ext.url)
        yield Harness(cluster, kube, ext, gpu_nodes(kube), random.Random(seed))
    finally:
        with contextlib.suppress(Exception):
            cluster.restart_scheduler(None)
        ext.stop()
        with contextlib.suppress(Exception):
            delete_suite(kube, SUITE)
            install_crd(kube)  # other tests expect it


@contextlib.contextmanager
def session(nodes: int, seed: int) -> Iterator[Harness]:
    """A control plane of its own with `nodes` KWOK nodes, always torn down."""
    state = Path(tempfile.mkdtemp(prefix="phalanx-chaos-"))
    cluster = LocalCluster(
        "chaos", state_dir_path=state, options=ControlPlaneOptions(die_with_parent=True, controller_manager=False)
    )
    try:
        cluster.up(nodes=False)
        cluster.create_nodes(nodes)
        with attach(cluster, state, seed) as harness:
            yield harness
    finally:
        cluster.down()


# ---------------------------------------------------------------------------- objects


def ensure_namespace(kube: RestKube, name: str) -> None:
    r = kube.request(
        "POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    if r.status not in (201, 409):
        raise RuntimeError(f"create namespace {name}: HTTP {r.status}: {r.body}")


def install_crd(kube: RestKube) -> None:
    r = kube.request("POST", CRDS, body=yaml.safe_load(CRD_FILE.read_text()))
    if r.status not in (201, 409):
        raise RuntimeError(f"install Workload CRD: HTTP {r.status}: {r.body}")
    wait_for("Workload API served", lambda: kube.request("GET", WORKLOADS).status == 200, 60)


def remove_crd(kube: RestKube) -> None:
    kube.request("DELETE", f"{CRDS}/{CRD_NAME}")
    wait_for("Workload CRD gone", lambda: kube.request("GET", f"{CRDS}/{CRD_NAME}").status == 404, 60)
    wait_for("Workload API gone", lambda: kube.request("GET", WORKLOADS).status == 404, 60)


def workload_body(name: str, run: str, count: int) -> dict[str, Any]:
    group = {
        "name": "workers",
        "minCount": count,
        "scheduleTimeoutSeconds": 30,
        "rankedGroups": [{"name": "all", "eqGroups": [{"name": "w", "count": count}]}],
    }
    meta = {"name": name, "namespace": NS, "labels": {SUITE: run}}
    return {"apiVersion": "phalanx.io/v1alpha1", "kind": "Workload", "metadata": meta, "spec": {"gangGroups": [group]}}


def pod_body(
    name: str,
    run: str,
    *,
    gpus: str = "1",
    fraction: str = "",
    workload: str = "",
    nodes: list[str] | None = None,
    node_name: str = "",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    requests: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta_labels = {SUITE: run, **(labels or {})}
    if workload:
        meta_labels["phalanx.io/workload"] = workload
    notes = dict(annotations or {})
    lim = dict(limits or {})
    if fraction:
        notes["gpu-fraction"] = fraction
    elif gpus:
        lim["nvidia.com/gpu"] = gpus
    spec: dict[str, Any] = {
        "tolerations": [{"operator": "Exists"}],
        "containers": [
            {"name": "c", "image": "x", "resources": {"limits": lim, "requests": {"cpu": "10m", **(requests or {})}}}
        ],
    }
    if nodes:
        term = {"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": nodes}]}
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": meta_labels, "annotations": notes},
        "spec": spec,
    }


def create(kube: RestKube, path: str, body: dict[str, Any]) -> None:
    r = kube.request("POST", path, body=body)
    if r.status != 201:
        raise RuntimeError(f"create {body['metadata']['name']}: HTTP {r.status}: {r.body}")


def pods(kube: RestKube, selector: str) -> list[dict[str, Any]]:
    return list(kube.request("GET", PODS, query={"labelSelector": selector}).body["items"])


def bound_count(kube: RestKube, selector: str) -> int:
    return sum(1 for p in pods(kube, selector) if p["spec"].get("nodeName"))


def parked(kube: RestKube, selector: str, count: int) -> bool:
    """Every one of `count` pods has been tried by kube-scheduler and left unscheduled."""
    items = pods(kube, selector)
    tried = [
        p
        for p in items
        if any(
            c.get("type") == "PodScheduled" and c.get("status") == "False" for c in p["status"].get("conditions") or []
        )
    ]
    return len(items) == count and len(tried) == count


def delete_suite(kube: RestKube, selector: str) -> None:
    """Delete the suite's pods and Workloads (by label selector) and wait until the pods are gone."""
    kube.request("DELETE", PODS, query={"labelSelector": selector, "gracePeriodSeconds": "0"})
    if kube.request("GET", WORKLOADS).status == 200:
        kube.request("DELETE", WORKLOADS, query={"labelSelector": selector})
    wait_for(f"pods {selector} deleted", lambda: not pods(kube, selector), 120, 0.2)


def events_of(kube: RestKube, name: str) -> list[dict[str, Any]]:
    r = kube.request("GET", f"/api/v1/namespaces/{NS}/events", query={"fieldSelector": f"involvedObject.name={name}"})
    return list(r.body.get("items") or []) if r.status == 200 else []


def reported(kube: RestKube, name: str) -> str:
    """The reason of a Warning Event Phalanx wrote on the pod ('' if none)."""
    for e in events_of(kube, name):
        if e.get("type") == "Warning" and e.get("reason") in REPORT_REASONS:
            return str(e["reason"])
    return ""


# ---------------------------------------------------------------------------- the oracle


@dataclass(frozen=True)
class DeviceCheck:
    double_booked: int  # (node, device) pairs with more than 1000 milli
    unreadable: int  # Phalanx-written records that do not decode
    worst: str  # the worst device, for the report


def device_check(kube: RestKube) -> DeviceCheck:
    """Sum `milli` per (node, device index) over every bound, active pod's record that Phalanx
    wrote (pods whose record the suite forged are left out: their devices are inferred)."""
    items = kube.request("GET", "/api/v1/pods").body["items"]
    used: dict[tuple[str, int], int] = defaultdict(int)
    holders: dict[tuple[str, int], list[str]] = defaultdict(list)
    unreadable = 0
    for p in items:
        meta, node = p["metadata"], p["spec"].get("nodeName")
        text = (meta.get("annotations") or {}).get(DEVICES)
        if not node or not text or FORGED in (meta.get("labels") or {}):
            continue
        if p["status"].get("phase") in ("Succeeded", "Failed"):
            continue
        try:
            for e in json.loads(text):
                if "mig" not in e:
                    used[(node, int(e["index"]))] += int(e["milli"])
                    holders[(node, int(e["index"]))].append(f"{meta['name']}:{e['milli']}")
        except (ValueError, KeyError, TypeError):
            unreadable += 1
    over = {k: v for k, v in used.items() if v > 1000}
    worst = max(over.items(), key=lambda kv: kv[1], default=None)
    where = f"{worst[0][0]}/{worst[0][1]}={worst[1]} ({', '.join(holders[worst[0]])})" if worst else ""
    return DeviceCheck(len(over), unreadable, where)


# ---------------------------------------------------------------------------- 1. creation orders

BASE_ORDERS = ("(C) W P", "(C) P W", "C W P", "C P W", "P C W")


def _with_restart(order: str) -> list[str]:
    """The order with an extender restart (R) inserted at every position after "(C)"."""
    pre, steps = (["(C)"], order.split()[1:]) if order.startswith("(C)") else ([], order.split())
    return [" ".join([*pre, *steps[:i], "R", *steps[i:]]) for i in range(len(steps) + 1)]


ALL_ORDERS: tuple[str, ...] = (*BASE_ORDERS, *(o for base in BASE_ORDERS for o in _with_restart(base)))
# "(C) P W R": members parked, their Workload created, the extender killed at once: the new
# process must wake them (it lists definitions and pods in either order).
QUICK_ORDERS = ("(C) P W", "C W P", "P C W", "(C) W R P", "(C) P W R")
GANG = 4


@dataclass
class OrderResult:
    order: str
    bind_s: float | None  # None: not bound within the deadline


def creation_order(h: Harness, order: str, settle_s: float = 60.0) -> OrderResult:
    """Run one order; the gang is 4 pods x 1 GPU. Past `settle_s` it counts as not bound: a
    gang that fits binds in well under 10 s, and a parked one waits for kube-scheduler's
    5-minute flush, so anything past a minute is that."""
    run = h.run_id("order")
    name, selector = run, f"{SUITE}={run}"
    steps = order.split()
    if steps[0] == "(C)":
        install_crd(h.kube)
        steps = steps[1:]
    else:
        remove_crd(h.kube)
    last = 0.0
    for i, step in enumerate(steps):
        final = i == len(steps) - 1
        if step == "C":
            install_crd(h.kube)
        elif step == "W":
            create(h.kube, WORKLOADS, workload_body(name, run, GANG))
        elif step == "P":
            for m in range(GANG):
                create(h.kube, PODS, pod_body(f"{name}-{m}", run, workload=name))
            if not final:  # let kube-scheduler try and park them before the next step
                until(lambda: parked(h.kube, selector, GANG), 30)
        elif step == "R":
            h.ext.restart()
        last = time.monotonic()
    done = until(lambda: bound_count(h.kube, selector) == GANG, settle_s, 0.05)
    result = OrderResult(order, time.monotonic() - last if done else None)
    delete_suite(h.kube, selector)
    return result


def creation_orders(h: Harness, orders: tuple[str, ...], settle_s: float = 60.0) -> dict[str, Any]:
    results = [creation_order(h, order, settle_s) for order in orders]
    install_crd(h.kube)
    times = [r.bind_s for r in results if r.bind_s is not None]
    return {
        "trials": len(results),
        "not_bound": [r.order for r in results if r.bind_s is None],
        "not_bound_in_10s": [r.order for r in results if r.bind_s is None or r.bind_s > BIND_WITHIN_S],
        "bind_s_p50": round(percentile(times, 50), 2) if times else None,
        "bind_s_p99": round(percentile(times, 99), 2) if times else None,
        "by_order": {r.order: None if r.bind_s is None else round(r.bind_s, 2) for r in results},
    }


# ---------------------------------------------------------------------------- 2./3. kills during binds

SHAPES = (("whole", "1", ""), ("half", "", "0.5"), ("quarter", "", "0.25"))


@dataclass
class KillTrial:
    partial: int = 0
    unbound: int = 0  # gangs with nothing bound at the deadline (all fit)
    singles_unbound: int = 0
    recover_s: float | None = None  # fault over -> everything bound
    bound_at_fault: int = 0
    total: int = 0
    evidence: str = ""  # a file with the extender's and the API server's view, when it failed


Fault = Callable[[str], int]  # (the trial's pod selector) -> pods bound when it struck


def gang_trial(h: Harness, fault: Fault, pair: list[str]) -> KillTrial:
    """3 gangs (4 x whole, half and quarter GPU) and 4 half-GPU singles on two nodes (16 GPUs,
    7 used: all fit); `fault` is injected while they bind."""
    run = h.run_id("kill")
    selector = f"{SUITE}={run}"
    for shape, _, _ in SHAPES:
        create(h.kube, WORKLOADS, workload_body(f"{run}-{shape}", run, GANG))
    bodies = [
        pod_body(f"{run}-{shape}-{m}", run, gpus=gpus, fraction=frac, workload=f"{run}-{shape}", nodes=pair)
        for shape, gpus, frac in SHAPES
        for m in range(GANG)
    ]
    bodies += [pod_body(f"{run}-single-{m}", run, fraction="0.5", nodes=pair, gpus="") for m in range(4)]
    h.rng.shuffle(bodies)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda b: create(h.kube, PODS, b), bodies))
    at_fault = fault(selector)
    over = time.monotonic()
    total = len(bodies)
    done = until(lambda: bound_count(h.kube, selector) == total, SETTLE_S, 0.1)
    trial = KillTrial(recover_s=time.monotonic() - over if done else None, bound_at_fault=at_fault, total=total)
    items = pods(h.kube, selector)
    for shape, _, _ in SHAPES:
        n = sum(
            1
            for p in items
            if p["metadata"]["labels"].get("phalanx.io/workload") == f"{run}-{shape}" and p["spec"].get("nodeName")
        )
        trial.partial += 0 < n < GANG
        trial.unbound += n == 0
    trial.singles_unbound = sum(1 for p in items if "single" in p["metadata"]["name"] and not p["spec"].get("nodeName"))
    if trial.partial or trial.unbound or trial.singles_unbound:
        trial.evidence = evidence(h, run, pair, items)
    return trial


def ext_json(h: Harness, path: str) -> Any:
    """GET the extender's read API; None when it does not answer with JSON."""
    try:
        request = urllib.request.Request(f"{h.ext.url}{path}", headers=ADMIN)  # reads need a token too
        with urllib.request.urlopen(request, timeout=10) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def evidence(h: Harness, run: str, nodes: list[str], items: list[dict[str, Any]]) -> str:
    """What a failed trial leaves for diagnosis: the extender's view of the nodes and gangs, and
    the pods as the API server has them; written beside the extender log, path returned."""
    out: dict[str, Any] = {"pods": [], "nodes": {}, "gangs": None}
    for p in items:
        meta = p["metadata"]
        out["pods"].append(
            {
                "name": meta["name"],
                "node": p["spec"].get("nodeName"),
                "record": (meta.get("annotations") or {}).get(DEVICES),
                "events": [e.get("message", "")[:300] for e in events_of(h.kube, meta["name"])][-3:],
            }
        )
    out["nodes"] = {n: ext_json(h, f"/api/v1/nodes/{n}") for n in nodes}
    out["gangs"] = [g for g in (ext_json(h, "/api/v1/gangs") or {}).get("gangs", []) if run in g.get("key", "")]
    path = h.ext.log.parent / f"evidence-{run}.json"
    path.write_text(json.dumps(out, indent=1))
    return str(path)


def _strike(h: Harness, selector: str) -> int:
    """The fault schedule, a third each: at once (filters and plans in flight), after a random
    0-0.3 s, or right after the first bind is seen (the other binds in flight; all 16 pods bind
    within a few hundred ms). Returns the pods bound just before it strikes."""
    roll = h.rng.random()
    if roll < 1 / 3:
        pass
    elif roll < 2 / 3:
        time.sleep(h.rng.uniform(0.0, 0.3))
    else:
        until(lambda: bound_count(h.kube, selector) > 0, 20, 0.01)
    return bound_count(h.kube, selector)


def kill_extender(h: Harness) -> Fault:
    def fault(selector: str) -> int:
        at = _strike(h, selector)
        h.ext.kill()
        h.ext.restart(gap_s=h.rng.choice((0.0, 0.0, 1.0, 3.0)))
        return at

    return fault


def kill_apiserver(h: Harness) -> Fault:
    def fault(selector: str) -> int:
        at = _strike(h, selector)
        h.cluster.restart_apiserver(crash=True, down_s=h.rng.uniform(1.0, 5.0))
        return at

    return fault


def kills(h: Harness, trials: int, fault: Callable[[Harness], Fault]) -> dict[str, Any]:
    results: list[KillTrial] = []
    checks: list[DeviceCheck] = []
    crashes = 0
    pairs = [h.nodes[i : i + 2] for i in range(0, len(h.nodes) - 1, 2)][:4]
    for t in range(trials):
        results.append(gang_trial(h, fault(h), pairs[t % len(pairs)]))
        checks.append(device_check(h.kube))
        if not h.ext.alive() or not h.ext.ready():
            crashes += 1
            h.ext.restart()
        delete_suite(h.kube, SUITE)
    times = [r.recover_s for r in results if r.recover_s is not None]
    return {
        "trials": trials,
        "partial_gangs": sum(r.partial for r in results),
        "unbound_gangs": sum(r.unbound for r in results),
        "unbound_singles": sum(r.singles_unbound for r in results),
        "double_booked_devices": max((c.double_booked for c in checks), default=0),
        "worst_device": next((c.worst for c in checks if c.worst), ""),
        "unreadable_records": max((c.unreadable for c in checks), default=0),
        "crashes": crashes,
        "evidence": [r.evidence for r in results if r.evidence][:5],
        "struck_mid_bind": sum(1 for r in results if 0 < r.bound_at_fault < r.total),
        "struck_before_bind": sum(1 for r in results if r.bound_at_fault == 0),
        "recover_s_p50": round(percentile(times, 50), 2) if times else None,
        "recover_s_max": round(max(times), 2) if times else None,
    }


# ---------------------------------------------------------------------------- 4. hostile pods

REPORT, PENDING, BINDS = "report", "pending", "binds"


@dataclass(frozen=True)
class Hostile:
    case: str
    body: Callable[[str, str, str], dict[str, Any]]  # (name, run, forged node) -> pod
    expect: str  # REPORT (Warning Event), PENDING (valid but fits nowhere), BINDS


def _q(where: str, key: str, value: str) -> Callable[[str, str, str], dict[str, Any]]:
    """A 1-GPU pod whose container `where` (limits / requests) sets `key` to `value`."""

    def body(name: str, run: str, node: str) -> dict[str, Any]:
        b = pod_body(name, run)
        b["spec"]["containers"][0]["resources"][where][key] = value
        return b

    return body


def _note(key: str, value: str) -> Callable[[str, str, str], dict[str, Any]]:
    return lambda name, run, node: pod_body(name, run, gpus="", annotations={key: value})


def _forged(record: str, gpus: str = "1") -> Callable[[str, str, str], dict[str, Any]]:
    """A pod bound by nodeName (bypassing the scheduler) that carries its own device record."""
    return lambda name, run, node: pod_body(
        name, run, gpus=gpus, node_name=node, annotations={DEVICES: record}, labels={FORGED: "1"}
    )


def _init_memory(value: str) -> Callable[[str, str, str], dict[str, Any]]:
    def body(name: str, run: str, node: str) -> dict[str, Any]:
        b = pod_body(name, run)
        b["spec"]["initContainers"] = [{"name": "i", "image": "x", "resources": {"requests": {"memory": value}}}]
        return b

    return body


def _labels(n: int) -> Callable[[str, str, str], dict[str, Any]]:
    return lambda name, run, node: pod_body(name, run, labels={f"l{i}.chaos/k{i}": f"v{i}" for i in range(n)})


HOSTILE: tuple[Hostile, ...] = (
    Hostile("memory Infinity", _q("requests", "memory", "Infinity"), REPORT),
    Hostile("memory NaN", _q("requests", "memory", "NaN"), REPORT),
    Hostile("memory 1e999999", _q("requests", "memory", "1e999999"), REPORT),
    Hostile("cpu 1e999999", _q("requests", "cpu", "1e999999"), REPORT),
    Hostile("cpu -1", _q("requests", "cpu", "-1"), REPORT),
    Hostile("gpu -1", _q("limits", "nvidia.com/gpu", "-1"), REPORT),
    Hostile("gpu 1e999999", _q("limits", "nvidia.com/gpu", "1e999999"), REPORT),
    Hostile("gpu 0.5", _q("limits", "nvidia.com/gpu", "0.5"), REPORT),
    Hostile("gpu 10^30", _q("limits", "nvidia.com/gpu", "1" + "0" * 30), REPORT),
    Hostile("gpu 10^18 (fits nowhere)", _q("limits", "nvidia.com/gpu", "1" + "0" * 18), PENDING),
    Hostile("gpumem 1e999999", _q("limits", "nvidia.com/gpumem", "1e999999"), REPORT),
    Hostile("init memory 1e999999", _init_memory("1e999999"), REPORT),
    Hostile("gpu-fraction NaN", _note("gpu-fraction", "NaN"), REPORT),
    Hostile("gpu-fraction Infinity", _note("gpu-fraction", "Infinity"), REPORT),
    Hostile("gpu-fraction -0.5", _note("gpu-fraction", "-0.5"), REPORT),
    Hostile("gpu-fraction 1e999999", _note("gpu-fraction", "1e999999"), REPORT),
    Hostile("gpu-memory -1", _note("gpu-memory", "-1"), REPORT),
    Hostile("tflops-request 1e999999", _note("tensor-fusion.ai/tflops-request", "1e999999"), REPORT),
    Hostile("gpuPortionRequest NaN", _note("phalanx.io/gpuPortionRequest", "NaN"), REPORT),
    Hostile("record negative milli", _forged('[{"index":0,"milli":-1000,"memoryMiB":0}]'), REPORT),
    Hostile("record duplicate index", _forged('[{"index":1,"milli":1000},{"index":1,"milli":1000}]', "2"), REPORT),
    Hostile("record milli 5000", _forged('[{"index":2,"milli":5000,"memoryMiB":81920}]'), REPORT),
    Hostile("record not JSON", _forged("{{{not json"), REPORT),
    Hostile("record on a CPU pod", _forged('[{"index":3,"milli":1000}]', ""), REPORT),
    Hostile("record index 1e999999", _forged('[{"index":1e999999,"milli":1000}]'), REPORT),
    Hostile("record nested 10k deep", _forged("[" * 10_000 + "]" * 10_000), REPORT),
    Hostile("record on an unbound pod", _note(DEVICES, '[{"index":0,"milli":-1000}]'), BINDS),
    Hostile("5,000 labels", _labels(5000), BINDS),
)
QUICK_HOSTILE = HOSTILE  # every case is cheap


def hostile_pods(h: Harness, cases: tuple[Hostile, ...]) -> dict[str, Any]:
    run = h.run_id("hostile")
    forged_node = h.nodes[-1]
    accepted: dict[str, Hostile] = {}
    rejected: dict[str, str] = {}
    healthz_max = 0.0
    rss_before = h.ext.rss_mib()
    lap = Laps()
    for i, case in enumerate(cases):
        name = f"{run}-h{i}"
        r = h.kube.request("POST", PODS, body=case.body(name, run, forged_node))
        if r.status == 201:
            accepted[name] = case
        else:
            message = r.body.get("message", "") if isinstance(r.body, dict) else str(r.body)
            rejected[case.case] = f"HTTP {r.status}: {message[:120]}"
        healthz_max = max(healthz_max, _timed_healthz(h))
    lap("create")
    # Good pods beside them: a gang and singles must bind.
    good = _good_pods(h, run, "before")
    lap("good pods")
    wanted = {n: c for n, c in accepted.items() if c.expect == REPORT}
    until(lambda: all(reported(h.kube, n) for n in wanted), 60, 0.5)
    unreported = sorted(c.case for n, c in wanted.items() if not reported(h.kube, n))
    lap("events")
    binds = [n for n, c in accepted.items() if c.expect == BINDS]
    until(lambda: all(_is_bound(h.kube, n) for n in binds), 60, 0.2)
    not_bound = sorted(accepted[n].case for n in binds if not _is_bound(h.kube, n))
    rss_after = h.ext.rss_mib()
    lap("binds")
    # A fresh extender with every hostile pod present must become ready and keep binding.
    h.ext.kill()
    try:
        ready_s: float | None = h.ext.start(ready_within_s=60)
    except RuntimeError:
        ready_s = None  # blocked by a hostile pod: remove them so the remaining checks can run
        h.kube.request("DELETE", PODS, query={"labelSelector": f"{SUITE}={run}", "gracePeriodSeconds": "0"})
        h.ext.restart()
    lap("restart")
    good_after = _good_pods(h, run, "after")
    lap("good pods after")
    fill = _forged_overcommit(h, run, forged_node)
    lap("fill")
    for _ in range(20):
        healthz_max = max(healthz_max, _timed_healthz(h))
    check = device_check(h.kube)
    delete_suite(h.kube, f"{SUITE}={run}")
    return {
        "trials": len(cases),
        "rejected_by_apiserver": len(rejected),
        "accepted": len(accepted),
        "reported": len(wanted) - len(unreported),
        "unreported": unreported,
        "binds_expected_not_bound": not_bound,
        "good_pods_blocked": good + good_after,
        "ready_after_restart_s": None if ready_s is None else round(ready_s, 2),
        "forged_node_overcommit": max(0, fill.bound - fill.room),
        "forged_node_fill": f"{fill.bound} of {fill.room} halves that fit",
        "healthz_max_s": round(healthz_max, 3),
        "double_booked_devices": check.double_booked,
        "rss_growth_mib": round(rss_after - rss_before, 1),
        "rejected": rejected,
        "step_s": lap.laps,
    }


def _is_bound(kube: RestKube, name: str) -> bool:
    r = kube.request("GET", f"{PODS}/{name}")
    return r.status == 200 and bool(r.body["spec"].get("nodeName"))


def _timed_healthz(h: Harness) -> float:
    started = time.monotonic()
    http_status(f"{h.ext.url}/healthz", timeout=60)
    return time.monotonic() - started


def _good_pods(h: Harness, run: str, when: str) -> int:
    """A 4 x 1-GPU gang and 4 1-GPU singles; returns how many did not bind within 60 s."""
    name = f"{run}-good-{when}"
    create(h.kube, WORKLOADS, workload_body(name, run, GANG))
    for m in range(GANG):
        create(h.kube, PODS, pod_body(f"{name}-{m}", run, workload=name, labels={"good": name}))
        create(h.kube, PODS, pod_body(f"{name}-s{m}", run, labels={"good": name}))
    selector = f"good={name}"
    until(lambda: bound_count(h.kube, selector) == 2 * GANG, 60, 0.1)
    return 2 * GANG - bound_count(h.kube, selector)


@dataclass(frozen=True)
class Fill:
    room: int  # half-GPU pods that fit beside the forged pods
    bound: int  # half-GPU pods bound


def _forged_overcommit(h: Harness, run: str, node: str) -> Fill:
    """Fill the node holding the forged records with half-GPU pods: a forged pod uses the GPUs it
    requests whatever its record says, so only the halves that fit the rest may bind."""
    room = (8000 - _used_milli(h.kube, node)) // 500
    selector = f"fill={run}"
    for m in range(16):
        body = pod_body(f"{run}-fill-{m}", run, fraction="0.5", gpus="", nodes=[node], labels={"fill": run})
        create(h.kube, PODS, body)
    until(lambda: bound_count(h.kube, selector) >= room, 60, 0.1)
    until(lambda: all(p["spec"].get("nodeName") or _tried(p) for p in pods(h.kube, selector)), 30, 0.2)
    return Fill(room, bound_count(h.kube, selector))


def _used_milli(kube: RestKube, node: str) -> int:
    """GPU milli in use on `node`: Phalanx's records, else what the pod requests."""
    used = 0
    for p in kube.request("GET", "/api/v1/pods", query={"fieldSelector": f"spec.nodeName={node}"}).body["items"]:
        meta = p["metadata"]
        text = (meta.get("annotations") or {}).get(DEVICES)
        if text and FORGED not in (meta.get("labels") or {}):
            used += sum(int(e.get("milli", 0)) for e in json.loads(text))
            continue
        for c in p["spec"]["containers"]:
            used += 1000 * int(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", "0"))
        used += round(1000 * float((meta.get("annotations") or {}).get("gpu-fraction", "0")))
    return used


def _tried(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" for c in pod["status"].get("conditions") or []
    )


# ---------------------------------------------------------------------------- 5. malformed HTTP

HOSTILE_VALUES: tuple[Any, ...] = (
    None,
    True,
    -1,
    0,
    2**70,
    -(2**70),
    1.5e308,
    "",
    "x" * 20_000,
    [],
    {},
    [[[[[[[[[[[]]]]]]]]]]],
    "Infinity",
    "NaN",
    "-Infinity",
    "1e999999",
    "-1",
    "\u0000",
    "../../etc/passwd",
    "名前",
    {"a": {"b": {"c": []}}},
    list(range(1000)),
)
QUANTITIES = ("Infinity", "NaN", "1e999999", "-1", "1e18", "0.0000001", "999999999999999999999999Ei", "1_000", "", "5")


def _valid_pod(rng: random.Random, node: str) -> dict[str, Any]:
    uid = f"chaos-{rng.getrandbits(64):016x}"
    limits: dict[str, Any] = {"nvidia.com/gpu": "1"}
    annotations: dict[str, Any] = {}
    if rng.random() < 0.3:
        limits = {}
        annotations["gpu-fraction"] = "0.5"
    return {
        "metadata": {
            "name": f"ghost-{uid}",
            "namespace": NS,
            "uid": uid,
            "resourceVersion": str(rng.randrange(10**6)),
            "labels": {"phalanx.io/workload": "ghost"} if rng.random() < 0.2 else {},
            "annotations": annotations,
        },
        "spec": {
            "schedulerName": "default-scheduler",
            "nodeSelector": {HOSTNAME: node},
            "containers": [
                {
                    "name": "c",
                    "image": "x",
                    "resources": {"limits": limits, "requests": {"cpu": "100m", "memory": "1Gi"}},
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


def _valid_body(rng: random.Random, verb: str, nodes: list[str]) -> dict[str, Any]:
    pod = _valid_pod(rng, rng.choice(nodes))
    names = rng.sample(nodes, min(len(nodes), 8))
    if verb in ("filter", "prioritize"):
        return {"Pod": pod, "NodeNames": names, "Nodes": None}
    if verb == "bind":
        meta = pod["metadata"]
        return {"PodName": meta["name"], "PodNamespace": NS, "PodUID": meta["uid"], "Node": names[0]}
    victims = {"Pods": [{"UID": f"chaos-{rng.getrandbits(32):08x}"}], "NumPDBViolations": 0}
    return {"Pod": pod, "NodeNameToVictims": {}, "NodeNameToMetaVictims": {n: victims for n in names[:3]}}


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list) and len(obj) <= 16:
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


def _mutate(rng: random.Random, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Replace one field (anywhere) with a hostile value, drop it, or set a quantity."""
    body = copy.deepcopy(body)
    path = rng.choice(_paths(body))
    parent = body
    for p in path[:-1]:
        parent = parent[p]
    roll = rng.random()
    if roll < 0.15 and isinstance(parent, dict):
        del parent[path[-1]]
        return f"drop {path[-1]}", body
    if roll < 0.35 and "Pod" in body:
        res = body["Pod"]["spec"]["containers"][0]["resources"]
        where, key = rng.choice(
            (("limits", "nvidia.com/gpu"), ("requests", "memory"), ("requests", "cpu"), ("limits", "nvidia.com/gpumem"))
        )
        res[where][key] = rng.choice(QUANTITIES)
        return f"quantity {key}", body
    if roll < 0.45 and "Pod" in body:
        notes = body["Pod"]["metadata"]["annotations"]
        key = rng.choice(
            (
                "gpu-fraction",
                DEVICES,
                "gpu-memory",
                "phalanx.io/gpuPortionRequest",
                "kai.scheduler/topology-required-placement",
            )
        )
        notes[key] = rng.choice(("NaN", "Infinity", "-1", "1e999999", '[{"index":-1,"milli":-5}]', "[" * 5000, "x"))
        return f"annotation {key}", body
    value = rng.choice(HOSTILE_VALUES)
    parent[path[-1]] = value
    return f"{path[-1]} = {type(value).__name__}", body


def _huge_names(rng: random.Random, n: int) -> list[str]:
    tag = f"{rng.getrandbits(32):08x}"
    return [f"ghost-{tag}-{i}" for i in range(n)]


def _request(
    method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None, length: str | None = None
) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if length is not None:
        head.append(f"Content-Length: {length}")
    elif body or method in ("POST", "PUT"):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@dataclass(frozen=True)
class Shot:
    case: str
    data: bytes
    half_close: bool = False  # the client stops sending (a truncated body)


#: The Authorization header of the workload-type writes (set once the cluster is up).
ADMIN: dict[str, str] = {}
FORGED_TOKEN = {"Authorization": "Bearer forged-token"}

WT_BODY = yaml.safe_load((ROOT / "config/resource-interfaces/jobset.yaml").read_text())


VERBS = ("filter", "prioritize", "bind", "preempt")
RAW_BODIES: tuple[bytes, ...] = (
    b"Infinity",
    b"NaN",
    b'{"Pod": Infinity}',
    b'{"Pod": NaN, "NodeNames": [1e999999]}',
    b"[1e999999]",
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    b"null",
    b"[]",
    b'"x"',
    b"\xff\xfe\x00",
    b'{"Pod": {"metadata": {"uid": ' + b"9" * 5000 + b"}}}",
    b"{" + b" " * 100_000,
)
LENGTHS = ("abc", "-1", "1e3", "99999999999999999999", " 12", "truncated", "empty-declared")
READS = ("/api/v1/nodes/", "/api/v1/gangs/", "/api/v1/pools/", "/api/v1/workload-types/")
TAILS = ("x", "%00", "..%2F..%2Fetc", "a" * 5000, "名前", "a/b/c/d", "%ff%fe", "?q=" + "x" * 1000, "")
PATHS = (
    "/healthz",
    "/readyz",
    "/metrics",
    "/api/v1/stats",
    "/api/v1/gangs",
    "/api/v1/pools",
    "/api/v1/workload-types",
    "/nope",
    "/filter",
)
METHODS = ("GET", "POST", "DELETE", "PUT")


def catalogue(rng: random.Random, nodes: list[str]) -> Iterator[Shot]:
    """One shot of every fixed case, so even a short run covers each."""
    for verb in VERBS:
        for raw in RAW_BODIES:
            yield Shot(f"{verb} raw {raw[:12]!r}", _request("POST", f"/{verb}", raw))
        for kind in LENGTHS:
            yield _framing(rng, verb, kind, nodes)
    for prefix in READS:
        for tail in (rng.choice(nodes), *TAILS):
            # With the operator's token, so the hostile paths reach the handlers behind the check.
            yield Shot(f"GET {prefix}*", _request("GET", prefix + tail, b"", ADMIN))
    for path in PATHS:
        for method in METHODS:
            yield Shot(f"{method} {path}", _request(method, path, b"{}" if method in ("POST", "PUT") else b""))
    for case, data in SPECIAL_TYPES:
        yield Shot(f"POST workload-types {case}", _request("POST", "/api/v1/workload-types", data, ADMIN))
    yield Shot("POST workload-types without a token", _request("POST", "/api/v1/workload-types", b"name: x"))
    yield Shot("DELETE stats with a forged token", _request("DELETE", "/api/v1/stats", b"", FORGED_TOKEN))
    yield _huge(rng, "filter", nodes)


def _framing(rng: random.Random, verb: str, kind: str, nodes: list[str]) -> Shot:
    body = json.dumps(_valid_body(rng, verb, nodes)).encode()
    if kind == "truncated":
        data = _request("POST", f"/{verb}", body[: len(body) // 2], length=str(len(body)))
        return Shot(f"{verb} truncated body", data, half_close=True)
    if kind == "empty-declared":
        return Shot(f"{verb} body without length", _request("POST", f"/{verb}", b"", length="0") + body)
    return Shot(f"{verb} Content-Length {kind}", _request("POST", f"/{verb}", body, length=kind), half_close=True)


def _huge(rng: random.Random, verb: str, nodes: list[str]) -> Shot:
    body = _valid_body(rng, verb, nodes)
    body["NodeNames"] = _huge_names(rng, 100_000)
    return Shot(f"{verb} 100k unknown nodes", _request("POST", f"/{verb}", json.dumps(body).encode()))


def shots(rng: random.Random, n: int, nodes: list[str], huge_every: int) -> Iterator[Shot]:
    """`n` malformed requests: the catalogue, then draws from a seeded generator (bounded, all
    to the extender); every `huge_every`-th draw names 100,000 unknown nodes."""
    fixed = list(catalogue(rng, nodes))
    yield from fixed[:n]
    for i in range(n - len(fixed)):
        roll = rng.random()
        verb = rng.choice(VERBS)
        if huge_every and i % huge_every == huge_every - 1:
            yield _huge(rng, rng.choice(("filter", "prioritize")), nodes)
        elif roll < 0.5:
            case, body = _mutate(rng, _valid_body(rng, verb, nodes))
            yield Shot(f"{verb} {case}", _request("POST", f"/{verb}", json.dumps(body).encode()))
        elif roll < 0.58:
            raw = rng.choice(RAW_BODIES)
            yield Shot(f"{verb} raw {raw[:12]!r}", _request("POST", f"/{verb}", raw))
        elif roll < 0.66:
            yield _framing(rng, verb, rng.choice(LENGTHS), nodes)
        elif roll < 0.8:
            prefix = rng.choice(READS)
            yield Shot(f"GET {prefix}*", _request("GET", prefix + rng.choice((rng.choice(nodes), *TAILS))))
        elif roll < 0.88:
            path, method = rng.choice(PATHS), rng.choice(METHODS)
            yield Shot(f"{method} {path}", _request(method, path, b"{}" if method in ("POST", "PUT") else b""))
        elif roll < 0.97:
            case, data = _workload_type(rng)
            yield Shot(f"POST workload-types {case}", _request("POST", "/api/v1/workload-types", data, ADMIN))
        else:
            name = rng.choice(("chaos-none", "x" * 3000, "%00", "a/b", "", "Chaos.Kind"))
            headers = rng.choice((ADMIN, FORGED_TOKEN, {}))
            yield Shot("DELETE workload-types *", _request("DELETE", f"/api/v1/workload-types/{name}", b"", headers))


LAUGHS = (
    "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"{b}: &{b} [{', '.join(['*' + a] * 10)}]\n" for a, b in zip("abc", "bcd", strict=True))
).encode()


SPECIAL_TYPES: tuple[tuple[str, bytes], ...] = (
    # 2,000 levels: a 4 KB body past the recursion limit (PyYAML's cost grows with the square)
    ("nested YAML 2k deep", ("a: " + "[" * 2000 + "]" * 2000).encode()),
    ("YAML aliases (10^4 leaves)", LAUGHS),
    ("not YAML", b"\x00\xff: : : [}"),
    ("JSON nested 100k deep", b"[" * 100_000 + b"]" * 100_000),
)


def _workload_type(rng: random.Random) -> tuple[str, bytes]:
    """A mutated Resource Interface body (JSON or YAML); its group is the suite's own, so one
    that happens to be valid registers only chaos types (deleted afterwards). A few are the
    special bodies (1 % nested YAML: each costs the extender seconds of CPU)."""
    roll = rng.random()
    if roll < 0.01:
        return SPECIAL_TYPES[0]
    if roll < 0.1:
        return rng.choice(SPECIAL_TYPES[1:])
    body = copy.deepcopy(WT_BODY)
    body["group"] = "chaos.phalanx.io"
    body["name"] = f"Chaos{rng.randrange(4)}"
    case, body = _mutate_any(rng, body)
    text = json.dumps(body) if rng.random() < 0.5 else yaml.safe_dump(body)
    return case, text.encode()


def _mutate_any(rng: random.Random, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    path = rng.choice(_paths(body))
    parent: Any = body
    for p in path[:-1]:
        parent = parent[p]
    value = rng.choice(HOSTILE_VALUES)
    parent[path[-1]] = value
    return f"{path[-1]} = {type(value).__name__}", body


def fire(port: int, shot: Shot, timeout: float = 60.0) -> int:
    """Send one request; returns its status, 0 for a connection closed without an answer,
    -1 for a timeout, -2 when nothing listens."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            with contextlib.suppress(OSError):  # the server may answer and close before we finish
                s.sendall(shot.data)
                if shot.half_close:
                    s.shutdown(socket.SHUT_WR)
            head = b""
            while b"\r\n" not in head and len(head) < 4096:
                chunk = s.recv(4096)
                if not chunk:
                    break
                head += chunk
    except ConnectionRefusedError:
        return -2
    except TimeoutError:
        return -1
    except OSError:
        return 0
    parts = head.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


class Prober:
    """GET /healthz every 0.25 s on a thread and keep the slowest answer: a request that stalls
    the process (the GIL held by a parse) shows here."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.worst = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self.worst = max(self.worst, _timed_healthz(self.h))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def slow_clients(h: Harness, count: int, hold_s: float) -> dict[str, Any]:
    """`count` connections that declare 10,000 body bytes and send 10, held for `hold_s`; the
    extender must stay responsive meanwhile and shed their threads afterwards."""
    before = h.ext.status("Threads")
    socks: list[socket.socket] = []
    answered = 0
    try:
        for i in range(count):
            s = socket.create_connection(("127.0.0.1", h.ext.port), timeout=5)
            socks.append(s)
            s.sendall(
                _request("POST", ("/filter", "/bind", "/api/v1/workload-types")[i % 3], b'{"Pod": {}}', length="10000")
            )
        peak = h.ext.status("Threads")
        healthz = max(_timed_healthz(h) for _ in range(5))
        end = time.monotonic() + hold_s
        for s in socks:
            s.settimeout(max(0.01, end - time.monotonic()))
            with contextlib.suppress(OSError):
                answered += bool(s.recv(64))
    finally:
        for s in socks:
            s.close()
    settled = until(lambda: h.ext.status("Threads") <= before + 2, 30, 0.2)
    return {
        "connections": count,
        "answered_within_hold": answered,
        "threads_before": before,
        "threads_peak": max(peak, h.ext.status("Threads")),
        "threads_after": h.ext.status("Threads"),
        "threads_settled": bool(settled),
        "healthz_s_while_held": round(healthz, 3),
    }


def malformed_http(h: Harness, n: int, *, slow: int, hold_s: float) -> dict[str, Any]:
    rng = random.Random(h.rng.random())
    nodes = h.nodes
    # Hostile bodies of writes come from an authorised client (the admin's token), so the
    # parsers behind authorisation are what they hit; unauthenticated writes are shots too.
    ADMIN.update({"Authorization": h.kube.headers.get("Authorization", "")})
    # Warm-up: the catalogue once, so first-use allocations do not count as growth.
    for shot in catalogue(random.Random(1), nodes):
        fire(h.ext.port, shot)
    rss_before = h.ext.rss_mib()
    statuses: Counter[int] = Counter()
    by_case: dict[str, Counter[int]] = defaultdict(Counter)
    crashes = 0
    slowest = (0.0, "")
    lock = threading.Lock()

    def one(shot: Shot) -> None:
        nonlocal slowest
        started = time.monotonic()
        status = fire(h.ext.port, shot)
        took = time.monotonic() - started
        with lock:
            statuses[status] += 1
            by_case[shot.case.split(" = ")[0]][status] += 1
            if took > slowest[0]:
                slowest = (took, shot.case)

    batch: list[Shot] = []
    probe = Prober(h)
    huge_every = max(100, n // 100)  # 1 % of requests name 100,000 unknown nodes
    with ThreadPoolExecutor(4) as pool:
        for shot in shots(rng, n, nodes, huge_every):
            batch.append(shot)
            if len(batch) == 200:
                list(pool.map(one, batch))
                batch.clear()
                if not h.ext.alive():
                    crashes += 1
                    h.ext.start()
        list(pool.map(one, batch))
    if not h.ext.alive():
        crashes += 1
        h.ext.start()
    probe.stop()
    rss_after = h.ext.rss_mib()
    slow_result = slow_clients(h, slow, hold_s)
    rss_end = h.ext.rss_mib()
    _delete_chaos_types(h)
    fives = {s: c for s, c in statuses.items() if s >= 500}
    cases_5xx = {case: sum(c for s, c in counts.items() if s >= 500) for case, counts in by_case.items()}
    silent = {case: counts[0] + counts[-1] for case, counts in by_case.items() if counts[0] + counts[-1]}
    return {
        "requests": n,
        "crashes": crashes,
        "http_5xx": sum(fives.values()),
        "statuses": dict(sorted(statuses.items())),
        "cases_5xx": {k: v for k, v in sorted(cases_5xx.items(), key=lambda kv: -kv[1]) if v},
        "timeouts": statuses.get(-1, 0),
        "closed_without_answer": statuses.get(0, 0),
        "cases_no_answer": dict(sorted(silent.items(), key=lambda kv: -kv[1])),
        "healthz_max_s": round(probe.worst, 3),
        "slowest_s": round(slowest[0], 2),
        "slowest_case": slowest[1],
        "rss_before_mib": round(rss_before, 1),
        "rss_after_mib": round(rss_after, 1),
        "rss_after_slow_mib": round(rss_end, 1),
        "rss_growth_mib": round(max(rss_after, rss_end) - rss_before, 1),
        "slow": slow_result,
    }


def _delete_chaos_types(h: Harness) -> None:
    with contextlib.suppress(OSError, ValueError):
        listing = urllib.request.Request(f"{h.ext.url}/api/v1/workload-types", headers=ADMIN)
        with urllib.request.urlopen(listing, timeout=30) as r:
            listed = json.loads(r.read()).get("workloadTypes") or []
        for wt in listed:
            if wt.get("group") == "chaos.phalanx.io":
                url = f"{h.ext.url}/api/v1/workload-types/{wt['name']}"
                req = urllib.request.Request(url, method="DELETE", headers=ADMIN)
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(req, timeout=30).close()


# ---------------------------------------------------------------------------- the suite


@dataclass(frozen=True)
class Plan:
    orders: tuple[str, ...]
    kills: int
    apiserver_kills: int
    hostile: tuple[Hostile, ...]
    requests: int
    slow: int
    hold_s: float


FULL = Plan(ALL_ORDERS, 50, 10, HOSTILE, 10_000, 300, 15.0)
QUICK = Plan(QUICK_ORDERS, 2, 1, QUICK_HOSTILE, 600, 50, 2.0)
PHASES = ("orders", "kills", "apiserver", "hostile", "http")


def run_phases(h: Harness, plan: Plan, phases: tuple[str, ...] = PHASES) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    steps: dict[str, Callable[[], dict[str, Any]]] = {
        "orders": lambda: creation_orders(h, plan.orders),
        "kills": lambda: kills(h, plan.kills, kill_extender),
        "apiserver": lambda: kills(h, plan.apiserver_kills, kill_apiserver),
        "hostile": lambda: hostile_pods(h, plan.hostile),
        "http": lambda: malformed_http(h, plan.requests, slow=plan.slow, hold_s=plan.hold_s),
    }
    for name in phases:
        started = time.monotonic()
        out[name] = steps[name]()
        out[name]["seconds"] = round(time.monotonic() - started, 1)
        print(f"phase {name}: {json.dumps(out[name], default=str)}", flush=True)
    out["extender"] = {"starts": h.ext.starts, "start_failures": h.ext.start_failures}
    return out


def headline(phases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    get = lambda phase, key, default=0: phases.get(phase, {}).get(key, default)  # noqa: E731
    return {
        "trials": sum(p.get("trials", 0) for p in phases.values()),
        "partial_gangs": get("kills", "partial_gangs") + get("apiserver", "partial_gangs"),
        "double_booked_devices": max(get(p, "double_booked_devices") for p in ("kills", "apiserver", "hostile")),
        "gangs_not_bound_in_10s": len(get("orders", "not_bound_in_10s", [])),
        "crashes": sum(get(p, "crashes") for p in ("kills", "apiserver", "http"))
        + len(get("extender", "start_failures", [])),
        "http_5xx": get("http", "http_5xx"),
        "max_rss_growth_mib": max(get("hostile", "rss_growth_mib", 0.0), get("http", "rss_growth_mib", 0.0)),
        "http_requests": get("http", "requests"),
        "phases": phases,
    }


def table(phases: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| phase | figure | value |", "|---|---|---|"]
    for name, figures in phases.items():
        for key, value in figures.items():
            if isinstance(value, dict | list) and len(json.dumps(value)) > 160:
                value = json.dumps(value)[:160] + "…"
            lines.append(f"| {name} | {key} | {value} |")
    return lines


def main() -> None:
    ap = parser(__doc__, quick="5 creation orders, 2 extender kills, 1 apiserver kill, 600 requests")
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--nodes", type=int, default=16, help="KWOK nodes (8 GPUs each)")
    ap.add_argument("--kills", type=int, help="extender kills (default 50, quick 2)")
    ap.add_argument("--apiserver-kills", type=int, help="kube-apiserver kills (default 10, quick 1)")
    ap.add_argument("--requests", type=int, help="malformed requests (default 10,000, quick 600)")
    ap.add_argument("--phases", default=",".join(PHASES), help="comma-separated subset of " + ",".join(PHASES))
    args = ap.parse_args()
    plan = QUICK if args.quick else FULL
    plan = Plan(
        plan.orders,
        plan.kills if args.kills is None else args.kills,
        plan.apiserver_kills if args.apiserver_kills is None else args.apiserver_kills,
        plan.hostile,
        plan.requests if args.requests is None else args.requests,
        plan.slow,
        plan.hold_s,
    )
    phases = tuple(p for p in args.phases.split(",") if p)
    with session(args.nodes, args.seed) as h:
        results = run_phases(h, plan, phases)
    head = headline(results)
    finish("chaos", args, table(results), head)


if __name__ == "__main__":
    main()
