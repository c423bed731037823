"""The watch cache under scripted events: usage, devices from annotations, assumed pods."""

from __future__ import annotations

import json

from extender.cache import Cache
from extender.config import GpuConfig
from extender.objects import DEVICES_ANNOTATION, encode_devices
from extender.pools import Hardware
from solver.model import DeviceAssignment
from tests.extender.fakes import node, pod

LEVELS = ("topology.phalanx.io/block", "topology.phalanx.io/rack", "kubernetes.io/hostname")


def cache_with(*nodes: dict) -> Cache:  # type: ignore[type-arg]
    cache = Cache(LEVELS)
    cache.replace_nodes(list(nodes))
    return cache


def test_node_devices_and_topology_come_from_status_and_labels() -> None:
    model = cache_with(node("n0", gpus=4)).node_model("n0")
    assert model is not None
    assert [d.index for d in model.gpus] == [0, 1, 2, 3]
    assert model.topology == ("b0", "b0-r0", "n0")
    assert model.allocatable.cpu_milli == 128000


def test_mig_layout_annotation_places_slices_on_devices() -> None:
    layout = json.dumps(
        [{"index": 4, "profile": "1g.10gb", "slices": 7}, {"index": 5, "profile": "3g.40gb", "slices": 2}]
    )
    model = cache_with(node("n0", gpus=4, mig={"1g.10gb": 7, "3g.40gb": 2}, layout=layout)).node_model("n0")
    assert model is not None
    assert [(d.index, d.mig_free("1g.10gb"), d.mig_free("3g.40gb")) for d in model.gpus[4:]] == [(4, 7, 0), (5, 0, 2)]


def test_bound_pod_devices_are_rebuilt_from_its_annotation() -> None:
    cache = cache_with(node("n0", gpus=2))
    devices = encode_devices((DeviceAssignment(1, 1000, 81920),))
    cache.pod_event(
        "ADDED", pod("p", gpus=1, node_name="n0", annotations={DEVICES_ANNOTATION: devices}, phase="Running")
    )
    model = cache.node_model("n0")
    assert model is not None
    assert [d.is_idle for d in model.gpus] == [True, False]


def test_gpu_pod_without_annotation_gets_devices_inferred() -> None:
    cache = cache_with(node("n0", gpus=2))
    cache.pod_event("ADDED", pod("p", gpus=1, node_name="n0", phase="Running"))
    model = cache.node_model("n0")
    assert model is not None and model.idle_gpus == 1


def test_deleted_and_finished_pods_free_their_devices() -> None:
    cache = cache_with(node("n0", gpus=1))
    cache.pod_event("ADDED", pod("p", gpus=1, node_name="n0", phase="Running"))
    assert cache.node_model("n0").idle_gpus == 0  # type: ignore[union-attr]
    cache.pod_event("MODIFIED", pod("p", gpus=1, node_name="n0", phase="Succeeded"))
    assert cache.node_model("n0").idle_gpus == 1  # type: ignore[union-attr]
    cache.pod_event("MODIFIED", pod("p", gpus=1, node_name="n0", phase="Running"))
    cache.pod_event("DELETED", pod("p", gpus=1, node_name="n0"))
    assert cache.node_model("n0").idle_gpus == 1  # type: ignore[union-attr]


def test_assumed_pod_counts_until_forgotten_and_is_kept_when_the_watch_confirms() -> None:
    cache = cache_with(node("n0", gpus=2))
    cache.pod_event("ADDED", pod("p", gpus=1))
    cache.assume("uid-p", "n0", (DeviceAssignment(0, 1000, 81920),))
    assert cache.node_model("n0").idle_gpus == 1  # type: ignore[union-attr]
    cache.forget("uid-p")
    assert cache.node_model("n0").idle_gpus == 2  # type: ignore[union-attr]
    cache.assume("uid-p", "n0", (DeviceAssignment(0, 1000, 81920),))
    cache.pod_event("MODIFIED", pod("p", gpus=1, node_name="n0", phase="Running"))
    assert cache.assumed("uid-p") is None
    model = cache.node_model("n0")
    assert model is not None and [d.is_idle for d in model.gpus] == [False, True]


