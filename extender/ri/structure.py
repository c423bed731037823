"""From a raw RI document (YAML/JSON text or a mapping) to a `Definition`, piece by piece.

The spec shows two layouts: the bare one (`rootComponent`, `childComponents`,
`additionalChildKinds`, `optimizationInstructions` at the top) and the KServe example's
`{"spec": {"structureDefinition": {...}, "optimizationInstructions": {...}}}`. Both are
accepted, with or without the `spec` wrapper (whose `apiVersion`/`kind`/`metadata` siblings are
ignored). Violation paths are always relative to the structure (`childComponents[1].kind`), or
start at `optimizationInstructions`, whatever the layout.

Each component, additional kind and pod group is validated on its own, so one broken component
does not hide the problems of the others; the pieces that parse go on to the semantic checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
import yaml
from pydantic import BaseModel, ValidationError

from extender.ri.model import JSON, ComponentDef, KindDef, OptimizationDef, PodGroupDef, Violation

STRUCTURE_KEYS = frozenset({"rootComponent", "childComponents", "additionalChildKinds"})
BODY_KEYS = frozenset({"structureDefinition", "optimizationInstructions", "additionalChildKinds"})
WRAPPER_KEYS = frozenset({"apiVersion", "kind", "metadata", "spec"})

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class Definition:
    """The parts of an RI that parsed; `children[i]` is None when `childComponents[i]` did not."""

    root: ComponentDef | None
    children: tuple[ComponentDef | None, ...]
    additional_kinds: tuple[KindDef | None, ...]
    pod_groups: tuple[PodGroupDef | None, ...]
    document: dict[str, JSON]  # normalized: {"structureDefinition": ..., "optimizationInstructions": ...}

    def components(self) -> list[tuple[str, ComponentDef]]:
        """(document path, component) for every parsed component, root first."""
        found = [("rootComponent", self.root)] if self.root else []
        found += [(f"childComponents[{i}]", c) for i, c in enumerate(self.children) if c]
        return found


def load_text(text: str) -> JSON:
    """JSON first (the spec's KServe example indents with tabs, which YAML refuses), then YAML."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return yaml.safe_load(text)


def read(doc: Mapping[str, JSON] | str) -> tuple[Definition, list[Violation]]:
    raw = load_text(doc) if isinstance(doc, str) else doc
    if not isinstance(raw, Mapping):
        return _empty(), [Violation("", "a resource interface must be a mapping")]
    violations: list[Violation] = []
    structure, optimization = _unwrap(raw, violations)
    root = _model(ComponentDef, structure.get("rootComponent"), "rootComponent", violations, required=True)
    children = _listed(ComponentDef, structure.get("childComponents"), "childComponents", violations)
    kinds = _listed(KindDef, structure.get("additionalChildKinds"), "additionalChildKinds", violations)
    groups = _pod_groups(optimization, violations)
    document = {"structureDefinition": dict(structure), "optimizationInstructions": optimization or {}}
    return Definition(root, children, kinds, groups, document), violations


def _empty() -> Definition:
    return Definition(None, (), (), (), {})


def _unwrap(raw: Mapping[str, JSON], violations: list[Violation]) -> tuple[dict[str, JSON], JSON]:
    body: Mapping[str, JSON] = raw
    if isinstance(raw.get("spec"), Mapping):
        _unknown(raw, WRAPPER_KEYS, "", violations)
        body = raw["spec"]
    if "structureDefinition" in body:
        _unknown(body, BODY_KEYS, "", violations)
        structure = body["structureDefinition"]
        if not isinstance(structure, Mapping):
            violations.append(Violation("structureDefinition", "must be a mapping"))
            structure = {}
        structure = dict(structure)
        if "additionalChildKinds" in body:
            structure.setdefault("additionalChildKinds", body["additionalChildKinds"])
    else:
        _unknown(body, STRUCTURE_KEYS | {"optimizationInstructions"}, "", violations)
        structure = {k: v for k, v in body.items() if k in STRUCTURE_KEYS}
    _unknown(structure, STRUCTURE_KEYS, "", violations)
    return structure, body.get("optimizationInstructions")


def _unknown(data: Mapping[str, JSON], allowed: frozenset[str], path: str, violations: list[Violation]) -> None:
    for key in data:
        if key not in allowed:
            violations.append(Violation(_join(path, str(key)), "unknown field"))


def _pod_groups(optimization: JSON, violations: list[Violation]) -> tuple[PodGroupDef | None, ...]:
    if optimization is None:
        return ()
    if not isinstance(optimization, Mapping):
        violations.append(Violation("optimizationInstructions", "must be a mapping"))
        return ()
    shell = {k: v for k, v in optimization.items() if k != "gangScheduling"}
    _model(OptimizationDef, shell, "optimizationInstructions", violations)
    gang = optimization.get("gangScheduling")
    if gang is None:
        return ()
    base = "optimizationInstructions.gangScheduling"
    if not isinstance(gang, Mapping):
        violations.append(Violation(base, "must be a mapping"))
        return ()
    _unknown(gang, frozenset({"podGroups"}), base, violations)
    return _listed(PodGroupDef, gang.get("podGroups"), f"{base}.podGroups", violations)


def _listed(model: type[M], items: JSON, path: str, violations: list[Violation]) -> tuple[M | None, ...]:
    if items is None:
        return ()
    if not isinstance(items, list):
        violations.append(Violation(path, "must be a list"))
        return ()
    return tuple(_model(model, item, f"{path}[{i}]", violations) for i, item in enumerate(items))


def _model(model: type[M], data: JSON, path: str, violations: list[Violation], *, required: bool = False) -> M | None:
    if data is None:
        if required:
            violations.append(Violation(path, "required"))
        return None
    try:
        return model.model_validate(data)
    except ValidationError as error:
        violations.extend(_violations(error, path))
        return None


def _violations(error: ValidationError, path: str) -> list[Violation]:
    return [Violation(_loc(path, e["loc"]), _message(e)) for e in error.errors()]


def _message(error: Any) -> str:
    kind = error["type"]
    if kind == "missing":
        return "required"
    if kind == "extra_forbidden":
        return "unknown field"
    return str(error["msg"]).removeprefix("Value error, ")


def _loc(path: str, loc: tuple[int | str, ...]) -> str:
    for part in loc:
        path = f"{path}[{part}]" if isinstance(part, int) else _join(path, part)
    return path


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
