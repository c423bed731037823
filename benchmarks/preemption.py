"""Preemption benchmark: gang-aware victim choice, and queues with fair share against a
priority-greedy baseline. Solver only, no cluster.

Part 1, victim choice: a full cluster of 625 nodes x 8 GPUs (5 blocks of 5 racks of 25 nodes),
5,000 running 1-GPU pods in 500 gangs of 10 (laid out rack by rack, one slot in ten swapped
at random, so some gangs span racks and blocks), priorities 0..2, three queues, 30% of gangs
borrowed. The preemptor: 8 pods x 8 GPUs (64 GPUs), block required, priority 10. Per seed:
`choose_victims` seconds, the cost of the set, and `validate_plan` of the plan on the snapshot
with the victims gone (every plan must be valid).

Part 2, queues (benchmarks/queue_sim.py): three queues (a and b deserve 3/8 of the GPUs each,
b with twice a's weight for idle capacity; c deserves nothing and is limited to half), Poisson
arrivals at 1.2x the cluster's capacity (a 50%, b 30%, c 20% of them), gangs of 1..32 GPUs
(16 and more within one rack), priorities 0..2, exponential durations around 30 min. Both
policies replay the same arrivals. Fairness is Jain's index over queues of (time-averaged GPUs
held by whole gangs / fair share), counted while the queue had demand.

    python -m benchmarks.preemption [--quick] [--seeds N] [--no-record]
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass

from benchmarks.common import finish, machine, median, parser, percentile
from benchmarks.queue_sim import POLICIES, Config, Stats, run_policy
from benchmarks.synth import BLOCK, RACK, Shape, cluster, node
from solver import (
    ClusterSnapshot,
    DeviceAssignment,
    EqGroup,
    GangName,
    GangRequest,
    GpuDemand,
    NodeName,
    PlanResult,
    PodShape,
    Resources,
    SolverParams,
    SolveStatus,
    TopologyRequest,
    validate_plan,
)
from solver.preempt import Preemption, RunningPod, VictimUnit, choose_victims, freed
from solver.queues import QueueSpec

FULL = Shape(1, 5, 5, 25)
PREEMPTOR = GangRequest(
    GangName("preemptor"),
    (EqGroup("worker", PodShape(Resources(8000, 65536, 1), GpuDemand.whole(8)), 8),),
    topology=TopologyRequest(required=BLOCK),
    priority=10,
)
INNER = SolverParams(time_limit_s=0.2)


def running_cluster(seed: int) -> tuple[ClusterSnapshot, list[VictimUnit]]:
    """Part 1's full cluster and its 500 running gangs (see the module doc)."""
    rnd = random.Random(seed)
    full = cluster(FULL, full=True)
    nodes = tuple(node(FULL, n.name, n.topology, FULL.gpus_per_node) for n in full.nodes)
    slots = [(n.name, i) for n in nodes for i in range(FULL.gpus_per_node)]
    for _ in range(len(slots) // 10):
        a, b = rnd.randrange(len(slots)), rnd.randrange(len(slots))
        slots[a], slots[b] = slots[b], slots[a]
    requests = Resources(FULL.cpu_milli // 16, FULL.memory_mib // 16, 1)
    units = []
    for g in range(len(slots) // 10):
        pods = tuple(
            RunningPod(f"g{g}-{k}", NodeName(name), requests, (DeviceAssignment(i, 1000, FULL.gpu_memory_mib),))
            for k, (name, i) in enumerate(slots[10 * g : 10 * g + 10])
        )
        priority = rnd.choice((0, 0, 0, 1, 1, 2))
        units.append(VictimUnit(f"gang-{g:03d}", f"q{g % 3}", priority, pods, borrowed=rnd.random() < 0.3))
    return ClusterSnapshot(nodes, full.levels), units


@dataclass
class VictimRun:
    seconds: float
    found: Preemption
    errors: list[str]


def victim_trial(seed: int) -> VictimRun:
    snapshot, units = running_cluster(seed)
    started = time.perf_counter()
    found = choose_victims(snapshot, PREEMPTOR, units, params=INNER)
    seconds = time.perf_counter() - started
    errors = ["no victim set found"]
    if found.plan is not None:
        after = freed(snapshot, [u for u in units if u.name in found.victims])
        errors = validate_plan(after, [PREEMPTOR], PlanResult(SolveStatus.FEASIBLE, (found.plan,)))
    return VictimRun(seconds, found, errors)


def queue_config(shape: Shape, hours: float, seed: int) -> Config:
    gpus = shape.nodes * shape.gpus_per_node
    tree = (
        QueueSpec("a", deserved={"gpu": gpus * 3 // 8}, weight=1),
        QueueSpec("b", deserved={"gpu": gpus * 3 // 8}, weight=2),
        QueueSpec("c", limit={"gpu": gpus // 2}, weight=1),
    )
    rate = 1.2 * gpus / 3.57  # a gang holds 7.13 GPUs for 0.5 h on average: 3.57 GPU-hours
    return Config(tree, {"a": rate * 0.5, "b": rate * 0.3, "c": rate * 0.2}, hours=hours, seed=seed, big_required=RACK)


def jain(stats: Stats) -> float:
    xs = [stats.share_ratio[q] / t for q, t in sorted(stats.demand_time.items()) if t > 0]
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if xs else float("nan")


def figures(stats: Stats, gpus: int) -> dict[str, float]:
    return {
        "utilization": round(stats.useful / stats.seconds / gpus, 4),
        "allocated": round(stats.allocated / stats.seconds / gpus, 4),
        "fairness_jain": round(jain(stats), 4),
        "evictions": stats.evicted_pods,
        "evicted_gangs": stats.evicted_gangs,
        "partial_gangs": stats.broken_gangs,
        "wasted_evictions": stats.wasted_evictions,
        "finished": stats.finished,
    }


def queue_lines(results: dict[str, Stats], gpus: int) -> list[str]:
    table = {p: figures(s, gpus) for p, s in results.items()}
    lines = [f"{'':34}" + "".join(f"{p:>18}" for p in results)]
    labels = {
        "utilization": "GPU utilisation (whole gangs)",
        "allocated": "GPUs allocated (broken included)",
        "fairness_jain": "Jain fairness (held / fair share)",
        "evictions": "pods evicted",
        "evicted_gangs": "gangs hit by evictions",
        "partial_gangs": "partial (broken) gangs",
        "wasted_evictions": "evictions for an unplaced gang",
        "finished": "gangs finished",
    }
    for key, label in labels.items():
        lines.append(f"{label:34}" + "".join(f"{table[p][key]:>18}" for p in results))
    queues = sorted({q for s in results.values() for q in s.waits})
    for q in queues:
        cells = []
        for s in results.values():
            waits = [w / 60 for w in s.waits.get(q, [])]
            cells.append(f"{median(waits):.1f} / {percentile(waits, 99):.1f}")
        lines.append(f"{'wait p50 / p99 min, queue ' + q:34}" + "".join(f"{c:>18}" for c in cells))
    return lines


def main() -> None:
    ap: argparse.ArgumentParser = parser(__doc__, quick="5 victim seeds; 32 nodes and 2 simulated hours")
    ap.add_argument("--seeds", type=int, default=0, help="victim-choice trials (default 30, quick 5)")
    args = ap.parse_args()
    seeds = args.seeds or (5 if args.quick else 30)
    lines = [f"machine: {machine()}", "", f"part 1: victim choice, {seeds} seeds"]
    runs = [victim_trial(seed) for seed in range(seeds)]
    times = [r.seconds for r in runs]
    invalid = sum(1 for r in runs if r.errors)
    for seed, r in enumerate(runs):
        cost = r.found.cost
        lines.append(
            f"  seed {seed}: {r.seconds:.3f} s, {len(r.found.victims)} gangs in {'/'.join(r.found.domain)}, cost {cost}"
        )
    lines.append(
        f"choose_victims: p50 {median(times):.3f} s, p99 {percentile(times, 99):.3f} s; invalid plans: {invalid}"
    )
    shape = Shape(1, 1, 4, 8) if args.quick else Shape(1, 2, 4, 8)
    hours = 2.0 if args.quick else 6.0
    gpus = shape.nodes * shape.gpus_per_node
    config = queue_config(shape, hours, seed=0)
    lines += ["", f"part 2: queue simulation, {shape.nodes} nodes x 8 GPUs, {hours:g} simulated hours"]
    results: dict[str, Stats] = {}
    for policy in POLICIES:
        started = time.perf_counter()
        results[policy] = run_policy(cluster(shape, occupancy=0.0), config, policy)
        lines.append(f"  {policy}: replayed in {time.perf_counter() - started:.1f} s")
    lines += queue_lines(results, gpus)
    ours, base = figures(results["phalanx"], gpus), figures(results["priority-greedy"], gpus)
    headline: dict[str, float | int] = {
        "victims_p50_s": round(median(times), 4),
        "victims_p99_s": round(percentile(times, 99), 4),
        "victims_invalid_plans": invalid,
        **ours,
        **{f"baseline_{k}": v for k, v in base.items()},
    }
    finish("preemption", args, lines, headline)


if __name__ == "__main__":
    main()
