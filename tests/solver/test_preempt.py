"""Gang-aware victim choice (solver/preempt.py) on small drawn clusters: one test per tie-breaker,
the required-domain rule, the all-or-nothing answers, and `free` per kind of device.

A scene draws each 8-GPU host as 8 characters, one per GPU: a unit's letter for a GPU one of
its 1-GPU pods holds, "." for an idle GPU, "#" for a pod no one may evict. For instance

    block b0                         block b1
    └── rack r0                      └── rack r0
        ├── h0  XXXXXXXX                 ├── h0  WWWWWWWW
        └── h1  YYYYZZZZ                 └── h1  VVVVVVVV
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from solver import (
    ClusterSnapshot,
    DeviceAssignment,
    GangRequest,
    GpuDevice,
    MigSlice,
    Node,
    NodeName,
    PlanResult,
    Resources,
    SolverParams,
    SolveStatus,
    validate_plan,
)
from solver.mig import MigSlot
from solver.preempt import (
    FITS_NOW,
    NOT_EVEN_ALL,
    ONLY_SPANNING,
    Preemption,
    RunningPod,
    VictimUnit,
    choose_victims,
    free,
    freed,
)
from tests.solver.builders import LEVELS, MODEL, gang, whole

ZONE, BLOCK, RACK, HOST = LEVELS
POD = Resources(1000, 1024, 1)
FAST = SolverParams(time_limit_s=0.2)
Layout = dict[tuple[str, str, str], str]


def scene(layout: Layout, units: dict[str, tuple[int, bool]]) -> tuple[ClusterSnapshot, list[VictimUnit]]:
    """Hosts drawn as in the module doc; `units`: letter -> (priority, borrowed)."""
    nodes = []
    pods: dict[str, list[RunningPod]] = {}
    for (block, rack, host), gpus in sorted(layout.items()):
        name = NodeName(f"{block}{rack}{host}")
        held = [i for i, c in enumerate(gpus) if c != "."]
        for i in held:
            pods.setdefault(gpus[i], []).append(
                RunningPod(f"{gpus[i]}{name}g{i}", name, POD, (DeviceAssignment(i, 1000, 81920),))
            )
        devices = tuple(
            GpuDevice(i, MODEL, 81920, 0 if i in held else 1000, 0 if i in held else 81920) for i in range(8)
        )
        used = Resources(POD.cpu_milli * len(held), POD.memory_mib * len(held), len(held))
        nodes.append(
            Node(name, Resources(128_000, 1_048_576, 110), used, topology=("z0", block, rack, name), gpus=devices)
        )
    victims = [VictimUnit(u, "q", p, tuple(pods.get(u, ())), b) for u, (p, b) in sorted(units.items())]
    return ClusterSnapshot(tuple(nodes), LEVELS), victims


def choose(snapshot: ClusterSnapshot, request: GangRequest, units: list[VictimUnit], **kw: float) -> Preemption:
    """choose_victims, with its plan checked by the independent validator on the freed snapshot."""
    found = choose_victims(snapshot, request, units, params=FAST, **kw)
    if found.plan is not None:
        after = freed(snapshot, [u for u in units if u.name in found.victims])
        assert validate_plan(after, [request], PlanResult(SolveStatus.FEASIBLE, (found.plan,))) == []
        assert found.found
    return found


NODE = gang("p", whole(8), 1)  # one whole 8-GPU node


@pytest.mark.parametrize(
    ("layout", "units", "request_", "victims"),
    [
        pytest.param(
            {("b0", "r0", "h0"): "XXXXXXXX", ("b0", "r0", "h1"): "YYYYYYYY"},
            {"X": (5, False), "Y": (1, False)},
            NODE,
            ("Y",),
            id="lowest highest-priority first",
        ),
        pytest.param(
            {("b0", "r0", "h0"): "XXXXXXXX", ("b0", "r0", "h1"): "YYYYYYYY"},
            {"X": (1, False), "Y": (1, True)},
            NODE,
            ("Y",),
            id="equal priority: borrowed over-quota usage first",
        ),
        pytest.param(
            {("b0", "r0", "h0"): "YYYYZZZZ", ("b0", "r0", "h1"): "XXXXXXXX"},
            {"X": (1, False), "Y": (1, False), "Z": (1, False)},
            NODE,
            ("X",),
            id="equal priority and quota: fewest units, even on the later node",
        ),
        pytest.param(
            {("b0", "r0", "h0"): "XXXXXXXX", ("b0", "r0", "h1"): "YYYY####"},
            {"X": (1, False), "Y": (1, False)},
            gang("p", whole(4), 1),
            ("Y",),
            id="equal units: fewest GPUs freed",
        ),
        pytest.param(
            {("b0", "r0", "h0"): "AAAABBBB", ("b0", "r0", "h1"): "CCCCCCCC"},
            {"A": (0, False), "B": (1, False), "C": (1, False)},
            NODE,
            ("C",),
            id="a cheap unit that does not help is not taken along",
        ),
        pytest.param(
            {("b0", "r0", "h0"): "XXXXXXXX", ("b0", "r0", "h1"): "XXXX...."},
            {"X": (0, False)},
            gang("p", whole(8), 2),
            ("X",),
            id="a gang on two nodes is evicted whole",
        ),
    ],
)
def test_tie_breakers(
    layout: Layout, units: dict[str, tuple[int, bool]], request_: GangRequest, victims: tuple[str, ...]
) -> None:
    """The cheapest set by (highest priority, not borrowed, units, GPUs)."""
    snapshot, candidates = scene(layout, units)
    assert choose(snapshot, request_, candidates).victims == victims


def test_pruning_drops_units_within_quota_before_borrowed_ones() -> None:
    """C straddles both hosts: {B, C} frees h0 and {A, C} frees h1; the kept set is the one
    with borrowed B, since pruning tries to drop units within quota first."""
    layout = {("b0", "r0", "h0"): "CCCCBBBB", ("b0", "r0", "h1"): "CCCCAAAA"}
    snapshot, units = scene(layout, {"A": (0, False), "B": (0, True), "C": (1, False)})
    found = choose(snapshot, NODE, units)
    assert found.victims == ("B", "C")
    assert found.cost == (1, 1, 2, 12000)


def test_victims_the_plan_does_not_need_are_dropped() -> None:
    """With no time to prune by solving, the set found by the solver's search still loses the
    victim whose node the plan does not use (B, in the other rack)."""
    layout = {
        ("b0", "r0", "h0"): "AAAAAAAA",
        ("b0", "r1", "h0"): "BBBBBBBB",
        ("b0", "r0", "h1"): "CCCCCCCC",
        ("b0", "r1", "h1"): "DDDDDDDD",
    }
    snapshot, units = scene(layout, {"A": (0, False), "B": (0, False), "C": (1, False), "D": (1, False)})
    request = gang("p", whole(8), 2, required=BLOCK, slices=((RACK, 2),))
    found = choose(snapshot, request, units, budget_s=0.0)
    assert found.victims == ("A", "C")


def test_cost_reports_the_set() -> None:
    """cost = (highest victim priority, victims not borrowed, units, milli-GPUs freed)."""
    snapshot, units = scene({("b0", "r0", "h0"): "XXXXYYYY"}, {"X": (2, True), "Y": (1, False)})
    found = choose(snapshot, NODE, units)
    assert found.victims == ("X", "Y")
    assert found.cost == (2, 1, 2, 8000)


def test_fits_now_needs_no_victims() -> None:
    """A gang that fits as things are gets a plan and no victims."""
    snapshot, units = scene({("b0", "r0", "h0"): "XXXXXXXX", ("b0", "r0", "h1"): "........"}, {"X": (0, False)})
    found = choose(snapshot, NODE, units)
    assert (found.victims, found.found, found.explanation) == ((), True, FITS_NOW)


def test_not_even_every_unit_is_enough() -> None:
    """Freeing every candidate still leaves too little: not found, with the solver's reason."""
    snapshot, units = scene(
        {("b0", "r0", "h0"): "XXXXXXXX", ("b0", "r0", "h1"): "YYYY####"}, {"X": (0, False), "Y": (0, False)}
    )
    found = choose(snapshot, gang("p", whole(8), 2), units)
    assert not found.found and found.plan is None and found.victims == ()
    assert found.explanation.startswith(f"{NOT_EVEN_ALL}: not enough capacity")


