"""Solver scale benchmark: plan time, optimality and misses on synthetic GPU clusters.

Clusters: 1,024 / 4,096 / 16,384 nodes of 8 GPUs in zones > blocks (8 racks) > racks (32
nodes) > hosts, about half the nodes busy with 1..8 GPUs. Gangs: 8 / 64 / 256 / 1,024 pods
of 1 / 2 / 4 / 8 GPUs, with a required level (the smallest domain with twice the gang's GPUs; none
if even a zone is smaller),
rack preferred, and, in the "slices" kind, slices of 8 pods per rack.

Tight instances are built around a planted placement in an otherwise full cluster, so a
feasible answer is known and a miss is countable:
- planted-slices: exactly one free 8-pod slice in each of a few racks of one block, decoy
  racks with 7 free nodes elsewhere;
- planted-pair: two gangs that each fit two blocks, one of them only allowed in the tighter
  block; order-based greedy puts the first into that block and loses the second.

Per case: median and p99 plan time, status, objective vs bound, and whether the greedy
baseline (Kueue-style BestFit) failed or was less compact while a placement exists.
Headline keys: p1_median_s (1,024 pods x 8 GPUs on 16,384 nodes), p1b_median_s (64 pods x
8 GPUs on 4,096 nodes), missed_feasible (all cases).

    python -m benchmarks.solver_scale [--quick] [--reps N] [--no-record]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field

from benchmarks.common import median, percentile, record
from benchmarks.synth import BLOCK, RACK, ZONE, Shape, cluster, with_used
from solver import (
    ClusterSnapshot,
    EqGroup,
    GangName,
    GangRequest,
    GpuDemand,
    NodeName,
    Outcome,
    PodShape,
    Resources,
    Slice,
    TopologyRequest,
    plan,
)
from solver.greedy import greedy
from solver.ledger import Ledger
from solver.objective import compactness
from solver.problem import prepare
from solver.topology import TopologyIndex

SIZES = {1024: Shape(4, 1, 8, 32), 4096: Shape(4, 4, 8, 32), 16384: Shape(4, 16, 8, 32)}
GANG_PODS = (8, 64, 256, 1024)
GPUS = (1, 2, 4, 8)
KINDS = ("required+preferred", "slices")


@dataclass(frozen=True)
class Case:
    name: str
    nodes: int
    pods: int
    gpus: int
    kind: str  # a request kind or a planted kind


@dataclass
class Outcomes:
    times: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    gaps: list[float] = field(default_factory=list)
    greedy_worse: int = 0
    greedy_failed: int = 0
    missed: int = 0
    runs: int = 0
    feasible_runs: int = 0


def pod(gpus: int) -> PodShape:
    return PodShape(Resources(4000 * gpus, 32768 * gpus, 1), GpuDemand.whole(gpus))


def required_level(shape: Shape, pods: int, gpus: int) -> str:
    """The smallest level whose domains hold twice the gang's GPUs; none when even a zone
    does not (then the gang only prefers racks)."""
    need = 2 * pods * gpus
    rack = shape.nodes_per_rack * shape.gpus_per_node
    block = rack * shape.racks_per_block
    zone = block * shape.blocks_per_zone
    for level, size in ((RACK, rack), (BLOCK, block), (ZONE, zone)):
        if need <= size:
            return level
    return ""


def random_instance(case: Case, seed: int) -> tuple[ClusterSnapshot, list[GangRequest]]:
    shape = SIZES[case.nodes]
    snap = cluster(shape, occupancy=0.5, seed=seed)
    level = required_level(shape, case.pods, case.gpus)
    slices = (Slice(RACK, 8),) if case.kind == "slices" and case.pods >= 8 else ()
    topo = TopologyRequest(required=level, preferred=RACK if level != RACK else "", slices=slices)
    if not level:
        topo = TopologyRequest(preferred=RACK, slices=slices)
    gang = GangRequest(GangName(case.name), (EqGroup("worker", pod(case.gpus), case.pods),), topology=topo)
    return snap, [gang]


def planted_slices(case: Case, seed: int) -> tuple[ClusterSnapshot, list[GangRequest]]:
    """One block gets exactly one free 8-node slice in each of pods/8 racks; decoy racks in
    other blocks get 7 free nodes (one short of a slice)."""
    shape = SIZES[case.nodes]
    rnd = random.Random(seed)
    snap = cluster(shape, seed=seed, full=True)
    by_rack: dict[str, list[str]] = {}
    for n in snap.nodes:
        by_rack.setdefault(n.topology[2], []).append(n.name)
    racks = sorted(by_rack)
    blocks = sorted({r[: r.index("r")] for r in racks})
    target = rnd.choice(blocks)
    slices = case.pods // 8
    chosen = rnd.sample([r for r in racks if r.startswith(target + "r")], slices)
    free: dict[str, int] = {}
    for r in chosen:
        for name in rnd.sample(by_rack[r], 8):
            free[name] = 0
    for r in rnd.sample([r for r in racks if not r.startswith(target + "r")], min(len(racks) // 2, 64)):
        for name in rnd.sample(by_rack[r], 7):
            free[name] = 0
    topo = TopologyRequest(required=BLOCK, preferred=RACK, slices=(Slice(RACK, 8),))
    gang = GangRequest(GangName(case.name), (EqGroup("worker", pod(8), case.pods),), topology=topo)
    return with_used(snap, shape, free), [gang]


def planted_pair(case: Case, seed: int) -> tuple[ClusterSnapshot, list[GangRequest]]:
    """Block X has exactly `pods` free nodes, block Y `pods + 8`; gang b may only use X.
    Greedy places a (same size, earlier name) in the tighter X and then b fits nowhere."""
    shape = SIZES[case.nodes]
    rnd = random.Random(seed)
    snap = cluster(shape, seed=seed, full=True)
    by_block: dict[str, list[str]] = {}
    for n in snap.nodes:
        by_block.setdefault(n.topology[1], []).append(n.name)
    x, y = rnd.sample(sorted(by_block), 2)
    free = {name: 0 for name in rnd.sample(by_block[x], case.pods)}
    free.update({name: 0 for name in rnd.sample(by_block[y], case.pods + 8)})
    topo = TopologyRequest(required=BLOCK, preferred=RACK)
    only_x = PodShape(pod(8).requests, pod(8).gpu, allowed_nodes=frozenset(NodeName(n) for n in by_block[x]))
    gangs = [
        GangRequest(GangName("a"), (EqGroup("worker", pod(8), case.pods),), topology=topo),
        GangRequest(GangName("b"), (EqGroup("worker", only_x, case.pods),), topology=topo),
    ]
    return with_used(snap, shape, free), gangs


BUILDERS = {"planted-slices": planted_slices, "planted-pair": planted_pair}


def run_case(case: Case, reps: int, seed0: int) -> Outcomes:
    out = Outcomes()
    for rep in range(reps):
        build = BUILDERS.get(case.kind, random_instance)
        snap, gangs = build(case, seed0 + rep)
        started = time.perf_counter()
        result = plan(snap, gangs)
        out.times.append(time.perf_counter() - started)
        out.runs += 1
        out.statuses[result.status.value] += 1
        placed = sum(1 for g in result.gangs if g.outcome is Outcome.PLACED)
        if result.bound:
            out.gaps.append((result.objective - result.bound) / max(1, abs(result.bound)))
        base_placed, base_compact = _baseline(snap, gangs)
        feasible = case.kind in BUILDERS or base_placed > 0 or placed > 0
        out.feasible_runs += feasible
        if case.kind in BUILDERS and placed < len(gangs):
            out.missed += 1
        if base_placed > placed:
            out.missed += 1  # the baseline found more: the solver missed a placement
        if placed > base_placed:
            out.greedy_failed += 1
        elif placed == base_placed and placed and base_compact > result.objective:
            out.greedy_worse += 1
    return out


def _baseline(snap: ClusterSnapshot, gangs: list[GangRequest]) -> tuple[int, int]:
    """Gangs the greedy baseline places, and their total compactness."""
    topo = TopologyIndex(snap)
    problem = prepare(snap, gangs, topo)
    placed = greedy(problem, Ledger(snap))
    return len(placed), sum(compactness(topo, problem.gangs[k], m) for k, m in placed.items())


def cases(quick: bool, rnd: random.Random) -> list[Case]:
    p1 = Case("p1", 16384, 1024, 8, "required+preferred")
    p1b = Case("p1b", 4096, 64, 8, "required+preferred")
    if quick:
        small = [Case(f"small-{i}", 1024, rnd.choice((8, 64)), rnd.choice(GPUS), rnd.choice(KINDS)) for i in range(16)]
        planted = [Case(f"planted-{k}-{i}", 1024, 32, 8, k) for i in range(2) for k in BUILDERS]
        return [p1, p1b, *small, *planted]
    matrix = [
        Case(f"{n}n-{p}p-{g}g-{k}", n, p, g, k)
        for n in SIZES
        for p in GANG_PODS
        for g in GPUS
        for k in KINDS
        if p * g * 2 <= n * 8  # the gang fits the cluster twice over
    ]
    planted = [Case(f"{n}n-{p}p-{k}", n, p, 8, k) for n in SIZES for p in (32, 64) for k in BUILDERS]
    return [p1, p1b, *matrix, *planted]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="p1, p1b, 20 small cases: under a minute")
    ap.add_argument("--reps", type=int, default=0, help="instances per case (default 5, quick 3; small cases 1)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-record", action="store_true", help="do not append to RESULTS.md")
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    reps = args.reps or (3 if args.quick else 5)
    rows = []
    totals = Outcomes()
    headline: dict[str, float | int | str] = {}
    header = (
        f"{'case':34} {'runs':>4} {'median_s':>9} {'p99_s':>8} {'status':22} {'gap':>6} "
        f"{'greedy fail/worse':>17} {'missed':>6}"
    )
    print(header)
    for case in cases(args.quick, rnd):
        n = reps if case.name in ("p1", "p1b") or not args.quick else 1
        o = run_case(case, n, args.seed * 1000)
        status = ",".join(f"{k}:{v}" for k, v in sorted(o.statuses.items()))
        gap = max(o.gaps) if o.gaps else 0.0
        row = (
            f"{case.name:34} {o.runs:>4} {median(o.times):>9.4f} {percentile(o.times, 99):>8.4f} {status:22} "
            f"{gap:>6.3f} {o.greedy_failed:>8}/{o.greedy_worse:<8} {o.missed:>6}"
        )
        print(row, flush=True)
        rows.append(row)
        if case.name in ("p1", "p1b"):
            headline[f"{case.name}_median_s"] = round(median(o.times), 4)
            headline[f"{case.name}_p99_s"] = round(percentile(o.times, 99), 4)
            headline[f"{case.name}_optimal"] = f"{o.statuses['optimal']}/{o.runs}"
        totals.runs += o.runs
        totals.feasible_runs += o.feasible_runs
        totals.missed += o.missed
        totals.greedy_failed += o.greedy_failed
        totals.greedy_worse += o.greedy_worse
        totals.statuses.update(o.statuses)
    headline["missed_feasible"] = totals.missed
    headline["runs"] = totals.runs
    headline["optimal_share"] = round(totals.statuses["optimal"] / max(1, totals.runs), 4)
    headline["greedy_fails_or_worse_share"] = round(
        (totals.greedy_failed + totals.greedy_worse) / max(1, totals.feasible_runs), 4
    )
    summary = (
        f"runs {totals.runs}, optimal {totals.statuses['optimal']}, missed feasible {totals.missed}, "
        f"greedy failed {totals.greedy_failed} and less compact {totals.greedy_worse} "
        f"of {totals.feasible_runs} feasible runs"
    )
    print(summary)
    if not args.no_record:
        body = "```\n" + "\n".join([header, *rows, summary]) + "\n```"
        record("solver_scale" + (" --quick" if args.quick else ""), body, headline)
    print(json.dumps(headline, sort_keys=True))


if __name__ == "__main__":
    main()
