"""Harder variants of the openb trace: more GPU pods pinned to GPU models.

The paper's traces with 20, 25 and 33 % model-constrained GPU pods are not in
shared/data/openb on purpose. The provided `openb_pod_list_gpuspec10.csv` is the default trace
with a `gpu_spec` on 10.4 % of its GPU pods, so the variants are built the same way: start from
gpuspec10 (its constrained pods stay as they are), then give a `gpu_spec` to more GPU pods,
chosen uniformly with a seeded generator, until `fraction` of the GPU pods carry one. Each new
pod's `gpu_spec` is drawn from gpuspec10's own `gpu_spec` values among pods of the same kind
(shares below one GPU, one whole GPU, several GPUs), with their frequencies, so a multi-GPU pod
never draws a model list only share pods used. Only GPU pods are constrained; every model named
exists in the node list.

    python -m benchmarks.trace_variants 0.25            # writes the file, prints its path
    python -m benchmarks.trace_replay --trace gpuspec25 # builds it on first use

The file is named like the paper's (`openb_pod_list_gpuspec25.csv`), so the replay shows the
paper's published FGD figures for that trace next to ours; the published runs used the paper's
own file, which differs pod by pod from this one: compare with our FGD on the same file.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
from collections import Counter, defaultdict
from pathlib import Path

DATA = Path(os.environ.get("PHALANX_OPENB", "/work/shared/data/openb"))
BASE = "openb_pod_list_gpuspec10.csv"
CACHE = Path(os.environ.get("PHALANX_CACHE", Path.home() / ".cache" / "phalanx")) / "traces"
SEED = 2023


def kind(row: dict[str, str]) -> str:
    """Pods of one kind draw their models from the same list."""
    num, milli = int(row["num_gpu"]), int(row["gpu_milli"])
    if num == 0 or milli == 0:
        return "cpu"
    if milli < 1000:
        return "share"
    return "one" if num == 1 else "multi"


def constrain(rows: list[dict[str, str]], fraction: float, seed: int = SEED) -> list[dict[str, str]]:
    """`rows` (a copy) with `gpu_spec` on `fraction` of the GPU pods (never fewer than before)."""
    out = [dict(r) for r in rows]
    specs: dict[str, Counter[str]] = defaultdict(Counter)
    for r in out:
        if r["gpu_spec"].strip():
            specs[kind(r)][r["gpu_spec"].strip()] += 1
    every = Counter[str]()
    for counter in specs.values():
        every.update(counter)
    gpu = [i for i, r in enumerate(out) if kind(r) != "cpu"]
    free = [i for i in gpu if not out[i]["gpu_spec"].strip()]
    want = round(fraction * len(gpu)) - (len(gpu) - len(free))
    rng = random.Random(seed)
    for i in rng.sample(free, max(0, min(want, len(free)))):
        pool = specs.get(kind(out[i])) or every
        values, weights = zip(*sorted(pool.items()), strict=True)
        out[i]["gpu_spec"] = rng.choices(values, weights)[0]
    return out


def variant(fraction: float, *, seed: int = SEED, data: Path = DATA, cache: Path = CACHE) -> Path:
    """The variant's CSV (built once, then reused): `openb_pod_list_gpuspec<percent>.csv`."""
    suffix = "" if seed == SEED else f"-seed{seed}"
    path = cache / f"openb_pod_list_gpuspec{round(fraction * 100)}{suffix}.csv"
    if path.exists():
        return path
    with (data / BASE).open() as f:
        reader = csv.DictReader(f)
        fields = list(reader.fieldnames or [])
        rows = list(reader)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(constrain(rows, fraction, seed))
    tmp.replace(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("fraction", type=float, help="share of GPU pods with a gpu_spec, e.g. 0.25")
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()
    print(variant(args.fraction, seed=args.seed))


if __name__ == "__main__":
    main()
