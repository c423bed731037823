"""Pod side: which component and instance a pod is, and which gang it joins - one jq run per pod.

All pod-side expressions of an RI (type selectors, instance selectors, every member's filters
and grouping keys, `podRootNamePath`) are slots of one `jqx.Slots` program, so classifying a
pod costs one serialization and one libjq run whatever the RI's size.

- Component: the one whose `componentTypeSelector` matches (with a value: the key's value, as
  text, equals it; without: the key is present, i.e. neither null nor false). None matching: the
  single pod-bearing component without a type selector, or the root when no component bears
  pods at all (the spec's minimal RI). Several matching: unassigned, as ambiguous.
- Instance: the `componentInstanceSelector` value, as text.
- Gang: pod groups in order, members in order; the first member that covers the pod's component
  (the component itself or any component below it through ownerRef, so a member naming the root
  covers every pod - the spec's "equivalent" grouping example) and whose filters are all truthy
  takes the pod. Its key is "<podGroup>/<key 1>/<key 2>..." (just "<podGroup>" without
  groupByKeyPaths); a null key part leaves the pod unassigned rather than guessing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from extender.ri import jqx
from extender.ri.model import JSON, ComponentDef, PodGroupDef

REASON_NO_COMPONENT = "no component's podSelector matches the pod"
REASON_AMBIGUOUS_COMPONENT = "several components' podSelectors match the pod"
REASON_NO_GANG_SCHEDULING = "the resource interface has no gangScheduling pod groups"
REASON_NO_POD_GROUP = "no pod group member takes the pod's component (or its filters exclude the pod)"
REASON_NULL_KEY = "a groupByKeyPaths expression is null for the pod"
REASON_NO_NAME = "the pod has no metadata.name"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a pod belongs: component, instance, pod group and gang key, or why not (`reason`)."""

    component: str | None = None
    instance: str | None = None
    pod_group: str | None = None
    key: str | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class _TypeSlot:
    component: str
    slot: int
    value: str | None


@dataclass(frozen=True, slots=True)
class _Member:
    pod_group: str
    covers: frozenset[str]
    filters: tuple[int, ...]
    keys: tuple[int, ...]


class PodPlanner:
    """Compiled pod-side view of one RI."""

    def __init__(
        self,
        root: ComponentDef,
        components: Sequence[ComponentDef],
        groups: Sequence[PodGroupDef],
        meter: jqx.Meter | None = None,
    ) -> None:
        self._meter = meter
        exprs: list[str] = []
        bearing = [c for c in components if c.bears_pods()]
        self._types = [
            _TypeSlot(c.name, _slot(exprs, ts.key_path), ts.value) for c in bearing if (ts := c.type_selector())
        ]
        self._instances = {c.name: _slot(exprs, si.id_path) for c in components if (si := c.instance_selector())}
        bare = [c.name for c in bearing if c.type_selector() is None]
        self._fallback = bare[0] if bare else (None if bearing else root.name)
        subtrees = _subtrees(components)
        self._members = [
            _Member(
                g.name,
                subtrees.get(m.component_name, frozenset()),
                tuple(_slot(exprs, f) for f in m.filters),
                tuple(_slot(exprs, jqx.key_expression(k)) for k in m.group_by_key_paths),
            )
            for g in groups
            for m in g.members
        ]
        self._root_name = _slot(exprs, root.pod_root_name_path) if root.pod_root_name_path else None
        self._slots = jqx.Slots(exprs)

    def classify(self, pod: Mapping[str, JSON]) -> Placement:
        values = self._slots.run(pod, self._meter)
        component, reason = self._component(values)
        if component is None:
            return Placement(reason=reason)
        slot = self._instances.get(component)
        instance = None if slot is None or values[slot] is None else jqx.as_text(values[slot])
        group, key, reason = self._place(values, component)
        return Placement(component, instance, group, key, reason)

    def place_template(self, template: Mapping[str, JSON], component: str) -> Placement:
        """Where a pod built from `template` would go, its component being known."""
        group, key, reason = self._place(self._slots.run(template, self._meter), component)
        return Placement(component, None, group, key, reason)

    def root_name(self, pod: Mapping[str, JSON]) -> str | None:
        if self._root_name is None:
            return None
        value = self._slots.run(pod, self._meter)[self._root_name]
        return None if value is None else jqx.as_text(value)

    def groups_covering(self, component: str) -> list[str]:
        return list(dict.fromkeys(m.pod_group for m in self._members if component in m.covers))

    def _component(self, values: list[JSON]) -> tuple[str | None, str]:
        matched = [t.component for t in self._types if _selected(values[t.slot], t.value)]
        if len(matched) == 1:
            return matched[0], ""
        if matched:
            return None, REASON_AMBIGUOUS_COMPONENT
        return (self._fallback, "") if self._fallback else (None, REASON_NO_COMPONENT)

    def _place(self, values: list[JSON], component: str) -> tuple[str | None, str | None, str]:
        if not self._members:
            return None, None, REASON_NO_GANG_SCHEDULING
        for member in self._members:
            if component not in member.covers or not all(jqx.truthy(values[i]) for i in member.filters):
                continue
            parts = [values[i] for i in member.keys]
            if any(p is None for p in parts):
                return member.pod_group, None, REASON_NULL_KEY
            return member.pod_group, "/".join([member.pod_group, *map(jqx.as_text, parts)]), ""
        return None, None, REASON_NO_POD_GROUP


def _slot(exprs: list[str], expression: str) -> int:
    exprs.append(expression)
    return len(exprs) - 1


def _selected(value: JSON, wanted: str | None) -> bool:
    if wanted is None:
        return jqx.truthy(value)
    return value is not None and jqx.as_text(value) == wanted


def _subtrees(components: Sequence[ComponentDef]) -> dict[str, frozenset[str]]:
    """Each component with every component below it through ownerRef."""
    owners = {c.name: c.owner_ref for c in components}
    found: dict[str, set[str]] = {c.name: {c.name} for c in components}
    for name in owners:
        seen, owner = {name}, owners.get(name)
        while owner is not None and owner not in seen and owner in found:
            found[owner].add(name)
            seen.add(owner)
            owner = owners.get(owner)
    return {name: frozenset(names) for name, names in found.items()}
