"""Trace replay: GPU allocation of Random, BestFit, FGD and Phalanx on the openb traces.

Reproduces the method of the FGD paper (Weng et al., USENIX ATC'23, "Beware of Fragmentation")
on the Alibaba openb files in shared/data/openb (see its README): the 1,213 GPU nodes, the pod
list in a seeded random order, then pods drawn uniformly with replacement until the GPU
request reaches 1.3 x the cluster's GPUs; pods arrive one at a time, never leave, and a pod
that fits nowhere is skipped. After every pod, `arrived` (GPU requested so far) and `alloc`
(GPU placed) are recorded as % of the cluster's GPUs; the table reports alloc at arrived 100 %
and 130 %, mean ± std over seeds, next to the published runs of the paper's simulator.

Policies, as the simulator (hkust-adsl/kubernetes-scheduler-simulator) defines them:
- random: a uniformly random feasible node (and device for a share pod);
- bestfit: max int(100 * (1 - (0.5 * cpu_left / 128 cores + 0.5 * gpu_left / 8 GPUs))) after
  the pod, random among ties; share pods go to the fullest device that fits;
- fgd: max int(100 * sigmoid(-ΔF / 1000)), random among ties, ΔF from `solver.frag`
  (pod-count weights, top classes covering 95 % of the replayed pod list);
- phalanx: the same score and tie-break over `solver.frag.Policy.PHALANX`'s ΔF, which caps
  each class's usable share by what the node's CPU and memory can feed (see its docstring),
  with share pods following the packing plan of `solver.packing` (join a device awaiting the
  pod's size, else open an idle device where the pattern's other members have room) and every
  pod avoiding CPU and memory reserved for awaited pods when it can (`phalanx_chooser`);
- extender (opt-in, `--policies ... extender`): the same policy as deployed, every pod through
  the extender's own filter, prioritize and bind in-process, with the target workload the
  extender itself estimates from the pods it has seen (`extender_chooser`); ~10x slower.
  `gpu_spec` limits reach it only as the nodes offered (kube-scheduler's filters' part).
CPU, memory, GPU count, per-device share and GPU model (`gpu_spec`) are hard limits.

Speed: a node's ΔF for a pod shape only changes when that node changes, so deltas are cached
per (shape, node) and only nodes touched since the shape was last scored are recomputed, with
numpy over those nodes. Seeds × policies run in a process pool.

    python -m benchmarks.trace_replay [--trace NAME | --pods FILE] [--nodes FILE]
        [--seeds N | --quick] [--policies random bestfit fgd phalanx extender] [--plot PNG]
        [--no-record] [--jobs N]
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from multiprocessing import Manager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import structlog

from benchmarks import trace_variants
from benchmarks.common import record
from extender.binder import Binder
from extender.cache import Cache
from extender.config import PhalanxConfig
from extender.metrics import Metrics
from extender.objects import DEVICES_ANNOTATION, PRODUCT_LABEL, encode_devices
from extender.pools import Hardware
from extender.verbs import Verbs
from solver.frag import Demand, Policy, WorkloadClass, workload_classes
from solver.frag_arrays import ClassTable, candidate_deltas, fgd_score, take_devices
from solver.model import FULL_SHARE, DeviceAssignment
from solver.packing import Packer, PackingPlan
from solver.pools import ModelPool, PoolLedger, PoolPlan

DATA = Path(os.environ.get("PHALANX_OPENB", "/work/shared/data/openb"))
DEFAULT_NODES = "openb_node_list_gpu_node.csv"
DEFAULT_PODS = "openb_pod_list_default.csv"
PUBLISHED = "published_analysis_allo_discrete.csv"
PUBLISHED_NAMES = {"random": "01-Random", "bestfit": "05-BestFit", "fgd": "06-FGD"}
POLICIES = ("random", "bestfit", "fgd", "phalanx")
EXTRA = ("extender",)  # opt-in (--policies): Phalanx through the extender's verbs, ~10x slower
INFLATION = 1.3  # the paper replays until 1.3 x the cluster's GPUs were requested
BUCKETS = np.arange(0, 131)  # arrived %, as the published CSV's columns
MAX_CPU, MAX_GPU = 128_000, 8 * FULL_SHARE  # the simulator's BestFit normalizers
SEED0 = 42  # the published seeds are 42..51

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


# ------------------------------------------------------------------------------ the data


@dataclass(frozen=True)
class Cluster:
    names: tuple[str, ...]
    cpu: I64
    memory: I64
    gpus: I64  # devices per node
    models: tuple[str, ...]
    width: int  # most devices on one node

    @cached_property
    def index(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.names)}

    @property
    def total_gpu_milli(self) -> int:
        return int(self.gpus.sum()) * FULL_SHARE

    def free_matrix(self) -> I64:
        free = np.zeros((len(self.names), self.width), dtype=np.int64)
        free[np.arange(self.width)[None, :] < self.gpus[:, None]] = FULL_SHARE
        return free


def load_cluster(path: Path) -> Cluster:
    with path.open() as f:
        rows = list(csv.DictReader(f))
    gpus = np.array([int(r["gpu"]) for r in rows], dtype=np.int64)
    return Cluster(
        names=tuple(r["sn"] for r in rows),
        cpu=np.array([int(r["cpu_milli"]) for r in rows], dtype=np.int64),
        memory=np.array([int(r["memory_mib"]) for r in rows], dtype=np.int64),
        gpus=gpus,
        models=tuple(r.get("model", "") for r in rows),
        width=max(1, int(gpus.max())),
    )


def load_pods(path: Path) -> list[Demand]:
    with path.open() as f:
        rows = list(csv.DictReader(f))
    pods = []
    for r in rows:
        spec = (r.get("gpu_spec") or "").strip()
        num, milli = int(r["num_gpu"]), int(r["gpu_milli"])
        pods.append(
            Demand(
                cpu_milli=int(r["cpu_milli"]),
                memory_mib=int(r["memory_mib"]),
                num_gpu=num if milli > 0 else 0,
                gpu_milli=milli if num > 0 else 0,
                models=frozenset(spec.split("|")) if spec else None,
            )
        )
    return pods


def arrival_order(pods: Sequence[Demand], total_gpu_milli: int, seed: int) -> I64:
    """The pod list shuffled, then uniform draws with replacement up to 1.3 x the GPUs."""
    rng = np.random.default_rng(seed)
    order = list(rng.permutation(len(pods)))
    gpu = np.array([p.gpu_total for p in pods], dtype=np.int64)
    requested = int(gpu.sum())
    target = INFLATION * total_gpu_milli
    while requested < target:
        i = int(rng.integers(len(pods)))
        order.append(i)
        requested += int(gpu[i])
    return np.array(order, dtype=np.int64)


# ---------------------------------------------------------------------------- the replay


@dataclass
class State:
    """Mutable free capacity of every node, and a version bumped on each change."""

    cpu: I64
    memory: I64
    free: I64
    version: I64

    @staticmethod
    def fresh(cluster: Cluster) -> State:
        n = len(cluster.names)
        return State(cluster.cpu.copy(), cluster.memory.copy(), cluster.free_matrix(), np.zeros(n, dtype=np.int64))

    def feasible(self, d: Demand, model_ok: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
        ok = (self.cpu >= d.cpu_milli) & (self.memory >= d.memory_mib)
        if d.uses_gpu:
            ok &= model_ok & ((self.free >= d.gpu_milli).sum(axis=1) >= d.num_gpu)
        return ok

    def place(self, node: int, d: Demand, device: int) -> None:
        self.cpu[node] -= d.cpu_milli
        self.memory[node] -= d.memory_mib
        if d.uses_gpu:
            if device >= 0:
                self.free[node, device] -= d.gpu_milli
            else:
                self.free[node] = take_devices(self.free[node : node + 1], d)[0]
        self.version[node] += 1
        if self.cpu[node] < 0 or self.memory[node] < 0 or self.free[node].min() < 0:
            raise ValueError(f"node {node} over capacity after {d}")


@dataclass
class DeltaCache:
    """ΔF per (shape, node, candidate), valid while the node's version is unchanged."""

    access: npt.NDArray[np.bool_]
    table: ClassTable
    entries: dict[Demand, tuple[F64, I64]] = field(default_factory=dict)

    def deltas(self, state: State, d: Demand, rows: I64) -> F64:
        width = state.free.shape[1] if d.is_share else 1
        if d not in self.entries:
            self.entries[d] = (np.full((len(state.cpu), width), np.inf), np.full(len(state.cpu), -1, dtype=np.int64))
        values, seen = self.entries[d]
        stale = rows[seen[rows] != state.version[rows]]
        if len(stale):
            values[stale] = candidate_deltas(
                state.cpu[stale], state.memory[stale], state.free[stale], self.access[stale], self.table, d
            )
            seen[stale] = state.version[stale]
        return values[rows]


