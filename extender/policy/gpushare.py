"""`/mutate-gpu-share`: a pod asking GPUs only by annotation gets one `phalanx.io/gpu-share`
slot, so that the kubelet calls the node agent's device plugin for it.

The kubelet calls a device plugin only for the resources a container requests. A KAI-style
(`gpu-fraction`, `gpu-memory`), TensorFusion or policy-field request (a share, whole GPUs by
`gpuDeviceRequest` or `gpu-fraction: "1"`, a `migProfile`) requests none, so without this its
container would start without a GPU (the node agent's enforcement is fail-closed: no resource,
no device). The slot only gets the container to the agent: what it gets is the pod's device
record, whatever the request's kind. The webhook adds `phalanx.io/gpu-share: 1` to the requests and limits of
the pod's first container, or of the container the annotation `phalanx.io/gpu-container` names.
Pods that already request `nvidia.com/gpu` (whole GPUs, HAMi shares), a MIG resource or the share
resource are left alone, and so is every pod without a GPU request.

Its webhook (in `phalanx-policies`, registration.py) is on only with `--gpu-share-resource` (the
node agent deployed), covers every namespace but the system ones and Phalanx's own, is asked only
for pods carrying a share annotation (`matchConditions`), and fails open (`Ignore`): a pod
admitted without the slot gets no GPU on an agent's node, never someone else's.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import orjson
import structlog

from extender.gpu import GPU, MIG_PREFIX, DemandError, demand
from solver import GpuKind

log = structlog.get_logger("phalanx.policy.gpushare")

SHARE_RESOURCE = "phalanx.io/gpu-share"
CONTAINER_ANNOTATION = "phalanx.io/gpu-container"
PATH = "/mutate-gpu-share"
#: The annotations of GPUs asked without a resource: the webhook's matchConditions.
SHARE_ANNOTATIONS = (
    "gpu-fraction",
    "gpu-memory",
    "tensor-fusion.ai/tflops-request",
    "tensor-fusion.ai/vram-request",
    "phalanx.io/gpuPortionRequest",
    "phalanx.io/gpuMemoryRequest",
    "phalanx.io/gpuRequestType",
    "phalanx.io/gpuDeviceRequest",
    "phalanx.io/migProfile",
)
JSON = Any


def match_condition() -> dict[str, str]:
    """CEL: the API server calls the webhook only for pods with a share annotation."""
    keys = ", ".join(f"'{k}'" for k in SHARE_ANNOTATIONS)
    return {
        "name": "asks-gpus-by-annotation",
        "expression": f"has(object.metadata.annotations) && object.metadata.annotations.exists(k, k in [{keys}])",
    }


def patch(pod: Mapping[str, JSON]) -> list[dict[str, JSON]]:
    """The JSON patch giving `pod` its share slot; [] when it needs none."""
    containers = (pod.get("spec") or {}).get("containers") or []
    if not containers or not isinstance(containers, list):
        return []
    for c in containers:
        res = c.get("resources") or {}
        for name in {**(res.get("requests") or {}), **(res.get("limits") or {})}:
            if name in (GPU, SHARE_RESOURCE) or name.startswith(MIG_PREFIX):
                return []
    try:
        if demand(dict(pod)).kind is GpuKind.NONE:
            return []
    except DemandError:
        return []  # refused by filter with its reason; nothing to add
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    wanted = annotations.get(CONTAINER_ANNOTATION)
    index = next((i for i, c in enumerate(containers) if c.get("name") == wanted), 0)
    base = f"/spec/containers/{index}/resources"
    resources = containers[index].get("resources")
    if not isinstance(resources, dict):
        return [
            {"op": "add", "path": base, "value": {"limits": {SHARE_RESOURCE: "1"}, "requests": {SHARE_RESOURCE: "1"}}}
        ]
    ops: list[dict[str, JSON]] = []
    key = SHARE_RESOURCE.replace("~", "~0").replace("/", "~1")
    for part in ("limits", "requests"):
        if isinstance(resources.get(part), dict):
            ops.append({"op": "add", "path": f"{base}/{part}/{key}", "value": "1"})
        else:
            ops.append({"op": "add", "path": f"{base}/{part}", "value": {SHARE_RESOURCE: "1"}})
    return ops


def review(body: bytes) -> tuple[int, JSON]:
    """One AdmissionReview: allowed, with the patch when the pod needs its slot."""
    try:
        request = orjson.loads(body)["request"]
        uid = str(request["uid"])
    except (orjson.JSONDecodeError, KeyError, TypeError) as e:
        return 400, {"error": f"not an AdmissionReview: {e}"}
    response: dict[str, JSON] = {"uid": uid, "allowed": True}
    obj = request.get("object")
    if request.get("operation") == "CREATE" and isinstance(obj, dict):
        ops = patch(obj)
        if ops:
            response |= {"patchType": "JSONPatch", "patch": base64.b64encode(orjson.dumps(ops)).decode()}
    return 200, {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
