"""Fake GPU Node objects: build them from a :class:`ClusterSpec` and create them in bulk.

Nodes are created with their status (capacity and allocatable, including ``nvidia.com/gpu``
and ``nvidia.com/mig-*``), as a kubelet registers itself; KWOK then adds conditions, addresses
and heartbeats because each node carries the annotation ``kwok.x-k8s.io/node: fake`` that the
controller is started to select on. Creation is idempotent (409 Conflict counts as present)
and runs on a small thread pool without decoding responses, so benchmarks can add thousands of
nodes in seconds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from deploy.local.kubeapi import request_json
from deploy.local.topology import ClusterSpec, MigPartition

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
KWOK_SELECTOR = f"{KWOK_ANNOTATION}={KWOK_ANNOTATION_VALUE}"
BLOCK_LABEL = "topology.phalanx.io/block"
RACK_LABEL = "topology.phalanx.io/rack"
MIG_LAYOUT_ANNOTATION = "phalanx.io/mig-layout"
KWOK_NODE_LABEL_SELECTOR = "type=kwok"


@dataclass(frozen=True)
class NodePlacement:
    """Where a node sits in the topology tree (0-based indices)."""

    block: int
    rack: int
    index: int


@dataclass(frozen=True)
class CreatedNodes:
    """Outcome of :func:`create_nodes`: names created now and names that already existed."""

    created: tuple[str, ...]
    existing: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return self.created + self.existing


def placements(spec: ClusterSpec, count: int | None = None) -> list[NodePlacement]:
    """Lay out ``count`` nodes (default: the spec's) rack by rack, block by block.

    Past the spec's size the tree grows by whole blocks of the same shape, so a benchmark can
    ask for 1,000 nodes with the topology of ``config/cluster.yaml``.
    """
    total = spec.node_count if count is None else count
    per_rack, racks = spec.topology.nodes_per_rack, spec.topology.racks_per_block
    return [
        NodePlacement(block=i // (per_rack * racks), rack=(i // per_rack) % racks, index=i % per_rack)
        for i in range(total)
    ]


def node_name(spec: ClusterSpec, where: NodePlacement) -> str:
    """Return the node name ``<prefix>-b<block>-r<rack>-n<nn>``."""
    return f"{spec.name_prefix}-b{where.block}-r{where.rack}-n{where.index:02d}"


def _mig_resources(partitions: Sequence[MigPartition]) -> dict[str, str]:
    return {f"nvidia.com/mig-{p.profile}": str(p.gpus * p.slices_per_gpu) for p in partitions}


def _mig_layout(whole_gpus: int, partitions: Sequence[MigPartition]) -> list[dict[str, Any]]:
    # Whole GPUs take the low indices; cut ones follow in the order the spec lists them.
    layout, index = [], whole_gpus
    for p in partitions:
        for _ in range(p.gpus):
            layout.append({"index": index, "profile": p.profile, "slices": p.slices_per_gpu})
            index += 1
    return layout


def _labels(
    spec: ClusterSpec,
    name: str,
    where: NodePlacement,
    whole_gpus: int,
    partitions: Sequence[MigPartition],
) -> dict[str, str]:
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        BLOCK_LABEL: f"b{where.block}",
        RACK_LABEL: f"b{where.block}-r{where.rack}",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": spec.gpu.product,
        "nvidia.com/gpu.memory": str(spec.gpu.memory_mib),
        "nvidia.com/gpu.count": str(whole_gpus),
    }
    if partitions:
        labels["nvidia.com/mig.strategy"] = "mixed"
        for p in partitions:
            labels[f"nvidia.com/mig-{p.profile}.count"] = str(p.gpus * p.slices_per_gpu)
    return labels


def node_manifest(spec: ClusterSpec, where: NodePlacement) -> dict[str, Any]:
    """Return the Node object (as a dict, with status) for one placement."""
    name = node_name(spec, where)
    partitions = spec.mig_layout(where.block, where.rack)
    whole_gpus = spec.gpu.count - sum(p.gpus for p in partitions)
    resources = {
        "cpu": spec.node.cpu,
        "memory": spec.node.memory,
        "pods": str(spec.node.pods),
        "nvidia.com/gpu": str(whole_gpus),
        **_mig_resources(partitions),
    }
    annotations = {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE}
    if partitions:
        annotations[MIG_LAYOUT_ANNOTATION] = json.dumps(_mig_layout(whole_gpus, partitions))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": annotations,
            "labels": _labels(spec, name, where, whole_gpus, partitions),
        },
        "spec": {},
        "status": {"capacity": resources, "allocatable": dict(resources)},
    }


def node_manifests(spec: ClusterSpec, count: int | None = None) -> list[dict[str, Any]]:
    """Return the Node objects for ``count`` nodes (default: the whole spec)."""
    return [node_manifest(spec, where) for where in placements(spec, count)]


def _create_one(api_client: client.ApiClient, body: dict[str, Any]) -> bool:
    response = request_json(api_client, "POST", "/api/v1/nodes", body=body)
    if response.status == 409:
        return False
    if response.status >= 300:
        raise RuntimeError(f"creating node {body['metadata']['name']}: {response.body}")
    return True


def create_node_objects(
    api_client: client.ApiClient, bodies: Iterable[dict[str, Any]], *, workers: int = 8
) -> CreatedNodes:
    """Create Node objects in parallel; existing ones are left alone and reported."""
    items = list(bodies)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="create-node") as pool:
        fresh = list(pool.map(lambda body: _create_one(api_client, body), items))
    names = [body["metadata"]["name"] for body in items]
    return CreatedNodes(
        created=tuple(n for n, new in zip(names, fresh, strict=True) if new),
        existing=tuple(n for n, new in zip(names, fresh, strict=True) if not new),
    )


def create_nodes(
    api_client: client.ApiClient,
    count: int | None = None,
    *,
    spec: ClusterSpec | None = None,
    workers: int = 8,
) -> CreatedNodes:
    """Create ``count`` fake GPU nodes shaped by ``spec`` (default: a default ClusterSpec).

    ``count`` defaults to the spec's size; larger counts add blocks of the same shape.
    """
    shape = spec if spec is not None else ClusterSpec()
    return create_node_objects(api_client, node_manifests(shape, count), workers=workers)


def is_ready(node: dict[str, Any]) -> bool:
    """Tell whether a Node (as a dict) has condition Ready=True."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def list_nodes(api_client: client.ApiClient, label_selector: str = "") -> list[dict[str, Any]]:
    """List nodes as plain dicts (one LIST; skipping model decoding is much faster at scale)."""
    query = {"labelSelector": label_selector} if label_selector else None
    response = request_json(api_client, "GET", "/api/v1/nodes", query=query)
    if response.status != 200:
        raise RuntimeError(f"listing nodes: {response.body}")
    items: list[dict[str, Any]] = response.body["items"]
    return items


def ready_node_names(api_client: client.ApiClient, label_selector: str = KWOK_NODE_LABEL_SELECTOR) -> set[str]:
    """Return the names of Ready nodes matching ``label_selector``."""
    return {n["metadata"]["name"] for n in list_nodes(api_client, label_selector) if is_ready(n)}


def delete_nodes(api_client: client.ApiClient, names: Iterable[str], *, workers: int = 8) -> None:
    """Delete nodes by name, ignoring ones already gone."""

    def delete(name: str) -> None:
        response = request_json(api_client, "DELETE", f"/api/v1/nodes/{name}")
        if response.status >= 300 and response.status != 404:
            raise RuntimeError(f"deleting node {name}: {response.body}")

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="delete-node") as pool:
        list(pool.map(delete, names))