Chooser = Callable[[State, Demand, "npt.NDArray[np.int64]", np.random.Generator], tuple[int, int]]
Skipped = Callable[[Demand], None]  # told of each pod that fit nowhere


@dataclass
class PoolTracker:
    """The model pools of solver.pools over the replay's arrays: each node's pool, the ledger
    of what constrained groups still have to claim, and the nodes a pod keeps to."""

    keys: tuple[str, ...]
    pool_of: I64  # [nodes] index into keys
    ledger: PoolLedger

    @staticmethod
    def build(cluster: Cluster, classes: Sequence[WorkloadClass]) -> PoolTracker:
        keys = tuple(sorted(set(cluster.models)))
        pool_of = np.array([keys.index(m) for m in cluster.models], dtype=np.int64)
        pools = [
            ModelPool(
                model=k,
                gpu_milli=int(cluster.gpus[pool_of == i].sum()) * FULL_SHARE,
                cpu_milli=int(cluster.cpu[pool_of == i].sum()),
                memory_mib=int(cluster.memory[pool_of == i].sum()),
            )
            for i, k in enumerate(keys)
        ]
        return PoolTracker(keys, pool_of, PoolLedger(PoolPlan.build(classes, pools)))

    def keep_out(self, state: State, d: Demand, rows: I64) -> I64:
        """`rows` in the pools where `d` trespasses on no other group's claim, if any; else all."""
        if not d.uses_gpu or not self.ledger.plan.expected:
            return rows
        free = np.bincount(self.pool_of, weights=state.free.sum(axis=1), minlength=len(self.keys))
        open_ = np.array(
            [
                not self.ledger.trespasses(d.models, k, free_milli=float(free[i]), gpu_milli=d.gpu_total)
                for i, k in enumerate(self.keys)
            ]
        )
        keep = open_[self.pool_of[rows]]
        return rows[keep] if keep.any() else rows

    def placed(self, d: Demand, node: int) -> None:
        if d.uses_gpu:
            self.ledger.placed(d.models, self.keys[self.pool_of[node]], d.gpu_total)

    def skipped(self, d: Demand) -> None:
        if d.uses_gpu:
            self.ledger.skipped(d.models, d.gpu_total)


