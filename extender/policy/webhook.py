"""The admission webhooks that enforce WorkloadPolicies: `/mutate` writes defaults, `/validate`
rejects violations, both answering `admission.k8s.io/v1` AdmissionReviews.

What is checked: every Pod at creation, and every workload object whose kind has a Resource
Interface (PyTorchJob, JobSet, ...; and batch Jobs) at creation and update, through the pod
templates the RI's `podTemplateSpecPath`s point at, so a job that breaks a policy is refused at
submission, before its controller makes a pod. Workload-level fields (`backoffLimit`) are read
from the object itself.

The webhook configurations that route reviews here: `registration.py`.
Without any WorkloadPolicy an answer is "allowed" after one dict lookup.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import structlog

from extender.policy import fields
from extender.policy.evaluate import Effective, Evaluation, Violation, evaluate
from extender.policy.priorities import Index
from extender.policy.store import PolicyStore
from extender.ri.jqx import Doc
from extender.ri.model import GVK
from extender.ri.registry import Registry

log = structlog.get_logger("phalanx.policy.webhook")

JOB = GVK("batch", "v1", "Job")
JSON = Any


@dataclass(frozen=True, slots=True)
class Checked:
    """What admission found in one object: violations, the JSON patch of its defaults, and
    warnings for the submitter (AdmissionResponse.warnings)."""

    violations: list[Violation]
    patch: list[dict[str, JSON]]
    warnings: list[str]


@dataclass(frozen=True, slots=True)
class Template:
    """One pod template inside an object: where its metadata and spec are (JSON pointers; a
    pod's own are "/metadata" and "/spec") and their content as one `{metadata, spec}`."""

    meta_pointer: str
    spec_pointer: str
    value: dict[str, JSON]

    @property
    def where(self) -> str:
        """The template's place for messages: `spec.pytorchReplicaSpecs.Worker.template`."""
        common = self.spec_pointer.removesuffix("/spec")
        if self.meta_pointer != common + "/metadata":
            common = self.spec_pointer
        return common.strip("/").replace("/", ".")


class Admission:
    def __init__(
        self,
        store: PolicyStore,
        registry: Registry,
        *,
        queue_of: Callable[[str, Mapping[str, str]], str],
        priorities: Callable[[], Index] = Index,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self.store = store
        self.registry = registry
        self.queue_of = queue_of  # (namespace, labels) -> queue
        self.priorities = priorities  # the cluster's PriorityClasses (priorities.py)
        self.ready = ready  # the WorkloadPolicies listed (or their API not served)

    # ------------------------------------------------------------------ HTTP

    def mutate(self, body: bytes) -> tuple[int, JSON]:
        return self._review(body, mutate=True)

    def validate(self, body: bytes) -> tuple[int, JSON]:
        return self._review(body, mutate=False)

    def _review(self, body: bytes, *, mutate: bool) -> tuple[int, JSON]:
        try:
            review = orjson.loads(body)
            request = review["request"]
            uid = str(request["uid"])
        except (orjson.JSONDecodeError, KeyError, TypeError) as e:
            return 400, {"error": f"not an AdmissionReview: {e}"}
        try:
            response = self.review(request, mutate=mutate)
        except Exception as e:  # a fault of ours is an answer the API server understands
            log.exception("admission failed", uid=uid)
            response = {
                "allowed": False,
                "status": {"code": 500, "message": f"Phalanx policy webhook: internal error: {e}"},
            }
        response["uid"] = uid
        return 200, {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}

    # ------------------------------------------------------------------ review

    def review(self, request: Mapping[str, JSON], *, mutate: bool) -> dict[str, JSON]:
        """One AdmissionReview's response. CREATE: defaults (mutate) and every rule (validate).
        UPDATE: no defaults (a running workload's templates may be immutable) and only the pod
        templates (and workload fields) the update changes are judged, so tightening a policy
        never freezes the workloads that were admitted before."""
        obj = request.get("object")
        if not isinstance(obj, dict):
            return {"allowed": True}
        if not self.ready():
            return _refused(503, "ServiceUnavailable", "Phalanx has not loaded the WorkloadPolicies yet; retry")
        if not self.store:
            return {"allowed": True}
        update = request.get("operation") == "UPDATE"
        if update and mutate:
            return {"allowed": True}
        old = request.get("oldObject") if update else None
        kind = request.get("kind") or {}
        gvk = GVK(str(kind.get("group", "")), str(kind.get("version", "")), str(kind.get("kind", "")))
        namespace = str(request.get("namespace") or (obj.get("metadata") or {}).get("namespace") or "")
        checked = self.check(gvk, obj, namespace, mutate=mutate, old=old if isinstance(old, dict) else None)
        if checked is None:
            return {"allowed": True}
        if checked.violations and not mutate:  # the validating webhook refuses (after every mutation)
            messages = "; ".join(v.message for v in checked.violations)
            return _refused(
                403, "Forbidden", f"{gvk.kind} {namespace}/{_name(obj)} violates workload policy: {messages}"
            )
        response: dict[str, JSON] = {"allowed": True}
        if checked.patch:
            response |= {"patchType": "JSONPatch", "patch": base64.b64encode(orjson.dumps(checked.patch)).decode()}
        if checked.warnings:
            response["warnings"] = checked.warnings
        return response

    def check(
        self, gvk: GVK, obj: dict[str, JSON], namespace: str, *, mutate: bool = True, old: dict[str, JSON] | None = None
    ) -> Checked | None:
        """The violations of `obj` under the policies of its namespace and queue, and the JSON
        patch that writes its defaults; None when no policy applies or the kind carries no pods.
        With `old` (an update), only what changed from it is judged. A template's queue is its
        own label's, else the object's (its pods will carry the template's labels)."""
        templates = self.templates(gvk, obj)
        if templates is None:
            return None
        labels = (obj.get("metadata") or {}).get("labels") or {}
        pod = gvk.group == "" and gvk.kind == "Pod"
        out = Checked([], [], [])
        for template in templates:
            if old is not None and _unchanged(old, template):
                continue
            own = (template.value.get("metadata") or {}).get("labels") or {}
            merged = {**labels, **own} if isinstance(own, dict) and isinstance(labels, dict) else labels
            effective = self.store.effective(namespace, self.queue_of(namespace, merged))
            if not effective.empty:
                self._template(obj, template, effective, pod, mutate, out)
        if not pod:
            effective = self.store.effective(namespace, self.queue_of(namespace, labels))
            workload = fields.read_workload(obj, gvk.group, gvk.kind)
            if not effective.empty and (old is None or fields.read_workload(old, gvk.group, gvk.kind) != workload):
                result = evaluate(effective, workload, only=_governed(effective) & fields.WORKLOAD_LEVEL)
                out.violations.extend(result.violations)
                if mutate:
                    out.patch.extend(
                        fields.apply_workload_defaults(obj, gvk.group, gvk.kind, result.values, result.defaulted)
                    )
        return out

    def _template(
        self, obj: dict[str, JSON], template: Template, effective: Effective, pod: bool, mutate: bool, out: Checked
    ) -> None:
        submission, other = fields.read_pod(template.value)
        governed = _governed(effective) & fields.POD_LEVEL
        index = self.priorities() if pod and "priorityClass" in governed else None
        if index is not None and index.global_default and submission.get("priorityClass") == index.global_default:
            del submission["priorityClass"]  # the API server's default, not the submitter's choice
        result = evaluate(effective, submission, only=governed)
        out.violations.extend(_at(result.violations, template, pod))
        if not mutate or not result.defaulted:
            return
        defaulted, priority = set(result.defaulted), None
        if index is not None and "priorityClass" in defaulted:
            name = str(result.values.get("priorityClass"))
            found = index.classes.get(name)
            if found is None:  # the other defaults still apply; the submitter is told
                defaulted.discard("priorityClass")
                out.warnings.append(f"priorityClass default {name!r} is not a PriorityClass of this cluster: not set")
            else:
                priority = (found.value, found.preemption_policy)
        changed = fields.apply_pod_defaults(
            template.value, result.values, defaulted, gpu_in_other_spelling=other, priority=priority
        )
        if changed is not None:
            out.patch.extend(_replace(obj, template, changed))

    def templates(self, gvk: GVK, obj: Mapping[str, JSON]) -> list[Template] | None:
        """The pod templates of `obj` (the pod itself for a Pod); None for a kind that has none.
        A Resource Interface names them by `podTemplateSpecPath` or by `podSpecPath` and
        `metadataPath` (one of them broadcast when it has a single output, as `instances.py`
        reads them); the paths are found with jq's `path()`."""
        if gvk.group == "" and gvk.kind == "Pod":
            return [Template("/metadata", "/spec", dict(obj))]
        if gvk == JOB:
            template = (obj.get("spec") or {}).get("template")
            if not isinstance(template, dict):
                return []
            return [Template("/spec/template/metadata", "/spec/template/spec", template)]
        ri = self.registry.lookup(gvk.group, gvk.version, gvk.kind)
        if ri is None:
            return None
        doc = Doc(obj)
        out: dict[tuple[str, str], Template] = {}
        for component in ri.components:
            spec = component.spec_definition
            if spec is None:
                continue
            if spec.pod_template_spec_path:
                for path in _paths(doc, spec.pod_template_spec_path):
                    value = _at_path(obj, path)
                    if isinstance(value, dict):
                        base = fields.pointer(path)
                        out[(base + "/metadata", base + "/spec")] = Template(base + "/metadata", base + "/spec", value)
            elif spec.pod_spec_path or spec.metadata_path:
                specs = _paths(doc, spec.pod_spec_path) if spec.pod_spec_path else []
                metas = _paths(doc, spec.metadata_path) if spec.metadata_path else []
                for i in range(max(len(specs), len(metas))):
                    sp = specs[0] if len(specs) == 1 else (specs[i] if i < len(specs) else None)
                    mp = metas[0] if len(metas) == 1 else (metas[i] if i < len(metas) else None)
                    if sp is None or not isinstance(_at_path(obj, sp), dict):
                        continue
                    meta = _at_path(obj, mp) if mp is not None else None
                    value = {"metadata": meta if isinstance(meta, dict) else {}, "spec": _at_path(obj, sp)}
                    key = (fields.pointer(mp) if mp is not None else "", fields.pointer(sp))
                    out[key] = Template(key[0], key[1], value)
        return list(out.values())

    def preview(self, namespace: str, queue: str, submission: Mapping[str, JSON]) -> tuple[Effective, Evaluation]:
        effective = self.store.effective(namespace, queue)
        return effective, evaluate(effective, submission)


def _governed(effective: Effective) -> frozenset[str]:
    """The fields some policy gives a default or a rule for: the only ones admission looks at
    (a field no policy governs is not the policies' business: two tolerations of one key, a
    malformed annotation the scheduler reports anyway)."""
    d = effective.defaults
    return frozenset({*d.values, *d.instances, *d.attributes, *effective.rules})


def _name(obj: Mapping[str, JSON]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("name") or meta.get("generateName") or "")


def _at_path(obj: JSON, path: list[JSON]) -> JSON:
    for key in path:
        if isinstance(obj, dict):
            obj = obj.get(str(key))
        elif isinstance(obj, list) and str(key).isdigit() and int(key) < len(obj):
            obj = obj[int(key)]
        else:
            return None
    return obj


def _paths(doc: Doc, expression: str) -> list[list[JSON]]:
    """The locations `expression` selects (jq `path()`); [] when it selects none or is not a
    path expression (`.a // .b`)."""
    found = doc.first(f"[path({expression})]")
    return [p for p in found or () if isinstance(p, list)]


def _at(violations: Iterable[Violation], template: Template, pod: bool) -> list[Violation]:
    """Violations of a template named with the template's place in the object."""
    if pod:
        return list(violations)
    return [Violation(v.field, v.rule, f"{template.where}: {v.message}", v.policy) for v in violations]


def _replace(obj: Mapping[str, JSON], template: Template, changed: dict[str, JSON]) -> list[dict[str, JSON]]:
    """Operations replacing a template's metadata and spec with their defaulted versions (added
    where the object has none; a template without a metadata location keeps its metadata)."""
    ops = []
    for section, pointer in (("metadata", template.meta_pointer), ("spec", template.spec_pointer)):
        if pointer and changed.get(section) != template.value.get(section):
            present = _at_path(obj, _path(pointer)) is not None
            ops.append({"op": "replace" if present else "add", "path": pointer, "value": changed[section]})
    return ops


def _unescape(segment: str) -> str:
    return segment.replace("~1", "/").replace("~0", "~")


def _path(pointer: str) -> list[JSON]:
    return [_unescape(p) for p in pointer.split("/")[1:]] if pointer else []


def _unchanged(old: Mapping[str, JSON], template: Template) -> bool:
    """Whether the template reads the same in the object before the update."""
    same_meta = not template.meta_pointer or _at_path(old, _path(template.meta_pointer)) == template.value.get(
        "metadata"
    )
    return same_meta and bool(_at_path(old, _path(template.spec_pointer)) == template.value.get("spec"))


def _refused(code: int, reason: str, message: str) -> dict[str, JSON]:
    return {"allowed": False, "status": {"code": code, "reason": reason, "message": message}}
