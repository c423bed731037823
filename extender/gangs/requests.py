"""Gang members to a solver `GangRequest`: pure functions over the snapshot and the pods.

Members with one shape and placement form an `EqGroup`; their eligibility (node selector,
required affinity, tolerations, GPU pool) becomes the group's allowed nodes, within the
domain of the required topology level that members already bound or planned fix (the
anchor). `split` is the one rule for which members still need a plan.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from extender.eligibility import matches
from extender.gangs.sources import GangSpec
from extender.objects import PodInfo
from extender.pools import Hardware, Pool
from solver import ClusterSnapshot, EqGroup, GangName, GangRequest, GpuDemand, NodeName, PodShape, Resources

PoolModels = Callable[[Pool], frozenset[str] | None]
WAITING_QUORUM = "waiting for gang quorum"


@dataclass(frozen=True, slots=True)
class Members:
    """A gang's active members, split by what they still need."""

    pending: list[PodInfo]  # neither bound nor planned: what a solve places
    bound: list[PodInfo]  # bound (the watch shows a node), or bound by this process while the watch lags


def split(pods: Sequence[PodInfo], *, planned: Collection[str], bound_here: Collection[str]) -> Members:
    """The one member split. A member this process bound is never pending again, even while
    the watch has not shown its node yet: a gang is never planned twice."""
    bound = [p for p in pods if p.node or p.uid in bound_here]
    pending = [p for p in pods if not p.node and p.uid not in bound_here and p.uid not in planned]
    return Members(pending, bound)


def quorum_shortfall(spec: GangSpec, pods: Sequence[PodInfo]) -> str:
    """Why the gang cannot be planned yet for want of members ("" when it can): fewer than
    minCount members, or a sub-group that must be placed with fewer members than its minimum.
    No eviction helps either: the members do not exist yet."""
    if len(pods) < spec.min_count:
        return f"{WAITING_QUORUM} {len(pods)}/{spec.min_count}"
    if not spec.subgroups:
        return ""
    present: dict[str, int] = defaultdict(int)
    for p in pods:
        present[spec.subgroup_of(p.labels)] += 1
    short = [(g, present[g.name]) for g in spec.subgroups if present[g.name] < max(1, g.min_count)]
    required = len(spec.subgroups) if not spec.min_subgroups else spec.min_subgroups
    if len(spec.subgroups) - len(short) >= required:
        return ""
    g, have = short[0]
    return f"{WAITING_QUORUM} of sub-group {g.name} {have}/{max(1, g.min_count)}"


@dataclass
class Entry:
    """One gang about to be planned: its unplanned members grouped by shape and placement."""

    key: str
    spec: GangSpec
    members: Members
    planned_nodes: list[str] = field(default_factory=list)  # nodes of members reserved already
    groups: dict[str, list[PodInfo]] = field(default_factory=dict)  # EqGroup name -> its pods, in order


def request(snapshot: ClusterSnapshot, entry: Entry, *, hardware: Hardware, pool_models: PoolModels) -> GangRequest:
    """The solver's request for `entry`'s pending members (and `entry.groups` filled in)."""
    spec = entry.spec
    # Members beyond a quorum that is already planned or bound join as they fit (at least one).
    need = max(1, spec.min_count - len(entry.planned_nodes) - len(entry.members.bound))
    by_shape: dict[tuple[Any, ...], list[PodInfo]] = defaultdict(list)
    for p in entry.members.pending:
        by_shape[(p.requests, p.demand, p.placement)].append(p)
    anchor = anchor_domain(snapshot, spec, [p.node for p in entry.members.bound] + entry.planned_nodes)
    n = len(by_shape)
    eqs = []
    entry.groups = {}
    for i, ((req, demand, placement), pods) in enumerate(by_shape.items()):
        name = group_name(i, n)
        entry.groups[name] = pods
        shape = member_shape(snapshot, req, demand, placement, anchor, hardware=hardware, pool_models=pool_models)
        eqs.append(EqGroup(name, shape, len(pods)))
    priority = spec.priority or max((qos_priority(p, hardware) for p in entry.members.pending), default=0)
    return GangRequest(GangName(entry.key), tuple(eqs), min_count=need, topology=spec.topology, priority=priority)


def member_shape(
    snapshot: ClusterSnapshot,
    req: Resources,
    demand: GpuDemand,
    placement: str,
    anchor: frozenset[NodeName] | None,
    *,
    hardware: Hardware,
    pool_models: PoolModels,
) -> PodShape:
    """Members' shape: eligibility (selector, affinity, taints, GPU pool) within the anchor."""
    spec = orjson.loads(placement) if placement else {}
    allowed = allowed_nodes(snapshot, spec, anchor)
    pool_name = spec.get("gpuPool", "")
    if not pool_name:
        return PodShape(req, demand, allowed_nodes=allowed)
    pool = hardware.by_name.get(pool_name)
    if pool is None:  # an undefined pool: no node qualifies, the explanation says why
        return PodShape(req, demand, allowed_nodes=frozenset())
    in_pool = frozenset(
        n.name for n in snapshot.nodes if (allowed is None or n.name in allowed) and pool.contains(n.name, n.labels)
    )
    return PodShape(req, demand, allowed_nodes=in_pool, gpu_models=pool_models(pool))


def qos_priority(pod: PodInfo, hardware: Hardware) -> int:
    pool = hardware.by_name.get(pod.pool) if pod.pool else None
    return pool.priority(pod.qos) if pool is not None else 0


def allowed_nodes(
    snapshot: ClusterSnapshot, spec: dict[str, Any], anchor: frozenset[NodeName] | None
) -> frozenset[NodeName] | None:
    """Nodes the members' nodeSelector, required affinity and tolerations allow, within the
    anchor domain; None for "every node"."""
    if not spec:
        return anchor
    return frozenset(
        n.name
        for n in snapshot.nodes
        if (anchor is None or n.name in anchor) and matches(n.name, n.labels, taints(n.taints), spec)
    )


def anchor_domain(snapshot: ClusterSnapshot, spec: GangSpec, nodes: list[str]) -> frozenset[NodeName] | None:
    """Members already bound or planned fix the domain of the required level."""
    required = spec.topology.required
    if not nodes or not required or required not in snapshot.levels:
        return None
    depth = snapshot.levels.index(required)
    paths: dict[str, tuple[str, ...]] = {str(n.name): n.topology for n in snapshot.nodes}
    domains = {paths[n][: depth + 1] for n in nodes if n in paths}
    return frozenset(n.name for n in snapshot.nodes if n.topology[: depth + 1] in domains)


def taints(values: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """Taints as the cache writes them ("key=value:effect") back to (key, value, effect)."""
    out = []
    for t in values:
        key_value, _, effect = t.rpartition(":")
        key, _, value = key_value.partition("=")
        out.append((key, value, effect))
    return out


def group_name(index: int, groups: int) -> str:
    """Members with one shape and placement; the name appears in explanations."""
    return "members" if groups == 1 else f"members-{index + 1}"
