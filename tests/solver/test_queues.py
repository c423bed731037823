"""Queues and quotas (solver/queues.py): usage vectors, the tree and its repairs, limits, fair
shares and the fair-share gate, the borrowed rule. The tree most cases use:

    org (deserved gpu 48)      lab (deserved gpu 16, weight 2)      default
    ├── org-x (deserved 32)
    └── org-y (deserved 16, limit 24)
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from solver.model import GpuDemand, PodShape, Resources
from solver.queues import (
    QueueSpec,
    QueueTree,
    add,
    borrowed,
    fair_share_check,
    fair_shares,
    format_amount,
    limit_check,
    limit_excess,
    rollup,
    sub,
    usage_of,
    water_fill,
)

SPECS = (
    QueueSpec("org", deserved={"gpu": 48}),
    QueueSpec("org-x", parent="org", deserved={"gpu": 32}),
    QueueSpec("org-y", parent="org", deserved={"gpu": 16}, limit={"gpu": 24}),
    QueueSpec("lab", deserved={"gpu": 16}, weight=2),
)


def tree(*specs: QueueSpec) -> QueueTree:
    built, errors = QueueTree.build(specs or SPECS)
    assert errors == []
    return built


def gpus(**by_queue: int) -> dict[str, dict[str, int]]:
    return {q.replace("_", "-"): {"gpu": n} for q, n in by_queue.items()}


# ---------------------------------------------------------------------------- vectors

SHAPE = Resources(2000, 4096, 1)


@pytest.mark.parametrize(
    ("shape", "kw", "expected"),
    [
        pytest.param(
            PodShape(SHAPE, GpuDemand.whole(4)),
            {"count": 2, "model": "A100", "device_memory_mib": 81920},
            {"cpu": 4000, "memory": 8192, "gpu": 8, "gpuShare": 8000, "gpuMemory": 655360}
            | {"gpu/A100": 8, "gpuShare/A100": 8000, "gpuMemory/A100": 655360},
            id="whole GPUs count devices, full shares and the device memory, per model too",
        ),
        pytest.param(
            PodShape(SHAPE, GpuDemand.share(500, 20480)),
            {"count": 3},
            {"cpu": 6000, "memory": 12288, "gpuShare": 1500, "gpuMemory": 61440},
            id="a share pod counts its milli and memory, no whole gpu, no model keys without a model",
        ),
        pytest.param(
            PodShape(SHAPE, GpuDemand.mig("3g.40gb")),
            {},
            {"cpu": 2000, "memory": 4096, "gpuShare": 429, "gpuMemory": 40960},
            id="a MIG slice counts 3/7 of a GPU and the profile's memory",
        ),
        pytest.param(
            PodShape(SHAPE, GpuDemand.mig("1g.10gb", count=2)),
            {"model": "H100"},
            {"cpu": 2000, "memory": 4096, "gpuShare": 286, "gpuMemory": 20480}
            | {"gpuShare/H100": 286, "gpuMemory/H100": 20480},
            id="two 1g.10gb slices of one pod",
        ),
        pytest.param(PodShape(Resources(0, 512, 1)), {}, {"memory": 512}, id="zero entries are left out"),
    ],
)
def test_usage_of(shape: PodShape, kw: dict[str, object], expected: dict[str, int]) -> None:
    """What a pod counts against its queue, resource by resource."""
    assert usage_of(shape, **kw) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("resource", "amount", "text"),
    [
        ("cpu", 16000, "16"),
        ("cpu", 15500, "15.5"),
        ("cpu", 250, "0.25"),
        ("memory", 65536, "64Gi"),
        ("memory", 512, "512Mi"),
        ("gpu", 8, "8"),
        ("gpuShare", 2500, "2.5"),
        ("gpuMemory/A100", 81920, "80Gi"),
        ("gpuShare", -500, "-0.5"),
    ],
)
def test_format_amount(resource: str, amount: int, text: str) -> None:
    """Amounts read as users write them: cores, Gi/Mi, device counts, GPUs."""
    assert format_amount(resource, amount) == text


def test_add_and_sub_drop_zero_entries() -> None:
    """Vector arithmetic keeps no zero entries, so equal vectors compare equal."""
    assert add({"gpu": 2, "cpu": 1}, {"gpu": -2, "memory": 3}) == {"cpu": 1, "memory": 3}
    assert sub({"gpu": 2}, {"gpu": 2}) == {}


# ---------------------------------------------------------------------------- the tree


@pytest.mark.parametrize(
    ("specs", "error", "top_level"),
    [
        pytest.param(
            (QueueSpec("a", parent="nowhere"),),
            "queue a: parent nowhere is not a queue; treated as top level",
            {"a"},
            id="unknown parent: top level",
        ),
        pytest.param(
            (QueueSpec("a", parent="b"), QueueSpec("b", parent="a"), QueueSpec("c", parent="a")),
            "queue a: parent chain a -> b -> a is a cycle; treated as top level",
            {"a", "b"},
            id="cycle: every queue on it top level, a queue hanging off it stays below",
        ),
        pytest.param(
            (QueueSpec("a", deserved={"gpu": 16}, limit={"gpu": 8}),),
            "queue a: deserved gpu 16 is above its limit 8",
            {"a"},
            id="deserved above limit",
        ),
        pytest.param(
            (
                QueueSpec("p", deserved={"memory": 65536}),
                QueueSpec("k1", parent="p", deserved={"memory": 49152}),
                QueueSpec("k2", parent="p", deserved={"memory": 32768}),
            ),
            "queue p: its children deserve memory 80Gi together, above its own deserved 64Gi",
            {"p"},
            id="children deserve more than their parent: reported, kept",
        ),
        pytest.param(
            (QueueSpec("a"), QueueSpec("a", weight=5)),
            "queue a: defined twice; the first definition is used",
            {"a"},
            id="duplicate: the first kept",
        ),
        pytest.param(
            (QueueSpec("a", weight=-1),),
            "queue a: weight -1 is negative; 0 is used",
            {"a"},
            id="negative weight: 0",
        ),
    ],
)
def test_build_reports_and_repairs(specs: tuple[QueueSpec, ...], error: str, top_level: set[str]) -> None:
    """Each configuration mistake is reported naming the queue and field, and repaired."""
    built, errors = QueueTree.build(specs)
    assert error in errors
    assert top_level <= set(built.children(""))
    assert "default" in built


def test_build_keeps_the_repairs_in_the_specs() -> None:
    """A repaired queue reads as repaired: the first duplicate, weight 0, parent cleared."""
    built, _ = QueueTree.build((QueueSpec("a", weight=3), QueueSpec("a", weight=5), QueueSpec("b", parent="zz")))
    assert built.get("a") == QueueSpec("a", weight=3)
    assert built.get("b") == QueueSpec("b")


def test_default_queue_exists_unless_given() -> None:
    """The default queue is added (no limit, deserved 0, weight 1) unless the specs define it."""
    built, _ = QueueTree.build(())
    assert built.get("default") == QueueSpec("default")
    built, _ = QueueTree.build((QueueSpec("default", weight=4),))
    assert built.get("default") == QueueSpec("default", weight=4)


def test_chain_children_and_names() -> None:
    """The chain runs from the queue to the top; children are sorted; "" lists the top."""
    t = tree()
    assert [s.name for s in t.chain("org-y")] == ["org-y", "org"]
    assert t.children("org") == ("org-x", "org-y")
    assert t.children("") == ("default", "lab", "org")
    assert t.names == ("default", "lab", "org", "org-x", "org-y")
    assert t.chain("nope") == ()


def test_rollup_adds_descendants() -> None:
    """A parent's amount is its own plus its children's; unknown names are ignored."""
    rolled = rollup(
        tree(), {"org-x": {"gpu": 8}, "org-y": {"gpu": 4, "cpu": 1000}, "org": {"gpu": 1}, "zz": {"gpu": 9}}
    )
    assert rolled["org"] == {"gpu": 13, "cpu": 1000}
    assert rolled["org-x"] == {"gpu": 8}
    assert rolled["lab"] == {}


# ---------------------------------------------------------------------------- limits


@pytest.mark.parametrize(
    ("used", "queue", "need", "what", "expected"),
    [
        pytest.param(gpus(org_y=16, org=16), "org-y", {"gpu": 8}, "gang", "", id="within the limit exactly"),
        pytest.param(
            gpus(org_y=20, org=20),
            "org-y",
            {"gpu": 8},
            "gang",
            "queue org-y: gpu limit 24, in use 20, gang needs 8",
            id="over its own limit",
        ),
        pytest.param(
            gpus(org_x=0, org=60),
            "org-x",
            {"gpu": 8},
            "pod",
            "queue org: gpu limit 64, in use 60, pod needs 8",
            id="an ancestor's limit binds",
        ),
        pytest.param(
            gpus(org_y=24, org=60),
            "org-y",
            {"gpu": 8},
            "gang",
            "queue org-y: gpu limit 24, in use 24, gang needs 8",
            id="the queue itself is reported before its ancestor",
        ),
        pytest.param(
            {"org-y": {"gpu": 24, "memory": 65536}, "org": {"gpu": 24, "memory": 65536}},
            "org-y",
            {"gpu/A100": 1, "memory": 65536, "gpu": 1},
            "gang",
            "queue org-y: memory limit 64Gi, in use 64Gi, gang needs 64Gi",
            id="resources in order: cpu, memory, gpu, ..., then per-model keys",
        ),
        pytest.param({}, "zz", {"gpu": 1}, "gang", "queue zz: no such queue", id="an unknown queue"),
    ],
)
def test_limit_check(
    used: Mapping[str, Mapping[str, int]], queue: str, need: dict[str, int], what: str, expected: str
) -> None:
    """The first limit broken, in the stable wording the extender shows users."""
    limited = (
        QueueSpec("org", limit={"gpu": 64}),
        QueueSpec("org-x", parent="org"),
        QueueSpec("org-y", parent="org", limit={"gpu": 24, "memory": 65536, "gpu/A100": 30}),
    )
    assert limit_check(tree(*limited), used, queue, need, what=what) == expected


# ---------------------------------------------------------------------------- fair shares


@pytest.mark.parametrize(
    ("amount", "weights", "caps", "expected"),
    [
        pytest.param(64, {"a": 1, "b": 1}, {"a": 100, "b": 100}, {"a": 32, "b": 32}, id="equal weights split evenly"),
        pytest.param(
            64, {"a": 2, "b": 1}, {"a": 100, "b": 100}, {"a": 43, "b": 21}, id="by weight, remainder by fraction"
        ),
        pytest.param(5, {"b": 1, "a": 1}, {"a": 9, "b": 9}, {"a": 3, "b": 2}, id="an equal remainder goes by name"),
        pytest.param(64, {"a": 1, "b": 1}, {"a": 10, "b": 100}, {"a": 10, "b": 54}, id="a capped one leaves the rest"),
        pytest.param(64, {"a": 0, "b": 1}, {"a": 100, "b": 40}, {"a": 0, "b": 40}, id="weight 0 gets none; extra kept"),
    ],
)
def test_water_fill(amount: int, weights: dict[str, int], caps: dict[str, int], expected: dict[str, int]) -> None:
    """Integer proportional split with caps, deterministic."""
    assert water_fill(amount, weights, caps) == expected


@pytest.mark.parametrize(
    ("specs", "capacity", "demand", "expected"),
    [
        pytest.param(
            (QueueSpec("a", deserved={"gpu": 40}), QueueSpec("b")),
            64,
            {"a": 50, "b": 100},
            {"a": 50, "b": 14},
            id="deserved first, then the rest by weight up to demand",
        ),
        pytest.param(
            (QueueSpec("a", deserved={"gpu": 48}), QueueSpec("b", deserved={"gpu": 16})),
            32,
            {"a": 100, "b": 100},
            {"a": 24, "b": 8},
            id="deserved above capacity: scaled down in proportion",
        ),
        pytest.param(
            (QueueSpec("a", limit={"gpu": 10}), QueueSpec("b")),
            64,
            {"a": 100, "b": 20},
            {"a": 10, "b": 20},
            id="a limit caps the share; capacity nobody demands stays unassigned",
        ),
        pytest.param(
            (QueueSpec("a", deserved={"gpu": 8}, weight=0), QueueSpec("b")),
            64,
            {"a": 100, "b": 20},
            {"a": 8, "b": 20},
            id="weight 0 never gets idle capacity beyond deserved",
        ),
        pytest.param(
            SPECS,
            100,
            {"org-x": 100, "org-y": 100, "lab": 100, "org": 200},
            {"org": 60, "org-x": 38, "org-y": 22, "lab": 40},
            id="nested: the parent's share is split among its children",
        ),
    ],
)
def test_fair_shares(
    specs: tuple[QueueSpec, ...], capacity: int, demand: dict[str, int], expected: dict[str, int]
) -> None:
    """Fair shares top-down: deserved, then weight, capped by demand and limit."""
    shares = fair_shares(tree(*specs), {"gpu": capacity}, {q: {"gpu": n} for q, n in demand.items()})
    assert {q: shares[q].get("gpu", 0) for q in expected} == expected


def test_fair_shares_are_per_resource() -> None:
    """A queue's GPU share is not cut because it also asks for a lot of CPU (no DRF)."""
    t = tree(QueueSpec("a"), QueueSpec("b"))
    demand = {"a": {"gpu": 64, "cpu": 1_000_000}, "b": {"gpu": 64, "cpu": 1000}}
    shares = fair_shares(t, {"gpu": 64, "cpu": 256_000}, demand)
    assert shares["a"] == {"gpu": 32, "cpu": 255_000}
    assert shares["b"] == {"gpu": 32, "cpu": 1000}


