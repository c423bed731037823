"""`parse` a Resource Interface and ask it about one CR and its pods.

`parse` reads the document (`structure`), runs every check (`validate`) and either raises one
`InvalidDefinition` listing all violations or returns a `ResourceInterface` whose jq programs
are compiled: the pod-side program (`pods.PodPlanner`), the status reader, the CR paths.

`evaluate(root, pods)` is the whole story for one root object: its status, its components'
instances and expected pods (`instances`), each pod's placement (`pods`) and the gangs they form
(`gangs`). `gang_key(pod)` is the per-pod fast path (one jq run, no CR needed).

Every jq run is timed by the definition's `budget.Breaker`; once it trips, nothing of this
definition is evaluated any more: pods get `REASON_BUDGET`, `evaluate` reports it as a problem.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from extender.ri import jqx
from extender.ri.budget import REASON_BUDGET, Breaker, TripHandler
from extender.ri.gangs import RIGang, build_gangs
from extender.ri.instances import ComponentInstance, read_instances
from extender.ri.model import GVK, JSON, ComponentDef, InvalidDefinition, KindDef
from extender.ri.pods import REASON_NO_NAME, Placement, PodPlanner
from extender.ri.status import StatusReader
from extender.ri.structure import Definition, read
from extender.ri.validate import validate


@dataclass(frozen=True, slots=True)
class Unassigned:
    """A given pod that joins no gang, and why (a `pods.REASON_*` constant)."""

    pod: str
    reason: str


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One root object seen through its RI."""

    gangs: tuple[RIGang, ...]
    unassigned: tuple[Unassigned, ...]
    status: str
    instances: tuple[ComponentInstance, ...]
    problems: tuple[str, ...]  # CR paths that failed, instances not attributable to a gang


def parse(doc: Mapping[str, Any] | str) -> ResourceInterface:
    """A validated RI from a mapping or YAML/JSON text; raises InvalidDefinition listing every violation."""
    definition, violations = read(doc)
    violations += validate(definition)
    if violations or definition.root is None:
        raise InvalidDefinition(violations)
    return ResourceInterface(definition)


class ResourceInterface:
    """A parsed, valid RI for one CRD version."""

    def __init__(self, definition: Definition) -> None:
        assert definition.root is not None and definition.root.status_definition is not None
        self.definition = definition
        self.root_component: ComponentDef = definition.root
        self.components: tuple[ComponentDef, ...] = tuple(c for _, c in definition.components())
        self.pod_groups = tuple(g for g in definition.pod_groups if g is not None)
        self.root = _gvk(definition.root.kind)
        self.breaker = Breaker(str(self.root))
        self._planner = PodPlanner(definition.root, self.components, self.pod_groups, meter=self.breaker)
        self._status = StatusReader(definition.root.status_definition)

    @property
    def name(self) -> str:
        return self.root_component.name

    def kinds(self) -> tuple[GVK, ...]:
        """Root, child component and additional child GVKs, without repeats, in document order."""
        listed = [_gvk(c.kind) for c in self.components] + [_gvk(k) for k in self.definition.additional_kinds]
        return tuple(dict.fromkeys(listed))

    def document(self) -> dict[str, JSON]:
        """The definition as given (a copy), normalized to {structureDefinition, optimizationInstructions}."""
        return copy.deepcopy(self.definition.document)

    def on_budget_trip(self, handler: TripHandler | None) -> None:
        """Who is told (once) when this definition's jq overruns its budget and is switched off."""
        self.breaker.on_trip = handler

    def classify(self, pod: Mapping[str, JSON]) -> Placement:
        if self.breaker.tripped:
            return Placement(reason=REASON_BUDGET)
        return self._planner.classify(pod)

    def gang_key(self, pod: Mapping[str, JSON]) -> str | None:
        """ "<podGroup>/<key parts>" for the pod, or None when no gang takes it (or the breaker is open)."""
        return self.classify(pod).key

    def pod_root_name(self, pod: Mapping[str, JSON]) -> str | None:
        """The root object's name from the pod alone (Phalanx extension `podRootNamePath`), if defined."""
        return None if self.breaker.tripped else self._planner.root_name(pod)

    def status(self, obj: JSON) -> str:
        if self.breaker.tripped:
            return ""
        return self._status.status(obj, jqx.Doc(obj, self.breaker))

    def instances(self, root_obj: JSON, doc: jqx.Doc | None = None) -> tuple[list[ComponentInstance], list[str]]:
        """Every component instance of `root_obj` with its expected pods, and the CR paths that failed."""
        if self.breaker.tripped:
            return [], [REASON_BUDGET]
        doc = doc or jqx.Doc(root_obj, self.breaker)
        found: list[ComponentInstance] = []
        problems: list[str] = []
        for comp in self.components:
            instances, trouble = read_instances(comp, doc)
            found += instances
            problems += trouble
        return found, problems

    def evaluate(self, root_obj: JSON, pods: list[dict[str, JSON]]) -> Evaluation:
        """Gangs, unassigned pods and status of `root_obj`, given the pods known to descend from it."""
        if self.breaker.tripped:
            return self._switched_off(pods)
        doc = jqx.Doc(root_obj, self.breaker)
        instances, problems = self.instances(root_obj, doc)
        placed, unassigned = self._place(pods)
        minimums = {g.name: _minimum(doc, g.min_member_path) for g in self.pod_groups}
        gangs, unattributed = build_gangs(placed, instances, planner=self._planner, minimums=minimums)
        return Evaluation(
            gangs=tuple(gangs),
            unassigned=tuple(unassigned),
            status=self._status.status(root_obj, doc),
            instances=tuple(instances),
            problems=tuple(problems + unattributed),
        )

    def _switched_off(self, pods: list[dict[str, JSON]]) -> Evaluation:
        names = [str((pod.get("metadata") or {}).get("name") or "") for pod in pods]
        unassigned = tuple(Unassigned(name, REASON_BUDGET) for name in names)
        return Evaluation(gangs=(), unassigned=unassigned, status="", instances=(), problems=(REASON_BUDGET,))

    def _place(self, pods: list[dict[str, JSON]]) -> tuple[list[tuple[str, Placement]], list[Unassigned]]:
        placed, unassigned = [], []
        for pod in pods:
            name = (pod.get("metadata") or {}).get("name")
            if not name:
                unassigned.append(Unassigned("", REASON_NO_NAME))
                continue
            placement = self._planner.classify(pod)
            if placement.key is None:
                unassigned.append(Unassigned(name, placement.reason))
            else:
                placed.append((name, placement))
        return placed, unassigned

    def __repr__(self) -> str:
        return f"ResourceInterface({self.root}, components={[c.name for c in self.components]})"


def _minimum(doc: jqx.Doc, path: str | None) -> int | None:
    return None if path is None else jqx.as_count(doc.first(path))


def _gvk(kind: KindDef | None) -> GVK:
    assert kind is not None and kind.group is not None and kind.version and kind.kind
    return GVK(kind.group, kind.version, kind.kind)
