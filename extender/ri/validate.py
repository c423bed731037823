"""The spec's best-practice list as checks; each check yields every violation it finds, with its path.

Rules, and how the spec's own examples bend them:
- Full GVK everywhere: `group` must be given (it may be "" for the core API group), `version`
  and `kind` must be non-empty.
- The root has a `statusDefinition` with at least one mapping, and no owner.
- Children have an `ownerRef` naming an existing component (not themselves), and owners form
  no cycle. Component names are unique.
- Paths (CR side: specDefinition, instanceIdPath, scaleDefinition, status paths, minMemberPath;
  pod side: podSelector paths, podRootNamePath) start with `.`; every jq expression compiles.
  `filters` and `groupByKeyPaths` are queries, not paths: they need only compile (bare-word keys
  are literals, see `jqx`). No expression may use what `jqlint` forbids (loops, recursion,
  user functions, environment, risky regexes): user jq runs in the extender's verbs.
- No duplicate child kinds: an `additionalChildKinds` entry may not repeat another entry, the
  root's kind, or an explicitly defined component's kind. Two *components* may share a kind only
  when both carry a `componentTypeSelector` - the spec's own KServe example defines predictor and
  transformer as two `apps/v1 Deployment` children told apart by their selectors.
- `podTemplateSpecPath` excludes `podSpecPath`/`metadataPath`; `fragmentedPodSpecDefinition` may
  complement either (the KServe example combines `podSpecPath`, `metadataPath` and fragments).
- Selectors are mutually exclusive: no two components with the same `componentTypeSelector` key
  and the same value, or the same key with one of them lacking a value; at most one
  pod-bearing component without a type selector (it takes the pods no selector claims). A
  component with `instanceIdPath` needs a `componentInstanceSelector`, and vice versa.
- Status mapping keys are generic statuses; gang members name existing components; pod group
  names are unique.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import combinations

from extender.ri import jqlint, jqx
from extender.ri.model import STATUSES, ComponentDef, KindDef, PodGroupDef, Violation
from extender.ri.structure import Definition

Components = list[tuple[str, ComponentDef]]


def validate(defn: Definition) -> list[Violation]:
    comps = defn.components()
    checks = (
        _gvks(defn),
        _root(defn),
        _names_and_owners(defn),
        _duplicate_kinds(defn),
        _spec_definitions(comps),
        _selectors(comps),
        _statuses(comps),
        _pod_groups(defn, {c.name for _, c in comps}),
        _expressions(defn),
    )
    return [v for check in checks for v in check]


def _gvks(defn: Definition) -> Iterator[Violation]:
    for path, comp in defn.components():
        if comp.kind is None:
            yield Violation(f"{path}.kind", "required (group, version, kind)")
        else:
            yield from _gvk(comp.kind, f"{path}.kind")
    for i, kind in enumerate(defn.additional_kinds):
        if kind is not None:
            yield from _gvk(kind, f"additionalChildKinds[{i}]")


def _gvk(kind: KindDef, path: str) -> Iterator[Violation]:
    if kind.group is None:
        yield Violation(f"{path}.group", 'required (use "" for the core API group)')
    if not kind.version:
        yield Violation(f"{path}.version", "required")
    if not kind.kind:
        yield Violation(f"{path}.kind", "required")


def _root(defn: Definition) -> Iterator[Violation]:
    root = defn.root
    if root is None:
        return
    if root.status_definition is None:
        yield Violation("rootComponent.statusDefinition", "required for the root component")
    elif not root.status_definition.status_mappings:
        yield Violation("rootComponent.statusDefinition.statusMappings", "at least one status mapping required")
    if root.owner_ref is not None:
        yield Violation("rootComponent.ownerRef", "the root component has no owner")


def _names_and_owners(defn: Definition) -> Iterator[Violation]:
    comps = defn.components()
    seen: dict[str, str] = {}
    for path, comp in comps:
        if comp.name in seen:
            yield Violation(f"{path}.name", f"duplicate component name {comp.name!r} (also {seen[comp.name]})")
        seen.setdefault(comp.name, path)
    owners: dict[str, str | None] = {}
    for _, comp in comps[1 if defn.root else 0 :]:
        owners.setdefault(comp.name, comp.owner_ref)
    for path, comp in comps[1 if defn.root else 0 :]:
        yield from _owner(path, comp, seen, owners)


def _owner(path: str, comp: ComponentDef, names: dict[str, str], owners: dict[str, str | None]) -> Iterator[Violation]:
    if comp.owner_ref is None:
        yield Violation(f"{path}.ownerRef", "required: the component that owns this one")
    elif comp.owner_ref == comp.name:
        yield Violation(f"{path}.ownerRef", "a component cannot own itself")
    elif comp.owner_ref not in names:
        yield Violation(f"{path}.ownerRef", f"names no component: {comp.owner_ref!r}")
    elif _cycle(comp.name, owners):
        yield Violation(f"{path}.ownerRef", f"ownership cycle through {comp.name!r}")


def _cycle(name: str, owners: dict[str, str | None]) -> bool:
    seen = {name}
    owner = owners.get(name)
    while owner is not None:
        if owner in seen:
            return owner == name
        seen.add(owner)
        owner = owners.get(owner)
    return False


def _duplicate_kinds(defn: Definition) -> Iterator[Violation]:
    comps = defn.components()
    children = comps[1:] if defn.root else comps
    for n, (path, comp) in enumerate(children):
        twin = next((p for p, c in children[:n] if _same_kind(c, comp) and not _both_selected(c, comp)), None)
        if twin is not None:
            why = f"duplicate child kind (also {twin}); tell them apart with componentTypeSelector"
            yield Violation(f"{path}.kind", why)
    defined: dict[tuple[str | None, ...], str] = {}
    for path, comp in comps:
        if comp.kind:
            defined.setdefault(_key(comp.kind), path)
    listed: dict[tuple[str | None, ...], str] = {}
    for i, kind in enumerate(defn.additional_kinds):
        if kind is None:
            continue
        path, key = f"additionalChildKinds[{i}]", _key(kind)
        if key in defined:
            yield Violation(path, f"already defined explicitly as {defined[key]}")
        elif key in listed:
            yield Violation(path, f"duplicate child kind (also {listed[key]})")
        listed.setdefault(key, path)


def _same_kind(a: ComponentDef, b: ComponentDef) -> bool:
    return a.kind is not None and b.kind is not None and _key(a.kind) == _key(b.kind)


def _both_selected(a: ComponentDef, b: ComponentDef) -> bool:
    return a.type_selector() is not None and b.type_selector() is not None


def _key(kind: KindDef) -> tuple[str | None, ...]:
    return (kind.group, kind.version, kind.kind)


def _spec_definitions(comps: Components) -> Iterator[Violation]:
    for path, comp in comps:
        spec = comp.spec_definition
        if spec and spec.pod_template_spec_path and (spec.pod_spec_path or spec.metadata_path):
            yield Violation(f"{path}.specDefinition", "podTemplateSpecPath excludes podSpecPath and metadataPath")
        if spec and spec.instance_id_path and comp.instance_id_path:
            yield Violation(f"{path}.instanceIdPath", "given twice (component and specDefinition)")
        if comp.id_path() and not comp.instance_selector():
            why = "required: the component has instances (instanceIdPath)"
            yield Violation(f"{path}.podSelector.componentInstanceSelector", why)
        if comp.instance_selector() and not comp.id_path():
            yield Violation(f"{path}.instanceIdPath", "required by componentInstanceSelector")


def _selectors(comps: Components) -> Iterator[Violation]:
    bearing = [(p, c) for p, c in comps if c.bears_pods()]
    bare = [(p, c) for p, c in bearing if c.type_selector() is None]
    if len(bare) > 1:
        names = ", ".join(c.name for _, c in bare)
        why = f"componentTypeSelector required: several components define pods ({names})"
        for path, _ in bare:
            yield Violation(f"{path}.podSelector", why)
    typed = [(p, c) for p, c in bearing if c.type_selector() is not None]
    for (p1, c1), (p2, c2) in combinations(typed, 2):
        s1, s2 = c1.type_selector(), c2.type_selector()
        assert s1 is not None and s2 is not None
        if " ".join(s1.key_path.split()) != " ".join(s2.key_path.split()):
            continue
        if s1.value is None or s2.value is None or s1.value == s2.value:
            why = "same key and value" if s1.value == s2.value else "same key, one without value"
            yield Violation(f"{p2}.podSelector.componentTypeSelector", f"not mutually exclusive with {p1} ({why})")


def _statuses(comps: Components) -> Iterator[Violation]:
    for path, comp in comps:
        status = comp.status_definition
        for name in status.status_mappings if status else ():
            if name not in STATUSES:
                why = f"unknown status; use one of {', '.join(STATUSES)}"
                yield Violation(f"{path}.statusDefinition.statusMappings.{name}", why)


def _pod_groups(defn: Definition, names: set[str]) -> Iterator[Violation]:
    base = "optimizationInstructions.gangScheduling.podGroups"
    seen: set[str] = set()
    for i, group in enumerate(defn.pod_groups):
        if group is None:
            continue
        if group.name in seen:
            yield Violation(f"{base}[{i}].name", f"duplicate pod group {group.name!r}")
        seen.add(group.name)
        for j, member in enumerate(group.members):
            if member.component_name not in names:
                why = f"names no component: {member.component_name!r}"
                yield Violation(f"{base}[{i}].members[{j}].componentName", why)


def _expressions(defn: Definition) -> Iterator[Violation]:
    for path, expression, absolute in all_expressions(defn):
        if absolute and not jqx.is_absolute(expression):
            yield Violation(path, f"must be an absolute path starting with '.': {expression!r}")
        elif (error := jqx.compile_error(expression)) is not None:
            yield Violation(path, f"jq does not compile: {error}")
        else:
            for problem in jqlint.problems(expression):
                yield Violation(path, f"jq not allowed in a resource interface: {problem}")


def all_expressions(defn: Definition) -> Iterator[tuple[str, str, bool]]:
    """(path, jq text, must be absolute) for every expression in the definition."""
    for path, comp in defn.components():
        yield from _component_expressions(path, comp)
    for i, group in enumerate(defn.pod_groups):
        if group is not None:
            yield from _group_expressions(f"optimizationInstructions.gangScheduling.podGroups[{i}]", group)


def _component_expressions(path: str, comp: ComponentDef) -> Iterator[tuple[str, str, bool]]:
    spec, scale, status = comp.spec_definition, comp.scale_definition, comp.status_definition
    for name, expression in (spec.pod_paths() if spec else {}).items():
        yield f"{path}.specDefinition.{name}", expression, True
    if spec and spec.instance_id_path:
        yield f"{path}.specDefinition.instanceIdPath", spec.instance_id_path, True
    optional: dict[str, str | None] = {
        "instanceIdPath": comp.instance_id_path,
        "podRootNamePath": comp.pod_root_name_path,
        "scaleDefinition.replicasPath": scale.replicas_path if scale else None,
        "scaleDefinition.minReplicasPath": scale.min_replicas_path if scale else None,
        "scaleDefinition.maxReplicasPath": scale.max_replicas_path if scale else None,
        "statusDefinition.conditionsDefinition.path": _conditions_path(comp),
        "statusDefinition.phaseDefinition.path": status.phase_definition.path
        if status and status.phase_definition
        else None,
    }
    type_selector, instance_selector = comp.type_selector(), comp.instance_selector()
    if type_selector:
        optional["podSelector.componentTypeSelector.keyPath"] = type_selector.key_path
    if instance_selector:
        optional["podSelector.componentInstanceSelector.idPath"] = instance_selector.id_path
    for name, text in optional.items():
        if text is not None:
            yield f"{path}.{name}", text, True


def _conditions_path(comp: ComponentDef) -> str | None:
    status = comp.status_definition
    return status.conditions_definition.path if status and status.conditions_definition else None


def _group_expressions(path: str, group: PodGroupDef) -> Iterator[tuple[str, str, bool]]:
    if group.min_member_path is not None:
        yield f"{path}.minMemberPath", group.min_member_path, True
    for j, member in enumerate(group.members):
        for k, key in enumerate(member.group_by_key_paths):
            yield f"{path}.members[{j}].groupByKeyPaths[{k}]", jqx.key_expression(key), False
        for k, expression in enumerate(member.filters):
            yield f"{path}.members[{j}].filters[{k}]", expression, False
