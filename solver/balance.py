"""Balanced placement (Kueue's BalancedPlacement): a gang asking `TopologyRequest.balanced`
uses as many preferred-level domains as its compact plan (the fewest that hold it), inside the
same required domain, and has its members spread over them as evenly as they can be: with n
members over k domains, the k roomiest domains each take n // k or one more (the roomiest the
extra ones). Done after the plan, on what the other gangs left; when the even split does not
fit, the compact placement stays. Single-group gangs
without slices only; others keep their compact placement.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from solver.greedy import place_gang
from solver.ledger import Ledger
from solver.model import GangName, GangRequest, NodeName, TopologyRequest
from solver.params import UnlabeledNodes
from solver.placement import Member, live_caps
from solver.problem import GangProblem, Problem, prepare
from solver.topology import TopologyIndex


def balanced(
    full: Problem, placed: dict[int, list[Member]], ledger: Ledger, unlabeled: UnlabeledNodes
) -> dict[int, list[Member]]:
    """`placed` with every balanced gang spread evenly; `ledger` holds nothing yet."""
    targets = [gp for gp in full.gangs if _balances(full, gp) and gp.index in placed]
    if not targets:
        return placed
    others = {k: v for k, v in placed.items() if k not in {gp.index for gp in targets}}
    for k, members in others.items():
        for m in members:
            ledger.apply(m.node, full.gangs[k].request.groups[m.group].shape, m.devices)
    out = dict(placed)
    for gp in targets:
        spread = _spread(full, gp, placed[gp.index], ledger, unlabeled)
        chosen = spread if spread is not None else placed[gp.index]
        if spread is None:
            for m in chosen:  # the compact placement stays: its capacity is taken
                ledger.apply(m.node, gp.request.groups[m.group].shape, m.devices)
        out[gp.index] = chosen
    return out


def _balances(full: Problem, gp: GangProblem) -> bool:
    tr = gp.request.topology
    return tr.balanced and bool(tr.preferred) and len(gp.request.groups) == 1 and not tr.slices


def _spread(
    full: Problem, gp: GangProblem, members: list[Member], ledger: Ledger, unlabeled: UnlabeledNodes
) -> list[Member] | None:
    topo, nodes = full.topo, full.snapshot.nodes
    tr = gp.request.topology
    level = topo.level_of(tr.preferred)
    k = len({_domain(topo, m.node, level) for m in members})
    if k < 2:
        return None  # one domain: nothing to spread
    # Candidates: the preferred-level domains inside the required domain the plan chose.
    required = topo.level_of(tr.required) if tr.required else -1
    within = {_domain(topo, m.node, required) for m in members} if required >= 0 else None
    room: Counter[str] = Counter()
    for node, pods in live_caps(gp.groups[0], ledger).items():
        if within is None or _domain(topo, node, required) in within:
            room[_domain(topo, node, level)] += pods
    n = len(members)
    chosen = sorted(room, key=lambda d: (-room[d], d))[:k]
    quotas = {d: n // k + (1 if i < n % k else 0) for i, d in enumerate(chosen)}
    if len(chosen) < k or any(room[d] < q for d, q in quotas.items()):
        return None
    if sorted(quotas.values()) == sorted(Counter(_domain(topo, m.node, level) for m in members).values()):
        return None  # already as even as it gets
    group = gp.request.groups[0]
    saved = ledger.checkpoint()
    out: list[Member] = []
    for d, quota in quotas.items():
        inside = frozenset(NodeName(nodes[i].name) for i in range(len(nodes)) if _domain(topo, i, level) == d)
        allowed = group.shape.allowed_nodes
        shape = replace(group.shape, allowed_nodes=inside if allowed is None else allowed & inside)
        part = GangRequest(
            GangName(f"{gp.request.name}/{d}"),
            (replace(group, shape=shape, count=quota, node_scores=()),),
            topology=TopologyRequest(),
        )
        got = place_gang(topo, prepare(full.snapshot, [part], topo, unlabeled=unlabeled).gangs[0], ledger)
        if got is None:
            ledger.restore(saved)
            return None
        out.extend(Member(0, m.node, m.devices) for m in got)
    return out


def _domain(topo: TopologyIndex, node: int, level: int) -> str:
    """The node's domain at `level`, as a key (the node itself at the host level)."""
    if level >= topo.above or topo.unit_of[node] < 0:
        return f"node/{node}"
    return f"domain/{topo.ancestor(topo.unit_of[node], level)}"
