"""The Workload Types API (`/api/v1/workload-types`) and where registered types live.

Three sources, later ones win per (group, Kind): the shipped definitions in
config/resource-interfaces/, the `phalanx-config` ConfigMap keys `workload-type.<group>.<Kind>.yaml`
(hot reload: edit the ConfigMap), and the API, whose writes go to those same keys, so nothing
registered is lost on restart and every replica converges through the ConfigMap watch. A key
with an empty value hides a shipped definition (that is how DELETE of a shipped type persists).

An invalid body gets 400 with every violation and its path; an invalid ConfigMap entry is
rejected alone (logged, Warning Event `InvalidWorkloadType`) and the type keeps its last good
definition. Unknown names get 404.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import structlog
import yaml

from extender.kube import Kube
from extender.ri.model import InvalidDefinition, Violation
from extender.ri.registry import Registry, WorkloadType, load_defaults
from extender.ri.structure import load_text

log = structlog.get_logger("phalanx.workload-types")

KEY_PREFIX = "workload-type."
# A definition is a few hundred values a dozen levels deep; past these bounds it is hostile
# (YAML aliases can make a 1 KiB text expand to millions of values).
MAX_DEPTH = 64
MAX_VALUES = 100_000
_BRACKETS = re.compile(r"[^\[\]{}]+")


class WorkloadTypes:
    def __init__(
        self,
        kube: Kube,
        registry: Registry,
        *,
        namespace: str,
        configmap: str,
        on_change: Callable[[], None],
        warn: Callable[[str], None],
    ) -> None:
        self.kube = kube
        self.registry = registry
        self.namespace = namespace
        self.configmap = configmap
        self.on_change = on_change
        self.warn = warn
        self.lock = threading.Lock()
        self.defaults = {KEY_PREFIX + wt.configmap_key: wt for wt in load_defaults()}
        self.applied: dict[str, str] = {}  # ConfigMap key -> text in effect
        for wt in self.defaults.values():
            registry.put(wt)

    # ------------------------------------------------------------------ ConfigMap

    def sync(self, data: dict[str, str]) -> None:
        """Apply the ConfigMap's workload-type keys (a list or watch event of the ConfigMap)."""
        entries = {k: v for k, v in data.items() if k.startswith(KEY_PREFIX)}
        changed = False
        with self.lock:
            for key in sorted(set(self.applied) - set(entries)):
                del self.applied[key]
                changed |= self._revert(key)
            for key, text in sorted(entries.items()):
                if self.applied.get(key) == text:
                    continue
                if not text.strip():
                    self.applied[key] = text
                    changed |= self._hide(key)
                    continue
                try:
                    wt = WorkloadType.from_body(_load(text), timed=False)  # timed when POSTed
                except (InvalidDefinition, yaml.YAMLError, ValueError, RecursionError) as e:
                    self.warn(f"ConfigMap {self.namespace}/{self.configmap} key {key}: {e}")
                    continue
                self.applied[key] = text
                self.registry.put(wt)
                changed = True
        if changed:
            self.on_change()

    def _revert(self, key: str) -> bool:
        default = self.defaults.get(key)
        if default is not None:
            self.registry.put(default)
            return True
        group_kind = key[len(KEY_PREFIX) :].removesuffix(".yaml")
        for wt in self.registry.list():
            if wt.configmap_key.removesuffix(".yaml") == group_kind:
                self.registry.delete(wt.name, wt.group)
                return True
        return False

    def _hide(self, key: str) -> bool:
        default = self.defaults.get(key)
        return default is not None and self.registry.delete(default.name, default.group) is not None

    def _persist(self, key: str, text: str | None) -> tuple[int, str]:
        """Write one key of the ConfigMap (None removes it; create the ConfigMap if absent)."""
        path = f"/api/v1/namespaces/{self.namespace}/configmaps/{self.configmap}"
        r = self.kube.request("PATCH", path, body={"data": {key: text}}, content_type="application/merge-patch+json")
        if r.status == 404 and text is not None:
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": self.configmap, "namespace": self.namespace},
                "data": {key: text},
            }
            r = self.kube.request("POST", f"/api/v1/namespaces/{self.namespace}/configmaps", body=body)
        if r.status >= 300:
            return r.status, f"could not persist to ConfigMap {self.namespace}/{self.configmap}: {r.body}"
        return r.status, ""

    # ------------------------------------------------------------------ HTTP

    def api(self, method: str, rest: str, body: bytes) -> tuple[int, Any]:
        name = unquote(rest.strip("/"))
        if method == "GET":
            return self._get(name)
        if method == "POST" and not name:
            return self._post(body)
        if method == "DELETE" and name:
            return self._delete(name)
        return 405, {"error": f"{method} is not supported on /api/v1/workload-types{rest}"}

    def _get(self, name: str) -> tuple[int, Any]:
        if not name:
            return 200, {"workloadTypes": [_describe(wt) for wt in self.registry.list()]}
        wt = self.registry.get(name)
        if wt is None:
            return 404, {"error": f"no workload type {name!r}"}
        return 200, _describe(wt)

    def _post(self, body: bytes) -> tuple[int, Any]:
        text = body.decode("utf-8", errors="replace")
        if not text.strip():
            return 400, {"error": "body required: a workload type (JSON or YAML)", "violations": []}
        try:
            wt = WorkloadType.from_body(_load(text))
        except InvalidDefinition as e:
            return 400, {
                "error": "invalid workload type",
                "violations": [{"path": v.path, "message": v.message} for v in e.violations],
            }
        except (yaml.YAMLError, ValueError) as e:
            return 400, {"error": f"body is neither JSON nor YAML: {str(e)[:512]}", "violations": []}
        except RecursionError:  # nesting deep enough to exhaust the parser's stack
            return 400, {"error": f"body nested deeper than {MAX_DEPTH} levels", "violations": []}
        key = KEY_PREFIX + wt.configmap_key
        text = yaml.safe_dump(wt.to_body(), sort_keys=False)
        with self.lock:
            _, error = self._persist(key, text)
            if error:
                return 502, {"error": error}
            replaced = self.registry.put(wt)
            self.applied[key] = text
        self.on_change()
        log.info("workload type registered", name=wt.name, group=wt.group, versions=wt.versions())
        return (200 if replaced is not None else 201), _describe(wt)

    def _delete(self, name: str) -> tuple[int, Any]:
        wt = self.registry.get(name)
        if wt is None:
            return 404, {"error": f"no workload type {name!r}"}
        key = KEY_PREFIX + wt.configmap_key
        with self.lock:
            # A shipped type stays hidden through an empty key; others simply lose theirs.
            status, error = self._persist(key, "" if key in self.defaults else None)
            if error and status != 404:
                return 502, {"error": error}
            self.registry.delete(wt.name, wt.group)
            self.applied[key] = ""
        self.on_change()
        log.info("workload type deleted", name=wt.name, group=wt.group)
        return 200, {"deleted": {"name": wt.name, "group": wt.group}}


