"""Phalanx's own webhook configurations: what they say and keeping them said.

Phalanx writes its MutatingWebhookConfiguration and ValidatingWebhookConfiguration
(`phalanx-policies`) itself, because the kinds to intercept follow the Resource Interfaces
registered at run time and the `caBundle` follows the certificate Phalanx rotates (`certs.py`).
The choices, and what they mean when Phalanx is down:
- `failurePolicy: Fail` for both. A policy is a limit (quotas of GPUs, required fields): an
  outage must not let violations in. While Phalanx is down, creating pods and workloads in the
  namespaces the webhooks cover is refused with the webhook's connection error (controllers
  retry); the namespaces are only those policies cover (below).
- `timeoutSeconds: 5`: an answer takes milliseconds; a hung process costs a submission 5 s, not
  the API server's default 10.
- `namespaceSelector`: only the namespaces policies cover (all of them once a policy covers a
  queue or the cluster; none without policies), never `kube-system`, `kube-public`,
  `kube-node-lease`, Phalanx's own namespace or one labelled `phalanx.io/policies: disabled`:
  a namespace without policies, the control plane and Phalanx itself never wait on Phalanx,
  and an operator can take a namespace out at once.
- `sideEffects: None` (the handlers change nothing; dry-run requests are served alike),
  `reinvocationPolicy: Never`, `matchPolicy: Equivalent`.

With `--gpu-share-resource` (the node agent deployed) the mutating configuration holds a second
webhook, `gpu-share.policies.phalanx.io` (gpushare.py): pods only, every namespace but the system
ones and Phalanx's own, asked only for pods with a GPU annotation (`matchConditions`), failing
open (`Ignore`: a pod admitted without its slot gets no GPU, never another's) and re-invoked
after the policy defaults (`IfNeeded`), which may add such an annotation.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
import structlog

from extender.kube import Kube
from extender.policy import gpushare
from extender.ri.model import GVK

log = structlog.get_logger("phalanx.policy.registration")

CONFIG_NAME = "phalanx-policies"
DISABLED_LABEL = "phalanx.io/policies"
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")
TIMEOUT_S = 5
NAME_LABEL = "kubernetes.io/metadata.name"
JSON = Any


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the API server reaches the webhooks: a URL base (local cluster) or a Service."""

    url: str = ""  # e.g. https://127.0.0.1:9443
    service_namespace: str = ""
    service_name: str = ""
    service_port: int = 443

    def client_config(self, path: str, ca_bundle: bytes) -> dict[str, JSON]:
        config: dict[str, JSON] = {"caBundle": base64.b64encode(ca_bundle).decode()}
        if self.url:
            config["url"] = self.url.rstrip("/") + path
        else:
            config["service"] = {
                "namespace": self.service_namespace,
                "name": self.service_name,
                "port": self.service_port,
                "path": path,
            }
        return config


def namespace_selector(namespaces: frozenset[str] | None, own_namespace: str) -> dict[str, JSON]:
    """The namespaces the webhooks cover: those policies cover (None: all), never the system
    ones, Phalanx's own or one labelled `phalanx.io/policies: disabled`; none without policies."""
    excluded = {*SYSTEM_NAMESPACES, own_namespace}
    disabled = {"key": DISABLED_LABEL, "operator": "NotIn", "values": ["disabled"]}
    if namespaces is None:
        return {"matchExpressions": [{"key": NAME_LABEL, "operator": "NotIn", "values": sorted(excluded)}, disabled]}
    covered = sorted(namespaces - excluded)
    if not covered:  # every namespace carries the name label: DoesNotExist matches none
        return {"matchExpressions": [{"key": NAME_LABEL, "operator": "DoesNotExist"}]}
    return {"matchExpressions": [{"key": NAME_LABEL, "operator": "In", "values": covered}, disabled]}


