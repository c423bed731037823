"""From placed pods and the CR's instances to gangs with `expected` and `minCount`.

Gangs exist for the keys the given pods produce. A gang's size is summed over the
(component, instance) pairs in it, each counting the replicas / minReplicas its instance asks
for (a pair without a known instance counts the pods seen). Two refinements:

- A pair whose pods are spread over k gangs (one LeaderWorkerSet component split by group
  index, when no instance ids say so) counts ceil(replicas / k) in each.
- Instances whose pods do not exist yet still count - otherwise a PyTorchJob whose master pod
  arrives first would form a gang of one. Such an instance joins: the gang its template pod
  keys into (filters and keys evaluated on `{metadata, spec}` of its pod template; filtered out
  of every pod group: it joins none); else the one gang of its pod group that already holds
  a pair with the same instance id (LeaderWorkerSet leader "1" and workers "1"); else the pod
  group's only gang. Otherwise it is reported in `problems` and not counted.

`minCount` is the sum of minimums, replaced by the pod group's `minMemberPath` value when that
is set on the CR (Kubeflow `minAvailable`), and kept within 1..expected.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from extender.ri.instances import ComponentInstance
from extender.ri.pods import REASON_NO_POD_GROUP, Placement, PodPlanner

Pair = tuple[str, str | None]


@dataclass(frozen=True, slots=True)
class RIGang:
    """One gang of one root object."""

    key: str  # "<podGroup>/<key parts...>", unique within the root object
    pod_group: str
    min_count: int
    expected: int  # pods the CR asks for in this gang (may exceed min_count)
    members: tuple[str, ...]  # names of the given pods in it, sorted


@dataclass
class _Size:
    expected: int = 0
    minimum: int = 0

    def add(self, expected: int, minimum: int) -> None:
        self.expected += expected
        self.minimum += minimum


@dataclass
class _Seen:
    """The gangs the pods form: members, pod group and pair counts per key."""

    members: dict[str, list[str]]
    group: dict[str, str]
    pairs: dict[str, Counter[Pair]]

    def spread(self) -> Counter[Pair]:
        return Counter(pair for counts in self.pairs.values() for pair in counts)


def build_gangs(
    placed: Iterable[tuple[str, Placement]],
    instances: list[ComponentInstance],
    *,
    planner: PodPlanner,
    minimums: Mapping[str, int | None],
) -> tuple[list[RIGang], list[str]]:
    """Gangs (sorted by key) and the instances that could not be attributed to one."""
    by_component: dict[str, list[ComponentInstance]] = defaultdict(list)
    for inst in instances:
        by_component[inst.component].append(inst)
    seen = _collect(placed, by_component)
    spread = seen.spread()
    sizes = {key: _observed_size(pairs, spread, by_component) for key, pairs in seen.pairs.items()}
    problems = []
    for inst in instances:
        if (inst.component, inst.instance) in spread or (inst.component, None) in spread:
            continue
        target, problem = _target(inst, planner, seen)
        if target is not None:
            sizes[target].add(inst.replicas, inst.min_replicas)
        elif problem:
            problems.append(problem)
    gangs = [_gang(key, seen, sizes[key], minimums.get(seen.group[key])) for key in sorted(seen.members)]
    return gangs, problems


def _collect(placed: Iterable[tuple[str, Placement]], by_component: Mapping[str, list[ComponentInstance]]) -> _Seen:
    seen = _Seen(defaultdict(list), {}, defaultdict(Counter))
    for name, p in placed:
        if p.key is None or p.component is None or p.pod_group is None:
            continue
        seen.members[p.key].append(name)
        seen.group[p.key] = p.pod_group
        seen.pairs[p.key][(p.component, _instance(p, by_component))] += 1
    return seen


def _instance(p: Placement, by_component: Mapping[str, list[ComponentInstance]]) -> str | None:
    """The pod's instance id; a component with a single instance needs no instance selector."""
    if p.instance is not None:
        return p.instance
    known = by_component.get(p.component or "", [])
    return known[0].instance if len(known) == 1 else None


def _observed_size(
    pairs: Counter[Pair], spread: Counter[Pair], by_component: Mapping[str, list[ComponentInstance]]
) -> _Size:
    size = _Size()
    for (component, instance), count in pairs.items():
        known = [i for i in by_component.get(component, []) if instance is None or i.instance == instance]
        replicas = sum(i.replicas for i in known) if known else count
        minimum = sum(i.min_replicas for i in known) if known else count
        k = spread[(component, instance)]
        size.add(-(-replicas // k), -(-minimum // k))
    return size


def _target(inst: ComponentInstance, planner: PodPlanner, seen: _Seen) -> tuple[str | None, str | None]:
    """The gang an instance without pods joins, or why it joins none."""
    candidates = planner.groups_covering(inst.component)
    if not candidates:
        return None, None
    if inst.template is not None:
        placement = planner.place_template(inst.template, inst.component)
        if placement.reason == REASON_NO_POD_GROUP:
            return None, None
        if placement.key in seen.group:
            return placement.key, None
        candidates = [placement.pod_group] if placement.pod_group else candidates
    keys = [k for k, g in seen.group.items() if g in candidates]
    same = [k for k in keys if inst.instance and any(i == inst.instance for _, i in seen.pairs[k])]
    if len(same) == 1:
        return same[0], None
    if len(keys) == 1 and len(candidates) == 1:
        return keys[0], None
    if not keys:
        return None, None  # its gang has no pods yet: there is nothing to size
    label = f"{inst.component}/{inst.instance}" if inst.instance else inst.component
    return None, f"{label}: no pods yet and {len(keys)} gangs it may join; not counted"


def _gang(key: str, seen: _Seen, size: _Size, min_override: int | None) -> RIGang:
    expected = max(size.expected, 1)
    minimum = size.minimum if min_override is None else min_override
    return RIGang(key, seen.group[key], max(1, min(minimum, expected)), expected, tuple(sorted(seen.members[key])))
