"""Why a gang was not placed, in words a user understands.

Checks run from the most basic to the most specific and the first that binds is reported:
eligibility, total capacity, slice divisibility, the required level, slices per domain, and
finally competition with other gangs in the same solve. Each check's reason is a constant with
stable wording (tests assert on it) that prefixes the message, and it travels with the outcome
it causes (`OUTCOMES`), so nobody has to parse the text back.
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.model import GpuKind, Outcome, PodShape
from solver.placement import domain_caps
from solver.problem import GangProblem, GroupCaps
from solver.topology import TopologyIndex

NO_ELIGIBLE_NODE = "no eligible node"
NOT_ENOUGH_CAPACITY = "not enough capacity"
SLICE_MISMATCH = "gang size is not a multiple of its slice size"
REQUIRED_TOPOLOGY = "required topology does not fit"
SLICES_DO_NOT_FIT = "slices do not fit"
TAKEN_BY_OTHERS = "capacity taken by other gangs in this plan"

# What each reason causes: no change of free capacity helps a gang that matches no node or
# whose size does not divide into its slices; every other reason may pass when capacity frees.
OUTCOMES = {NO_ELIGIBLE_NODE: Outcome.UNRESOLVABLE, SLICE_MISMATCH: Outcome.UNRESOLVABLE}


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why a gang was not placed: the outcome it causes and the message, prefixed by its reason."""

    outcome: Outcome
    message: str


def _because(reason: str, detail: str) -> Explanation:
    return Explanation(OUTCOMES.get(reason, Outcome.UNSCHEDULABLE), f"{reason}: {detail}")


def unit_of_demand(shape: PodShape) -> tuple[str, float]:
    """How to count one pod's demand in messages: ('GPUs', n), ('MIG <p> slices', n) or pods."""
    gpu = shape.gpu
    if gpu.kind is GpuKind.WHOLE or gpu.kind is GpuKind.SHARE:
        return "GPUs", gpu.gpus
    if gpu.kind is GpuKind.MIG:
        return f"MIG {gpu.mig_profile} slices", float(gpu.count)
    return "pods", 1.0


def _amount(caps: GroupCaps, pods: int) -> str:
    unit, per_pod = unit_of_demand(caps.shape)
    value = pods * per_pod
    text = f"{value:g}"
    return f"{text} {unit}" if unit != "pods" else f"{pods} pods"


def level_name(level: str) -> str:
    """A topology level as users say it: "rack" for topology.phalanx.io/rack."""
    return level.rsplit("/", 1)[-1]


def explain(topo: TopologyIndex, gp: GangProblem) -> Explanation:
    """The binding constraint for an unplaced gang (capacities as prepared from the snapshot)."""
    req = gp.request
    need_total = req.quorum
    fit_total = 0
    for caps in gp.groups:
        name = req.groups[caps.group].name
        if not caps.eligible:
            return _because(NO_ELIGIBLE_NODE, f"group {name!r} matches no node (selector, affinity, taints, GPU model)")
        if not caps.node_caps:
            return _because(NOT_ENOUGH_CAPACITY, f"group {name!r} fits on none of {caps.eligible} eligible nodes")
        fit_total += min(caps.count, caps.total)
        if caps.total < caps.count and req.quorum >= req.count:
            return _because(
                NOT_ENOUGH_CAPACITY,
                f"group {name!r} needs {_amount(caps, caps.count)} ({caps.count} pods); "
                f"eligible nodes have room for {_amount(caps, caps.total)}",
            )
    if fit_total < need_total:
        return _because(NOT_ENOUGH_CAPACITY, f"only {fit_total} of {req.count} members fit (minCount {need_total})")
    for s in gp.slices:
        if need_total % s.size:
            per = level_name(topo.levels[s.level])
            return _because(SLICE_MISMATCH, f"{need_total} members in slices of {s.size} per {per}")
    for caps in gp.groups:
        reason = _topology_reason(topo, gp, caps)
        if reason is not None:
            return reason
    alone = "it fits the free capacity alone, but not next to higher-priority or earlier gangs"
    return _because(TAKEN_BY_OTHERS, alone)


def _topology_reason(topo: TopologyIndex, gp: GangProblem, caps: GroupCaps) -> Explanation | None:
    need = caps.count if gp.request.quorum >= gp.request.count else min(caps.count, gp.request.quorum)
    dcaps = domain_caps(topo, gp, caps.node_caps)
    for s in gp.slices:
        total = sum(dcaps.get(d, 0) for d in topo.levels_of[s.level])
        if total < need:
            name = level_name(topo.levels[s.level])
            return _because(
                SLICES_DO_NOT_FIT,
                f"needs {need // s.size} slices of {s.size} pods, each within one "
                f"{name}; the {name}s hold {total // s.size} such slices",
            )
    level = gp.required_level
    if level < 0:
        return None
    name = level_name(topo.levels[level])
    if level == topo.host_level:
        best = max(caps.node_caps.values(), default=0)
    else:
        best = max((dcaps.get(d, 0) for d in topo.levels_of[level]), default=0)
    if best < need:
        return _because(
            REQUIRED_TOPOLOGY,
            f"needs {_amount(caps, need)} within one {name}; the largest {name} has {_amount(caps, best)} free",
        )
    return None
