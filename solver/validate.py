"""An independent check of a plan against the snapshot: the oracle for every plan the solver
returns and for the property tests. It shares no code with the placement path on purpose: it
recomputes every capacity from the immutable snapshot.

Design. `Facts` reads the plan once: the members whose gang, node and group resolve, and what
they take of each node and device, tallied by the kind of GPU their pod asked for. Each rule a
plan must keep is a `Check` in `CHECKS`: a name, a reason constant and a function that yields the
fields of each violation. Checks are independent of each other (a plan that breaks one rule
trips that rule's check), so each can be tested on its own hand-made bad plan and disabled on
its own to show that some test notices (tests/solver/test_validate.py,
tests/validator_mutations.py). The module is over 400 lines because the checks belong together:
the registry at the bottom reads as the list of every rule a plan keeps.

Not checked here: taints, tolerations, selectors and affinity, which the extender resolves into
`PodShape.allowed_nodes` (checked); preferred topology and node scores, which are preferences.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from solver import mig
from solver.mig import MigSlot
from solver.model import (
    FULL_SHARE,
    Assignment,
    ClusterSnapshot,
    EqGroup,
    GangPlan,
    GangRequest,
    GpuDevice,
    GpuKind,
    Node,
    NodeName,
    Outcome,
    PlanResult,
    SubGroup,
)

Fields = Mapping[str, object]


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: the check that found it, its reason constant and the filled-in text."""

    check: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Member:
    """One assignment whose gang, node and group all resolve."""

    request: GangRequest
    assignment: Assignment
    node: Node
    group: EqGroup
    first_rank: int  # the group's ranks are first_rank .. first_rank + group.count - 1


@dataclass(slots=True)
class DeviceUse:
    """What the plan takes of one device, by the kind of GPU each member asked for."""

    users: int = 0  # grants of any kind
    whole: int = 0
    shares: int = 0  # share grants
    milli: int = 0
    memory_mib: int = 0
    tflops: int = 0
    slices: Counter[str] = field(default_factory=Counter)  # static MIG slices per profile
    cuts: list[MigSlot] = field(default_factory=list)  # dynamic MIG slices to cut


@dataclass(slots=True)
class NodeUse:
    cpu_milli: int = 0
    memory_mib: int = 0
    pods: int = 0
    extended: Counter[str] = field(default_factory=Counter)


class Facts:
    """The plan read once against the snapshot and the requests."""

    def __init__(self, snapshot: ClusterSnapshot, requests: list[GangRequest], result: PlanResult) -> None:
        self.snapshot = snapshot
        self.requests = requests
        self.result = result
        self.nodes = {n.name: n for n in snapshot.nodes}
        self.by_name = {r.name: r for r in requests}
        self.answered = [(g, self.by_name[g.gang]) for g in result.gangs if g.gang in self.by_name]
        self.members: list[Member] = []
        self.node_use: dict[NodeName, NodeUse] = defaultdict(NodeUse)
        self.device_use: dict[tuple[NodeName, int], DeviceUse] = defaultdict(DeviceUse)
        for gang, request in self.answered:
            firsts = _first_ranks(request)
            groups = {g.name: g for g in request.groups}
            for a in gang.assignments:
                node, group = self.nodes.get(a.node), groups.get(a.group)
                if node is not None and group is not None:
                    self._add(Member(request, a, node, group, firsts[group.name]))

    def _add(self, m: Member) -> None:
        self.members.append(m)
        r = m.group.shape.requests
        use = self.node_use[m.node.name]
        use.cpu_milli += r.cpu_milli
        use.memory_mib += r.memory_mib
        use.pods += r.pods
        for k, v in r.extended:
            use.extended[k] += v
        kind = m.group.shape.gpu.kind
        indexes = {d.index for d in m.node.gpus}
        for d in m.assignment.devices:
            if kind is GpuKind.NONE or d.index not in indexes:
                continue  # reported by devices_unasked / device_exists
            dev = self.device_use[(m.node.name, d.index)]
            dev.users += 1
            if kind is GpuKind.WHOLE:
                dev.whole += 1
            elif kind is GpuKind.SHARE:
                dev.shares += 1
                dev.milli += d.milli
                dev.memory_mib += d.memory_mib
                dev.tflops += d.tflops
            elif d.mig_start >= 0:
                dev.cuts.append(MigSlot(d.mig_profile, d.mig_start))
            else:
                dev.slices[d.mig_profile] += 1

    def devices(self) -> Iterator[tuple[NodeName, GpuDevice, DeviceUse]]:
        """Every device the plan uses, with its use, in node then index order."""
        return iter(self._devices)

    @cached_property
    def _devices(self) -> list[tuple[NodeName, GpuDevice, DeviceUse]]:
        """Sorted and looked up once: a dozen checks walk them (a 512-node gang: 4,096 devices)."""
        out = []
        for (name, index), use in sorted(self.device_use.items()):
            dev = next(d for d in self.nodes[name].gpus if d.index == index)
            out.append((name, dev, use))
        return out

    def domain(self, level: str, node: Node) -> tuple[str, ...]:
        """The node's domain at `level`; the host itself for a level not in the paths."""
        if level not in self.snapshot.levels:
            return (node.name,)
        return node.topology[: self.snapshot.levels.index(level) + 1]


