"""Request admission: a gang whose request makes no sense is answered on its own.

`plan()` checks every request before preparing it. A request that names a topology level the
cluster does not have (a typo in a PodGroup's topology key), a slice without a size or coarser
than the required level, or a `minCount` outside 0..members can never be placed as asked. It
gets its own `GangPlan` (UNRESOLVABLE, the message naming the field and value), and the other
gangs of the same call are planned as if it were not there, as Kueue and KAI-Scheduler reject
such a workload at admission without touching the others. Checks run in field order and the
first problem is reported.
"""

from __future__ import annotations

from solver.explain import Explanation, level_name
from solver.model import GangRequest, Outcome, TopologyRequest
from solver.topology import TopologyIndex

INVALID_REQUEST = "invalid request"


def _invalid(detail: str) -> Explanation:
    return Explanation(Outcome.UNRESOLVABLE, f"{INVALID_REQUEST}: {detail}")


def _levels(topo: TopologyIndex) -> str:
    return ", ".join(topo.levels)


def check(topo: TopologyIndex, request: GangRequest) -> Explanation | None:
    """Why `request` can never be planned as written, or None when it is well formed."""
    problem = _members(request) or _levels_known(topo, request) or _slices(topo, request) or _subgroups(topo, request)
    return _invalid(problem) if problem is not None else None


def _subgroups(topo: TopologyIndex, request: GangRequest) -> str | None:
    if not request.subgroups:
        return None
    names = {g.name for g in request.groups}
    owner: dict[str, str] = {}
    for sub in request.subgroups:
        where = f"sub-group {sub.name!r}"
        for g in sub.groups:
            if g not in names:
                return f"{where} names group {g!r}, which the gang does not have"
            if g in owner:
                return f"group {g!r} is in sub-groups {owner[g]!r} and {sub.name!r}; a group is in one at most"
            owner[g] = sub.name
        members = sub.members(request)
        if not 0 <= sub.min_count <= members:
            return f"{where} has minCount {sub.min_count}, outside 0..{members} (its members)"
        tr = sub.topology
        unknown = _unknown_level(topo, tr, f"{where} topology.")
        if unknown is not None:
            return unknown
        gang_required = request.topology.required
        if tr.required and gang_required and topo.level_of(tr.required) < topo.level_of(gang_required):
            return (
                f"{where} topology.required {tr.required!r} is coarser than the gang's {gang_required!r}: "
                f"one {level_name(tr.required)} cannot fit inside one {level_name(gang_required)}"
            )
        required = topo.level_of(tr.required) if tr.required else topo.level_of(gang_required) if gang_required else -1
        for i, sl in enumerate(tr.slices):
            if sl.size < 1:
                return f"{where} topology.slices[{i}] has size {sl.size}; a slice needs a size of 1 or more"
            if topo.level_of(sl.level) < required:
                return f"{where} topology.slices[{i}].level {sl.level!r} is coarser than its required level"
    if not 0 <= request.min_subgroups <= len(request.subgroups):
        return f"minSubGroups {request.min_subgroups} is outside 0..{len(request.subgroups)} (the sub-groups)"
    return None


def _members(request: GangRequest) -> str | None:
    for g in request.groups:
        if g.count < 0:
            return f"group {g.name!r} has count {g.count}; a count is 0 or more"
    if request.count <= 0:
        return "the gang has no members"
    if not 0 <= request.min_count <= request.count:
        return f"minCount {request.min_count} is outside 0..{request.count} (the gang's members)"
    return None


def _levels_known(topo: TopologyIndex, request: GangRequest) -> str | None:
    return _unknown_level(topo, request.topology, "topology.")


def _unknown_level(topo: TopologyIndex, tr: TopologyRequest, prefix: str) -> str | None:
    """The first level a topology request names that the cluster does not have, in words."""
    named = [("required", tr.required), ("preferred", tr.preferred)]
    named += [(f"slices[{i}].level", s.level) for i, s in enumerate(tr.slices)]
    for field, level in named:
        if level and not topo.has_level(level):
            return f"{prefix}{field} {level!r} is not a topology level of this cluster (levels: {_levels(topo)})"
    return None


def _slices(topo: TopologyIndex, request: GangRequest) -> str | None:
    tr = request.topology
    if tr.balanced and not tr.preferred:
        return "topology.balanced needs topology.preferred: the level whose domains the members are spread over"
    required = topo.level_of(tr.required) if tr.required else -1
    for i, s in enumerate(tr.slices):
        if not s.level:
            return f"topology.slices[{i}] names no level"
        if s.size < 1:
            return f"topology.slices[{i}] on {s.level!r} has size {s.size}; a slice needs a size of 1 or more"
        if topo.level_of(s.level) < required:
            return (
                f"topology.slices[{i}].level {s.level!r} is coarser than topology.required {tr.required!r}: "
                f"a {level_name(s.level)} slice cannot fit inside one {level_name(tr.required)}"
            )
    return None