def choose_random(state: State, d: Demand, rows: I64, rng: np.random.Generator) -> tuple[int, int]:
    node = int(rows[rng.integers(len(rows))])
    if not d.is_share:
        return node, -1
    devices = np.flatnonzero(state.free[node] >= d.gpu_milli)
    return node, int(devices[rng.integers(len(devices))])


def choose_bestfit(state: State, d: Demand, rows: I64, rng: np.random.Generator) -> tuple[int, int]:
    left = (
        0.5 * (state.cpu[rows] - d.cpu_milli) / MAX_CPU + 0.5 * (state.free[rows].sum(axis=1) - d.gpu_total) / MAX_GPU
    )
    score = ((1.0 - left) * 100).astype(np.int64)
    node = int(rows[np.argmax(score)])  # ties: the first node (the simulator's smallest name)
    if not d.is_share:
        return node, -1
    free = state.free[node]
    fitting = np.where(free >= d.gpu_milli, free, FULL_SHARE + 1)
    return node, int(np.argmin(fitting))


def fgd_chooser(cache: DeltaCache) -> Chooser:
    def choose(state: State, d: Demand, rows: I64, rng: np.random.Generator) -> tuple[int, int]:
        return _best(cache.deltas(state, d, rows), rows, d)

    return choose


def _best(deltas: F64, rows: I64, d: Demand) -> tuple[int, int]:
    """The candidate of best FGD score; ties: the first node (the simulator's smallest name),
    then the lowest device."""
    scores = np.where(np.isinf(deltas), -1, fgd_score(deltas))  # [rows, C]; -1: no such candidate
    if d.is_share:
        pick, device = divmod(int(np.argmax(scores)), scores.shape[1])
        return int(rows[pick]), device
    return int(rows[int(np.argmax(scores[:, 0]))]), -1