def _first_ranks(request: GangRequest) -> dict[str, int]:
    """Groups of a gang are ranked in the order given: each group's first rank."""
    firsts: dict[str, int] = {}
    offset = 0
    for g in request.groups:
        firsts[g.name] = offset
        offset += g.count
    return firsts


Find = Callable[[Facts], Iterator[Fields]]


@dataclass(frozen=True, slots=True)
class Check:
    """One rule: `find` yields the fields of each violation, which fill in `reason`."""

    name: str
    reason: str
    find: Find


def violations(snapshot: ClusterSnapshot, requests: list[GangRequest], result: PlanResult) -> list[Violation]:
    """Every violation found, check by check in `CHECKS` order; empty when the plan is valid."""
    facts = Facts(snapshot, requests, result)
    return [Violation(c.name, c.reason, c.reason.format(**f)) for c in CHECKS for f in c.find(facts)]


def validate(snapshot: ClusterSnapshot, requests: list[GangRequest], result: PlanResult) -> list[str]:
    """Every violation found, as text; an empty list means the plan is valid."""
    return [v.message for v in violations(snapshot, requests, result)]


# ---------------------------------------------------------------------------- gangs

UNKNOWN_GANG = "plan answers gang {gang}, which no request names"
ANSWERED = "gang {gang} answered {times} times for {asked} requests"
QUORUM = "{gang}: {placed} members placed, needs {quorum}..{count}"
PARTIAL = "{gang}: {outcome} but has {placed} members (partial gang)"


def _unknown_gangs(f: Facts) -> Iterator[Fields]:
    for g in f.result.gangs:
        if g.gang not in f.by_name:
            yield {"gang": g.gang}


def _answered_once(f: Facts) -> Iterator[Fields]:
    asked = Counter(r.name for r in f.requests)
    times = Counter(g.gang for g in f.result.gangs)
    for name in sorted(asked):
        if times[name] != asked[name]:
            yield {"gang": name, "times": times[name], "asked": asked[name]}


def _quorum(f: Facts) -> Iterator[Fields]:
    for g, r in f.answered:
        if g.outcome is Outcome.PLACED and not r.quorum <= len(g.assignments) <= r.count:
            yield {"gang": r.name, "placed": len(g.assignments), "quorum": r.quorum, "count": r.count}


def _all_or_nothing(f: Facts) -> Iterator[Fields]:
    for g, _ in f.answered:
        if g.outcome is not Outcome.PLACED and g.assignments:
            yield {"gang": g.gang, "outcome": g.outcome.value, "placed": len(g.assignments)}


# ---------------------------------------------------------------------------- members

OTHER_GANG = "{gang}: member {rank} is labelled gang {other}"
UNKNOWN_NODE = "{gang}: member {rank} on unknown node {node}"
UNKNOWN_GROUP = "{gang}: member {rank} in unknown group {group}"
RANK_OUTSIDE = "{gang}: member {rank} outside group {group}'s ranks {first}..{last}"
RANK_TWICE = "{gang}: rank {rank} given {times} times"
CORDONED = "{gang}: member {rank} on cordoned node {node}"
NOT_ALLOWED = "{gang}: member {rank} on node {node}, outside its allowed nodes"


