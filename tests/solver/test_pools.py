"""solver.pools: the LP that holds scarce models for the pods that can only use them, and the
online ledger of what each constrained group still has to claim."""

from __future__ import annotations

import pytest

from solver.frag import WorkloadClass
from solver.pools import ModelPool, PoolLedger, PoolPlan

T4 = frozenset({"T4"})


def pool(model: str, gpus: int, *, cpu: int = 96, memory: int = 512) -> ModelPool:
    """`gpus` GPUs of `model` on nodes with `cpu` cores and `memory` GiB per 8 GPUs."""
    nodes = max(1, gpus // 8)
    return ModelPool(model, gpus * 1000, nodes * cpu * 1000, nodes * memory * 1024)


def gpu_class(probability: float, *, models: frozenset[str] | None = None, cpu: int = 4000) -> WorkloadClass:
    return WorkloadClass(cpu, 1000, 1, models, probability, 8192)


def test_no_constrained_class_gives_an_empty_plan() -> None:
    plan = PoolPlan.build([gpu_class(1.0)], [pool("T4", 16), pool("V100", 16)])
    assert plan.expected == {}
    ledger = PoolLedger(plan)
    assert not ledger.trespasses(None, "T4", free_milli=1000, gpu_milli=1000)


def test_the_scarce_pool_is_held_for_the_group_that_can_only_use_it() -> None:
    # A quarter of the demand can only use T4 (a quarter of the GPUs): the plan gives it all
    # of T4, and the unconstrained rest goes to V100.
    classes = [gpu_class(0.25, models=T4), gpu_class(0.75)]
    plan = PoolPlan.build(classes, [pool("T4", 16), pool("V100", 48)])
    assert plan.expected[T4, "T4"] == pytest.approx(16_000)
    assert plan.expected.get((None, "T4"), 0.0) == pytest.approx(0.0, abs=1e-6)
    assert plan.expected[None, "V100"] == pytest.approx(48_000)
    assert plan.demand[T4] == pytest.approx(16_000)


def test_an_unconstrained_pod_trespasses_where_the_pool_is_held() -> None:
    plan = PoolPlan.build([gpu_class(0.25, models=T4), gpu_class(0.75)], [pool("T4", 16), pool("V100", 48)])
    ledger = PoolLedger(plan)
    assert ledger.held_for_others(None, "T4") == pytest.approx(16_000)
    assert ledger.trespasses(None, "T4", free_milli=16_000, gpu_milli=1000)
    assert not ledger.trespasses(T4, "T4", free_milli=16_000, gpu_milli=1000)
    assert not ledger.trespasses(None, "V100", free_milli=48_000, gpu_milli=1000)


def test_placed_and_skipped_pods_shrink_the_claim() -> None:
    plan = PoolPlan.build([gpu_class(0.25, models=T4), gpu_class(0.75)], [pool("T4", 16), pool("V100", 48)])
    ledger = PoolLedger(plan)
    for _ in range(4):
        ledger.placed(T4, "T4", 1000)
    assert ledger.left(T4, "T4") == pytest.approx(12_000)
    ledger.skipped(T4, 2000)
    assert ledger.left(T4, "T4") == pytest.approx(10_000)
    # 10 GPUs are held: an unconstrained pod fits on T4 once more than 10 GPUs are free there.
    assert ledger.trespasses(None, "T4", free_milli=10_500, gpu_milli=1000)
    assert not ledger.trespasses(None, "T4", free_milli=11_000, gpu_milli=1000)
    ledger.placed(None, "T4", 1000)  # unconstrained pods keep no claims
    assert ledger.left(T4, "T4") == pytest.approx(10_000)
    for _ in range(20):
        ledger.placed(T4, "T4", 1000)
    assert ledger.left(T4, "T4") == 0.0


def test_a_pod_placed_off_its_claim_draws_on_its_other_claims() -> None:
    both = frozenset({"T4", "P100"})
    plan = PoolPlan.build(
        [gpu_class(0.5, models=both), gpu_class(0.5)], [pool("T4", 16), pool("P100", 16), pool("V100", 32)]
    )
    ledger = PoolLedger(plan)
    before = ledger.left(both, "T4") + ledger.left(both, "P100")
    assert before == pytest.approx(32_000)
    ledger.placed(both, "V100", 4000)  # not a claim: the claims shrink in proportion
    assert ledger.left(both, "T4") + ledger.left(both, "P100") == pytest.approx(before - 4000)


def test_cpu_bounds_what_the_plan_holds() -> None:
    # T4-only pods of 12 cores on 16-core nodes of 8 GPUs: the pool's 32 cores take 2.67 such
    # GPUs (relaxed), not 16; the plan holds no more than that.
    heavy = gpu_class(0.5, models=T4, cpu=12_000)
    plan = PoolPlan.build([heavy, gpu_class(0.5)], [pool("T4", 16, cpu=16), pool("V100", 16)])
    assert plan.expected[T4, "T4"] == pytest.approx(2 * 1000 * 16 / 12, rel=1e-6)
    assert plan.expected[T4, "T4"] < 16_000


def test_no_pools_gives_an_empty_plan() -> None:
    assert PoolPlan.build([gpu_class(1.0, models=T4)], []).expected == {}
