"""Resource Interface cost: per-pod gang-key evaluation over realistic pods, for every shipped definition.

Pods come from the RI sample workloads (benchmarks/ri_samples, shared with the tests), which
build each framework's CR and the pods its controller creates - labels, annotations,
ownerReferences, containers with env and resources, managedFields - so the JSON jq parses is
pod-sized (~2.5 KB). The workload mix: PyTorchJob (1 master + 7 workers), MPIJob (launcher + 8
workers), JobSet (driver + 2x4), LeaderWorkerSet (3 groups of 4), InferenceService (2 predictors
+ transformer), TrainJob (initializer + 4 nodes), RayCluster (head + 2 + 4 workers), repeated
with distinct names until the pod count is reached.

Measured per pod: `ResourceInterface.gang_key(pod)` (one jq run over the cut-down pod, compiled
programs cached), after a warm-up pass. Also: `evaluate(cr, pods)` per root object, and the
one-off cost of loading and compiling the shipped definitions. Target: p99 < 0.5 ms per pod.

    python -m benchmarks.ri_keys [--quick] [--pods N] [--no-record]
    python benchmarks/ri_keys.py [--quick] [--pods N] [--no-record]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script, Python puts benchmarks/ (not the repository root) on the path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import ri_samples as samples
from benchmarks.common import finish, median, parser, percentile
from extender.ri import ResourceInterface
from extender.ri.registry import Registry, load_defaults

Builder = Callable[[str], tuple[dict[str, Any], list[dict[str, Any]]]]

WORKLOADS: list[tuple[str, str, Builder]] = [
    ("kubeflow.org/v1", "PyTorchJob", lambda n: samples.pytorchjob(n, workers=7)),
    ("kubeflow.org/v2beta1", "MPIJob", lambda n: samples.mpijob(n, workers=8)),
    ("jobset.x-k8s.io/v1alpha2", "JobSet", lambda n: samples.jobset(n)),
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", lambda n: samples.leaderworkerset(n, replicas=3, size=4)),
    ("serving.kserve.io/v1beta1", "InferenceService", lambda n: samples.inferenceservice(n, predictor_min=2)),
    ("trainer.kubeflow.org/v1alpha1", "TrainJob", lambda n: samples.trainjob(n, num_nodes=4)),
    ("ray.io/v1", "RayCluster", lambda n: samples.raycluster(n)),
]


@dataclass
class KindRun:
    kind: str
    key_ms: list[float] = field(default_factory=list)
    evaluate_ms: list[float] = field(default_factory=list)
    keyed: int = 0


def build(registry: Registry, pods_wanted: int) -> list[tuple[KindRun, ResourceInterface, dict[str, Any], list[Any]]]:
    roots = []
    total, i = 0, 0
    while total < pods_wanted:
        api_version, kind, make = WORKLOADS[i % len(WORKLOADS)]
        group, _, version = api_version.rpartition("/")
        iface = registry.lookup(group, version, kind)
        assert iface is not None
        cr, pods = make(f"{kind.lower()}-{i}")
        roots.append((kind, iface, cr, pods))
        total += len(pods)
        i += 1
    runs = {kind: KindRun(kind) for _, kind, _ in WORKLOADS}
    return [(runs[kind], iface, cr, pods) for kind, iface, cr, pods in roots]


def measure(roots: list[tuple[KindRun, ResourceInterface, dict[str, Any], list[Any]]]) -> None:
    for _, iface, _, pods in roots[: len(WORKLOADS)]:  # warm-up: compile caches, allocator
        for pod in pods:
            iface.gang_key(pod)
    for run, iface, cr, pods in roots:
        for pod in pods:
            t0 = time.perf_counter_ns()
            key = iface.gang_key(pod)
            run.key_ms.append((time.perf_counter_ns() - t0) / 1e6)
            run.keyed += key is not None
        t0 = time.perf_counter_ns()
        iface.evaluate(cr, pods)
        run.evaluate_ms.append((time.perf_counter_ns() - t0) / 1e6)


def main() -> None:
    ap = parser(__doc__, quick="1,000 pods instead of 20,000")
    ap.add_argument("--pods", type=int, default=0, help="pods to key (default 20,000; quick 1,000)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    registry = Registry(load_defaults())
    load_s = time.perf_counter() - t0
    roots = build(registry, args.pods or (1_000 if args.quick else 20_000))
    measure(roots)
    runs = list({id(run): run for run, _, _, _ in roots}.values())
    header = f"{'kind':<18}{'pods':>7}{'keyed':>7}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'eval p50 ms':>13}"
    rows = [
        f"{r.kind:<18}{len(r.key_ms):>7}{r.keyed:>7}{median(r.key_ms):>9.4f}{percentile(r.key_ms, 99):>9.4f}"
        f"{max(r.key_ms):>9.3f}{median(r.evaluate_ms):>13.3f}"
        for r in runs
    ]
    every = [ms for r in runs for ms in r.key_ms]
    summary = (
        f"all kinds: {len(every)} pods in {len(roots)} root objects, gang key p50 {median(every):.4f} ms, "
        f"p99 {percentile(every, 99):.4f} ms per pod; loading + compiling {len(runs)} definitions {load_s:.2f} s"
    )
    headline = {
        "pods": len(every),
        "p50_ms_per_pod": round(median(every), 4),
        "p99_ms_per_pod": round(percentile(every, 99), 4),
        "evaluate_p50_ms_per_root": round(median([ms for r in runs for ms in r.evaluate_ms]), 3),
        "load_defaults_s": round(load_s, 3),
    }
    finish("ri_keys", args, [header, *rows, summary], headline)


if __name__ == "__main__":
    main()
