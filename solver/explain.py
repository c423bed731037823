"""Why a gang was not placed, in words a user understands.

Checks run from the most basic to the most specific and the first that binds is reported:
eligibility (nodes left out for a missing topology label included), total capacity, slice
divisibility, the required level and slices per domain for each group, then the gang as a
whole: one domain of the required level holding every group, the groups sharing the free
capacity. Only a gang that fits the free capacity alone (tried on an empty ledger) and lost
to other gangs placed in the same plan is told its capacity was taken by them. When nodes
were left out for a missing topology label, the message says how many. Each check's reason is a constant with
stable wording (tests assert on it) that prefixes the message, and it travels with the outcome
it causes (`OUTCOMES`), so nobody has to parse the text back.
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.compact import compact_gang
from solver.greedy import place_gang
from solver.ledger import Ledger
from solver.model import GpuKind, Outcome, PodShape
from solver.placement import domain_caps
from solver.problem import GangProblem, GroupCaps, Problem
from solver.topology import TopologyIndex

NO_ELIGIBLE_NODE = "no eligible node"
NOT_ENOUGH_CAPACITY = "not enough capacity"
SLICE_MISMATCH = "gang size is not a multiple of its slice size"
REQUIRED_TOPOLOGY = "required topology does not fit"
SLICES_DO_NOT_FIT = "slices do not fit"
TAKEN_BY_OTHERS = "capacity taken by other gangs in this plan"
MISSING_TOPOLOGY_LABEL = "eligible nodes lack a topology label"
GROUPS_DO_NOT_FIT_TOGETHER = "groups do not fit together"
NO_PLACEMENT_FOUND = "no placement found"

# What each reason causes: no change of free capacity helps a gang that matches no node (or
# only nodes outside the topology) or whose size does not divide into its slices; every
# other reason may pass when capacity frees.
OUTCOMES = {
    NO_ELIGIBLE_NODE: Outcome.UNRESOLVABLE,
    MISSING_TOPOLOGY_LABEL: Outcome.UNRESOLVABLE,
    SLICE_MISMATCH: Outcome.UNRESOLVABLE,
}


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


def explain(problem: Problem, gp: GangProblem, *, others_placed: bool) -> Explanation:
    """The binding constraint for an unplaced gang (capacities as prepared from the snapshot);
    `others_placed`: whether other gangs of the same plan were placed."""
    topo = problem.topo
    why = _per_group(topo, gp) or _whole_gang(topo, gp)
    if why is None:
        alone = others_placed and _fits_alone(problem, gp)
        why = _because(TAKEN_BY_OTHERS, ALONE) if alone else _not_together(topo, gp)
    return _with_unlabeled(topo, gp, why)


ALONE = "it fits the free capacity alone, but not next to higher-priority or earlier gangs"


def _per_group(topo: TopologyIndex, gp: GangProblem) -> Explanation | None:
    """Each group on its own: eligibility, capacity, slices, the required level."""
    req = gp.request
    need_total = req.quorum
    fit_total = 0
    for caps in gp.groups:
        name = req.groups[caps.group].name
        if not caps.eligible:
            return _because(NO_ELIGIBLE_NODE, f"group {name!r} matches no node (selector, affinity, taints, GPU model)")
        if caps.unlabeled == caps.eligible:
            return _because(
                MISSING_TOPOLOGY_LABEL,
                f"group {name!r} matches {caps.eligible} nodes, all without a label of "
                f"{_label_levels(topo, gp)}; such nodes are left out of topology-constrained placement",
            )
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
    return None


def _group_need(gp: GangProblem, caps: GroupCaps) -> int:
    return caps.count if gp.request.quorum >= gp.request.count else min(caps.count, gp.request.quorum)


def _whole_gang(topo: TopologyIndex, gp: GangProblem) -> Explanation | None:
    """A gang of several groups with a required level: is there one domain of that level (one
    node for the host level) that holds every group, each counted on its own?"""
    level = gp.required_level
    if len(gp.groups) < 2 or level < 0 or gp.request.quorum < gp.request.count:
        return None
    if level == topo.host_level:
        held = [(caps, caps.node_caps) for caps in gp.groups]
        candidates = sorted(gp.groups[0].node_caps)
    else:
        held = [(caps, domain_caps(topo, gp, caps.node_caps)) for caps in gp.groups]
        candidates = topo.levels_of[level]
    if any(all(c.get(d, 0) >= caps.count for caps, c in held) for d in candidates):
        return None
    name = level_name(topo.levels[level])
    return _because(
        REQUIRED_TOPOLOGY,
        f"needs {_group_amounts(gp)} within one {name}; each group fits in some {name}, but no {name} holds them all",
    )


def _not_together(topo: TopologyIndex, gp: GangProblem) -> Explanation:
    """Every check passed on its own yet the gang does not fit alone: say what binds it."""
    where = ""
    if gp.required_level >= 0:
        where = f" within one {level_name(topo.levels[gp.required_level])}"
    if len(gp.groups) > 1:
        return _because(
            GROUPS_DO_NOT_FIT_TOGETHER,
            f"needs {_group_amounts(gp)}{where}; each group fits the free capacity alone, "
            f"but they share nodes and do not fit together",
        )
    detail = f"no placement of all {gp.request.quorum} members{where} fits the free capacity"
    return _because(NO_PLACEMENT_FOUND, detail)


def _fits_alone(problem: Problem, gp: GangProblem) -> bool:
    """Whether the heuristics place the gang whole on the snapshot's free capacity."""
    ledger = Ledger(problem.snapshot)
    return (compact_gang(problem.topo, gp, ledger) or place_gang(problem.topo, gp, ledger)) is not None


def _group_amounts(gp: GangProblem) -> str:
    parts = [f"{_amount(caps, caps.count)} for {gp.request.groups[caps.group].name!r}" for caps in gp.groups]
    return " and ".join([", ".join(parts[:-1]), parts[-1]]) if len(parts) > 1 else parts[0]


def _label_levels(topo: TopologyIndex, gp: GangProblem) -> str:
    last = min(gp.label_level, topo.above - 1)
    return ", ".join(level_name(lv) for lv in topo.levels[: last + 1])


def _with_unlabeled(topo: TopologyIndex, gp: GangProblem, why: Explanation) -> Explanation:
    left_out = max((caps.unlabeled for caps in gp.groups), default=0)
    if not left_out or why.message.startswith(MISSING_TOPOLOGY_LABEL):
        return why
    note = (
        f" ({left_out} eligible nodes without a label of {_label_levels(topo, gp)} are left out of "
        f"topology-constrained placement)"
    )
    return Explanation(why.outcome, why.message + note)


def _topology_reason(topo: TopologyIndex, gp: GangProblem, caps: GroupCaps) -> Explanation | None:
    need = _group_need(gp, caps)
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
