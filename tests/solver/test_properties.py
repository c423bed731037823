"""Property tests: the independent validator is the oracle for random clusters and gangs."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver import (
    ClusterSnapshot,
    EqGroup,
    GangName,
    GangRequest,
    GpuDemand,
    GpuDevice,
    MigSlice,
    Node,
    NodeName,
    Outcome,
    PodShape,
    Resources,
    Slice,
    SubGroup,
    TopologyRequest,
    plan,
)
from solver.greedy import greedy
from solver.ledger import Ledger
from solver.objective import compactness
from solver.problem import prepare
from solver.topology import TopologyIndex
from solver.validate import validate

LEVELS = ("block", "rack", "kubernetes.io/hostname")
MIG_SLICES = (MigSlice("1g.10gb", 3), MigSlice("3g.40gb", 1))


@st.composite
def devices(draw: st.DrawFn, count: int, mig: bool) -> tuple[GpuDevice, ...]:
    out = []
    for i in range(count):
        if mig:
            out.append(
                GpuDevice(
                    i, "A100", 40960, mig=tuple(MigSlice(s.profile, draw(st.integers(0, s.free))) for s in MIG_SLICES)
                )
            )
            continue
        state = draw(st.sampled_from(["idle", "idle", "used", "shared"]))
        if state == "idle":
            out.append(GpuDevice(i, "A100", 40960))
        elif state == "used":
            out.append(GpuDevice(i, "A100", 40960, 0, 0))
        else:
            free = draw(st.integers(1, 9)) * 100
            out.append(GpuDevice(i, "A100", 40960, free, draw(st.integers(0, 40960))))
    return tuple(out)


@st.composite
def snapshots(draw: st.DrawFn) -> ClusterSnapshot:
    nodes = []
    for b in range(draw(st.integers(1, 2))):
        for r in range(draw(st.integers(1, 2))):
            for h in range(draw(st.integers(1, 3))):
                name = f"b{b}r{r}h{h}"
                gpus = draw(devices(draw(st.integers(1, 4)), draw(st.booleans()) and h == 0))
                cpu_used = draw(st.integers(0, 8)) * 1000
                nodes.append(
                    Node(
                        NodeName(name),
                        Resources(16000, 65536, 8),
                        Resources(cpu_used, 0, 0),
                        topology=(f"b{b}", f"b{b}r{r}", name),
                        gpus=gpus,
                        unschedulable=draw(st.integers(0, 9)) == 0,
                    )
                )
    return ClusterSnapshot(tuple(nodes), LEVELS)


@st.composite
def shapes(draw: st.DrawFn) -> PodShape:
    kind = draw(st.sampled_from(["whole", "share", "memory", "mig", "none", "multi"]))
    gpu = {
        "whole": GpuDemand.whole(draw(st.integers(1, 2))),
        "share": GpuDemand.share(draw(st.integers(1, 9)) * 100),
        "memory": GpuDemand.share(0, draw(st.integers(1, 4)) * 8192),
        "mig": GpuDemand.mig(draw(st.sampled_from([s.profile for s in MIG_SLICES]))),
        "none": GpuDemand(),
        "multi": GpuDemand.share(draw(st.integers(1, 5)) * 100, 0, 2),
    }[kind]
    return PodShape(Resources(draw(st.integers(0, 4)) * 1000, 1024, 1), gpu)


@st.composite
def gangs(draw: st.DrawFn, index: int, balanced: bool = False) -> GangRequest:
    """`balanced`: may ask for balanced placement (then less compact below its preferred level)."""
    count = draw(st.integers(1, 6))
    level = draw(st.sampled_from(["", *LEVELS]))
    preferred = draw(st.sampled_from(["", "rack"]))
    slices = ()
    if draw(st.booleans()) and count % 2 == 0:
        # A slice is never coarser than the required level (admission rejects that).
        fine = ["kubernetes.io/hostname"] if level == "kubernetes.io/hostname" else ["rack", "kubernetes.io/hostname"]
        slices = (Slice(draw(st.sampled_from(fine)), 2),)
    groups = [EqGroup("worker", draw(shapes()), count)]
    if draw(st.integers(0, 3)) == 0:
        groups.insert(0, EqGroup("leader", draw(shapes()), 1))
        slices = ()
    total = sum(g.count for g in groups)
    return GangRequest(
        GangName(f"g{index}"),
        tuple(groups),
        min_count=draw(st.integers(0, total)),
        topology=TopologyRequest(
            level, preferred, slices, balanced=balanced and bool(preferred) and draw(st.booleans())
        ),
        priority=draw(st.integers(0, 2)),
    )


@st.composite
def problems(draw: st.DrawFn) -> tuple[ClusterSnapshot, list[GangRequest]]:
    snapshot = draw(snapshots())
    return snapshot, [draw(gangs(i, balanced=True)) for i in range(draw(st.integers(1, 3)))]


SETTINGS = settings(
    max_examples=int(os.environ.get("PHALANX_HYPOTHESIS_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@SETTINGS
@given(problems())
def test_every_plan_is_valid_and_all_or_nothing(problem: tuple[ClusterSnapshot, list[GangRequest]]) -> None:
    """No plan exceeds a capacity, splits a whole GPU, breaks required topology or places part
    of a gang; unplaced gangs carry an explanation; nothing raises."""
    snapshot, requests = problem
    result = plan(snapshot, requests)
    assert validate(snapshot, requests, result) == []
    for g in result.gangs:
        if g.outcome is not Outcome.PLACED:
            assert g.explanation and not g.assignments


@SETTINGS
@given(problems())
def test_the_solver_places_at_least_what_greedy_places(problem: tuple[ClusterSnapshot, list[GangRequest]]) -> None:
    """Members placed per priority, highest first, never fall behind the greedy baseline."""
    snapshot, requests = problem
    result = plan(snapshot, requests)
    problem_ = prepare(snapshot, requests, TopologyIndex(snapshot))
    base = greedy(problem_, Ledger(snapshot))
    priorities = sorted({r.priority for r in requests}, reverse=True)
    ours = [
        sum(len(g.assignments) for g, r in zip(result.gangs, requests, strict=True) if r.priority == p)
        for p in priorities
    ]
    theirs = [sum(len(m) for k, m in base.items() if requests[k].priority == p) for p in priorities]
    assert ours >= theirs


@SETTINGS
@given(snapshots(), gangs(0))
def test_when_greedy_places_a_gang_the_solver_is_at_least_as_compact(
    snapshot: ClusterSnapshot, request: GangRequest
) -> None:
    topo = TopologyIndex(snapshot)
    problem = prepare(snapshot, [request], topo)
    base = greedy(problem, Ledger(snapshot))
    result = plan(snapshot, [request])
    if 0 in base and len(base[0]) == request.count:
        assert result.gangs[0].outcome is Outcome.PLACED
        assert len(result.gangs[0].assignments) == request.count
        assert result.objective <= compactness(topo, problem.gangs[0], base[0])


# ---------------------------------------------------------------------------- sub-groups and preferences


@st.composite
def subgrouped(draw: st.DrawFn, index: int) -> GangRequest:
    """A gang of 2-3 groups in sub-groups with their own minimum and topology (never coarser
    than the gang's required level), sometimes a group in no sub-group."""
    groups = tuple(EqGroup(f"grp{i}", draw(shapes()), draw(st.integers(1, 3))) for i in range(draw(st.integers(2, 3))))
    required = draw(st.sampled_from(["", "block", "rack"]))
    finer = {
        "": ["", "block", "rack", "kubernetes.io/hostname"],
        "block": ["", "block", "rack", "kubernetes.io/hostname"],
    }
    finer["rack"] = ["", "rack", "kubernetes.io/hostname"]
    subs = []
    names = [g.name for g in groups]
    if draw(st.booleans()):
        names = names[:-1]  # the last group in no sub-group
    for i, name in enumerate(names):
        count = groups[i].count
        level = draw(st.sampled_from(finer[required]))
        slices = (Slice("kubernetes.io/hostname", 2),) if count % 2 == 0 and draw(st.integers(0, 3)) == 0 else ()
        subs.append(SubGroup(f"s{i}", (name,), draw(st.integers(0, count)), TopologyRequest(level, "", slices)))
    total = sum(g.count for g in groups)
    return GangRequest(
        GangName(f"sg{index}"),
        groups,
        min_count=draw(st.integers(0, total)),
        topology=TopologyRequest(required, draw(st.sampled_from(["", "rack"]))),
        priority=draw(st.integers(0, 2)),
        subgroups=tuple(subs),
        min_subgroups=draw(st.integers(0, len(subs))),
    )


@SETTINGS
@given(snapshots(), st.lists(st.integers(0, 1), min_size=1, max_size=3), st.data())
def test_gangs_with_sub_groups_get_valid_plans_next_to_plain_gangs(
    snapshot: ClusterSnapshot, kinds: list[int], data: st.DataObject
) -> None:
    """Every plan passes the validator, whose checks include each sub-group rule (placed whole
    or not at all, its own required domain and slices, the quorum of sub-groups); an unplaced
    gang with sub-groups says why."""
    requests = [data.draw(subgrouped(i) if k else gangs(i)) for i, k in enumerate(kinds)]
    result = plan(snapshot, requests)
    assert validate(snapshot, requests, result) == []
    for g in result.gangs:
        if g.outcome is not Outcome.PLACED:
            assert g.explanation and not g.assignments


@SETTINGS
@given(snapshots(), gangs(0), st.data())
def test_preferred_nodes_never_hide_capacity(snapshot: ClusterSnapshot, gang: GangRequest, data: st.DataObject) -> None:
    """A gang alone that is placed without node scores is placed with them (its last tier is
    the gang as asked). The converse need not hold: a narrower tier can lead the heuristics
    to a placement they miss on the whole cluster."""
    names = [n.name for n in snapshot.nodes]
    scored = tuple(
        EqGroup(
            g.name,
            g.shape,
            g.count,
            node_scores=tuple((n, data.draw(st.integers(1, 100))) for n in names if data.draw(st.booleans())),
        )
        for g in gang.groups
    )
    preferring = GangRequest(gang.name, scored, gang.min_count, gang.topology, gang.priority)
    plain, preferred = plan(snapshot, [gang]), plan(snapshot, [preferring])
    assert validate(snapshot, [preferring], preferred) == []
    if plain.gangs[0].outcome is Outcome.PLACED:
        assert preferred.gangs[0].outcome is Outcome.PLACED
