"""Workload types: the `POST /api/v1/workload-types` body, its validation, and the registry of them.

A workload type is a Kind (`name`) in an API `group` with one Resource Interface per served CRD
version. Validation reports every violation at once, with paths into the body
(`resourceInterfaces[1].childComponents[0].ownerRef: ...`): the body's own shape, every RI's
violations, each RI's root kind equal to `name` and root group equal to `group`, and versions
unique across the RIs. Every RI's jq is then timed on probe pods (`probe`): one over its
budget is a violation like any other.

`Registry` is the thread-safe set of registered types, keyed by (group, name), indexed by the
root GVK of every RI; `generation` moves on every change so derived state (watches) can follow.
It hands every RI it holds the handler told when that RI's jq breaker trips (`budget`): by
default a Warning log line; the app adds an Event with `on_budget_trip`.
It round-trips through a ConfigMap's `data`: one key per type, `<group>.<Kind>.yaml` ("core" for
the empty group), holding the body as YAML. `load_defaults()` reads the shipped definitions from
config/resource-interfaces/ (one body per file).
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from extender.ri import probe
from extender.ri.budget import TripHandler
from extender.ri.interface import ResourceInterface, parse
from extender.ri.model import GVK, InvalidDefinition, Violation
from extender.ri.structure import load_text

log = structlog.get_logger("phalanx.ri")

DEFAULTS_DIR = Path(__file__).resolve().parents[2] / "config" / "resource-interfaces"


class WorkloadTypeBody(BaseModel):
    """The REST body, as the spec's Workload Types API table describes it."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    name: str = Field(min_length=1, description="the Kubernetes Kind of the workload, e.g. PyTorchJob")
    group: str = Field(description="the Kind's API group; '' for the core group")
    resource_interfaces: list[dict[str, Any]] = Field(min_length=1, description="one RI per served CRD version")
    category_id: str | None = Field(default=None, description="workload category id (opaque to Phalanx)")
    priority_id: str | None = Field(default=None, description="workload priority id (opaque to Phalanx)")


@dataclass(frozen=True, slots=True)
class WorkloadType:
    """A registered workload type: its Kind, group and one parsed RI per version."""

    name: str
    group: str
    interfaces: tuple[ResourceInterface, ...]
    category_id: str | None = None
    priority_id: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.name)

    @property
    def configmap_key(self) -> str:
        return f"{self.group or 'core'}.{self.name}.yaml"

    def versions(self) -> tuple[str, ...]:
        return tuple(ri.root.version for ri in self.interfaces)

    def interface(self, version: str) -> ResourceInterface | None:
        return next((ri for ri in self.interfaces if ri.root.version == version), None)

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"name": self.name, "group": self.group}
        body["resourceInterfaces"] = [ri.document() for ri in self.interfaces]
        for field, value in (("categoryId", self.category_id), ("priorityId", self.priority_id)):
            if value is not None:
                body[field] = value
        return body

    @classmethod
    def from_body(cls, body: Mapping[str, Any] | str, *, timed: bool = True) -> WorkloadType:
        """Parse and validate; raises InvalidDefinition listing every violation. `timed`: also
        time the jq on probe pods (what a user registers through the API); the shipped
        definitions and what an administrator stored in the ConfigMap are not re-timed at
        load, where a busy machine would make the verdict flaky (the static rules and the
        run-time breaker still apply)."""
        raw = load_text(body) if isinstance(body, str) else body
        try:
            model = WorkloadTypeBody.model_validate(raw)
        except ValidationError as error:
            raise InvalidDefinition(_body_violations(error)) from None
        interfaces, violations = _interfaces(model, timed=timed)
        if violations:
            raise InvalidDefinition(violations)
        return cls(model.name, model.group, tuple(interfaces), model.category_id, model.priority_id)


def _body_violations(error: ValidationError) -> list[Violation]:
    found = []
    for e in error.errors():
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"]).lstrip(".")
        found.append(Violation(path, "required" if e["type"] == "missing" else str(e["msg"])))
    return found


def _interfaces(model: WorkloadTypeBody, *, timed: bool) -> tuple[list[ResourceInterface], list[Violation]]:
    interfaces: list[ResourceInterface] = []
    violations: list[Violation] = []
    versions: dict[str, str] = {}
    for i, doc in enumerate(model.resource_interfaces):
        base = f"resourceInterfaces[{i}]"
        try:
            ri = parse(doc)
        except InvalidDefinition as error:
            violations += [Violation(f"{base}.{v.path}" if v.path else base, v.message) for v in error.violations]
            continue
        violations += _matches_type(ri, model, base)
        if timed:
            probed = probe.check(ri.definition)
            violations += [Violation(f"{base}.{v.path}" if v.path else base, v.message) for v in probed]
        if ri.root.version in versions:
            why = f"duplicate version {ri.root.version!r} (also {versions[ri.root.version]})"
            violations.append(Violation(f"{base}.rootComponent.kind.version", why))
        versions.setdefault(ri.root.version, base)
        interfaces.append(ri)
    return interfaces, violations