def phalanx_chooser(cache: DeltaCache, packer: Packer, pools: PoolTracker) -> Chooser:
    """Phalanx's policy: the capped measure's score, with share pods following the packing
    plan (solver.packing): join a device awaiting the pod's size, else open an idle device
    on a node with headroom for the pattern's other members, else the best score anywhere.
    Every GPU pod first keeps to the model pools where it takes no share held for the pods
    that can only use that pool (solver.pools), and every pod avoids nodes where it would eat
    into reservations, when it can."""

    def choose(state: State, d: Demand, rows: I64, rng: np.random.Generator) -> tuple[int, int]:
        node, device = pick(state, d, pools.keep_out(state, d, rows))
        pools.placed(d, node)
        return node, device

    def pick(state: State, d: Demand, rows: I64) -> tuple[int, int]:
        size = d.gpu_milli if d.is_share and packer.plan.knows(d.gpu_milli) else 0
        cpu_after, mem_after = state.cpu[rows] - d.cpu_milli, state.memory[rows] - d.memory_mib
        res_cpu, res_mem = np.zeros(len(rows)), np.zeros(len(rows))
        for node, cpu, mem in packer.reservations():
            at = np.searchsorted(rows, node)
            if at < len(rows) and rows[at] == node:
                res_cpu[at], res_mem[at] = cpu, mem
        keeps = (cpu_after >= res_cpu - 1e-6) & (mem_after >= res_mem - 1e-6)
        if size:  # its own device's reservation is its to take
            keeps |= (cpu_after >= res_cpu - packer.plan.cpu[size] - 1e-6) & (
                mem_after >= res_mem - packer.plan.memory[size] - 1e-6
            )
        if keeps.any() and not keeps.all():
            rows, cpu_after, mem_after = rows[keeps], cpu_after[keeps], mem_after[keeps]
            res_cpu, res_mem = res_cpu[keeps], res_mem[keeps]
        deltas = cache.deltas(state, d, rows)
        if not size:
            return _best(deltas, rows, d)
        join = np.full(deltas.shape, np.inf)
        for node, device in packer.awaiting(size):
            at = np.searchsorted(rows, node)
            if at < len(rows) and rows[at] == node:
                join[at, device] = deltas[at, device]
        if np.isfinite(join).any():
            node, device = _best(join, rows, d)
            packer.placed(node, device, size, fresh=False)
            return node, device
        need_cpu, need_mem = packer.opening_need(size)
        room = (cpu_after - res_cpu >= need_cpu) & (mem_after - res_mem >= need_mem)
        fresh = np.where((state.free[rows] == FULL_SHARE) & room[:, None], deltas, np.inf)
        if np.isfinite(fresh).any():
            node, device = _best(fresh, rows, d)
        else:
            node, device = _best(deltas, rows, d)
        packer.placed(node, device, size, fresh=bool(state.free[node, device] == FULL_SHARE))
        return node, device

    return choose


class ReplayBinder(Binder):
    """Bind without an API server: the extender's verbs run in-process, on this replay."""

    def __init__(self) -> None:
        self.fence = None  # one process, always the leader
        self.pods: dict[str, dict[str, Any]] = {}
        self.devices: tuple[DeviceAssignment, ...] = ()

    def bind(self, namespace: str, name: str, uid: str, node: str, devices: tuple[DeviceAssignment, ...]) -> None:
        obj = self.pods[name]
        obj["spec"]["nodeName"] = node
        obj["metadata"]["resourceVersion"] = "2"
        obj["metadata"]["annotations"][DEVICES_ANNOTATION] = encode_devices(devices)
        obj["status"] = {"phase": "Running"}
        self.devices = devices

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.pods.get(name)


REFRESH_EVERY = 200  # pods between target-workload refreshes (a live extender: every 10 s)