def configurations(
    endpoint: Endpoint,
    ca_bundle: bytes,
    kinds: Iterable[tuple[GVK, str]],
    own_namespace: str,
    namespaces: frozenset[str] | None = None,
    *,
    gpu_share: bool = False,
) -> tuple[dict[str, JSON], dict[str, JSON]]:
    """The MutatingWebhookConfiguration and ValidatingWebhookConfiguration for pods, Jobs and the
    workload kinds `kinds` ((kind, its resource plural)); with `gpu_share`, the mutating one also
    routes pods asking a GPU share by annotation to `/mutate-gpu-share` (gpushare.py)."""

    def rule(group: str, version: str, plural: str, operations: list[str]) -> dict[str, JSON]:
        return {
            "apiGroups": [group],
            "apiVersions": [version],
            "resources": [plural],
            "operations": operations,
            "scope": "Namespaced",
        }

    rules = [rule("", "v1", "pods", ["CREATE"]), rule("batch", "v1", "jobs", ["CREATE", "UPDATE"])]
    rules += [rule(gvk.group, gvk.version, plural, ["CREATE", "UPDATE"]) for gvk, plural in sorted(set(kinds))]
    selector = namespace_selector(namespaces, own_namespace)

    def webhook(name: str, path: str) -> dict[str, JSON]:
        return {
            "name": f"{name}.policies.phalanx.io",
            "clientConfig": endpoint.client_config(path, ca_bundle),
            "rules": rules,
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "namespaceSelector": selector,
            "sideEffects": "None",
            "timeoutSeconds": TIMEOUT_S,
            "admissionReviewVersions": ["v1"],
        }

    meta = {"name": CONFIG_NAME, "labels": {"app": "phalanx"}}
    mutating_hooks: list[dict[str, JSON]] = [{**webhook("defaults", "/mutate"), "reinvocationPolicy": "Never"}]
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": meta,
        "webhooks": mutating_hooks,
    }
    if gpu_share:
        # Every namespace but the system ones and Phalanx's own, failing open, and called again
        # after the policy defaults (which may add a share annotation).
        mutating_hooks.append(
            {
                "name": "gpu-share.policies.phalanx.io",
                "clientConfig": endpoint.client_config(gpushare.PATH, ca_bundle),
                "rules": [rule("", "v1", "pods", ["CREATE"])],
                "failurePolicy": "Ignore",
                "matchPolicy": "Equivalent",
                "namespaceSelector": namespace_selector(None, own_namespace),
                "matchConditions": [gpushare.match_condition()],
                "sideEffects": "None",
                "timeoutSeconds": TIMEOUT_S,
                "admissionReviewVersions": ["v1"],
                "reinvocationPolicy": "IfNeeded",
            }
        )
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": meta,
        "webhooks": [webhook("rules", "/validate")],
    }
    return mutating, validating


class Registration:
    """Writes the two webhook configurations when what they should say changes, and puts them
    back when someone else changed them (checked on `force`). When the ClusterRole
    `phalanx-policies` exists (the chart's), it owns them: deleting the release lets the garbage
    collector remove webhooks nothing would serve any more."""

    PATHS = (
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
    )
    OWNER = "/apis/rbac.authorization.k8s.io/v1/clusterroles/phalanx-policies"

    def __init__(self, kube: Kube, endpoint: Endpoint, own_namespace: str, *, gpu_share: bool = False) -> None:
        self.kube = kube
        self.endpoint = endpoint
        self.own_namespace = own_namespace
        self.gpu_share = gpu_share
        self._written: tuple[bytes, ...] = ()
        self._lock = threading.Lock()

    def sync(
        self,
        ca_bundle: bytes,
        kinds: Iterable[tuple[GVK, str]],
        namespaces: frozenset[str] | None = None,
        *,
        force: bool = False,
    ) -> bool:
        """Create or update both configurations; True when they are current. Raises on
        transport errors (the caller retries on its next round)."""
        bodies = configurations(
            self.endpoint, ca_bundle, kinds, self.own_namespace, namespaces, gpu_share=self.gpu_share
        )
        stamp = tuple(orjson.dumps(b, option=orjson.OPT_SORT_KEYS) for b in bodies)
        with self._lock:
            if stamp == self._written and not force:
                return True
            owner = self._owner()
            ok = all(self._put(path, body, owner) for path, body in zip(self.PATHS, bodies, strict=True))
            if ok and stamp != self._written:
                self._written = stamp
                log.info(
                    "webhook configurations current", name=CONFIG_NAME, rules=len(bodies[0]["webhooks"][0]["rules"])
                )
            return ok

    def _owner(self) -> list[dict[str, JSON]]:
        r = self.kube.request("GET", self.OWNER)
        if r.status != 200 or not isinstance(r.body, dict):
            return []
        uid = (r.body.get("metadata") or {}).get("uid")
        return [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "name": "phalanx-policies",
                "uid": uid,
            }
        ]

    def _put(self, collection: str, body: dict[str, JSON], owner: list[dict[str, JSON]]) -> bool:
        path = f"{collection}/{CONFIG_NAME}"
        meta = {**body["metadata"], **({"ownerReferences": owner} if owner else {})}
        current = self.kube.request("GET", path)
        if current.status == 200 and isinstance(current.body, dict):
            have = current.body
            if (
                _same(have.get("webhooks"), body["webhooks"])
                and (have.get("metadata") or {}).get("ownerReferences", []) == owner
            ):
                return True
            meta["resourceVersion"] = have["metadata"]["resourceVersion"]
            r = self.kube.request("PUT", path, body={**body, "metadata": meta})
        else:
            r = self.kube.request("POST", collection, body={**body, "metadata": meta})
        if r.status not in (200, 201):
            log.warning("webhook configuration not written", path=path, status=r.status, body=str(r.body)[:300])
            return False
        return True


def _same(have: JSON, want: list[dict[str, JSON]]) -> bool:
    """Whether the served webhooks say what `want` says (the API server adds defaults, such as
    objectSelector: {}, that `want` leaves out)."""
    if not isinstance(have, list) or len(have) != len(want):
        return False
    return all(
        isinstance(h, dict) and all(h.get(k) == v for k, v in w.items()) for h, w in zip(have, want, strict=True)
    )
