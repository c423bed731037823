"""Pattern packing of GPU shares: the plan's LP and the online packer."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from solver.frag import WorkloadClass
from solver.model import FULL_SHARE
from solver.packing import HEADROOM, Packer, PackingPlan


def share(milli: int, p: float, cpu: int = 4000, memory: int = 8192) -> WorkloadClass:
    return WorkloadClass(cpu, milli, 1, None, p, memory)


def coverage(plan: PackingPlan) -> Counter[int]:
    out: Counter[int] = Counter()
    for pattern, w in zip(plan.patterns, plan.weights, strict=True):
        for s in pattern:
            out[s] += w  # type: ignore[assignment]
    return out


def test_complements_share_a_device() -> None:
    plan = PackingPlan.build([share(810, 0.25), share(190, 0.25), WorkloadClass(8000, 1000, 1, None, 0.5)])
    assert plan.patterns == ((810, 190),)
    assert plan.weights == pytest.approx((0.5,))
    assert plan.devices_per_pod() == pytest.approx(0.5)


@pytest.mark.parametrize("seed", range(20))
def test_the_mix_covers_every_size_exactly_within_one_gpu(seed: int) -> None:
    rng = random.Random(seed)
    sizes = rng.sample(range(50, 1000, 10), rng.randint(1, 12))
    classes = [share(s, rng.random() + 0.01) for s in sizes]
    plan = PackingPlan.build(classes)
    total = sum(c.probability for c in classes)
    got = coverage(plan)
    for c in classes:
        assert got[c.gpu_milli] == pytest.approx(c.probability / total, abs=1e-6)
    assert all(sum(p) <= FULL_SHARE for p in plan.patterns)
    volume = sum(c.gpu_milli * c.probability for c in classes) / total / FULL_SHARE
    assert volume - 1e-6 <= plan.devices_per_pod() <= 1 + 1e-6  # between the volume bound and one device each


def test_no_share_classes_no_plan() -> None:
    plan = PackingPlan.build([WorkloadClass(4000, 1000, 1, None, 0.7), WorkloadClass(2000, 0, 0, None, 0.3)])
    assert plan.patterns == () and not plan.knows(500)


def test_a_device_opened_for_a_pattern_awaits_the_rest_and_reserves_for_it() -> None:
    plan = PackingPlan.build([share(810, 0.5, cpu=6000), share(190, 0.5, cpu=2000, memory=1024)])
    packer = Packer(plan)
    packer.placed("n1", 0, 810, fresh=True)
    assert packer.awaits("n1", 0, 190) and not packer.awaits("n1", 0, 810)
    assert packer.awaiting(190) == {("n1", 0)}
    assert packer.reserved("n1") == pytest.approx((2000.0, 1024.0))
    packer.placed("n1", 0, 190, fresh=False)
    assert not packer.awaiting(190) and packer.reserved("n1") == (0.0, 0.0)
    assert list(packer.reservations()) == []


def test_opening_needs_headroom_for_the_missing_members() -> None:
    plan = PackingPlan.build([share(500, 1.0, cpu=3000, memory=4096)])
    assert plan.patterns == ((500, 500),)
    assert Packer(plan).opening_need(500) == pytest.approx((HEADROOM * 3000, HEADROOM * 4096))
    assert Packer(plan, headroom=1.0).opening_need(500) == pytest.approx((3000, 4096))


def test_openings_follow_the_mix() -> None:
    """Pods drawn from the workload, each joining a device that awaits it or opening one: the
    devices opened per pattern track the LP's mix, and almost every device completes."""
    plan = PackingPlan.build([share(650, 0.25), share(320, 0.75)])
    weights = dict(zip(plan.patterns, plan.weights, strict=True))
    assert set(weights) == {(650, 320), (320, 320, 320)}
    packer = Packer(plan)
    rng = random.Random(7)
    opened: Counter[tuple[int, ...]] = Counter()
    n = 2000
    for i in range(n):
        size = 650 if rng.random() < 0.25 else 320
        waiting = sorted(packer.awaiting(size), key=str)
        if waiting:
            node, device = waiting[0]
            packer.placed(node, device, size, fresh=False)
        else:
            pattern = packer.pattern_for(size)
            assert pattern is not None
            opened[pattern] += 1
            packer.placed(f"n{i}", 0, size, fresh=True)
    for pattern, w in weights.items():
        assert opened[pattern] == pytest.approx(w * n, rel=0.1)
    assert sum(len(packer.awaiting(s)) for s in (320, 650)) < 0.05 * sum(opened.values())


def test_a_pod_outside_the_pattern_ends_the_wait() -> None:
    plan = PackingPlan.build([share(810, 0.5), share(190, 0.5)])
    packer = Packer(plan)
    packer.placed("n1", 0, 810, fresh=True)
    packer.placed("n1", 0, 100, fresh=False)  # not a planned size
    assert not packer.awaiting(190) and packer.reserved("n1") == (0.0, 0.0)


def test_adopt_rebuilds_from_contents() -> None:
    plan = PackingPlan.build([share(650, 0.25), share(320, 0.75)])
    packer = Packer(plan)
    packer.adopt("n1", 0, [320, 320])
    assert packer.awaits("n1", 0, 320)  # only (320, 320, 320) holds two 320s
    packer.adopt("n1", 1, [650])
    assert packer.awaits("n1", 1, 320)
    packer.adopt("n1", 2, [650, 650])  # no pattern holds it
    assert not any(packer.awaits("n1", 2, s) for s in (320, 650))
    packer.adopt("n1", 0, [])
    assert not packer.awaits("n1", 0, 320)
    assert packer.awaiting(320) == {("n1", 1)}