def _assignments(f: Facts) -> Iterator[tuple[GangPlan, GangRequest, Assignment]]:
    for g, r in f.answered:
        for a in g.assignments:
            yield g, r, a


def _other_gang(f: Facts) -> Iterator[Fields]:
    for g, _, a in _assignments(f):
        if a.gang != g.gang:
            yield {"gang": g.gang, "rank": a.rank, "other": a.gang}


def _unknown_nodes(f: Facts) -> Iterator[Fields]:
    for g, _, a in _assignments(f):
        if a.node not in f.nodes:
            yield {"gang": g.gang, "rank": a.rank, "node": a.node}


def _unknown_groups(f: Facts) -> Iterator[Fields]:
    for g, r, a in _assignments(f):
        if a.group not in {eq.name for eq in r.groups}:
            yield {"gang": g.gang, "rank": a.rank, "group": a.group}


def _rank_in_group(f: Facts) -> Iterator[Fields]:
    for m in f.members:
        a, first = m.assignment, m.first_rank
        if not first <= a.rank < first + m.group.count:
            last = first + m.group.count - 1
            yield _who(m, group=a.group, first=first, last=last)


def _rank_once(f: Facts) -> Iterator[Fields]:
    for g, _ in f.answered:
        ranks = Counter(a.rank for a in g.assignments)
        for rank in sorted(r for r, n in ranks.items() if n > 1):
            yield {"gang": g.gang, "rank": rank, "times": ranks[rank]}


def _cordoned(f: Facts) -> Iterator[Fields]:
    for m in f.members:
        if m.node.unschedulable:
            yield {"gang": m.request.name, "rank": m.assignment.rank, "node": m.node.name}


def _not_allowed(f: Facts) -> Iterator[Fields]:
    for m in f.members:
        allowed = m.group.shape.allowed_nodes
        if allowed is not None and m.node.name not in allowed:
            yield {"gang": m.request.name, "rank": m.assignment.rank, "node": m.node.name}


# ---------------------------------------------------------------------------- node scalars

CPU_OVER = "node {node}: cpu {used}m over free {free}m"
MEMORY_OVER = "node {node}: memory {used}Mi over free {free}Mi"
PODS_OVER = "node {node}: {used} pods over {free} free pod slots"
EXTENDED_OVER = "node {node}: {resource} {used} over free {free}"


def _scalar(attribute: str) -> Find:
    def find(f: Facts) -> Iterator[Fields]:
        for name, use in sorted(f.node_use.items()):
            used, free = getattr(use, attribute), getattr(f.nodes[name].free, attribute)
            if used > free:
                yield {"node": name, "used": used, "free": free}

    return find


def _extended(f: Facts) -> Iterator[Fields]:
    for name, use in sorted(f.node_use.items()):
        for resource, used in sorted(use.extended.items()):
            free = f.nodes[name].free.get(resource)
            if used > free:
                yield {"node": name, "resource": resource, "used": used, "free": free}


# ---------------------------------------------------------------------------- device grants

UNASKED = "{gang}: member {rank} got {count} devices it did not ask for"
DEVICE_COUNT = "{gang}: member {rank} got {got} devices, needs {count}"
DEVICE_TWICE = "{gang}: member {rank} got gpu {index} twice"
NO_DEVICE = "{gang}: member {rank} on missing gpu {index} of {node}"
WRONG_MODEL = "{gang}: member {rank} on gpu {index} of model {model}, outside its models"
WHOLE_SPLIT = "{gang}: member {rank} got part of whole gpu {index} ({milli} milli, MIG {profile!r})"
SHARE_DIFFERS = "{gang}: member {rank} got a share of gpu {index} that differs from its request"
MIG_DIFFERS = "{gang}: member {rank} got MIG {got!r} on gpu {index}, asked for {profile}"


def _asking(f: Facts, *kinds: GpuKind) -> Iterator[Member]:
    return (m for m in f.members if m.group.shape.gpu.kind in kinds)


def _who(m: Member, **more: object) -> Fields:
    return {"gang": m.request.name, "rank": m.assignment.rank, **more}


def _unasked(f: Facts) -> Iterator[Fields]:
    for m in _asking(f, GpuKind.NONE):
        if m.assignment.devices:
            yield _who(m, count=len(m.assignment.devices))


