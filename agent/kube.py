"""The agent's API-server client: plain JSON over the kubernetes package's configuration (a
kubeconfig, or the in-cluster service account), and the few calls the agent makes.

The agent watches only the pods of its own node (a field selector), patches its own Node's
annotations, posts Evictions and Events, and reviews the tokens of its gRPC callers
(TokenReview and SubjectAccessReview, as the extender's REST API does).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
from kubernetes import client, config

JSON = dict[str, Any]


class ApiError(Exception):
    def __init__(self, status: int, body: Any, what: str) -> None:
        message = body.get("message") if isinstance(body, dict) else str(body)[:200]
        super().__init__(f"{what}: HTTP {status}: {message}")
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Response:
    status: int
    body: Any


class Kube:
    def __init__(self, configuration: client.Configuration) -> None:
        self.base = configuration.host.rstrip("/")
        self.headers = {"Accept": "application/json"}
        auth = configuration.get_api_key_with_prefix("authorization") or configuration.get_api_key_with_prefix(
            "BearerToken"
        )
        if auth:
            self.headers["Authorization"] = auth
        self.pool = urllib3.PoolManager(
            num_pools=2,
            maxsize=4,
            cert_reqs="CERT_REQUIRED" if configuration.verify_ssl else "CERT_NONE",
            ca_certs=configuration.ssl_ca_cert,
            cert_file=configuration.cert_file,
            key_file=configuration.key_file,
        )

    @classmethod
    def from_kubeconfig(cls, path: str | None) -> Kube:
        configuration = client.Configuration()
        if path:
            config.load_kube_config(config_file=path, client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return cls(configuration)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> Response:
        url = self.base + path + ("?" + urlencode(query) if query else "")
        headers = dict(self.headers)
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        r = self.pool.request(method, url, body=data, headers=headers, timeout=timeout, retries=False)
        try:
            decoded = json.loads(r.data) if r.data else None
        except ValueError:
            decoded = r.data.decode(errors="replace")[:200]
        return Response(r.status, decoded)

    def ok(self, method: str, path: str, **kwargs: Any) -> Any:
        r = self.request(method, path, **kwargs)
        if r.status >= 300:
            raise ApiError(r.status, r.body, f"{method} {path}")
        return r.body

    def watch(self, path: str, query: Mapping[str, str], *, timeout_s: int = 300) -> Iterator[JSON]:
        """The events of one watch call, decoded; ends when the server closes it."""
        q = {**query, "watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_s)}
        url = self.base + path + "?" + urlencode(q)
        r = self.pool.request(
            "GET",
            url,
            headers=self.headers,
            preload_content=False,
            timeout=urllib3.Timeout(connect=10, read=timeout_s + 30),
        )
        try:
            if r.status != 200:
                raise ApiError(r.status, r.data[:200].decode(errors="replace"), f"watch {path}")
            buffer = b""
            for chunk in r.stream(64 * 1024):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            r.release_conn()

    # -- the agent's calls ----------------------------------------------------------------------

    def node(self, name: str) -> JSON:
        body: JSON = self.ok("GET", f"/api/v1/nodes/{quote(name)}")
        return body

    def annotate_node(self, name: str, annotations: Mapping[str, str | None]) -> None:
        self.ok(
            "PATCH",
            f"/api/v1/nodes/{quote(name)}",
            body={"metadata": {"annotations": dict(annotations)}},
            content_type="application/merge-patch+json",
        )

    def pod(self, namespace: str, name: str) -> JSON | None:
        r = self.request("GET", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}")
        if r.status == 404:
            return None
        if r.status >= 300:
            raise ApiError(r.status, r.body, f"GET pod {namespace}/{name}")
        body: JSON = r.body
        return body

    def evict(self, namespace: str, name: str, *, grace_s: int | None, uid: str = "") -> Response:
        body: JSON = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        options: JSON = {}
        if grace_s is not None and grace_s >= 0:
            options["gracePeriodSeconds"] = grace_s
        if uid:
            options["preconditions"] = {"uid": uid}
        if options:
            body["deleteOptions"] = options
        return self.request("POST", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/eviction", body=body)

    def event(self, *, pod: JSON, reason: str, message: str, component: str, kind: str = "Warning") -> None:
        meta = pod.get("metadata") or {}
        namespace = meta.get("namespace", "default")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'pod')}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta.get("name", ""),
                "namespace": namespace,
                "uid": meta.get("uid", ""),
            },
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": component},
        }
        self.request("POST", f"/api/v1/namespaces/{quote(namespace)}/events", body=body)