def extender_chooser(cluster: Cluster) -> tuple[Chooser, Skipped]:
    """Phalanx's policy as deployed: each pod goes through the extender's own filter,
    prioritize and bind (extender/verbs.py, default config) in-process, over a cache fed with
    the same events a watch would deliver; the target workload is what the extender sees (the
    pods so far, refreshed every REFRESH_EVERY pods), not the whole pod list. The node is the
    best score (kube-scheduler's other plugins left out), ties to the first name. A pod that
    fits nowhere stays in the cache as Pending, as it would in a cluster: its kind still counts
    in the workload the extender estimates."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))  # no per-pod logs
    config = PhalanxConfig()
    cache = Cache(config.topology.levels, Hardware(config.gpu))
    binder = ReplayBinder()
    verbs = Verbs(cache, binder, config, Metrics())
    cache.replace_nodes(
        {
            "metadata": {"name": name, "labels": {PRODUCT_LABEL: model}},
            "status": {
                "allocatable": {"cpu": f"{cpu}m", "memory": f"{mem}Mi", "pods": "1000", "nvidia.com/gpu": str(gpus)}
            },
        }
        for name, cpu, mem, gpus, model in zip(
            cluster.names, cluster.cpu, cluster.memory, cluster.gpus, cluster.models, strict=True
        )
    )
    count = [0]

    def arrive(d: Demand) -> tuple[str, dict[str, Any]]:
        """The pod as created: in the cache (the watch saw it), Pending."""
        n = count[0] = count[0] + 1
        name = f"p{n}"
        annotations = {"gpu-fraction": f"{d.gpu_milli / FULL_SHARE}"} if d.is_share else {}
        limits = {"nvidia.com/gpu": str(d.num_gpu)} if d.uses_gpu and not d.is_share else {}
        requests = {"cpu": f"{d.cpu_milli}m", "memory": f"{d.memory_mib}Mi"}
        obj: dict[str, Any] = {
            "metadata": {
                "name": name,
                "namespace": "r",
                "uid": name,
                "resourceVersion": "1",
                "annotations": annotations,
            },
            "spec": {"containers": [{"name": "c", "resources": {"requests": requests, "limits": limits}}]},
            "status": {"phase": "Pending"},
        }
        if d.models is not None:  # gpu_spec: as a user pins models, by required node affinity
            term = {"matchExpressions": [{"key": PRODUCT_LABEL, "operator": "In", "values": sorted(d.models)}]}
            obj["spec"]["affinity"] = {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
            }
        binder.pods[name] = obj
        cache.pod_event("ADDED", obj)
        if n % REFRESH_EVERY == 1:
            verbs.sharing.refresh()
        return name, obj

    def choose(state: State, d: Demand, rows: I64, rng: np.random.Generator) -> tuple[int, int]:
        name, obj = arrive(d)
        names = [cluster.names[i] for i in rows]  # rows: what kube-scheduler's own filters pass
        passed = verbs.filter({"Pod": obj, "NodeNames": names})["NodeNames"]
        reply = orjson.loads(orjson.dumps(verbs.prioritize({"Pod": obj, "NodeNames": passed})))
        score = {e["Host"]: e["Score"] for e in reply}
        best = max(passed, key=lambda host: score.get(host, 0))  # max keeps the first of equals
        if verbs.bind({"PodNamespace": "r", "PodName": name, "PodUID": name, "Node": best})["Error"]:
            raise RuntimeError(f"extender refused to bind {name} to {best}")
        cache.pod_event("MODIFIED", obj)
        node = cluster.index[best]
        return node, binder.devices[0].index if d.is_share else -1

    def skipped(d: Demand) -> None:
        arrive(d)

    return choose, skipped


@dataclass(frozen=True)
class Run:
    policy: str
    seed: int
    arrived: F64  # % of cluster GPUs after each pod
    alloc: F64
    seconds: float
    pods: int

    def at(self, buckets: npt.NDArray[np.int64]) -> F64:
        """alloc % at the first pod where arrived reached each bucket (the last pod past the end)."""
        idx = np.minimum(np.searchsorted(self.arrived, buckets - 1e-9), len(self.arrived) - 1)
        return self.alloc[idx]


def replay(
    cluster: Cluster,
    pods: Sequence[Demand],
    classes: Sequence[WorkloadClass],
    policy: str,
    seed: int,
    progress: Callable[[int], None] | None = None,
) -> Run:
    start = time.perf_counter()
    rng = np.random.default_rng(seed + 7919)
    order = arrival_order(pods, cluster.total_gpu_milli, seed)
    state = State.fresh(cluster)
    choose, skipped = _chooser(policy, cluster, classes)
    model_ok: dict[frozenset[str] | None, npt.NDArray[np.bool_]] = {}
    arrived = np.zeros(len(order))
    alloc = np.zeros(len(order))
    asked = placed = 0
    for step, i in enumerate(order):
        d = pods[int(i)]
        if d.models not in model_ok:
            model_ok[d.models] = np.array([d.models is None or m in d.models for m in cluster.models])
        rows = np.flatnonzero(state.feasible(d, model_ok[d.models]))
        asked += d.gpu_total
        if len(rows):
            node, device = choose(state, d, rows, rng)
            state.place(node, d, device)
            placed += d.gpu_total
        else:
            skipped(d)
        arrived[step], alloc[step] = asked, placed
        if progress is not None and step % 500 == 499:
            progress(500)
    if progress is not None:
        progress(len(order) % 500)
    scale = 100.0 / cluster.total_gpu_milli
    return Run(policy, seed, arrived * scale, alloc * scale, time.perf_counter() - start, len(order))


def _chooser(policy: str, cluster: Cluster, classes: Sequence[WorkloadClass]) -> tuple[Chooser, Skipped]:
    """The policy's chooser, and what it is told of pods that fit nowhere."""
    if policy == "extender":
        return extender_chooser(cluster)
    if policy == "random":
        return choose_random, _ignore
    if policy == "bestfit":
        return choose_bestfit, _ignore
    p = Policy.FGD if policy == "fgd" else Policy.PHALANX
    table = ClassTable.build(classes, p)
    cache = DeltaCache(table.access(cluster.models), table)
    if p is Policy.FGD:
        return fgd_chooser(cache), _ignore
    pools = PoolTracker.build(cluster, classes)
    return phalanx_chooser(cache, Packer(PackingPlan.build(classes)), pools), pools.skipped


