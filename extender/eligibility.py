"""Which nodes a pod may use: nodeSelector, required node affinity, taints and tolerations;
and which it prefers: preferred node affinity.

For single pods kube-scheduler has already filtered the candidates it sends; a gang is planned
for members that have not been through the scheduler yet, so the extender evaluates the same
rules itself (the subset of kube-scheduler's plugins that decides *where* a pod may go).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

JSON = dict[str, Any]
HARD_EFFECTS = ("NoSchedule", "NoExecute")


def matches(node_name: str, labels: Mapping[str, str], taints: Iterable[tuple[str, str, str]], pod_spec: JSON) -> bool:
    selector = pod_spec.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    if not _affinity(node_name, labels, pod_spec):
        return False
    tolerations = pod_spec.get("tolerations") or []
    return all(_tolerated(t, tolerations) for t in taints if t[2] in HARD_EFFECTS)


def _affinity(node_name: str, labels: Mapping[str, str], pod_spec: JSON) -> bool:
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    return any(term_matches(node_name, labels, term) for term in terms)


def term_matches(node_name: str, labels: Mapping[str, str], term: JSON) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches nothing, as in kube-scheduler
    ok = all(_expression(labels.get(e.get("key", "")), e) for e in expressions)
    return ok and all(_expression(node_name if f.get("key") == "metadata.name" else None, f) for f in fields)


def _expression(value: str | None, expr: JSON) -> bool:
    op, values = expr.get("operator", ""), expr.get("values") or []
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and values:
        try:
            a, b = int(value), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def _tolerated(taint: tuple[str, str, str], tolerations: list[JSON]) -> bool:
    key, value, effect = taint
    for t in tolerations:
        if t.get("effect") and t.get("effect") != effect:
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == key:
                return True
        elif t.get("key") == key and (t.get("value") or "") == value:
            return True
    return False


def preference(node_name: str, labels: Mapping[str, str], pod_spec: JSON) -> int:
    """The summed weights of the pod's preferred node-affinity terms this node matches
    (kube-scheduler's NodeAffinity score before normalising); 0 without preferred terms."""
    preferred = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "preferredDuringSchedulingIgnoredDuringExecution"
    ) or []
    total = 0
    for entry in preferred:
        if not isinstance(entry, dict):
            continue
        weight = entry.get("weight")
        term = entry.get("preference")
        if isinstance(weight, int) and not isinstance(weight, bool) and 0 < weight <= 100 and isinstance(term, dict):
            total += weight if term_matches(node_name, labels, term) else 0
    return total