def _device_count(f: Facts) -> Iterator[Fields]:
    for m in _asking(f, GpuKind.WHOLE, GpuKind.SHARE, GpuKind.MIG):
        if len(m.assignment.devices) != m.group.shape.gpu.count:
            yield _who(m, got=len(m.assignment.devices), count=m.group.shape.gpu.count)


def _device_twice(f: Facts) -> Iterator[Fields]:
    """A MIG pod may take several slices of one device; whole and share pods distinct devices."""
    for m in _asking(f, GpuKind.WHOLE, GpuKind.SHARE):
        counts = Counter(d.index for d in m.assignment.devices)
        for index in sorted(i for i, n in counts.items() if n > 1):
            yield _who(m, index=index)


def _no_device(f: Facts) -> Iterator[Fields]:
    for m in f.members:
        indexes = {d.index for d in m.node.gpus}
        for d in m.assignment.devices:
            if d.index not in indexes:
                yield _who(m, index=d.index, node=m.node.name)


def _wrong_model(f: Facts) -> Iterator[Fields]:
    for m in f.members:
        models = m.group.shape.gpu_models
        known = {d.index: d for d in m.node.gpus}
        for d in m.assignment.devices:
            dev = known.get(d.index)
            if models is not None and dev is not None and dev.model not in models:
                yield _who(m, index=d.index, model=dev.model)


def _whole_split(f: Facts) -> Iterator[Fields]:
    for m in _asking(f, GpuKind.WHOLE):
        for d in m.assignment.devices:
            if d.milli != FULL_SHARE or d.mig_profile or d.mig_start >= 0:
                yield _who(m, index=d.index, milli=d.milli, profile=d.mig_profile)


def _share_differs(f: Facts) -> Iterator[Fields]:
    for m in _asking(f, GpuKind.SHARE):
        gpu = m.group.shape.gpu
        for d in m.assignment.devices:
            if (d.milli, d.memory_mib, d.tflops, d.mig_profile) != (gpu.milli, gpu.memory_mib, gpu.tflops, ""):
                yield _who(m, index=d.index)


def _mig_differs(f: Facts) -> Iterator[Fields]:
    for m in _asking(f, GpuKind.MIG):
        for d in m.assignment.devices:
            if d.mig_profile != m.group.shape.gpu.mig_profile:
                yield _who(m, index=d.index, got=d.mig_profile, profile=m.group.shape.gpu.mig_profile)


# ---------------------------------------------------------------------------- device capacity

WHOLE_TAKEN = "node {node} gpu {index}: whole GPU not idle or not its only user"
SHARE_OVER = "node {node} gpu {index}: share {used} milli over free {free}"
GPU_MEMORY_OVER = "node {node} gpu {index}: GPU memory {used}Mi over free {free}Mi"
TFLOPS_OVER = "node {node} gpu {index}: {used} milli-TFLOPs over free {free}"
SHARE_ON_MIG = "node {node} gpu {index}: share on a MIG device"
MIG_OVER = "node {node} gpu {index}: {used} x MIG {profile} over {free} free slices"
NOT_PARTITIONABLE = "node {node} gpu {index}: dynamic MIG slice on a GPU that cannot be partitioned"
CUT_SHARED = "node {node} gpu {index}: dynamic MIG slice on a GPU that is shared or whole-used"
BAD_LAYOUT = "node {node} gpu {index}: {violation}"


def _whole_taken(f: Facts) -> Iterator[Fields]:
    for name, dev, use in f.devices():
        if use.whole and (use.users > 1 or not dev.is_idle):
            yield {"node": name, "index": dev.index}


def _device_amount(used_of: str, free_of: str) -> Find:
    def find(f: Facts) -> Iterator[Fields]:
        for name, dev, use in f.devices():
            used, free = getattr(use, used_of), getattr(dev, free_of)
            if used > free:
                yield {"node": name, "index": dev.index, "used": used, "free": free}

    return find


def _share_on_mig(f: Facts) -> Iterator[Fields]:
    for name, dev, use in f.devices():
        if use.shares and dev.is_mig:
            yield {"node": name, "index": dev.index}