def test_a_parents_own_pods_come_off_its_share_first() -> None:
    """Pods placed in a parent queue directly are served before its children split the rest."""
    t = tree(QueueSpec("p"), QueueSpec("k", parent="p"))
    shares = fair_shares(t, {"gpu": 10}, {"p": {"gpu": 14}, "k": {"gpu": 10}})
    assert shares["p"] == {"gpu": 10}
    assert shares["k"] == {"gpu": 6}


# ---------------------------------------------------------------------------- the gate

TWO = (QueueSpec("a"), QueueSpec("b"))


def gate(
    specs: tuple[QueueSpec, ...], capacity: int, used: dict[str, int], demand: dict[str, int], queue: str, need: int
) -> str:
    t = tree(*specs)
    rolled_used = rollup(t, {q: {"gpu": n} for q, n in used.items()})
    rolled_demand = rollup(t, {q: {"gpu": n} for q, n in demand.items()})
    shares = fair_shares(t, {"gpu": capacity}, rolled_demand)
    return fair_share_check(
        t,
        capacity={"gpu": capacity},
        used=rolled_used,
        demand=rolled_demand,
        shares=shares,
        queue=queue,
        need={"gpu": need},
    )


@pytest.mark.parametrize(
    ("specs", "capacity", "used", "demand", "queue", "need", "expected"),
    [
        pytest.param(TWO, 64, {"a": 24, "b": 24}, {"a": 100, "b": 100}, "a", 8, "", id="within its share"),
        pytest.param(
            TWO,
            64,
            {"a": 32, "b": 16},
            {"a": 100, "b": 100},
            "a",
            8,
            "queue a: gpu fair share 32, in use 32, gang needs 8, while queue b waits below its share",
            id="over its share while a sibling waits below its own",
        ),
        pytest.param(
            TWO,
            64,
            {"a": 32, "b": 24},
            {"a": 100, "b": 28},
            "a",
            4,
            "",
            id="idle capacity beyond what the waiting sibling can use",
        ),
        pytest.param(
            TWO,
            64,
            {"a": 24, "b": 24},
            {"a": 100, "b": 100},
            "a",
            12,
            "",
            id="gangs that do not divide the share: the least served goes past it (tie by name)",
        ),
        pytest.param(
            TWO,
            64,
            {"a": 36, "b": 24},
            {"a": 100, "b": 100},
            "b",
            12,
            "queue b: gpu fair share 32, in use 24, gang needs 12, with only 4 idle",
            id="nothing idle enough: refused even when least served",
        ),
        pytest.param(
            (QueueSpec("a", deserved={"gpu": 48}), QueueSpec("b")),
            64,
            {"a": 40, "b": 24},
            {"a": 100, "b": 100},
            "a",
            8,
            "",
            id="deserved counts even above the computed share",
        ),
        pytest.param(
            SPECS,
            100,
            {"org-x": 30, "org-y": 30, "lab": 20},
            {"org-x": 100, "org-y": 30, "lab": 100},
            "org-x",
            10,
            "queue org: gpu fair share 60, in use 60, gang needs 10, while queue lab waits below its share",
            id="the parent's level refuses when the parent's sibling waits",
        ),
        pytest.param(
            (QueueSpec("org", limit={"gpu": 64}), QueueSpec("a", parent="org"), QueueSpec("b", parent="org")),
            480,
            {"a": 32, "b": 32},
            {"a": 64, "b": 64},
            "a",
            16,
            "queue a: gpu fair share 32, in use 32, gang needs 16, with only 0 idle",
            id="a parent's limit bounds the idle capacity its children compete for",
        ),
        pytest.param(
            (QueueSpec("org", limit={"gpu": 64}), QueueSpec("a", parent="org"), QueueSpec("b", parent="org")),
            480,
            {"a": 32, "b": 0},
            {"a": 64, "b": 64},
            "a",
            16,
            "queue a: gpu fair share 32, in use 32, gang needs 16, while queue b waits below its share",
            id="the cluster's idle capacity beyond a parent's limit is not its children's",
        ),
    ],
)
def test_fair_share_check(
    specs: tuple[QueueSpec, ...],
    capacity: int,
    used: dict[str, int],
    demand: dict[str, int],
    queue: str,
    need: int,
    expected: str,
) -> None:
    """The gate for idle capacity, in the stable wording users see."""
    assert gate(specs, capacity, used, demand, queue, need) == expected