def _load(text: str) -> Any:
    """The text as JSON or YAML, within MAX_DEPTH and MAX_VALUES. Flow nesting is counted
    before parsing: PyYAML's scanner takes seconds (holding the GIL) on a few thousand
    unclosed brackets before its parser overflows the stack."""
    depth = 0
    for bracket in _BRACKETS.sub("", text):
        depth += 1 if bracket in "[{" else -1
        if depth > MAX_DEPTH:
            raise InvalidDefinition([Violation("", f"nested deeper than {MAX_DEPTH} levels")])
    return _bounded(load_text(text))


def _bounded(doc: Any) -> Any:
    """`doc` itself if it is at most MAX_DEPTH deep with at most MAX_VALUES values (aliases
    counted each time they are reached); InvalidDefinition otherwise. Iterative: it cannot overflow
    the stack, and it stops at the first bound, so a cyclic alias costs MAX_VALUES steps."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    seen = 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if depth > MAX_DEPTH or seen > MAX_VALUES:
            raise InvalidDefinition(
                [Violation("", f"nested deeper than {MAX_DEPTH} levels or over {MAX_VALUES} values")]
            )
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    return doc


def _describe(wt: WorkloadType) -> dict[str, Any]:
    body = wt.to_body()
    return {
        "name": wt.name,
        "group": wt.group,
        "versions": list(wt.versions()),
        "resourceInterfaces": body.get("resourceInterfaces", []),
        **{k: v for k, v in body.items() if k in ("categoryId", "priorityId")},
    }