def test_a_confirmed_bind_and_its_start_leave_the_node_model_as_it_was() -> None:
    """What a pod counts on its node does not move when the watch confirms its bind (with the
    devices the bind assumed) or the pod starts running: the node keeps its model and version,
    with nothing for the shape memos to measure again. Devices other than the assumed ones,
    or the pod's end, do move it."""
    cache = cache_with(node("n0", gpus=2))
    cache.pod_event("ADDED", pod("p", gpus=1))
    devices = (DeviceAssignment(1, 1000, 81920),)
    cache.assume("uid-p", "n0", devices)
    assumed = cache.node_model("n0")
    start = cache.changes_since(0, 0)
    annotations = {DEVICES_ANNOTATION: encode_devices(devices)}
    cache.pod_event("MODIFIED", pod("p", gpus=1, node_name="n0", annotations=annotations))
    cache.pod_event("MODIFIED", pod("p", gpus=1, node_name="n0", annotations=annotations, phase="Running"))
    assert cache.assumed("uid-p") is None and cache.pod("uid-p").phase == "Running"  # type: ignore[union-attr]
    assert cache.node_model("n0") is assumed
    assert cache.changes_since(start.epoch, start.cursor).nodes == []
    cache.pod_event("MODIFIED", pod("p", gpus=1, node_name="n0", annotations=annotations, phase="Succeeded"))
    assert cache.node_model("n0").idle_gpus == 2  # type: ignore[union-attr]

    cache.pod_event("ADDED", pod("q", gpus=1))
    cache.assume("uid-q", "n0", (DeviceAssignment(0, 1000, 81920),))
    before = cache.node_model("n0")
    other = {DEVICES_ANNOTATION: encode_devices((DeviceAssignment(1, 1000, 81920),))}
    cache.pod_event("MODIFIED", pod("q", gpus=1, node_name="n0", annotations=other))
    model = cache.node_model("n0")
    assert model is not before and model is not None and [d.is_idle for d in model.gpus] == [True, False]


def test_versions_move_only_for_touched_nodes() -> None:
    cache = cache_with(node("n0"), node("n1"))
    start = cache.changes_since(0, 0)
    n0 = cache.node_model("n0")
    cache.pod_event("ADDED", pod("p", gpus=1, node_name="n1", phase="Running"))
    assert cache.changes_since(start.epoch, start.cursor).nodes == ["n1"]
    assert cache.node_model("n0") is n0  # not rebuilt


def test_relist_drops_vanished_objects() -> None:
    cache = cache_with(node("n0"), node("n1"))
    cache.replace_nodes([node("n1")])
    assert cache.node_model("n0") is None and cache.node_model("n1") is not None


def test_new_topology_levels_re_derive_paths() -> None:
    cache = cache_with(node("n0"))
    cache.configure(("topology.phalanx.io/rack",), Hardware(GpuConfig()))
    assert cache.node_model("n0").topology == ("b0-r0",)  # type: ignore[union-attr]