def test_indivisible_gangs_do_not_deadlock() -> None:
    """Two queues short of their share by less than a gang: one of them always goes on."""
    admitted = [q for q in ("a", "b") if gate(TWO, 64, {"a": 24, "b": 24}, {"a": 100, "b": 100}, q, 12) == ""]
    assert admitted == ["a"]


# ---------------------------------------------------------------------------- borrowed


@pytest.mark.parametrize(
    ("units", "resources", "expected"),
    [
        pytest.param([("u1", {"gpu": 8}), ("u2", {"gpu": 8})], None, set(), id="all within deserved"),
        pytest.param(
            [("u1", {"gpu": 8}), ("u2", {"gpu": 16}), ("u3", {"gpu": 2})],
            None,
            {"u2", "u3"},
            id="the crossing unit and every later one, even one that would still fit",
        ),
        pytest.param(
            [("u1", {"gpu": 8, "cpu": 1000})], None, {"u1"}, id="a resource deserved does not name counts as 0"
        ),
        pytest.param(
            [("u1", {"gpu": 8, "cpu": 1000}), ("u2", {"gpu": 10})],
            ("gpu",),
            {"u2"},
            id="only the resources compared",
        ),
    ],
)
def test_borrowed(
    units: list[tuple[str, dict[str, int]]], resources: tuple[str, ...] | None, expected: set[str]
) -> None:
    """Over-quota units of one queue in keep order."""
    assert borrowed({"gpu": 16}, units, resources=resources) == expected


def test_limit_excess_says_how_much_each_limited_queue_must_free() -> None:
    """The queue and every ancestor over a limit, each with how far over it would go."""
    t = tree(
        QueueSpec("org", limit={"gpu": 64}),
        QueueSpec("a", parent="org", limit={"gpu": 40}),
        QueueSpec("b", parent="org"),
    )
    used = rollup(t, {"a": {"gpu": 32}, "b": {"gpu": 24}})
    assert limit_excess(t, used, "a", {"gpu": 16}) == {"a": {"gpu": 8}, "org": {"gpu": 8}}
    assert limit_excess(t, used, "b", {"gpu": 8}) == {}
