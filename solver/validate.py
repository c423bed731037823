"""An independent check of a plan against the snapshot: the oracle for every plan the solver
returns and for the property tests. It shares no code with the placement path on purpose:
it recomputes every capacity from the immutable snapshot.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from solver import mig
from solver.mig import MigSlot
from solver.model import (
    FULL_SHARE,
    Assignment,
    ClusterSnapshot,
    DeviceAssignment,
    GangRequest,
    GpuDevice,
    GpuKind,
    Node,
    NodeName,
    Outcome,
    PlanResult,
    PodShape,
)


def validate(snapshot: ClusterSnapshot, requests: list[GangRequest], result: PlanResult) -> list[str]:
    """Every violation found, as text; an empty list means the plan is valid."""
    errors: list[str] = []
    nodes = {n.name: n for n in snapshot.nodes}
    by_name = {r.name: r for r in requests}
    cpu: Counter[str] = Counter()
    mem: Counter[str] = Counter()
    pods: Counter[str] = Counter()
    ext: dict[str, Counter[str]] = defaultdict(Counter)
    share: Counter[tuple[str, int]] = Counter()
    gmem: Counter[tuple[str, int]] = Counter()
    tflops: Counter[tuple[str, int]] = Counter()
    whole: Counter[tuple[str, int]] = Counter()
    users: Counter[tuple[str, int]] = Counter()
    mig: Counter[tuple[str, int, str]] = Counter()
    cuts: dict[tuple[str, int], list[MigSlot]] = defaultdict(list)  # dynamic MIG slices per device
    for gang in result.gangs:
        req = by_name.get(gang.gang)
        if req is None:
            errors.append(f"plan has unknown gang {gang.gang}")
            continue
        errors.extend(_check_gang_counts(req, gang.outcome, len(gang.assignments)))
        groups = {g.name: g for g in req.groups}
        for a in gang.assignments:
            node = nodes.get(a.node)
            group = groups.get(a.group)
            if node is None or group is None:
                errors.append(f"{gang.gang}: member {a.rank} on unknown node {a.node} or group {a.group}")
                continue
            shape = group.shape
            if node.unschedulable or (shape.allowed_nodes is not None and a.node not in shape.allowed_nodes):
                errors.append(f"{gang.gang}: member {a.rank} on ineligible node {a.node}")
            r = shape.requests
            cpu[a.node] += r.cpu_milli
            mem[a.node] += r.memory_mib
            pods[a.node] += r.pods
            for k, v in r.extended:
                ext[k][a.node] += v
            errors.extend(_check_devices(gang.gang, a.rank, node, shape, a.devices))
            for d in a.devices:
                key = (a.node, d.index)
                users[key] += 1
                if d.mig_profile and d.mig_start >= 0:
                    cuts[key].append(MigSlot(d.mig_profile, d.mig_start))
                elif d.mig_profile:
                    mig[(a.node, d.index, d.mig_profile)] += 1
                elif shape.gpu.kind is GpuKind.WHOLE:
                    whole[key] += 1
                else:
                    share[key] += d.milli
                    gmem[key] += d.memory_mib
                    tflops[key] += d.tflops
        errors.extend(_check_topology(snapshot, req, gang.assignments))
    touched = {a.node for gang in result.gangs for a in gang.assignments if a.node in nodes}
    for name in sorted(touched):
        node = nodes[name]
        free = node.free
        if cpu[name] > free.cpu_milli or mem[name] > free.memory_mib or pods[name] > free.pods:
            errors.append(f"node {name}: cpu/memory/pods over free capacity")
        for k, counter in ext.items():
            if counter[name] > free.get(k):
                errors.append(f"node {name}: {k} over free capacity")
        for dev in node.gpus:
            key = (name, dev.index)
            if whole[key] and (whole[key] > 1 or users[key] > 1 or not dev.is_idle):
                errors.append(f"node {name} gpu {dev.index}: whole GPU shared or not idle")
            if share[key] > dev.free_milli or gmem[key] > dev.free_memory_mib or tflops[key] > dev.free_tflops:
                errors.append(f"node {name} gpu {dev.index}: share, memory or TFLOPs over free")
            if (share[key] or gmem[key]) and dev.is_mig:
                errors.append(f"node {name} gpu {dev.index}: share on a MIG device")
            for s in dev.mig:
                if mig[(name, dev.index, s.profile)] > s.free:
                    errors.append(f"node {name} gpu {dev.index}: MIG {s.profile} over free slices")
            if cuts[key]:
                errors.extend(_check_cuts(name, dev, cuts[key], users[key] - len(cuts[key])))
    for (node_name, index, profile), count in mig.items():
        device = next((d for d in nodes[NodeName(node_name)].gpus if d.index == index), None)
        if device is None or sum(s.free for s in device.mig if s.profile == profile) < count:
            errors.append(f"node {node_name} gpu {index}: no free MIG {profile} slice")
    return errors


def _check_cuts(name: str, dev: GpuDevice, added: list[MigSlot], other_users: int) -> list[str]:
    """Dynamic MIG slices on one device: a partitionable GPU in MIG mode or idle, no other
    kind of user, and a layout valid for its model (placements, no overlap, compute)."""
    where = f"node {name} gpu {dev.index}"
    if dev.partition is None:
        return [f"{where}: dynamic MIG slice on a GPU that cannot be partitioned"]
    if other_users or not (dev.mig_layout or dev.is_idle):
        return [f"{where}: dynamic MIG slice on a GPU that is shared or whole-used"]
    return [f"{where}: {v}" for v in mig.violations(dev.partition, (*dev.mig_layout, *added))]


def _check_gang_counts(req: GangRequest, outcome: Outcome, placed: int) -> list[str]:
    if outcome is Outcome.PLACED and not req.quorum <= placed <= req.count:
        return [f"{req.name}: {placed} members placed, needs {req.quorum}..{req.count}"]
    if outcome is not Outcome.PLACED and placed:
        return [f"{req.name}: not placed but has {placed} members (partial gang)"]
    return []


def _check_devices(
    gang: str, rank: int, node: Node, shape: PodShape, devices: tuple[DeviceAssignment, ...]
) -> list[str]:
    gpu = shape.gpu
    if gpu.kind is GpuKind.NONE:
        return [f"{gang}: member {rank} got devices it did not ask for"] if devices else []
    errors = []
    distinct = len({d.index for d in devices}) == len(devices) or gpu.kind is GpuKind.MIG
    if len(devices) != gpu.count or not distinct:
        errors.append(f"{gang}: member {rank} has {len(devices)} devices, needs {gpu.count} distinct")
    known = {d.index: d for d in node.gpus}
    for d in devices:
        dev = known.get(d.index)
        if dev is None:
            errors.append(f"{gang}: member {rank} on missing device {d.index} of {node.name}")
        elif shape.gpu_models is not None and dev.model not in shape.gpu_models:
            errors.append(f"{gang}: member {rank} on GPU model {dev.model}")
        elif gpu.kind is GpuKind.WHOLE and d.milli != FULL_SHARE:
            errors.append(f"{gang}: member {rank} whole GPU split")
        elif gpu.kind is GpuKind.SHARE and (d.milli, d.memory_mib, d.tflops) != (gpu.milli, gpu.memory_mib, gpu.tflops):
            errors.append(f"{gang}: member {rank} share differs from request")
    return errors


def _check_topology(snapshot: ClusterSnapshot, req: GangRequest, assignments: tuple[Assignment, ...]) -> list[str]:
    if not assignments:
        return []
    levels = snapshot.levels
    paths = {n.name: n.topology for n in snapshot.nodes}
    errors = []
    t = req.topology
    if t.required:
        depth = _depth(levels, t.required)
        domains = {paths[a.node][: depth + 1] if depth >= 0 else a.node for a in assignments}
        if len(domains) > 1:
            errors.append(f"{req.name}: required {t.required} violated ({len(domains)} domains)")
    for s in t.slices:
        depth = _depth(levels, s.level)
        ordered = sorted(assignments, key=lambda a: a.rank)
        for start in range(0, len(ordered), s.size):
            chunk = ordered[start : start + s.size]
            domains = {paths[a.node][: depth + 1] if depth >= 0 else a.node for a in chunk}
            if len(chunk) != s.size or len(domains) > 1:
                errors.append(f"{req.name}: slice of ranks {start}.. not whole within one {s.level}")
    return errors


def _depth(levels: tuple[str, ...], level: str) -> int:
    """Index of a level in node paths; -1 for the host itself (a level not in the paths)."""
    return levels.index(level) if level in levels else -1
