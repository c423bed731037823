"""The harder openb variants (benchmarks/trace_variants.py): deterministic per seed, the share
of model-constrained GPU pods as asked, only GPU pods constrained, only models that exist."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from benchmarks.trace_variants import BASE, DATA, constrain, kind, variant

pytestmark = pytest.mark.skipif(not (DATA / BASE).exists(), reason="openb data not present")


def rows() -> list[dict[str, str]]:
    with (DATA / BASE).open() as f:
        return list(csv.DictReader(f))


def models() -> set[str]:
    with (DATA / "openb_node_list_gpu_node.csv").open() as f:
        return {r["model"] for r in csv.DictReader(f)}


@pytest.mark.parametrize("fraction", [0.20, 0.25, 0.33])
def test_the_share_of_constrained_gpu_pods_is_as_asked(fraction: float) -> None:
    base = rows()
    out = constrain(base, fraction)
    gpu = [r for r in out if kind(r) != "cpu"]
    share = sum(1 for r in gpu if r["gpu_spec"]) / len(gpu)
    assert abs(share - fraction) < 0.002
    assert all(not r["gpu_spec"] for r in out if kind(r) == "cpu")
    assert {m for r in out for m in r["gpu_spec"].split("|") if m} <= models()
    kept = [(a, b) for a, b in zip(base, out, strict=True) if a["gpu_spec"]]
    assert all(a["gpu_spec"] == b["gpu_spec"] for a, b in kept)  # gpuspec10's own pins stay
    assert [(r["name"], r["cpu_milli"], r["num_gpu"], r["gpu_milli"]) for r in out] == [
        (r["name"], r["cpu_milli"], r["num_gpu"], r["gpu_milli"]) for r in base
    ]


def test_a_seed_gives_one_variant_and_another_seed_another() -> None:
    base = rows()
    assert constrain(base, 0.25, seed=1) == constrain(base, 0.25, seed=1)
    assert constrain(base, 0.25, seed=1) != constrain(base, 0.25, seed=2)


def test_multi_gpu_pods_draw_from_the_models_multi_gpu_pods_use() -> None:
    base = rows()
    allowed = {r["gpu_spec"] for r in base if kind(r) == "multi" and r["gpu_spec"]}
    out = constrain(base, 0.33)
    assert {r["gpu_spec"] for r in out if kind(r) == "multi" and r["gpu_spec"]} <= allowed


def test_the_variant_file_is_built_once_and_named_like_the_papers(tmp_path: Path) -> None:
    path = variant(0.2, cache=tmp_path)
    assert path.name == "openb_pod_list_gpuspec20.csv"
    stamp = path.stat().st_mtime_ns
    assert variant(0.2, cache=tmp_path) == path and path.stat().st_mtime_ns == stamp