def _mig_over(f: Facts) -> Iterator[Fields]:
    for name, dev, use in f.devices():
        for profile, used in sorted(use.slices.items()):
            free = sum(s.free for s in dev.mig if s.profile == profile)
            if used > free:
                yield {"node": name, "index": dev.index, "profile": profile, "used": used, "free": free}


def _not_partitionable(f: Facts) -> Iterator[Fields]:
    for name, dev, use in f.devices():
        if use.cuts and dev.partition is None:
            yield {"node": name, "index": dev.index}


def _cut_shared(f: Facts) -> Iterator[Fields]:
    """A GPU cut into slices holds nothing else: no other kind of user, no share taken before."""
    for name, dev, use in f.devices():
        exclusive = use.users == len(use.cuts) and (dev.mig_layout or dev.is_idle)
        if use.cuts and dev.partition is not None and not exclusive:
            yield {"node": name, "index": dev.index}


def _bad_layout(f: Facts) -> Iterator[Fields]:
    """Slices already cut plus the new ones: placements, no overlap, compute, instance counts."""
    for name, dev, use in f.devices():
        if use.cuts and dev.partition is not None:
            for violation in mig.violations(dev.partition, (*dev.mig_layout, *use.cuts)):
                yield {"node": name, "index": dev.index, "violation": violation}


# ---------------------------------------------------------------------------- topology

REQUIRED_SPLIT = "{gang}: required {level} violated ({domains} domains)"
SLICE_PARTIAL = "{gang}: {placed} members placed, not whole slices of {size} within one {level}"
SLICE_SPLIT = "{gang}: slice of ranks {first}.. not within one {level} ({domains} domains)"


def _placed_members(f: Facts) -> Iterator[tuple[GangRequest, list[Member]]]:
    by_gang: dict[str, list[Member]] = defaultdict(list)
    for m in f.members:
        by_gang[m.request.name].append(m)
    for members in by_gang.values():
        yield members[0].request, sorted(members, key=lambda m: m.assignment.rank)


def _required_split(f: Facts) -> Iterator[Fields]:
    for r, members in _placed_members(f):
        level = r.topology.required
        domains = {f.domain(level, m.node) for m in members}
        if level and len(domains) > 1:
            yield {"gang": r.name, "level": level, "domains": len(domains)}


def _slice_partial(f: Facts) -> Iterator[Fields]:
    for g, r in f.answered:
        for s in r.topology.slices:
            if s.size > 1 and len(g.assignments) % s.size:
                yield {"gang": r.name, "placed": len(g.assignments), "size": s.size, "level": s.level}


def _slice_split(f: Facts) -> Iterator[Fields]:
    """Slices are consecutive members in rank order, `size` at a time."""
    for r, members in _placed_members(f):
        for s in (s for s in r.topology.slices if s.size > 1):
            for start in range(0, len(members), s.size):
                domains = {f.domain(s.level, m.node) for m in members[start : start + s.size]}
                if len(domains) > 1:
                    yield {"gang": r.name, "first": start, "level": s.level, "domains": len(domains)}


SUB_PARTIAL = "{gang}: sub-group {sub} has {placed} members placed, needs 0 or {quorum}..{count}"
SUB_QUORUM = "{gang}: {placed} sub-groups placed, needs {quorum}"
SUB_REQUIRED = "{gang}: sub-group {sub}'s required {level} violated ({domains} domains)"
SUB_SLICE = "{gang}: sub-group {sub}'s slice of its members {first}.. not within one {level} ({domains} domains)"


def _subgroup_members(f: Facts) -> Iterator[tuple[GangRequest, SubGroup, list[Member]]]:
    """Each sub-group of each placed gang with its placed members, in rank order."""
    for r, members in _placed_members(f):
        for sub in r.subgroups:
            yield r, sub, [m for m in members if m.group.name in sub.groups]


def _subgroup_whole(f: Facts) -> Iterator[Fields]:
    for r, sub, members in _subgroup_members(f):
        count, quorum = sub.members(r), sub.quorum(r)
        if members and not quorum <= len(members) <= count:
            yield {"gang": r.name, "sub": sub.name, "placed": len(members), "quorum": quorum, "count": count}


