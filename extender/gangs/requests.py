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

from extender.eligibility import matches, preference
from extender.gangs.sources import GangSpec
from extender.node_pools import NodePools, Preference
from extender.node_pools import preference as pool_preference
from extender.objects import PodInfo
from extender.pools import Hardware, Pool
from solver import ClusterSnapshot, EqGroup, GangName, GangRequest, GpuDemand, NodeName, PodShape, Resources, SubGroup

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
    planned: list[tuple[PodInfo | None, str]] = field(default_factory=list)  # members reserved already, where
    groups: dict[str, list[PodInfo]] = field(default_factory=dict)  # EqGroup name -> its pods, in order


def request(snapshot: ClusterSnapshot, entry: Entry, *, hardware: Hardware, pool_models: PoolModels) -> GangRequest:
    """The solver's request for `entry`'s pending members (and `entry.groups` filled in).

    Pending members are grouped by sub-group, shape and placement. Members bound or planned
    already anchor the rest: the domain of the gang's required level they use, and per
    sub-group the domain of its own required level; they count toward the gang's and their
    sub-group's minimum. Node pools and preferred node affinity become each group's node
    scores and tiers."""
    spec = entry.spec
    placed: list[tuple[PodInfo | None, str]] = [(p, p.node) for p in entry.members.bound] + entry.planned
    by_shape: dict[tuple[Any, ...], list[PodInfo]] = defaultdict(list)
    for p in entry.members.pending:
        by_shape[(spec.subgroup_of(p.labels), p.requests, p.demand, p.placement)].append(p)
    anchor = anchor_domain(snapshot, spec.topology.required, [node for _, node in placed])
    running: dict[str, list[str]] = defaultdict(list)  # sub-group -> nodes of its placed members
    for pod, node in placed:
        running[spec.subgroup_of(pod.labels) if pod is not None else ""].append(node)
    subs = {g.name: g for g in spec.subgroups}
    n = len(by_shape)
    eqs = []
    entry.groups = {}
    in_sub: dict[str, list[str]] = defaultdict(list)
    for i, ((sub, req, demand, placement), pods) in enumerate(by_shape.items()):
        name = group_name(i, n)
        entry.groups[name] = pods
        where = anchor
        if sub in subs and running[sub]:  # the sub-group's own required domain, where its members are
            own = anchor_domain(snapshot, subs[sub].topology.required, running[sub])
            where = own if where is None else (where & own if own is not None else where)
        shape = member_shape(snapshot, req, demand, placement, where, hardware=hardware, pool_models=pool_models)
        preferred = node_scores(snapshot, placement, shape.allowed_nodes, pods[0].node_pools)
        if preferred.scores:
            eqs.append(EqGroup(name, shape, len(pods), node_scores=preferred.scores, tiers=preferred.tiers))
        else:  # near its placed peers, by score (pool tiers would keep it off them)
            eqs.append(EqGroup(name, shape, len(pods), node_scores=near(snapshot, [n for _, n in placed])))
        if sub:
            in_sub[sub].append(name)
    subgroups, min_subgroups = _subgroups(spec, in_sub, running)
    # Members beyond a quorum that is already planned or bound join as they fit (at least one).
    need = max(1, spec.min_count - len(placed))
    priority = spec.priority or max((qos_priority(p, hardware) for p in entry.members.pending), default=0)
    return GangRequest(
        GangName(entry.key),
        tuple(eqs),
        min_count=min(need, sum(len(p) for p in by_shape.values())),
        topology=spec.topology,
        priority=priority,
        subgroups=subgroups,
        min_subgroups=min_subgroups,
    )


def _subgroups(
    spec: GangSpec, in_sub: dict[str, list[str]], running: dict[str, list[str]]
) -> tuple[tuple[SubGroup, ...], int]:
    """The sub-groups with pending members, each needing what its placed members do not
    already give it, and how many of them must be placed: a sub-group at its minimum already
    counts toward the gang's quorum of sub-groups and is optional."""
    out, done = [], 0
    for g in spec.subgroups:
        have = len(running[g.name])
        satisfied = have > 0 and have >= max(1, g.min_count)
        done += satisfied
        if in_sub[g.name]:
            left = 1 if satisfied else max(0, g.min_count - have) if g.min_count else 0
            out.append(SubGroup(g.name, tuple(in_sub[g.name]), left, g.topology))
    required = (spec.min_subgroups or len(spec.subgroups)) - done
    if not out:
        return (), 0
    if done:  # some sub-groups are placed already: the others are needed only to reach the quorum
        return tuple(out), min(len(out), max(1, required))
    return tuple(out), min(len(out), spec.min_subgroups) if spec.min_subgroups else 0


def near(snapshot: ClusterSnapshot, nodes: list[str]) -> tuple[tuple[NodeName, int], ...]:
    """Nodes close to the gang's placed members, as node scores: sharing their rack scores
    more than sharing only their block (each topology level above hosts, finest highest), so
    a member that joins late or replaces a failed one goes next to its peers while there is
    room there; () when no member is placed."""
    depth = len([lv for lv in snapshot.levels if lv not in ("kubernetes.io/hostname", "hostname")])
    if not nodes or depth == 0:
        return ()
    paths = {str(n.name): n.topology[:depth] for n in snapshot.nodes}
    anchors = {paths[n] for n in nodes if n in paths}
    if not anchors:
        return ()
    out = []
    for n in snapshot.nodes:
        shared = max(_common(n.topology[:depth], a) for a in anchors)
        if shared:
            out.append((n.name, 100 * shared // depth))
    return tuple(out)


def _common(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """Levels two topology paths share from the coarsest (empty values share nothing)."""
    k = 0
    while k < min(len(a), len(b)) and a[k] and a[k] == b[k]:
        k += 1
    return k


def node_scores(
    snapshot: ClusterSnapshot, placement: str, allowed: frozenset[NodeName] | None, pools: NodePools = ()
) -> Preference:
    """Node pools and preferred node affinity as the solver's node scores and tiers, over the
    allowed nodes. Without pools: affinity normalised as kube-scheduler does (the best node
    100), the solver choosing the tiers; with pools: extender/node_pools.py `preference`
    (pools dominate, affinity orders nodes within each). No scores when neither is stated."""
    nodes = [n for n in snapshot.nodes if allowed is None or n.name in allowed]
    raw: dict[NodeName, int] = {}
    if "preferredDuringScheduling" in placement:
        spec = orjson.loads(placement)
        raw = {n.name: w for n in nodes if (w := preference(n.name, n.labels, spec)) > 0}
    if pools:
        return pool_preference(((n.name, n.labels) for n in nodes), pools, raw)
    best = max(raw.values(), default=0)
    return Preference(tuple(sorted((name, 100 * w // best) for name, w in raw.items())), ())


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
    spec.pop("nodePools", None)  # a preference (node_scores), not eligibility
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


def anchor_domain(snapshot: ClusterSnapshot, required: str, nodes: list[str]) -> frozenset[NodeName] | None:
    """Members already bound or planned fix the domain of the required level."""
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
