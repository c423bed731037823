"""Raw JSON requests through a kubernetes ``ApiClient``, for bulk work.

The generated client validates every argument and decodes every response into models, which
costs milliseconds per object; creating or listing thousands of nodes for a benchmark should
not. These helpers reuse the client's configuration, auth and connection pool but send and
receive plain JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from kubernetes import client, config


@dataclass(frozen=True)
class RawResponse:
    """Status code and decoded JSON body (None when empty)."""

    status: int
    body: Any


def request_json(
    api_client: client.ApiClient,
    method: str,
    path: str,
    *,
    body: Mapping[str, Any] | None = None,
    query: Mapping[str, str] | None = None,
    content_type: str = "application/json",
) -> RawResponse:
    """Send one request to ``path`` (e.g. ``/api/v1/nodes``) and return the raw response.

    Error statuses are returned, not raised; callers decide which ones are expected.
    """
    headers = {"Accept": "application/json", "Content-Type": content_type}
    params = api_client.param_serialize(
        method=method,
        resource_path=path,
        header_params=headers,
        body=body,
        query_params=list(query.items()) if query else None,
        auth_settings=["BearerToken"],
    )
    response = api_client.call_api(*params)
    data = cast(bytes, response.read())  # type: ignore[no-untyped-call]
    return RawResponse(status=response.status, body=json.loads(data) if data else None)


def new_api_client(kubeconfig: str) -> client.ApiClient:
    """Return an ``ApiClient`` for a kubeconfig file (typed wrapper of the untyped loader)."""
    return cast(client.ApiClient, config.new_client_from_config(config_file=kubeconfig))  # type: ignore[no-untyped-call]
