"""The Resource Interface (RI) document as it arrives on the wire: pydantic models, one per section.

The models only check shape (types, unknown fields, required names). Everything the spec's
best-practice list demands (full GVKs, absolute paths, owners, exclusive selectors, compiling jq)
is checked afterwards by `validate`, so that one pass reports every violation with its path.
That is also why GVK fields are optional here: a missing `version` is reported as
`childComponents[1].kind.version: required` without losing the component for the other checks.

Spelling variants the spec itself uses are accepted and normalized before validation:
`ownerName` → `ownerRef`, `fragmentedPodDefinition` → `fragmentedPodSpecDefinition`, a single
status mapping → a one-element list, `byPhase: "X"` → `byPhase: ["X"]`. Giving both spellings of
one field is a violation. Fields marked *Phalanx extension* are not in the spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

JSON = Any

# Generic statuses, in the order they win when several mappings match (terminal states first).
STATUS_FAILED = "failed"
STATUS_COMPLETED = "completed"
STATUS_RUNNING = "running"
STATUS_INITIALIZING = "initializing"
STATUS_PENDING = "pending"
STATUSES = (STATUS_FAILED, STATUS_COMPLETED, STATUS_RUNNING, STATUS_INITIALIZING, STATUS_PENDING)


@dataclass(frozen=True, slots=True, order=True)
class GVK:
    """A complete group/version/kind; `group` is "" for the core API group."""

    group: str
    version: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def __str__(self) -> str:
        return f"{self.api_version} {self.kind}"


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: where (a dotted path into the RI document) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class InvalidDefinition(ValueError):
    """A document rejected as a whole; `violations` lists every problem found."""

    def __init__(self, violations: list[Violation]) -> None:
        self.violations = list(violations)
        lines = "\n".join(f"  - {v}" for v in self.violations)
        super().__init__(f"invalid resource interface ({len(self.violations)} violations):\n{lines}")


def _rename(data: JSON, old: str, new: str) -> JSON:
    """Accept the spec's alternative spelling `old` for `new`; both at once is an error."""
    if not isinstance(data, Mapping) or old not in data:
        return data
    if new in data:
        raise ValueError(f"give either {new} or {old} (the same field), not both")
    renamed = {k: v for k, v in data.items() if k != old}
    renamed[new] = data[old]
    return renamed


class Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)


class KindDef(Wire):
    group: str | None = Field(default=None, description="API group; '' for the core group, but it must be given")
    version: str | None = None
    kind: str | None = None


class SpecDefinition(Wire):
    pod_template_spec_path: str | None = None
    pod_spec_path: str | None = None
    metadata_path: str | None = None
    fragmented_pod_spec_definition: dict[str, str] | None = Field(
        default=None, description="pod fields scattered across the CR, e.g. resourcesPath, schedulerNamePath"
    )
    instance_id_path: str | None = Field(default=None, description="also accepted on the component itself")

    @model_validator(mode="before")
    @classmethod
    def _spellings(cls, data: JSON) -> JSON:
        return _rename(data, "fragmentedPodDefinition", "fragmentedPodSpecDefinition")

    def pod_paths(self) -> dict[str, str]:
        """Every CR path of this definition, by its field name (fragments as `fragmentedPodSpecDefinition.<key>`)."""
        paths = {
            name: value
            for name, value in (
                ("podTemplateSpecPath", self.pod_template_spec_path),
                ("podSpecPath", self.pod_spec_path),
                ("metadataPath", self.metadata_path),
            )
            if value is not None
        }
        for key, value in (self.fragmented_pod_spec_definition or {}).items():
            paths[f"fragmentedPodSpecDefinition.{key}"] = value
        return paths


class ScaleDefinition(Wire):
    replicas_path: str | None = None
    min_replicas_path: str | None = None
    max_replicas_path: str | None = None


class TypeSelector(Wire):
    key_path: str
    value: str | None = Field(default=None, description="without a value only the key's presence is checked")


class InstanceSelector(Wire):
    id_path: str


class PodSelector(Wire):
    component_type_selector: TypeSelector | None = None
    component_instance_selector: InstanceSelector | None = None


class ConditionsDefinition(Wire):
    path: str = ".status.conditions"
    type_field_name: str = "type"
    status_field_name: str = "status"


class PhaseDefinition(Wire):
    path: str = ".status.phase"


class ConditionRequirement(Wire):
    type: str
    status: str


class StatusMapping(Wire):
    by_conditions: list[ConditionRequirement] = Field(default_factory=list)
    by_phase: list[str] = Field(default_factory=list, description="the field name is not in the spec's examples")

    @model_validator(mode="before")
    @classmethod
    def _phase_as_list(cls, data: JSON) -> JSON:
        if isinstance(data, Mapping) and isinstance(data.get("byPhase"), str):
            return {**data, "byPhase": [data["byPhase"]]}
        return data

    @model_validator(mode="after")
    def _not_empty(self) -> StatusMapping:
        if not self.by_conditions and not self.by_phase:
            raise ValueError("a status mapping needs byConditions or byPhase")
        return self


class StatusDefinition(Wire):
    conditions_definition: ConditionsDefinition | None = None
    phase_definition: PhaseDefinition | None = None
    status_mappings: dict[str, list[StatusMapping]] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _mappings_as_lists(cls, data: JSON) -> JSON:
        mappings = data.get("statusMappings") if isinstance(data, Mapping) else None
        if not isinstance(mappings, Mapping):
            return data
        listed = {k: [v] if isinstance(v, Mapping) else v for k, v in mappings.items()}
        return {**data, "statusMappings": listed}


class ComponentDef(Wire):
    name: str = Field(min_length=1)
    kind: KindDef | None = None
    owner_ref: str | None = None
    spec_definition: SpecDefinition | None = None
    instance_id_path: str | None = None
    scale_definition: ScaleDefinition | None = None
    pod_selector: PodSelector | None = None
    status_definition: StatusDefinition | None = None
    pod_root_name_path: str | None = Field(
        default=None, description="Phalanx extension (root only): pod path giving the root object's name"
    )

    @model_validator(mode="before")
    @classmethod
    def _spellings(cls, data: JSON) -> JSON:
        return _rename(data, "ownerName", "ownerRef")

    def id_path(self) -> str | None:
        spec = self.spec_definition
        return self.instance_id_path or (spec.instance_id_path if spec else None)

    def defines_pods(self) -> bool:
        return bool(self.spec_definition and self.spec_definition.pod_paths())

    def bears_pods(self) -> bool:
        """Pods may belong to it: it defines pods or selects them."""
        return self.defines_pods() or self.pod_selector is not None

    def type_selector(self) -> TypeSelector | None:
        return self.pod_selector.component_type_selector if self.pod_selector else None

    def instance_selector(self) -> InstanceSelector | None:
        return self.pod_selector.component_instance_selector if self.pod_selector else None


class MemberDef(Wire):
    component_name: str
    group_by_key_paths: list[str] = Field(default_factory=list)
    filters: list[str] = Field(default_factory=list, description="jq on the pod; all must be truthy (AND)")


class PodGroupDef(Wire):
    name: str = Field(min_length=1)
    members: list[MemberDef] = Field(min_length=1)
    min_member_path: str | None = Field(
        default=None, description="Phalanx extension: CR path overriding each gang's minCount (e.g. minAvailable)"
    )


class GangSchedulingDef(Wire):
    pod_groups: list[PodGroupDef] = Field(default_factory=list)


class OptimizationDef(Wire):
    gang_scheduling: GangSchedulingDef | None = None
