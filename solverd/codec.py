"""solver's model <-> rpc/solver.proto messages, field for field: decode(encode(x)) == x for
every snapshot, request list, parameter set and plan (tests/solverd/test_codec.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rpc import solver_pb2 as pb
from solver import (
    Assignment,
    ClusterSnapshot,
    DeviceAssignment,
    EqGroup,
    GangName,
    GangPlan,
    GangRequest,
    GpuDemand,
    GpuDevice,
    MigProfile,
    MigSlice,
    MigSlot,
    MigTable,
    Node,
    NodeName,
    Outcome,
    PlacementMode,
    PlanResult,
    PodShape,
    Resources,
    ScoreBand,
    Slice,
    SolverParams,
    SolveStatus,
    SubGroup,
    TopologyRequest,
    UnlabeledNodes,
    WorkloadClass,
)

# ---------------------------------------------------------------------------- snapshot


def _resources(r: Resources) -> pb.Resources:
    extended = [pb.NamedQuantity(name=k, value=v) for k, v in r.extended]
    return pb.Resources(cpu_milli=r.cpu_milli, memory_mib=r.memory_mib, pods=r.pods, extended=extended)


def _from_resources(m: pb.Resources) -> Resources:
    return Resources(m.cpu_milli, m.memory_mib, m.pods, tuple((q.name, q.value) for q in m.extended))


def _table(t: MigTable) -> pb.MigTable:
    profiles = [
        pb.MigProfile(
            name=p.name,
            compute_slices=p.compute_slices,
            memory_slices=p.memory_slices,
            memory_mib=p.memory_mib,
            starts=p.starts,
            max_count=p.max_count,
        )
        for p in t.profiles
    ]
    return pb.MigTable(
        model=t.model,
        aliases=t.aliases,
        memory_slices=t.memory_slices,
        compute_slices=t.compute_slices,
        memory_mib=t.memory_mib,
        profiles=profiles,
    )


def _from_table(m: pb.MigTable) -> MigTable:
    profiles = tuple(
        MigProfile(p.name, p.compute_slices, p.memory_slices, p.memory_mib, tuple(p.starts), p.max_count)
        for p in m.profiles
    )
    return MigTable(m.model, tuple(m.aliases), m.memory_slices, m.compute_slices, m.memory_mib, profiles)


def _device(d: GpuDevice, tables: dict[int, int]) -> pb.GpuDevice:
    return pb.GpuDevice(
        index=d.index,
        model=d.model,
        memory_mib=d.memory_mib,
        free_milli=d.free_milli,
        free_memory_mib=d.free_memory_mib,
        mig=[pb.MigSlice(profile=s.profile, free=s.free) for s in d.mig],
        tflops=d.tflops,
        free_tflops=d.free_tflops,
        partition=tables[id(d.partition)] + 1 if d.partition is not None else 0,
        mig_layout=[pb.MigSlot(profile=s.profile, start=s.start) for s in d.mig_layout],
    )


def _from_device(m: pb.GpuDevice, tables: Sequence[MigTable]) -> GpuDevice:
    if not 0 <= m.partition <= len(tables):
        raise ValueError(f"gpu {m.index}: partition {m.partition} names no table (mig_tables holds {len(tables)})")
    return GpuDevice(
        index=m.index,
        model=m.model,
        memory_mib=m.memory_mib,
        free_milli=m.free_milli,
        free_memory_mib=m.free_memory_mib,
        mig=tuple(MigSlice(s.profile, s.free) for s in m.mig),
        tflops=m.tflops,
        free_tflops=m.free_tflops,
        partition=tables[m.partition - 1] if m.partition else None,
        mig_layout=tuple(MigSlot(s.profile, s.start) for s in m.mig_layout),
    )


def snapshot(s: ClusterSnapshot) -> pb.ClusterSnapshot:
    tables: dict[int, int] = {}  # id(table) -> its index; a table is sent once
    ordered: list[MigTable] = []
    for node in s.nodes:
        for d in node.gpus:
            if d.partition is not None and id(d.partition) not in tables:
                tables[id(d.partition)] = len(ordered)
                ordered.append(d.partition)
    nodes = [
        pb.Node(
            name=n.name,
            allocatable=_resources(n.allocatable),
            used=_resources(n.used),
            labels=dict(n.labels),
            taints=n.taints,
            topology=n.topology,
            gpus=[_device(d, tables) for d in n.gpus],
            unschedulable=n.unschedulable,
        )
        for n in s.nodes
    ]
    return pb.ClusterSnapshot(
        nodes=nodes, levels=s.levels, generation=s.generation, mig_tables=[_table(t) for t in ordered]
    )


def from_snapshot(m: pb.ClusterSnapshot) -> ClusterSnapshot:
    tables = [_from_table(t) for t in m.mig_tables]
    nodes = tuple(
        Node(
            name=NodeName(n.name),
            allocatable=_from_resources(n.allocatable),
            used=_from_resources(n.used),
            labels=dict(n.labels),
            taints=tuple(n.taints),
            topology=tuple(n.topology),
            gpus=tuple(_from_device(d, tables) for d in n.gpus),
            unschedulable=n.unschedulable,
        )
        for n in m.nodes
    )
    return ClusterSnapshot(nodes, tuple(m.levels), m.generation)


# ---------------------------------------------------------------------------- requests


def _names(values: Iterable[str] | None) -> pb.Names | None:
    return None if values is None else pb.Names(names=sorted(values))


def _topology(t: TopologyRequest) -> pb.TopologyRequest:
    slices = [pb.Slice(level=s.level, size=s.size) for s in t.slices]
    return pb.TopologyRequest(required=t.required, preferred=t.preferred, slices=slices, balanced=t.balanced)


def _from_topology(m: pb.TopologyRequest) -> TopologyRequest:
    return TopologyRequest(m.required, m.preferred, tuple(Slice(s.level, s.size) for s in m.slices), m.balanced)


def _shape(s: PodShape) -> pb.PodShape:
    g = s.gpu
    gpu = pb.GpuDemand(count=g.count, milli=g.milli, memory_mib=g.memory_mib, mig_profile=g.mig_profile)
    gpu.tflops = g.tflops
    return pb.PodShape(
        requests=_resources(s.requests),
        gpu=gpu,
        allowed_nodes=_names(s.allowed_nodes),
        gpu_models=_names(s.gpu_models),
    )


def _from_shape(m: pb.PodShape) -> PodShape:
    g = m.gpu
    return PodShape(
        requests=_from_resources(m.requests),
        gpu=GpuDemand(g.count, g.milli, g.memory_mib, g.mig_profile, g.tflops),
        allowed_nodes=frozenset(NodeName(n) for n in m.allowed_nodes.names) if m.HasField("allowed_nodes") else None,
        gpu_models=frozenset(m.gpu_models.names) if m.HasField("gpu_models") else None,
    )


def _band(b: ScoreBand) -> pb.ScoreBand:
    return pb.ScoreBand(low=b.low, high=b.high, rank=b.rank)


def request(r: GangRequest) -> pb.GangRequest:
    groups = [
        pb.EqGroup(
            name=g.name,
            shape=_shape(g.shape),
            count=g.count,
            node_scores=[pb.NodeScore(node=n, score=s) for n, s in g.node_scores],
            tiers=[_band(b) for b in g.tiers],
        )
        for g in r.groups
    ]
    subgroups = [
        pb.SubGroup(name=s.name, groups=s.groups, min_count=s.min_count, topology=_topology(s.topology))
        for s in r.subgroups
    ]
    return pb.GangRequest(
        name=r.name,
        groups=groups,
        min_count=r.min_count,
        topology=_topology(r.topology),
        priority=r.priority,
        subgroups=subgroups,
        min_subgroups=r.min_subgroups,
    )


def from_request(m: pb.GangRequest) -> GangRequest:
    groups = tuple(
        EqGroup(
            name=g.name,
            shape=_from_shape(g.shape),
            count=g.count,
            node_scores=tuple((NodeName(s.node), s.score) for s in g.node_scores),
            tiers=tuple(ScoreBand(b.low, b.high, b.rank if b.HasField("rank") else None) for b in g.tiers),
        )
        for g in m.groups
    )
    subgroups = tuple(SubGroup(s.name, tuple(s.groups), s.min_count, _from_topology(s.topology)) for s in m.subgroups)
    return GangRequest(
        name=GangName(m.name),
        groups=groups,
        min_count=m.min_count,
        topology=_from_topology(m.topology),
        priority=m.priority,
        subgroups=subgroups,
        min_subgroups=m.min_subgroups,
    )


def params(p: SolverParams) -> pb.SolverParams:
    workload = [
        pb.WorkloadClass(
            cpu_milli=c.cpu_milli,
            gpu_milli=c.gpu_milli,
            num_gpu=c.num_gpu,
            models=_names(c.models),
            probability=c.probability,
            memory_mib=c.memory_mib,
        )
        for c in p.workload
    ]
    return pb.SolverParams(
        time_limit_s=p.time_limit_s,
        workers=p.workers,
        seed=p.seed,
        placement_mode=p.placement_mode.value,
        workload=workload,
        unlabeled_nodes=p.unlabeled_nodes.value,
    )


def from_params(m: pb.SolverParams) -> SolverParams:
    workload = tuple(
        WorkloadClass(
            cpu_milli=c.cpu_milli,
            gpu_milli=c.gpu_milli,
            num_gpu=c.num_gpu,
            models=frozenset(c.models.names) if c.HasField("models") else None,
            probability=c.probability,
            memory_mib=c.memory_mib,
        )
        for c in m.workload
    )
    return SolverParams(
        time_limit_s=m.time_limit_s,
        workers=m.workers,
        seed=m.seed,
        placement_mode=PlacementMode(m.placement_mode),
        workload=workload,
        unlabeled_nodes=UnlabeledNodes(m.unlabeled_nodes),
    )


def solve_request(s: ClusterSnapshot, requests: Sequence[GangRequest], p: SolverParams) -> pb.SolveRequest:
    return pb.SolveRequest(snapshot=snapshot(s), requests=[request(r) for r in requests], params=params(p))


# ---------------------------------------------------------------------------- the plan


def plan(r: PlanResult) -> pb.PlanResult:
    gangs = [
        pb.GangPlan(
            gang=g.gang,
            outcome=g.outcome.value,
            assignments=[
                pb.Assignment(
                    gang=a.gang,
                    group=a.group,
                    rank=a.rank,
                    node=a.node,
                    devices=[
                        pb.DeviceAssignment(
                            index=d.index,
                            milli=d.milli,
                            memory_mib=d.memory_mib,
                            mig_profile=d.mig_profile,
                            tflops=d.tflops,
                            mig_start=d.mig_start,
                        )
                        for d in a.devices
                    ],
                )
                for a in g.assignments
            ],
            explanation=g.explanation,
            domains_used=g.domains_used,
        )
        for g in r.gangs
    ]
    return pb.PlanResult(
        status=r.status.value,
        gangs=gangs,
        objective=r.objective,
        bound=r.bound,
        solve_seconds=r.solve_seconds,
        notes=r.notes,
    )


def from_plan(m: pb.PlanResult) -> PlanResult:
    gangs = tuple(
        GangPlan(
            gang=GangName(g.gang),
            outcome=Outcome(g.outcome),
            assignments=tuple(
                Assignment(
                    gang=GangName(a.gang),
                    group=a.group,
                    rank=a.rank,
                    node=NodeName(a.node),
                    devices=tuple(
                        DeviceAssignment(d.index, d.milli, d.memory_mib, d.mig_profile, d.tflops, d.mig_start)
                        for d in a.devices
                    ),
                )
                for a in g.assignments
            ),
            explanation=g.explanation,
            domains_used=tuple(g.domains_used),
        )
        for g in m.gangs
    )
    return PlanResult(SolveStatus(m.status), gangs, m.objective, m.bound, m.solve_seconds, tuple(m.notes))