def test_kept_nodes_hold_only_what_re_deriving_them_needs() -> None:
    """managedFields, conditions and images are most of a Node's memory at 5,000 nodes: the
    copy kept for re-deriving is cut to what node_info reads, and re-deriving from it gives
    the same node (taints, cordon, devices, pool annotations and all)."""
    full = node("n0", gpus=4, labels={"pool": "a"})
    full["metadata"]["managedFields"] = [{"manager": "kwok", "fieldsV1": {"f:status": {}}}]
    full["spec"] = {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}], "unschedulable": True}
    full["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    full["status"]["images"] = [{"names": ["x"], "sizeBytes": 1}]
    cache = cache_with(full)
    before = cache.node_model("n0")
    kept = cache._raw_nodes["n0"]
    assert "managedFields" not in kept["metadata"] and set(kept["status"]) == {"allocatable"}
    cache.configure(LEVELS, Hardware(GpuConfig(defaultMemoryMiB=40960)))  # re-derived from the kept copy
    after = cache.node_model("n0")
    assert before is not None and after is not None
    assert (after.taints, after.unschedulable, after.labels, after.topology) == (
        before.taints,
        before.unschedulable,
        before.labels,
        before.topology,
    )
    assert [d.index for d in after.gpus] == [0, 1, 2, 3]


def test_a_pod_bound_elsewhere_than_assumed_stops_counting_on_the_assumed_node() -> None:
    cache = cache_with(node("n0", gpus=1), node("n1", gpus=1))
    cache.pod_event("ADDED", pod("p", gpus=1))
    cache.assume("uid-p", "n0", (DeviceAssignment(0, 1000, 81920),))
    cache.pod_event("MODIFIED", pod("p", gpus=1, node_name="n1", phase="Running"))
    assert cache.node_model("n0").idle_gpus == 1  # type: ignore[union-attr]
    assert cache.node_model("n1").idle_gpus == 0  # type: ignore[union-attr]


def test_deleting_a_reserved_pod_frees_its_node_at_once() -> None:
    """Regression: the assumed node's model was cached by version and kept the reservation."""
    cache = cache_with(node("n0", gpus=1))
    cache.pod_event("ADDED", pod("p", gpus=1))
    cache.assume("uid-p", "n0", (DeviceAssignment(0, 1000, 81920),))
    assert cache.node_model("n0").idle_gpus == 0  # type: ignore[union-attr]
    cache.pod_event("DELETED", pod("p", gpus=1))
    assert cache.node_model("n0").idle_gpus == 1  # type: ignore[union-attr]


def test_a_status_only_change_moves_the_version_and_nomination_without_a_change_event() -> None:
    """The verbs answer a pod at the cache's version from the cache (no parse): a nomination
    (a gang member's, before each of its filters) must not leave that version behind."""
    cache = cache_with(node("n1"))
    seen: list[object] = []
    cache.on_pod_change(lambda old, new: seen.append(new))
    p = pod("a", uid="u-a", gpus=1)
    p["metadata"]["resourceVersion"] = "10"
    cache.pod_event("ADDED", p)
    before, generation = cache.pod("u-a"), cache.generation
    nominated = json.loads(json.dumps(p))
    nominated["metadata"]["resourceVersion"] = "11"
    nominated["status"]["nominatedNodeName"] = "n1"
    cache.pod_event("MODIFIED", nominated)
    after = cache.pod("u-a")
    assert after is not None and before is not None
    assert (after.resource_version, after.nominated) == ("11", "n1")
    assert after.requests == before.requests and after.demand == before.demand
    assert len(seen) == 1 and cache.generation == generation  # no change for the solver


def test_a_spec_change_alone_is_read_again() -> None:
    """A resize or a gated pod's nodeSelector changes only the spec: the cache must not keep
    the old reading (and must not answer a verb at the new version with it)."""
    cache = cache_with(node("n1"))
    p = pod("a", uid="u-a", gpus=1)
    p["metadata"]["resourceVersion"] = "10"
    cache.pod_event("ADDED", p)
    selected = json.loads(json.dumps(p))
    selected["metadata"]["resourceVersion"] = "11"
    selected["spec"]["nodeSelector"] = {"pool": "a"}
    cache.pod_event("MODIFIED", selected)
    after = cache.pod("u-a")
    assert after is not None and after.resource_version == "11" and '"pool"' in after.placement


def test_a_phase_change_alone_is_a_change_without_a_parse(monkeypatch: object) -> None:
    import extender.cache as cache_module

    cache = cache_with(node("n1"))
    p = pod("a", uid="u-a", gpus=1, node_name="n1")
    p["metadata"]["resourceVersion"] = "10"
    cache.pod_event("ADDED", p)
    seen: list[object] = []
    cache.on_pod_change(lambda old, new: seen.append(new))
    before = cache.pod("u-a")
    assert cache.node_model("n1").idle_gpus == 7  # type: ignore[union-attr]
    parsed: list[object] = []
    original = cache_module.pod_info
    cache_module.pod_info = lambda obj: parsed.append(obj) or original(obj)  # type: ignore[assignment,func-returns-value]
    try:
        done = json.loads(json.dumps(p))
        done["metadata"]["resourceVersion"] = "12"
        done["status"]["phase"] = "Succeeded"
        cache.pod_event("MODIFIED", done)
    finally:
        cache_module.pod_info = original  # type: ignore[assignment]
    after = cache.pod("u-a")
    assert after is not None and before is not None and not parsed
    assert (after.phase, after.resource_version, after.active) == ("Succeeded", "12", False)
    assert after.requests == before.requests and after.devices == before.devices
    assert len(seen) == 1  # the solver sees it: the pod's devices are free again
    assert cache.node_model("n1").idle_gpus == 8  # type: ignore[union-attr]


def test_a_status_only_change_before_an_owned_pod_is_keyed_keeps_it_a_member() -> None:
    """An owned pod waits for its Resource Interface key (jq, outside the locks); a status
    change meanwhile gives the cache a new reading of the same pod, which must still count."""
    from extender.gangs.membership import Membership

    class KeysAll:
        on_rekey = None

        def may_key(self, pod: object) -> bool:
            return True

        def key(self, pod: object) -> str:
            return "ri:default/job/0"

    cache = cache_with(node("n1"))
    members = Membership(cache, KeysAll())  # type: ignore[arg-type]
    p = pod("a", uid="u-a", gpus=1)
    p["metadata"]["resourceVersion"] = "10"
    p["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u-j"}]
    cache.pod_event("ADDED", p)
    nominated = json.loads(json.dumps(p))
    nominated["metadata"]["resourceVersion"] = "11"
    nominated["status"]["conditions"] = [{"type": "PodScheduled", "status": "False"}]
    cache.pod_event("MODIFIED", nominated)
    assert [m.uid for m in members.member_pods("ri:default/job/0")] == ["u-a"]