def _ignore(d: Demand) -> None:
    return None


# --------------------------------------------------------------------------- the driver


def _task(args: tuple[Path, Path, str, int, Any]) -> Run:
    nodes, pods_path, policy, seed, queue = args
    pods = load_pods(pods_path)
    classes = workload_classes(pods, multi_gpu=policy == "phalanx")  # the paper's classes for FGD
    return replay(load_cluster(nodes), pods, classes, policy, seed, queue.put)


class Progress:
    """A one-line progress bar on stderr, redrawn at each whole percent."""

    def __init__(self, total: int, label: str) -> None:
        self.total, self.done, self.label, self.start = total, 0, label, time.perf_counter()
        self.shown = -1

    def add(self, n: int) -> None:
        self.done = min(self.total, self.done + n)
        pct = int(100 * self.done / max(1, self.total))
        if pct != self.shown:
            self.shown = pct
            bar = "#" * (pct // 4) + "." * (25 - pct // 4)
            took = time.perf_counter() - self.start
            print(f"\r{self.label} [{bar}] {pct:3d}% {took:6.0f}s", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        print(file=sys.stderr, flush=True)


def run_all(nodes: Path, pods_path: Path, policies: Sequence[str], seeds: Sequence[int], jobs: int) -> list[Run]:
    cluster, pods = load_cluster(nodes), load_pods(pods_path)
    per_run = sum(len(arrival_order(pods, cluster.total_gpu_milli, s)) for s in seeds)
    bar = Progress(per_run * len(policies), f"{pods_path.stem}")
    runs: list[Run] = []
    with Manager() as manager, ProcessPoolExecutor(max_workers=jobs) as pool:
        queue = manager.Queue()
        futures = [pool.submit(_task, (nodes, pods_path, p, s, queue)) for p in policies for s in seeds]
        pending = set(futures)
        while pending:
            while not queue.empty():
                bar.add(queue.get())
            finished = [f for f in pending if f.done()]
            for f in finished:
                runs.append(f.result())
                pending.discard(f)
            time.sleep(0.2)
        while not queue.empty():
            bar.add(queue.get())
    bar.close()
    return runs


def published(trace: str) -> dict[str, F64]:
    """Published alloc % per policy: [seeds, buckets] for `trace` (empty if not published)."""
    path = DATA / PUBLISHED
    if not path.exists():
        return {}
    out: dict[str, list[list[float]]] = {}
    names = {v: k for k, v in PUBLISHED_NAMES.items()}
    with path.open() as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        if r["workload"] == trace and r["sc_policy"] in names:
            out.setdefault(names[r["sc_policy"]], []).append([float(r[str(b)]) for b in BUCKETS])
    return {k: np.array(v) for k, v in out.items()}


def summarize(runs: Sequence[Run], trace: str) -> tuple[str, dict[str, Any]]:
    pub = published(trace)
    lines = [
        f"{'policy':<8} | {'alloc@100':>13} | {'alloc@130':>13} | {'published @100 / @130':>23} | {'s/replay':>8}",
        "-" * 78,
    ]
    head: dict[str, Any] = {"trace": trace, "alloc_at_100": {}, "alloc_at_130": {}, "seconds_per_replay": {}}
    for policy in POLICIES + EXTRA:
        mine = [r for r in runs if r.policy == policy]
        if not mine:
            continue
        at = np.array([r.at(BUCKETS) for r in mine])
        m100, s100, m130, s130 = at[:, 100].mean(), at[:, 100].std(), at[:, 130].mean(), at[:, 130].std()
        p = pub.get(policy)
        ref = f"{p[:, 100].mean():6.2f}±{p[:, 100].std():4.2f} / {p[:, 130].mean():6.2f}" if p is not None else "n/a"
        secs = float(np.mean([r.seconds for r in mine]))
        lines.append(f"{policy:<8} | {m100:6.2f} ± {s100:4.2f} | {m130:6.2f} ± {s130:4.2f} | {ref:>23} | {secs:8.1f}")
        head["alloc_at_100"][policy] = round(float(m100), 2)
        head["alloc_at_130"][policy] = round(float(m130), 2)
        head["seconds_per_replay"][policy] = round(secs, 1)
    pods = max(r.pods for r in runs)
    lines.append(f"{len({r.seed for r in runs})} seeds, up to {pods} pods per replay")
    return "\n".join(lines), head


def plot(runs: Sequence[Run], trace: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = dict(zip(POLICIES + EXTRA, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"), strict=True))
    for policy in POLICIES + EXTRA:
        mine = [r for r in runs if r.policy == policy]
        if mine:
            ax.plot(BUCKETS, np.mean([r.at(BUCKETS) for r in mine], axis=0), color=colors[policy], label=policy)
    for policy, arr in published(trace).items():
        ax.plot(BUCKETS, arr.mean(axis=0), color=colors[policy], linestyle=":", label=f"{policy} (published)")
    ax.plot(BUCKETS, BUCKETS, color="grey", linewidth=0.5)
    ax.set(xlabel="arrived GPU demand (% of cluster GPUs)", ylabel="GPU allocation (%)", title=trace)
    ax.set_xlim(60, 130)
    ax.set_ylim(60, 100)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--nodes", type=Path, default=DATA / DEFAULT_NODES, help="node list CSV (sn,cpu_milli,memory_mib,gpu,model)"
    )
    ap.add_argument("--pods", type=Path, default=None, help=f"pod list CSV (default {DEFAULT_PODS})")
    ap.add_argument(
        "--trace",
        default=None,
        help="shorthand: openb_pod_list_<TRACE>.csv in the data folder, e.g. gpushare40; gpuspec<N> not there is "
        "built by benchmarks/trace_variants.py",
    )
    ap.add_argument("--seeds", type=int, default=10, help="seeds 42.. (default 10, as the paper)")
    ap.add_argument("--quick", action="store_true", help="3 seeds")
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES + EXTRA)
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    ap.add_argument(
        "--plot", type=Path, default=None, help="PNG path (default ~/.cache/phalanx/trace_replay_<trace>.png)"
    )
    ap.add_argument("--no-record", action="store_true", help="do not append to benchmarks/RESULTS.md")
    args = ap.parse_args(argv)
    pods_path = args.pods or DATA / (f"openb_pod_list_{args.trace}.csv" if args.trace else DEFAULT_PODS)
    spec = re.fullmatch(r"gpuspec(\d+)", args.trace or "")
    if args.pods is None and spec and not pods_path.exists():  # a harder variant, built (benchmarks/trace_variants.py)
        pods_path = trace_variants.variant(int(spec.group(1)) / 100)
    trace = pods_path.stem
    seeds = list(range(SEED0, SEED0 + (3 if args.quick else args.seeds)))
    runs = run_all(args.nodes, pods_path, args.policies, seeds, args.jobs)
    table, head = summarize(runs, trace)
    png = args.plot or Path.home() / ".cache" / "phalanx" / f"trace_replay_{trace}.png"
    plot(runs, trace, png)
    print(table)
    print(f"plot: {png}")
    if not args.no_record:
        body = f"Nodes `{args.nodes.name}`, pods `{pods_path.name}`, {args.jobs} worker processes.\n\n```\n{table}\n```"
        record(f"trace_replay {trace}", body, head)
    print(json.dumps(head, sort_keys=True))


if __name__ == "__main__":
    main()