def _matches_type(ri: ResourceInterface, model: WorkloadTypeBody, base: str) -> list[Violation]:
    found = []
    if ri.root.kind != model.name:
        why = f"must equal the workload type name {model.name!r}, not {ri.root.kind!r}"
        found.append(Violation(f"{base}.rootComponent.kind.kind", why))
    if ri.root.group != model.group:
        why = f"must equal the workload type group {model.group!r}, not {ri.root.group!r}"
        found.append(Violation(f"{base}.rootComponent.kind.group", why))
    return found


class Registry:
    """Registered workload types; every method is safe to call from any thread."""

    def __init__(self, types: Iterable[WorkloadType] = ()) -> None:
        self._lock = threading.Lock()
        self._types: dict[tuple[str, str], WorkloadType] = {}
        self._by_gvk: dict[GVK, ResourceInterface] = {}
        self.generation = 0
        self._on_trip: TripHandler = _log_trip
        for wt in types:
            self.put(wt)

    def put(self, wt: WorkloadType) -> WorkloadType | None:
        """Add or replace; returns the type it replaced, if any."""
        with self._lock:
            previous = self._types.get(wt.key)
            self._types[wt.key] = wt
            self._reindex()
            return previous

    def on_budget_trip(self, handler: TripHandler) -> None:
        """Also tell `handler(definition, message)` when a registered RI's jq is switched off for
        overrunning its budget (after the Warning log line)."""

        def both(name: str, message: str) -> None:
            _log_trip(name, message)
            handler(name, message)

        with self._lock:
            self._on_trip = both
            self._reindex()

    def get(self, name: str, group: str | None = None) -> WorkloadType | None:
        """By name and group; without a group, the only type of that name (None when several)."""
        with self._lock:
            return self._find(name, group)

    def list(self) -> list[WorkloadType]:
        with self._lock:
            return [self._types[k] for k in sorted(self._types)]

    def delete(self, name: str, group: str | None = None) -> WorkloadType | None:
        with self._lock:
            found = self._find(name, group)
            if found is None:
                return None
            del self._types[found.key]
            self._reindex()
            return found

    def lookup(self, group: str, version: str, kind: str) -> ResourceInterface | None:
        """The RI for a root object's GVK."""
        with self._lock:
            return self._by_gvk.get(GVK(group, version, kind))

    def watched_kinds(self) -> frozenset[GVK]:
        """Root, child and additional child GVKs of every registered RI."""
        with self._lock:
            return frozenset(gvk for ri in self._by_gvk.values() for gvk in ri.kinds())

    def to_configmap_data(self) -> dict[str, str]:
        with self._lock:
            types = list(self._types.values())
        return {wt.configmap_key: yaml.safe_dump(wt.to_body(), sort_keys=False) for wt in types}

    @classmethod
    def from_configmap_data(cls, data: Mapping[str, str]) -> tuple[Registry, builtins.list[Violation]]:
        """A registry of every valid entry, and the violations of the others (paths prefixed by key)."""
        types: builtins.list[WorkloadType] = []
        violations: builtins.list[Violation] = []
        for key in sorted(data):
            try:
                types.append(WorkloadType.from_body(data[key], timed=False))
            except InvalidDefinition as error:
                violations += [Violation(f"{key}:{v.path}", v.message) for v in error.violations]
            except yaml.YAMLError as error:
                violations.append(Violation(key, f"not YAML: {error}"))
        return cls(types), violations

    def _find(self, name: str, group: str | None) -> WorkloadType | None:
        if group is not None:
            return self._types.get((group, name))
        found = [wt for (_, n), wt in self._types.items() if n == name]
        return found[0] if len(found) == 1 else None

    def _reindex(self) -> None:
        self._by_gvk = {ri.root: ri for wt in self._types.values() for ri in wt.interfaces}
        for ri in self._by_gvk.values():
            ri.on_budget_trip(self._on_trip)
        self.generation += 1


def _log_trip(name: str, message: str) -> None:
    log.warning("resource interface switched off", definition=name, message=message)


def load_defaults(directory: Path | None = None) -> list[WorkloadType]:
    """The shipped workload types (config/resource-interfaces/*.yaml); a broken file raises."""
    files = sorted((directory or DEFAULTS_DIR).glob("*.yaml"))
    return [WorkloadType.from_body(path.read_text(), timed=False) for path in files]
