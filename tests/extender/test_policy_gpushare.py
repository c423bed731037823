"""`/mutate-gpu-share`: a share asked by annotation gets one phalanx.io/gpu-share slot on the
right container; every other pod is left alone; the webhook is registered only when asked."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from extender.policy import gpushare
from extender.policy.registration import Endpoint, configurations

R = gpushare.SHARE_RESOURCE


def pod(annotations: dict[str, str], *containers: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "annotations": annotations},
        "spec": {"containers": list(containers) or [{"name": "main", "image": "x"}]},
    }


def apply(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """A JSON patch of `add` operations, as the API server applies it."""
    doc = json.loads(json.dumps(obj))
    for op in ops:
        assert op["op"] == "add"
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        assert last not in node, f"add over an existing {op['path']}"
        node[last] = op["value"]
    return doc


def slots(obj: dict[str, Any]) -> list[tuple[str, str | None, str | None]]:
    return [
        (
            c["name"],
            (c.get("resources") or {}).get("limits", {}).get(R),
            (c.get("resources") or {}).get("requests", {}).get(R),
        )
        for c in obj["spec"]["containers"]
    ]


CPU = {"resources": {"requests": {"cpu": "1"}}}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (pod({"gpu-fraction": "0.5"}), [("main", "1", "1")]),
        (pod({"gpu-memory": "10Gi"}, {"name": "main", **CPU}), [("main", "1", "1")]),
        (
            pod({"tensor-fusion.ai/tflops-request": "20"}, {"name": "a", "resources": {"limits": {"cpu": "1"}}}),
            [("a", "1", "1")],
        ),
        (
            pod({"gpu-fraction": "0.25", "phalanx.io/gpu-container": "cuda"}, {"name": "sidecar"}, {"name": "cuda"}),
            [("sidecar", None, None), ("cuda", "1", "1")],
        ),
        (pod({"phalanx.io/gpuPortionRequest": "0.3"}), [("main", "1", "1")]),
        (pod({"gpu-fraction": "1"}), [("main", "1", "1")]),
        (pod({"phalanx.io/gpuDeviceRequest": "2"}), [("main", "1", "1")]),
        (pod({"phalanx.io/gpuRequestType": "migProfile", "phalanx.io/migProfile": "1g.10gb"}), [("main", "1", "1")]),
    ],
    ids=[
        "KAI fraction, no resources",
        "KAI memory, requests only",
        "TensorFusion TFLOPs, limits only",
        "the container the annotation names",
        "a policy portion field",
        "a whole GPU by fraction 1",
        "whole GPUs by a policy field",
        "a MIG slice by a policy field",
    ],
)
def test_gpus_asked_by_annotation_get_one_slot(obj: dict[str, Any], expected: list[Any]) -> None:
    patched = apply(obj, gpushare.patch(obj))
    assert slots(patched) == expected
    assert patched["spec"]["containers"][0].get("resources", {}).get("requests", {}).get("cpu") in (None, "1")


@pytest.mark.parametrize(
    "obj",
    [
        pod({}),
        pod({}, {"name": "m", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"}}}),
        pod({"gpu-fraction": "0.5"}, {"name": "m", "resources": {"limits": {R: "1"}}}),
        pod({}, {"name": "m", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}),
        pod({"gpu-fraction": "2"}),
        {"metadata": {"annotations": {"gpu-fraction": "0.5"}}, "spec": {}},
    ],
    ids=[
        "no GPU",
        "a HAMi share (the kubelet calls the plugin for nvidia.com/gpu)",
        "the slot already asked",
        "a MIG slice",
        "an invalid request (filter refuses it with its reason)",
        "no containers",
    ],
)
def test_every_other_pod_is_left_alone(obj: dict[str, Any]) -> None:
    assert gpushare.patch(obj) == []


def review(obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    body = json.dumps({"request": {"uid": "u1", "operation": operation, "object": obj}}).encode()
    status, answer = gpushare.review(body)
    assert status == 200
    response: dict[str, Any] = answer["response"]
    assert response["uid"] == "u1" and response["allowed"] is True
    return response


def test_the_review_carries_the_patch_for_a_creation_only() -> None:
    response = review(pod({"gpu-fraction": "0.5"}))
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"]))[0]["path"] == "/spec/containers/0/resources"
    assert "patch" not in review(pod({"gpu-fraction": "0.5"}), "UPDATE")
    assert gpushare.review(b"{not json")[0] == 400


def test_the_webhook_is_registered_only_when_asked_and_fails_open() -> None:
    endpoint = Endpoint(url="https://127.0.0.1:9443")
    off, _ = configurations(endpoint, b"ca", [], "phalanx-system")
    on, _ = configurations(endpoint, b"ca", [], "phalanx-system", gpu_share=True)
    assert [h["name"] for h in off["webhooks"]] == ["defaults.policies.phalanx.io"]
    hook = on["webhooks"][1]
    assert hook["clientConfig"]["url"] == "https://127.0.0.1:9443/mutate-gpu-share"
    assert (hook["failurePolicy"], hook["reinvocationPolicy"]) == ("Ignore", "IfNeeded")
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "operations": ["CREATE"],
            "scope": "Namespaced",
        }
    ]
    excluded = hook["namespaceSelector"]["matchExpressions"][0]
    assert excluded["operator"] == "NotIn" and "kube-system" in excluded["values"]
    assert "gpu-fraction" in hook["matchConditions"][0]["expression"]