SPANNING: Layout = {
    ("b0", "r0", "h0"): "PPPPTTTT",
    ("b0", "r0", "h1"): "SSSSSSSS",
    ("b1", "r0", "h0"): "SSSSWWWW",
    ("b1", "r0", "h1"): "VVVVVVVV",
}


def test_required_block_never_evicts_a_unit_spanning_blocks() -> None:
    """S spans both blocks, so b0 cannot be freed (without the rule {P, T, S} at priority 0
    would be cheapest); b1 is, at a higher priority."""
    snapshot, units = scene(
        SPANNING, {"P": (0, False), "S": (0, False), "T": (0, False), "W": (3, False), "V": (3, False)}
    )
    found = choose(snapshot, gang("p", whole(4), 3, required=BLOCK), units)
    assert found.victims == ("V", "W")
    assert found.domain == ("z0", "b1")
    assert found.plan is not None
    assert {a.node[:2] for a in found.plan.assignments} == {"b1"}


def test_required_block_fits_only_through_spanning_units() -> None:
    """When only units spanning domains would make room, the answer says so."""
    snapshot, units = scene(SPANNING, {"P": (0, False), "S": (0, False), "T": (0, False)})
    found = choose(snapshot, gang("p", whole(8), 2, required=BLOCK), units)
    assert not found.found
    assert found.explanation == ONLY_SPANNING.format(level=BLOCK)


