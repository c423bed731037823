"""CR side: each component's instances, the pods each instance expects, and a template pod for it.

- A component's pod specs are the outputs of its specDefinition path (`podTemplateSpecPath`, else
  `podSpecPath`/`metadataPath` zipped, broadcasting a single output). A null output (e.g.
  `.spec.pytorchReplicaSpecs.Master.template` on a job without a master) means no instance.
  A component defined only by `fragmentedPodSpecDefinition` has one instance: fragments are
  overrides, their absence does not make the component absent.
- Instance ids are the outputs of `instanceIdPath` (`.spec.jobs[].name` for arrays,
  `.spec.jobs | to_entries[] | .key` for maps), aligned with the specs by position; one spec
  and many ids broadcasts the spec (LeaderWorkerSet: one template, `replicas` groups). Without
  `instanceIdPath` a single spec is instance "" and several are "0", "1", ...
- Counts per instance: `replicasPath` (default: minReplicas when positive, else 1),
  `minReplicasPath` (default: replicas; capped at replicas), `maxReplicasPath` (informational).
  Each path yields one value for all instances or one per instance.
- The template pod (`{"metadata", "spec"}` from the spec) lets the gang builder evaluate a
  member's filters and keys for instances whose pods do not exist yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from extender.ri import jqx
from extender.ri.model import JSON, ComponentDef, SpecDefinition

_ABSENT = object()


@dataclass(frozen=True, slots=True)
class ComponentInstance:
    """One instance of a component and the pods the CR asks of it."""

    component: str
    instance: str
    replicas: int
    min_replicas: int
    max_replicas: int | None = None
    template: JSON = field(default=None, compare=False, repr=False)


def read_instances(comp: ComponentDef, doc: jqx.Doc) -> tuple[list[ComponentInstance], list[str]]:
    """The component's instances in `doc` (the root CR), and what could not be read."""
    if comp.spec_definition is None or not comp.defines_pods():
        return [], []
    problems: list[str] = []
    sources = _sources(comp.spec_definition, doc, problems, comp.name)
    ids = _ids(comp, doc, len(sources), problems)
    if len(sources) == 1 and len(ids) > 1:
        sources = sources * len(ids)
    elif len(sources) != len(ids):
        problems.append(f"{comp.name}: instanceIdPath gives {len(ids)} ids for {len(sources)} pod specs")
    n = min(len(sources), len(ids))
    scale = comp.scale_definition
    paths = (scale.replicas_path, scale.min_replicas_path, scale.max_replicas_path) if scale else (None, None, None)
    replicas, mins, maxs = (_counts(p, doc, n, problems, comp.name) for p in paths)
    found = []
    for i in range(n):
        if sources[i] is _ABSENT:
            continue
        r, m = _replicas(replicas[i], mins[i])
        found.append(ComponentInstance(comp.name, ids[i], r, m, maxs[i], sources[i]))
    return found, problems


def _sources(spec: SpecDefinition, doc: jqx.Doc, problems: list[str], name: str) -> list[JSON]:
    """One entry per pod spec: a template pod, None (present, no pod shape) or _ABSENT."""
    if spec.pod_template_spec_path:
        return [
            _template(t.get("metadata"), t.get("spec")) if isinstance(t, Mapping) else _ABSENT
            for t in _all(doc, spec.pod_template_spec_path, problems, name)
        ]
    if spec.pod_spec_path or spec.metadata_path:
        specs = _all(doc, spec.pod_spec_path, problems, name) if spec.pod_spec_path else None
        metas = _all(doc, spec.metadata_path, problems, name) if spec.metadata_path else None
        return _zip_pod(specs, metas)
    return [None]


def _zip_pod(specs: list[JSON] | None, metas: list[JSON] | None) -> list[JSON]:
    n = max(len(specs or ()), len(metas or ()))
    found = []
    for i in range(n):
        spec = _nth(specs, i)
        meta = _nth(metas, i)
        present = spec is not None if specs is not None else meta is not None
        found.append(_template(meta, spec) if present else _ABSENT)
    return found


def _nth(values: list[JSON] | None, i: int) -> JSON:
    if not values:
        return None
    return values[0] if len(values) == 1 else (values[i] if i < len(values) else None)


def _template(meta: JSON, spec: JSON) -> dict[str, JSON]:
    return {"metadata": meta if isinstance(meta, Mapping) else {}, "spec": spec if isinstance(spec, Mapping) else {}}


def _ids(comp: ComponentDef, doc: jqx.Doc, n: int, problems: list[str]) -> list[str]:
    path = comp.id_path()
    if path is None:
        return [""] if n == 1 else [str(i) for i in range(n)]
    return [jqx.as_text(v) for v in _all(doc, path, problems, comp.name) if v is not None]


def _counts(path: str | None, doc: jqx.Doc, n: int, problems: list[str], name: str) -> list[int | None]:
    if path is None:
        return [None] * n
    values = [jqx.as_count(v) for v in _all(doc, path, problems, name)]
    if len(values) == n:
        return values
    if len(values) != 1 and n:
        problems.append(f"{name}: {path} gives {len(values)} values for {n} instances")
    return [values[0] if values else None] * n


def _replicas(replicas: int | None, minimum: int | None) -> tuple[int, int]:
    if replicas is None:
        replicas = minimum if minimum else 1
    if minimum is None:
        minimum = replicas
    return replicas, min(minimum, replicas)


def _all(doc: jqx.Doc, path: str, problems: list[str], name: str) -> list[JSON]:
    try:
        return doc.all(path)
    except jqx.JqRuntimeError as error:
        problems.append(f"{name}: {error}")
        return []
