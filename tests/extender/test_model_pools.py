"""Model pools in the extender: pods that may only use some GPU models (a nodeSelector or
required affinity on nvidia.com/gpu.product) have the pools of those models held for them, so
prioritize ranks those nodes last for pods that could go elsewhere; binds draw the hold down."""

from __future__ import annotations

from typing import Any

import pytest

from extender.app import Extender
from extender.objects import PRODUCT_LABEL, pod_info, selected_models
from extender.sharing import TRESPASSES
from tests.extender.fakes import bind_devices, extender_on, leader, node, pod, scores

T4 = frozenset({"T4"})


def on_t4(name: str, node_name: str = "") -> dict[str, Any]:
    obj = pod(name, gpus=1, node_name=node_name, phase="Running" if node_name else "Pending")
    obj["spec"]["nodeSelector"] = {PRODUCT_LABEL: "T4"}
    return obj


def cluster(pods: list[dict[str, Any]]) -> Extender:
    """t0: 2 T4 GPUs; v0-v2: 2 V100 GPUs each."""
    nodes = [node("t0", gpus=2, product="T4")] + [node(f"v{i}", gpus=2, product="V100") for i in range(3)]
    extender: Extender = extender_on(nodes, pods)
    return extender


@pytest.fixture
def ext() -> Extender:
    """Half the GPU pods may only use T4 (a quarter of the GPUs): T4 is held for them."""
    return cluster([on_t4(f"t{i}") for i in range(4)] + [pod(f"u{i}", gpus=1) for i in range(4)])


def test_the_pods_selection_names_its_models() -> None:
    assert pod_info(on_t4("a")).gpu_models == T4
    assert pod_info(pod("b", gpus=1)).gpu_models is None


def test_selected_models_reads_selector_and_required_affinity() -> None:
    def expr(*values: str, op: str = "In") -> dict[str, Any]:
        return {"key": PRODUCT_LABEL, "operator": op, "values": list(values)}

    def affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
        required = {"nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}

    assert selected_models({}) is None
    assert selected_models({"affinity": affinity([expr("T4", "P100")], [expr("V100")])}) == {"T4", "P100", "V100"}
    assert selected_models({"affinity": affinity([expr("T4", "P100"), expr("P100", "A10")])}) == {"P100"}
    assert selected_models({"affinity": affinity([expr("T4")], [])}) is None  # a term allows any
    assert selected_models({"affinity": affinity([expr("T4", op="NotIn")])}) is None
    both = {"nodeSelector": {PRODUCT_LABEL: "T4"}, "affinity": affinity([expr("T4", "V100")])}
    assert selected_models(both) == T4
    assert selected_models({"affinity": {"nodeAffinity": "hostile"}}) is None
    assert selected_models({"affinity": affinity(["not a dict"])}) is None  # type: ignore[list-item]


def test_the_sweep_plans_the_pools(ext: Extender) -> None:
    pools = ext.sharing.pools()
    assert pools is not None
    assert pools.pool_of == {"t0": "T4", "v0": "V100", "v1": "V100", "v2": "V100"}
    assert pools.ledger.left(T4, "T4") == pytest.approx(2000)
    assert pools.free == {"T4": 2000, "V100": 6000}


def test_a_pod_that_may_go_anywhere_ranks_the_held_pool_last(ext: Extender) -> None:
    assert ext.sharing.tiers(["t0", "v0"], ext.verbs._ask(pod_info(pod("u0", gpus=1))).shape, ext.cache.node_model) == {
        "t0": TRESPASSES
    }
    assert leader(scores(ext, pod("u0", gpus=1), ["t0", "v0"])) == "v0"
    # The pods the pool is held for rank it as usual (the node name breaks the tie).
    assert leader(scores(ext, on_t4("t0"), ["t0"])) is None
    assert ext.sharing.tiers(["t0", "v0"], ext.verbs._ask(pod_info(on_t4("t0"))).shape, ext.cache.node_model) == {}


def test_without_confined_pods_there_is_no_hold() -> None:
    ext = cluster([pod(f"u{i}", gpus=1) for i in range(8)])
    assert ext.sharing.pools() is None
    assert leader(scores(ext, pod("u0", gpus=1), ["t0", "v0"])) == "t0"  # by name, as before


def test_when_every_candidate_is_held_none_ranks_down(ext: Extender) -> None:
    shape = ext.verbs._ask(pod_info(pod("u0", gpus=1))).shape
    assert ext.sharing.tiers(["t0"], shape, ext.cache.node_model) == {}


def test_binds_and_running_pods_draw_the_hold_down() -> None:
    ext = cluster([on_t4("t0"), on_t4("t1", node_name="t0")] + [pod(f"u{i}", gpus=1) for i in range(2)])
    pools = ext.sharing.pools()
    assert pools is not None
    # 2 of 4 GPU pods are T4-only: the plan holds T4's 2 GPUs; one is taken by a running pod.
    assert pools.ledger.left(T4, "T4") == pytest.approx(1000) and pools.free["T4"] == pytest.approx(1000)
    bind_devices(ext, "t0", "t0")
    assert pools.ledger.left(T4, "T4") == pytest.approx(0) and pools.free["T4"] == pytest.approx(0)