def test_required_block_takes_the_cheapest_domain() -> None:
    """Both blocks could be freed; the one with the cheaper victims is chosen."""
    layout = {("b0", "r0", "h0"): "AAAAAAAA", ("b1", "r0", "h0"): "BBBBBBBB"}
    snapshot, units = scene(layout, {"A": (2, False), "B": (1, False)})
    found = choose(snapshot, gang("p", whole(8), 1, required=BLOCK), units)
    assert (found.victims, found.domain) == (("B",), ("z0", "b1"))


def test_required_host_level_solves_per_node() -> None:
    """A gang required on one host frees one host, never parts of two."""
    layout = {("b0", "r0", "h0"): "AAAA....", ("b0", "r0", "h1"): "BBBBBB.."}
    snapshot, units = scene(layout, {"A": (0, False), "B": (0, False)})
    found = choose(snapshot, gang("p", whole(2), 3, required=HOST), units)
    assert found.victims == ("A",)
    assert found.domain == ("z0", "b0", "r0", "b0r0h0")


def test_when_counting_is_not_enough_the_solver_decides() -> None:
    """Slices of 2 pods per rack: counting says two nodes anywhere in the block, the solve
    needs both in one rack, so the set grows to a rack's worth."""
    layout = {
        ("b0", "r0", "h0"): "AAAAAAAA",
        ("b0", "r1", "h0"): "BBBBBBBB",
        ("b0", "r0", "h1"): "CCCCCCCC",
        ("b0", "r1", "h1"): "DDDDDDDD",
    }
    snapshot, units = scene(layout, {"A": (0, False), "B": (0, False), "C": (1, False), "D": (1, False)})
    request = gang("p", whole(8), 2, required=BLOCK, slices=((RACK, 2),))
    found = choose(snapshot, request, units)
    assert found.victims in (("A", "C"), ("B", "D"))
    assert found.cost[0] == 1


def test_the_same_input_gives_the_same_answer_in_any_order() -> None:
    """Deterministic: candidates shuffled, the victims and plan do not change."""
    layout = {
        (f"b{b}", f"r{r}", f"h{h}"): "".join("ABCDEFGH"[(b + r + h + i) % 8] for i in range(8))
        for b in (0, 1)
        for r in (0, 1)
        for h in (0, 1)
    }
    snapshot, units = scene(layout, {u: (i % 3, i % 2 == 0) for i, u in enumerate("ABCDEFGH")})
    first = choose(snapshot, gang("p", whole(8), 2, required=BLOCK), units)
    shuffled = list(units)
    random.Random(7).shuffle(shuffled)
    again = choose(snapshot, gang("p", whole(8), 2, required=BLOCK), shuffled)
    assert (again.victims, again.domain, again.cost) == (first.victims, first.domain, first.cost)
    assert first.plan == again.plan


def test_past_the_budget_the_best_so_far_is_returned() -> None:
    """With no time at all, the first domain confirmed is still a valid answer."""
    layout = {("b0", "r0", "h0"): "AAAAAAAA", ("b1", "r0", "h0"): "BBBBBBBB"}
    snapshot, units = scene(layout, {"A": (0, False), "B": (0, False)})
    found = choose(snapshot, gang("p", whole(8), 1, required=BLOCK), units, budget_s=0.0)
    assert found.found and found.victims == ("A",)


