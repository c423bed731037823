"""Checks on the extender's wire input: what kube-scheduler sends, read as hostile.

kube-scheduler serializes typed Go structs, so a real request always has the right types;
anything else is malformed and gets HTTP 400 (`BadRequest`) with a message naming the field,
before any handler can trip over it. The checks are plain type tests, cheap enough for
filter and prioritize on kube-scheduler's hot path (a 5,000-name list costs one pass in C),
never a per-request model. Names that end up in API paths (bind's namespace, name and node)
must be what Kubernetes itself accepts: DNS-1123 labels and subdomains, so no "../" or "?"
can ever reach a URL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from extender.errors import BadRequest

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_LABEL = re.compile(_LABEL)  # namespaces: at most 63 characters
_DNS_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")  # pod and node names: at most 253
_UID = re.compile(r"[A-Za-z0-9._:-]{1,64}")  # Kubernetes UIDs are 36-character UUIDs
_SUB = "a-z, 0-9, '-', '.'"
MAX_LABEL = 63
MAX_SUBDOMAIN = 253
MAX_UID = 64

_META_STRINGS = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "generateName")
_SPEC_STRINGS = ("nodeName", "schedulerName", "priorityClassName")
_SPEC_OBJECTS = ("affinity", "schedulingGroup", "overhead")
_SPEC_LISTS = ("containers", "initContainers", "tolerations")


@dataclass(frozen=True, slots=True)
class BindArgs:
    """ExtenderBindingArgs, checked."""

    namespace: str
    name: str
    uid: str
    node: str


def check_pod(obj: Any) -> dict[str, Any]:
    """The request's Pod, its fields of the right types (those Phalanx reads)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        raise BadRequest("missing or malformed field Pod: must be an object with metadata")
    meta = obj["metadata"]
    for key in _META_STRINGS:
        _optional(meta.get(key), str, f"Pod.metadata.{key}", "a string")
    _name(meta.get("namespace"), "Pod.metadata.namespace", _DNS_LABEL, MAX_LABEL, empty=True)
    _name(meta.get("name"), "Pod.metadata.name", _DNS_SUBDOMAIN, MAX_SUBDOMAIN, empty=True, allowed=_SUB)
    if len(meta.get("uid") or "") > MAX_UID:
        raise BadRequest("Pod.metadata.uid: longer than 64 characters")
    _string_map(meta.get("labels"), "Pod.metadata.labels")
    _string_map(meta.get("annotations"), "Pod.metadata.annotations")
    _objects(meta.get("ownerReferences"), "Pod.metadata.ownerReferences")
    spec = _optional(obj.get("spec"), dict, "Pod.spec", "an object") or {}
    for key in _SPEC_STRINGS:
        _optional(spec.get(key), str, f"Pod.spec.{key}", "a string")
    for key in _SPEC_OBJECTS:
        _optional(spec.get(key), dict, f"Pod.spec.{key}", "an object")
    for key in _SPEC_LISTS:
        _objects(spec.get(key), f"Pod.spec.{key}")
    _string_map(spec.get("nodeSelector"), "Pod.spec.nodeSelector")
    status = _optional(obj.get("status"), dict, "Pod.status", "an object") or {}
    _optional(status.get("phase"), str, "Pod.status.phase", "a string")
    return obj


def node_names(args: dict[str, Any]) -> list[str]:
    """NodeNames (nodeCacheCapable), else the names of Nodes.items."""
    names = args.get("NodeNames")
    if names is None:
        nodes = args.get("Nodes")
        items = nodes.get("items") if isinstance(nodes, dict) else None
        if items is None:
            raise BadRequest("missing field NodeNames (is nodeCacheCapable set?)")
        _objects(items, "Nodes.items")
        metas = [n.get("metadata") for n in items]
        if not all(isinstance(m, dict) for m in metas):
            raise BadRequest("Nodes.items[].metadata must be objects")
        names = [m.get("name") for m in metas]
    if not isinstance(names, list) or not set(map(type, names)) <= {str}:
        raise BadRequest("NodeNames must be a list of strings")
    return names


def bind_args(args: dict[str, Any]) -> BindArgs:
    """PodNamespace, PodName, PodUID and Node, each as Kubernetes would accept it."""
    for key in ("PodNamespace", "PodName", "PodUID", "Node"):
        if key not in args:
            raise BadRequest(f"bind: missing field {key}")
    return BindArgs(
        namespace=_name(args["PodNamespace"], "bind: PodNamespace", _DNS_LABEL, MAX_LABEL),
        name=_name(args["PodName"], "bind: PodName", _DNS_SUBDOMAIN, MAX_SUBDOMAIN, allowed=_SUB),
        uid=_name(args["PodUID"], "bind: PodUID", _UID, MAX_UID, allowed="A-Z, a-z, 0-9, '.', ':', '-'"),
        node=_name(args["Node"], "bind: Node", _DNS_SUBDOMAIN, MAX_SUBDOMAIN, allowed=_SUB),
    )


def victims(args: dict[str, Any]) -> dict[str, Any]:
    """NodeNameToMetaVictims: node name -> {"Pods": [{"UID": ...}], "NumPDBViolations": n}
    (Go's nil map, slice and pointer arrive as null and mean none)."""
    found = args.get("NodeNameToMetaVictims")
    if found is None:
        return {}
    if not isinstance(found, dict):
        raise BadRequest("preempt: NodeNameToMetaVictims must be an object")
    for node, meta in found.items():
        if meta is None:
            continue
        if not isinstance(meta, dict):
            raise BadRequest(f"preempt: NodeNameToMetaVictims[{node[:253]!r}] must be an object")
        pods = meta.get("Pods")
        if pods is not None and (
            not isinstance(pods, list) or not all(isinstance(p, dict) and isinstance(p.get("UID"), str) for p in pods)
        ):
            raise BadRequest(f"preempt: NodeNameToMetaVictims[{node[:253]!r}].Pods must be a list of {{UID: string}}")
        count = meta.get("NumPDBViolations")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool)):
            raise BadRequest(f"preempt: NodeNameToMetaVictims[{node[:253]!r}].NumPDBViolations must be an integer")
    return found


def _optional(value: Any, kind: type, field: str, what: str) -> Any:
    if value is not None and not isinstance(value, kind):
        raise BadRequest(f"{field}: must be {what}")
    return value


def _name(
    value: Any, field: str, pattern: re.Pattern[str], limit: int, *, empty: bool = False, allowed: str = "a-z, 0-9, '-'"
) -> str:
    if not isinstance(value, str):
        if empty and value is None:
            return ""
        raise BadRequest(f"{field}: must be a string")
    if empty and not value:
        return value
    if len(value) > limit or not pattern.fullmatch(value):
        raise BadRequest(f"{field}: {value[:limit]!r} is not valid (at most {limit} characters of {allowed})")
    return value


def _string_map(value: Any, field: str) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise BadRequest(f"{field}: must be an object of strings")


def _objects(value: Any, field: str) -> None:
    if value is not None and (not isinstance(value, list) or not all(isinstance(v, dict) for v in value)):
        raise BadRequest(f"{field}: must be a list of objects")
