"""A scripted stand-in for the API server, for in-process tests of handlers and watches.

End-to-end tests use the real kube-apiserver (tests/e2e); these cover what a real server
cannot be made to do on cue: a 410 in the middle of a watch, a failing bind, exact replies.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson

from extender.kube import JSON, Expired, Response
from extender.objects import DEVICES_ANNOTATION

#: Tokens the fake API server's TokenReview knows: the admin may write, the viewer may not.
TOKENS = {"admin-token": "admin", "viewer-token": "viewer"}
ADMIN = {"Authorization": "Bearer admin-token"}


@dataclass
class FakeKube:
    pods: dict[str, JSON] = field(default_factory=dict)  # "ns/name" -> pod
    lists: dict[str, list[list[JSON]]] = field(default_factory=dict)  # path -> successive list results
    streams: dict[str, list[list[JSON] | type[Exception]]] = field(default_factory=dict)
    list_kinds: dict[str, tuple[str, str]] = field(default_factory=dict)  # path -> (apiVersion, kind) of its lists
    calls: list[tuple[str, str, Any]] = field(default_factory=list)
    fail_bind: bool = False
    budget_refuses: set[str] = field(default_factory=set)  # pod names a disruption budget protects
    evicted: list[str] = field(default_factory=list)  # "ns/name" of pods evicted (not dry runs)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Response:
        self.calls.append((method, path, copy.deepcopy(body)))
        if method == "GET" and path in self.lists:
            items = self.lists[path].pop(0) if len(self.lists[path]) > 1 else self.lists[path][0]
            body = {"items": items, "metadata": {"resourceVersion": "10"}}
            if path in self.list_kinds:
                body["apiVersion"], body["kind"] = self.list_kinds[path]
            return Response(200, body)
        parts = path.strip("/").split("/")
        if len(parts) >= 6 and parts[4] == "pods":
            key = f"{parts[3]}/{parts[5]}"
            if method == "POST" and parts[-1] == "eviction":
                if parts[5] in self.budget_refuses:
                    return Response(429, {"message": "Cannot evict pod: it would violate a disruption budget."})
                if not (body.get("deleteOptions") or {}).get("dryRun"):
                    self.evicted.append(key)
                return Response(201, {})
            pod = self.pods.get(key)
            if pod is None:
                return Response(404, {"message": "not found"})
            if method == "GET":
                return Response(200, pod)
            if method == "PATCH":  # merge patches: annotations, or status fields (None removes)
                if "metadata" in body:
                    pod["metadata"].setdefault("annotations", {}).update(body["metadata"]["annotations"])
                for key, value in (body.get("status") or {}).items():
                    if value is None:
                        pod.setdefault("status", {}).pop(key, None)
                    else:
                        pod.setdefault("status", {})[key] = value
                return Response(200, pod)
            if method == "POST" and parts[-1] == "eviction":
                if parts[5] in self.budget_refuses:
                    return Response(
                        429, {"message": "Cannot evict pod as it would violate the pod's disruption budget."}
                    )
                if not (body.get("deleteOptions") or {}).get("dryRun"):
                    self.evicted.append(key)
                return Response(201, {})
            if method == "POST" and parts[-1] == "binding":
                if self.fail_bind:
                    return Response(500, {"message": "etcd on fire"})
                if pod["spec"].get("nodeName"):
                    return Response(409, {"message": "already bound"})
                pod["spec"]["nodeName"] = body["target"]["name"]
                annotations = body["metadata"].get("annotations") or {}
                pod["metadata"].setdefault("annotations", {}).update(annotations)  # as kube-apiserver does
                return Response(201, {})
        if method == "POST" and path.endswith("/events"):
            return Response(201, body)
        if method == "POST" and path == "/apis/authentication.k8s.io/v1/tokenreviews":
            user = TOKENS.get(body["spec"]["token"])
            status = {"authenticated": True, "user": {"username": user, "groups": []}} if user else {}
            return Response(201, {**body, "status": status})
        if method == "POST" and path == "/apis/authorization.k8s.io/v1/subjectaccessreviews":
            # admin: anything; viewer: reads, except in the namespace "private".
            spec, attributes = body["spec"], body["spec"]["resourceAttributes"]
            reads = attributes["verb"] in ("get", "list") and attributes.get("namespace") != "private"
            allowed = spec["user"] == "admin" or (spec["user"] == "viewer" and reads)
            return Response(201, {**body, "status": {"allowed": allowed, "reason": "" if allowed else "no RBAC rule"}})
        return Response(404, {"message": f"no fake route {method} {path}"})

    def stream(self, path: str, query: Mapping[str, str]) -> Iterator[JSON]:
        script = self.streams.get(path) or []
        if not script:
            return iter(())
        step = script.pop(0)
        if isinstance(step, type) and issubclass(step, Exception):
            raise step(path) if step is Expired else step()
        return iter(step)  # type: ignore[arg-type]


def node(
    name: str,
    *,
    gpus: int = 8,
    block: str = "b0",
    rack: str = "b0-r0",
    mig: dict[str, int] | None = None,
    layout: str | None = None,
    labels: dict[str, str] | None = None,
    product: str = "A100",
) -> JSON:
    alloc = {"cpu": "128", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": str(gpus)}
    for profile, n in (mig or {}).items():
        alloc[f"nvidia.com/mig-{profile}"] = str(n)
    annotations = {"phalanx.io/mig-layout": layout} if layout else {}
    return {
        "metadata": {
            "name": name,
            "annotations": annotations,
            "labels": {
                "topology.phalanx.io/block": block,
                "topology.phalanx.io/rack": rack,
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.memory": "81920",
                **(labels or {}),
            },
        },
        "spec": {},
        "status": {"allocatable": alloc, "capacity": alloc},
    }


def pod(
    name: str,
    *,
    uid: str = "",
    gpus: int = 0,
    node_name: str = "",
    annotations: dict[str, str] | None = None,
    resources: dict[str, str] | None = None,
    phase: str = "Pending",
    namespace: str = "default",
) -> JSON:
    limits = dict(resources or {})
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "annotations": dict(annotations or {}),
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"limits": limits, "requests": {"cpu": "1"}}}],
        },
        "status": {"phase": phase},
    }


def leader(scores: dict[str, int]) -> str | None:
    """The one host a prioritize reply scores highest (None: no reply, or a tie at the top):
    replies are shifted so the lowest is 0, so only the order means anything."""
    if not scores:
        return None
    top = max(scores.values())
    best = [h for h, s in scores.items() if s == top]
    return best[0] if len(best) == 1 else None


def extender_on(nodes: list[JSON], pods: list[JSON], **options: Any) -> Any:
    """An extender (no HTTP server) over a FakeKube holding `pods`, its cache listed with
    `nodes` and `pods` and its target workload refreshed, as the periodic sweep would;
    `options` are more of its `Options`."""
    from extender.app import Extender, Options  # here: the fakes load before the app in some tests

    kube = FakeKube()
    extender = Extender(kube, Options(port=0, **options))
    extender.server.server_close()
    extender.cache.replace_nodes(nodes)
    for p in pods:
        kube.pods[f"{p['metadata'].get('namespace', 'default')}/{p['metadata']['name']}"] = p
    extender.cache.replace_pods(pods)
    mark_listed(extender)
    extender.sharing.refresh()
    return extender


def scores(extender: Any, obj: JSON, names: list[str]) -> dict[str, int]:
    """Host -> score of one prioritize call, as kube-scheduler reads it."""
    reply = orjson.loads(orjson.dumps(extender.verbs.prioritize({"Pod": obj, "NodeNames": names})))
    return {e["Host"]: e["Score"] for e in reply}


def bind_devices(extender: Any, name: str, node_name: str) -> list[dict[str, Any]]:
    """Bind pod default/`name` (uid-`name`) to `node_name` through the extender; the device
    entries its annotation got. Fails the test if the bind is refused."""
    reply = extender.verbs.bind(
        {"PodNamespace": "default", "PodName": name, "PodUID": f"uid-{name}", "Node": node_name}
    )
    assert reply == {"Error": ""}, reply
    kube = extender.kube
    assert isinstance(kube, FakeKube)
    entries: list[dict[str, Any]] = json.loads(
        kube.pods[f"default/{name}"]["metadata"]["annotations"][DEVICES_ANNOTATION]
    )
    return entries


def mark_listed(extender: Any) -> None:
    """As if the node and pod watches had listed (the verbs refuse to answer before)."""
    for r in extender.reflectors:
        r.listed.set()


@contextmanager
def serving(extender: Any) -> Iterator[Any]:
    """The extender's HTTP server on a thread, its watches marked listed; shut down after."""
    mark_listed(extender)
    thread = threading.Thread(target=extender.server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield extender
    finally:
        extender.server.shutdown()
        extender.server.close_connections()
        extender.server.server_close()