# ---------------------------------------------------------------------------- free


def node_with(*devices: GpuDevice) -> Node:
    return Node(NodeName("n"), Resources(128_000, 1_048_576, 110), Resources(4000, 4096, 4), gpus=devices)


def pod(*devices: DeviceAssignment, node: str = "n") -> RunningPod:
    return RunningPod("p", NodeName(node), Resources(1000, 1024, 1), devices)


@pytest.mark.parametrize(
    ("device", "grant", "after"),
    [
        pytest.param(
            GpuDevice(0, MODEL, 81920, 0, 0, tflops=300, free_tflops=0),
            DeviceAssignment(0, 1000, 81920),
            GpuDevice(0, MODEL, 81920, 1000, 81920, tflops=300, free_tflops=300),
            id="whole: the device back in full",
        ),
        pytest.param(
            GpuDevice(0, MODEL, 81920, 300, 20480),
            DeviceAssignment(0, 500, 40960),
            GpuDevice(0, MODEL, 81920, 800, 61440),
            id="share: its milli and memory back",
        ),
        pytest.param(
            GpuDevice(0, MODEL, 81920, 900, 81000),
            DeviceAssignment(0, 500, 40960),
            GpuDevice(0, MODEL, 81920, 1000, 81920),
            id="share: capped at the device's size",
        ),
        pytest.param(
            GpuDevice(0, MODEL, 81920, mig=(MigSlice("1g.10gb", 2), MigSlice("3g.40gb", 0))),
            DeviceAssignment(0, 0, 0, "3g.40gb"),
            GpuDevice(0, MODEL, 81920, mig=(MigSlice("1g.10gb", 2), MigSlice("3g.40gb", 1))),
            id="static MIG: one more free slice of its profile",
        ),
        pytest.param(
            GpuDevice(0, MODEL, 81920, mig=(MigSlice("1g.10gb", 0),)),
            DeviceAssignment(0, 0, 0, "2g.20gb"),
            GpuDevice(0, MODEL, 81920, mig=(MigSlice("1g.10gb", 0), MigSlice("2g.20gb", 1))),
            id="static MIG: a profile not listed is added",
        ),
        pytest.param(
            GpuDevice(0, MODEL, 81920, mig_layout=(MigSlot("1g.10gb", 0), MigSlot("3g.40gb", 4))),
            DeviceAssignment(0, 0, 0, "3g.40gb", mig_start=4),
            GpuDevice(0, MODEL, 81920, mig_layout=(MigSlot("1g.10gb", 0),)),
            id="dynamic MIG: the slice's cut removed",
        ),
    ],
)
def test_free_gives_devices_back(device: GpuDevice, grant: DeviceAssignment, after: GpuDevice) -> None:
    """Each kind of device grant comes back as the device had it before."""
    freed_node = free(node_with(device), [pod(grant)])
    assert freed_node.gpus == (after,)
    assert freed_node.used == Resources(3000, 3072, 3, ())


def test_free_recomputes_idle_gpus_and_ignores_other_nodes() -> None:
    """A whole GPU freed counts as idle again; a pod on another node changes nothing."""
    busy = node_with(GpuDevice(0, MODEL, 81920, 0, 0), GpuDevice(1, MODEL, 81920))
    assert busy.idle_gpus == 1
    assert free(busy, [pod(DeviceAssignment(0, 1000, 81920))]).idle_gpus == 2
    assert free(busy, [pod(DeviceAssignment(0, 1000, 81920), node="other")]) is busy


def test_freed_snapshot_keeps_untouched_nodes() -> None:
    """freed() rebuilds only the nodes the units ran on."""
    snapshot, units = scene({("b0", "r0", "h0"): "AAAAAAAA", ("b0", "r0", "h1"): "########"}, {"A": (0, False)})
    after = freed(snapshot, units)
    assert after.nodes[1] is snapshot.nodes[1]
    assert after.nodes[0] == replace(snapshot.nodes[0], used=Resources(0, 0, 0, ()), gpus=after.nodes[0].gpus)
    assert after.nodes[0].idle_gpus == 8
