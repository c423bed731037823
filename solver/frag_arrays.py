"""GPU fragmentation, the numpy face: the measures of frag.py over many nodes at once.

The trace replay (benchmarks/trace_replay.py) scores every candidate node of every pod, so it
needs F and ΔF for thousands of node states per step; the formulas and the policies are
frag.py's (its docstring has them), written here over arrays [nodes, devices, classes].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from solver.device import FULL_SHARE
from solver.frag import UNBOUNDED, Demand, Policy, WorkloadClass

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
BOOL = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class ClassTable:
    """The classes as arrays for the numpy face; index k is the class."""

    cpu: I64
    memory: I64
    milli: I64  # per device, 0 for CPU-only classes
    num: I64
    weight: F64
    models: tuple[frozenset[str] | None, ...]
    policy: Policy

    @staticmethod
    def build(classes: Sequence[WorkloadClass], policy: Policy) -> ClassTable:
        return ClassTable(
            cpu=np.array([c.cpu_milli for c in classes], dtype=np.int64),
            memory=np.array([c.memory_mib for c in classes], dtype=np.int64),
            milli=np.array([c.gpu_milli if c.uses_gpu else 0 for c in classes], dtype=np.int64),
            num=np.array([c.num_gpu if c.uses_gpu else 0 for c in classes], dtype=np.int64),
            weight=np.array([c.probability for c in classes], dtype=np.float64),
            models=tuple(c.models for c in classes),
            policy=policy,
        )

    def access(self, node_models: Sequence[str]) -> BOOL:
        """[nodes, classes]: the class may use the node's GPUs (GPU class, allowed model)."""
        out = np.zeros((len(node_models), len(self.models)), dtype=np.bool_)
        for k, allowed in enumerate(self.models):
            if self.num[k] > 0:
                out[:, k] = [allowed is None or m in allowed for m in node_models]
        return out


def _pods_fed(free: I64, demand: I64) -> I64:
    """[n, K]: how many pods of each class the free CPU (or memory) can feed."""
    return np.where(demand[None, :] > 0, free[:, None] // np.maximum(demand, 1)[None, :], UNBOUNDED)


def usable_share(cpu: I64, memory: I64, free: I64, access: BOOL, table: ClassTable) -> F64:
    """[n]: sum_k p_k * fit_k * usable_k for n node states (free: [n, devices] milli, 0 = absent)."""
    enough = free[:, :, None] >= np.maximum(table.milli, 1)[None, None, :]  # [n, G, K]
    count = enough.sum(axis=1)
    usable = (free[:, :, None] * enough).sum(axis=1)
    fit = access & (count >= table.num[None, :]) & (cpu[:, None] >= table.cpu[None, :])
    if table.policy is Policy.PHALANX:
        pods = np.minimum(_pods_fed(cpu, table.cpu), _pods_fed(memory, table.memory))
        fit &= pods >= 1
        usable = np.minimum(usable, pods * table.num[None, :] * FULL_SHARE)
    return np.asarray(np.where(fit, usable, 0) @ table.weight, dtype=np.float64)


def fragmentation(cpu: I64, memory: I64, free: I64, access: BOOL, table: ClassTable) -> F64:
    """[n]: F = T - sum_k p_k fit_k usable_k in milli-GPU."""
    idle: F64 = free.sum(axis=1).astype(np.float64)
    return idle - usable_share(cpu, memory, free, access, table)


def take_devices(free: I64, demand: Demand) -> I64:
    """[n, G] free share after a non-share GPU pod takes devices as the simulator does: the
    least sufficient first, ties to the lowest index (whole pods take the first idle devices)."""
    after = free.copy()
    order = np.argsort(free, axis=1, kind="stable")
    rows = np.arange(free.shape[0])
    left = np.full(free.shape[0], demand.num_gpu)
    for col in range(free.shape[1]):
        idx = order[:, col]
        take = (left > 0) & (after[rows, idx] >= demand.gpu_milli)
        after[rows[take], idx[take]] -= demand.gpu_milli
        left -= take
    return after


def candidate_deltas(cpu: I64, memory: I64, free: I64, access: BOOL, table: ClassTable, demand: Demand) -> F64:
    """[n, C] ΔF of each candidate placement on each node; +inf where a candidate is invalid.

    A share pod has one candidate per device (C = devices); any other pod one (C = 1):
    CPU-only, or the devices `take_devices` picks. Node feasibility (CPU, memory, model,
    device count) is the caller's filter.
    """
    before = fragmentation(cpu, memory, free, access, table)
    cpu_after, mem_after = cpu - demand.cpu_milli, memory - demand.memory_mib
    if not demand.is_share:
        after_free = take_devices(free, demand) if demand.uses_gpu else free
        return (fragmentation(cpu_after, mem_after, after_free, access, table) - before)[:, None]
    n, g = free.shape
    states = np.repeat(free[:, None, :], g, axis=1)  # [n, candidate device, device]
    states[:, np.arange(g), np.arange(g)] -= demand.gpu_milli
    after = fragmentation(
        np.repeat(cpu_after, g), np.repeat(mem_after, g), states.reshape(n * g, g), np.repeat(access, g, axis=0), table
    ).reshape(n, g)
    return np.where(free >= demand.gpu_milli, after - before[:, None], np.inf)


def fgd_score(delta: F64) -> I64:
    """The simulator's score int(100 * sigmoid(-ΔF / 1000)), 0..100, higher is better."""
    return (100.0 / (1.0 + np.exp(np.clip(delta / FULL_SHARE, -700.0, 700.0)))).astype(np.int64)