def _subgroup_quorum(f: Facts) -> Iterator[Fields]:
    for r, members in _placed_members(f):
        if not r.subgroups:
            continue
        placed = sum(1 for sub in r.subgroups if any(m.group.name in sub.groups for m in members))
        if placed < r.subgroup_quorum:
            yield {"gang": r.name, "placed": placed, "quorum": r.subgroup_quorum}


def _subgroup_required(f: Facts) -> Iterator[Fields]:
    for r, sub, members in _subgroup_members(f):
        level = sub.topology.required
        domains = {f.domain(level, m.node) for m in members}
        if level and len(domains) > 1:
            yield {"gang": r.name, "sub": sub.name, "level": level, "domains": len(domains)}


def _subgroup_slice(f: Facts) -> Iterator[Fields]:
    for r, sub, members in _subgroup_members(f):
        for s in (s for s in sub.topology.slices if s.size > 1):
            for start in range(0, len(members), s.size):
                chunk = members[start : start + s.size]
                domains = {f.domain(s.level, m.node) for m in chunk}
                if len(domains) > 1 or len(chunk) < s.size:
                    yield {"gang": r.name, "sub": sub.name, "first": start, "level": s.level, "domains": len(domains)}


# ---------------------------------------------------------------------------- the registry

CHECKS: tuple[Check, ...] = (
    Check("gang_known", UNKNOWN_GANG, _unknown_gangs),
    Check("gang_answered_once", ANSWERED, _answered_once),
    Check("gang_quorum", QUORUM, _quorum),
    Check("gang_all_or_nothing", PARTIAL, _all_or_nothing),
    Check("member_gang", OTHER_GANG, _other_gang),
    Check("member_node_known", UNKNOWN_NODE, _unknown_nodes),
    Check("member_group_known", UNKNOWN_GROUP, _unknown_groups),
    Check("member_rank_in_group", RANK_OUTSIDE, _rank_in_group),
    Check("member_rank_once", RANK_TWICE, _rank_once),
    Check("node_cordoned", CORDONED, _cordoned),
    Check("node_allowed", NOT_ALLOWED, _not_allowed),
    Check("node_cpu", CPU_OVER, _scalar("cpu_milli")),
    Check("node_memory", MEMORY_OVER, _scalar("memory_mib")),
    Check("node_pods", PODS_OVER, _scalar("pods")),
    Check("node_extended", EXTENDED_OVER, _extended),
    Check("devices_unasked", UNASKED, _unasked),
    Check("device_count", DEVICE_COUNT, _device_count),
    Check("device_twice", DEVICE_TWICE, _device_twice),
    Check("device_exists", NO_DEVICE, _no_device),
    Check("device_model", WRONG_MODEL, _wrong_model),
    Check("grant_whole", WHOLE_SPLIT, _whole_split),
    Check("grant_share", SHARE_DIFFERS, _share_differs),
    Check("grant_mig", MIG_DIFFERS, _mig_differs),
    Check("gpu_whole", WHOLE_TAKEN, _whole_taken),
    Check("gpu_share", SHARE_OVER, _device_amount("milli", "free_milli")),
    Check("gpu_memory", GPU_MEMORY_OVER, _device_amount("memory_mib", "free_memory_mib")),
    Check("gpu_tflops", TFLOPS_OVER, _device_amount("tflops", "free_tflops")),
    Check("gpu_share_on_mig", SHARE_ON_MIG, _share_on_mig),
    Check("mig_static_slices", MIG_OVER, _mig_over),
    Check("mig_partitionable", NOT_PARTITIONABLE, _not_partitionable),
    Check("mig_cut_exclusive", CUT_SHARED, _cut_shared),
    Check("mig_layout", BAD_LAYOUT, _bad_layout),
    Check("topology_required", REQUIRED_SPLIT, _required_split),
    Check("topology_slice_whole", SLICE_PARTIAL, _slice_partial),
    Check("topology_slice_domain", SLICE_SPLIT, _slice_split),
    Check("subgroup_whole", SUB_PARTIAL, _subgroup_whole),
    Check("subgroup_quorum", SUB_QUORUM, _subgroup_quorum),
    Check("subgroup_required", SUB_REQUIRED, _subgroup_required),
    Check("subgroup_slice", SUB_SLICE, _subgroup_slice),
)
