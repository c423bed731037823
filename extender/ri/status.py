"""A CR's own status, mapped onto the RI's generic statuses.

Semantics (the spec is brief; these are the choices):
- A mapping matches when every `byConditions` entry finds a condition of that type whose status
  equals the given one (AND; an absent condition does not satisfy `status: "False"` - the spec
  says "all must exist"), and, when `byPhase` is given, the phase is one of those values. Both
  parts given: both must hold.
- A generic status may list several mappings; any one matching is enough (OR).
- When several statuses match, the first of failed, completed, running, initializing, pending
  wins: terminal states first, so "Running=True, Succeeded=True" during teardown is completed.
- Nothing matches: `pending`.
- `conditionsDefinition` / `phaseDefinition` default to `.status.conditions` (type/status) and
  `.status.phase`: the spec's minimal example uses `byConditions` without a
  `conditionsDefinition`, although its text says one must be included first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from extender.ri import jqx
from extender.ri.model import (
    JSON,
    STATUS_PENDING,
    STATUSES,
    ConditionsDefinition,
    PhaseDefinition,
    StatusDefinition,
    StatusMapping,
)


@dataclass(frozen=True, slots=True)
class Observed:
    """What the CR says: condition type → status, and the phase."""

    conditions: Mapping[str, str]
    phase: str | None


class StatusReader:
    """Compiled once per RI; `status(obj)` is the generic status of one CR."""

    def __init__(self, definition: StatusDefinition) -> None:
        self._conditions = definition.conditions_definition or ConditionsDefinition()
        self._phase = definition.phase_definition or PhaseDefinition()
        self._mappings = {s: definition.status_mappings.get(s, []) for s in STATUSES}

    def status(self, obj: JSON, doc: jqx.Doc | None = None) -> str:
        observed = self.observe(doc or jqx.Doc(obj))
        for name in STATUSES:
            if any(_matches(m, observed) for m in self._mappings[name]):
                return name
        return STATUS_PENDING

    def observe(self, doc: jqx.Doc) -> Observed:
        listed = doc.first(self._conditions.path)
        conditions: dict[str, str] = {}
        for item in listed if isinstance(listed, list) else []:
            if isinstance(item, Mapping) and self._conditions.type_field_name in item:
                kind = jqx.as_text(item[self._conditions.type_field_name])
                conditions[kind] = jqx.as_text(item.get(self._conditions.status_field_name))
        phase = doc.first(self._phase.path)
        return Observed(conditions, None if phase is None else jqx.as_text(phase))


def _matches(mapping: StatusMapping, observed: Observed) -> bool:
    if mapping.by_phase and observed.phase not in mapping.by_phase:
        return False
    return all(observed.conditions.get(c.type) == c.status for c in mapping.by_conditions)
