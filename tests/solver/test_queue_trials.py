"""Randomized queue simulations (benchmarks/queue_sim.py, Phalanx policy) on small clusters,
checked after every event: no partial gang, nothing double-booked (all running gangs together
are a valid plan on the empty cluster), no queue or ancestor over its limit, and every
preemption's plan valid with its victims gone and placed at once (no eviction for a gang that
then waits). Seeded: a failure names its trial, which replays alone."""

from __future__ import annotations

import random

import pytest

from benchmarks.queue_sim import Config, Stats, run_policy
from benchmarks.synth import RACK, Shape, cluster
from solver.queues import QueueSpec

TRIALS = 200
SHAPES = (Shape(1, 1, 2, 4), Shape(1, 1, 2, 6), Shape(1, 1, 3, 4))


def tree(rnd: random.Random, gpus: int) -> tuple[QueueSpec, ...]:
    """Two or three top-level queues, sometimes one of them a parent of two; random deserved
    quotas (within the parent's), limits and weights (0 included)."""
    specs = []
    names = ["a", "b", "c"][: rnd.choice((2, 3))]
    for name in names:
        deserved = rnd.choice((0, gpus // 4, gpus // 2))
        limit = {"gpu": rnd.choice((gpus // 2, 3 * gpus // 4))} if rnd.random() < 0.4 else {}
        if limit and deserved > limit["gpu"]:
            deserved = limit["gpu"]
        specs.append(QueueSpec(name, deserved={"gpu": deserved}, limit=limit, weight=rnd.choice((0, 1, 1, 2))))
    if rnd.random() < 0.4:
        parent = specs[0]
        half = parent.deserved.get("gpu", 0) // 2
        kids = [QueueSpec(f"{parent.name}{i}", parent=parent.name, deserved={"gpu": half}) for i in (1, 2)]
        kids[1] = QueueSpec(kids[1].name, parent=parent.name, deserved={"gpu": half}, limit={"gpu": gpus // 4})
        specs += kids
    return tuple(specs)


def leaves(specs: tuple[QueueSpec, ...]) -> list[str]:
    parents = {s.parent for s in specs}
    return [s.name for s in specs if s.name not in parents]


def trial(seed: int) -> Stats:
    rnd = random.Random(seed)
    shape = rnd.choice(SHAPES)
    gpus = shape.nodes * shape.gpus_per_node
    specs = tree(rnd, gpus)
    rate = rnd.uniform(1.0, 2.0) * gpus / 0.6  # gangs of ~4.3 GPUs for ~8 min: heavy overload
    queues = leaves(specs)
    config = Config(
        specs,
        {q: rate / len(queues) for q in queues},
        hours=0.5,
        seed=seed,
        gang_gpus=((1, 0.3), (2, 0.2), (4, 0.2), (8, 0.15), (16, 0.15)),
        mean_duration_s=480.0,
        big_required=RACK,
        preemptions_per_pass=1,
    )
    return run_policy(cluster(shape, occupancy=0.0), config, "phalanx", check=True)


@pytest.mark.parametrize("seed", range(TRIALS), ids=lambda s: f"trial {s}")
def test_no_partial_gang_no_limit_breach_no_wasted_eviction(seed: int) -> None:
    """Every invariant holds after every event of one random simulation."""
    stats = trial(seed)
    assert stats.invariant_errors == []
    assert stats.broken_gangs == 0
    assert stats.wasted_evictions == 0


def test_the_trials_reach_preemption_and_completion() -> None:
    """The first trials evict gangs and finish others, so the invariants above are tested
    across evictions, not only on a cluster that never preempts."""
    runs = [trial(seed) for seed in range(5)]
    assert sum(s.preemptions for s in runs) > 0
    assert sum(s.evicted_gangs for s in runs) > 0
    assert all(s.finished > 0 for s in runs)
