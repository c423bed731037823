"""Dynamic MIG through the extender: the bind writes the slice's position, the cache counts it,
and a restarted cache rebuilds the same layout from the pods' annotations."""

from __future__ import annotations

import json

from extender.app import Extender, Options
from extender.cache import Cache
from extender.objects import DEVICES_ANNOTATION
from solver.mig import MigSlot
from tests.extender.fakes import FakeKube, mark_listed, node, pod

DYNAMIC = {"phalanx.io/mig-mode": "dynamic"}
LEVELS = ("kubernetes.io/hostname",)


def test_bind_writes_the_cut_and_the_cache_counts_it() -> None:
    kube = FakeKube()
    ext = Extender(kube, Options(port=0))
    ext.server.server_close()  # only the verbs are used, in-process
    ext.cache.replace_nodes([node("h0", gpus=1, labels=DYNAMIC, product="NVIDIA-H100-80GB-HBM3")])
    objs = [pod(f"m{i}", annotations={"phalanx.io/migProfile": "3g.40gb"}) for i in range(3)]
    for obj in objs:
        kube.pods[f"default/{obj['metadata']['name']}"] = obj
    ext.cache.replace_pods(objs)
    mark_listed(ext)
    replies = [
        ext.verbs.bind({"PodNamespace": "default", "PodName": f"m{i}", "PodUID": f"uid-m{i}", "Node": "h0"})
        for i in range(3)
    ]
    assert replies[:2] == [{"Error": ""}, {"Error": ""}]
    assert "no longer fits" in replies[2]["Error"], "a H100 holds two 3g.40gb slices"
    cuts = [json.loads(o["metadata"]["annotations"][DEVICES_ANNOTATION]) for o in objs[:2]]
    assert sorted(c[0]["start"] for c in cuts) == [0, 4]
    assert all(c[0]["mig"] == "3g.40gb" and c[0]["index"] == 0 for c in cuts)
    model = ext.cache.node_model("h0")
    assert model is not None and sorted(model.gpus[0].mig_layout, key=lambda s: s.start) == [
        MigSlot("3g.40gb", 0),
        MigSlot("3g.40gb", 4),
    ]
    # A new cache (an extender restart) rebuilds the layout from the bound pods' annotations.
    for o in objs[:2]:
        o["spec"]["nodeName"] = "h0"
    fresh = Cache(LEVELS)
    fresh.replace_nodes([node("h0", gpus=1, labels=DYNAMIC, product="NVIDIA-H100-80GB-HBM3")])
    fresh.replace_pods(objs[:2])
    again = fresh.node_model("h0")
    assert again is not None and set(again.gpus[0].mig_layout) == set(model.gpus[0].mig_layout)


def test_nodes_without_the_dynamic_label_are_not_cut() -> None:
    cache = Cache(LEVELS)
    cache.replace_nodes([node("h0", gpus=1, product="NVIDIA-H100-80GB-HBM3")])
    model = cache.node_model("h0")
    assert model is not None and model.gpus[0].partition is None and model.gpus[0].mig_free("1g.10gb") == 0
