"""What the hot path reuses instead of computing again (issue 14), checked against computing
it afresh: a bound pod's reading from its pending one, a node's model with the devices no pod
takes as read, a device choice per node state."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

from extender.cache import Cache
from extender.objects import (
    DEVICES_ANNOTATION,
    NODE_POOLS_ANNOTATION,
    PodInfo,
    bound_pod_info,
    encode_devices,
    pod_info,
)
from extender.sharing import CHOSEN_STATES, Sharing
from solver import DeviceState, NodeState, WorkloadClass
from solver.model import DeviceAssignment, GpuDemand, GpuDevice, MigSlice, Node, PodShape, Resources
from tests.extender.fakes import node, pod

LEVELS = ("topology.phalanx.io/block", "topology.phalanx.io/rack", "kubernetes.io/hostname")


# ---------------------------------------------------------------- a bound pod's reading


def pending(rnd: random.Random, i: int) -> dict[str, Any]:
    """A pending pod as the API server lists it (no spec.nodeName), of varied shape."""
    gpus = rnd.choice([0, 0, 1, 2, 4])
    obj = pod(f"p{i}", gpus=gpus, resources={"memory": rnd.choice(["1Gi", "4Gi", "300Mi"])})
    del obj["spec"]["nodeName"]
    meta, spec = obj["metadata"], obj["spec"]
    meta["resourceVersion"] = str(rnd.randrange(1, 10**6))
    if rnd.random() < 0.5:
        meta["labels"] = {"app": rnd.choice(["a", "b"]), "tier": "x"}
    if rnd.random() < 0.3:
        meta["annotations"]["phalanx.io/gpu-pool"] = "pool-a"
    if rnd.random() < 0.3:
        meta["annotations"][NODE_POOLS_ANNOTATION] = rnd.choice(["spot", "spot,on-demand", "bad pool!"])
    if rnd.random() < 0.3:
        meta["annotations"]["gpu-fraction"] = rnd.choice(["0.5", "0.25"])
    if rnd.random() < 0.3:
        meta["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u-j", "controller": True}
        ]
    if rnd.random() < 0.3:
        spec["tolerations"] = [{"key": "gpu", "operator": "Exists"}]
    if rnd.random() < 0.3:
        term = {"weight": 1, "preference": {"matchExpressions": [{"key": "z", "operator": "In", "values": ["1"]}]}}
        spec["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}
    if rnd.random() < 0.2:
        spec["schedulerName"] = "phalanx"
    if rnd.random() < 0.2:
        spec["priority"] = rnd.choice([0, 100, 10**6])
    return obj


def bound(rnd: random.Random, obj: dict[str, Any], info: PodInfo) -> dict[str, Any]:
    """`obj` as its bind's event shows it: the node set (in the spec's place the API server
    gives it), maybe a device record (right for its request, or not), the status moved."""
    out = copy.deepcopy(obj)
    spec = out["spec"]
    keys = list(spec)
    at = rnd.randrange(len(keys) + 1)
    out["spec"] = {**dict(list(spec.items())[:at]), "nodeName": "n1", **dict(list(spec.items())[at:])}
    meta = out["metadata"]
    meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
    count = info.demand.count
    record = rnd.random()
    if record < 0.6 and count:
        devices = tuple(DeviceAssignment(i, info.demand.milli or 1000, 0) for i in range(count))
        meta["annotations"][DEVICES_ANNOTATION] = encode_devices(devices)
    elif record < 0.8:
        meta["annotations"][DEVICES_ANNOTATION] = rnd.choice(
            ["not json", encode_devices((DeviceAssignment(5, 1000, 0),))]
        )
    out["status"] = {
        "phase": rnd.choice(["Pending", "Running"]),
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        **({"nominatedNodeName": "n1"} if rnd.random() < 0.2 else {}),
    }
    return out


def same_reading(a: PodInfo, b: PodInfo) -> bool:
    """Equal, the fields left out of PodInfo's comparison included."""
    return a == b and (a.resource_version, a.spec_hash, a.nominated, a.obj) == (
        b.resource_version,
        b.spec_hash,
        b.nominated,
        b.obj,
    )


def test_a_bound_pods_reading_from_its_pending_one_is_its_full_reading() -> None:
    rnd = random.Random(14)
    taken = 0
    for i in range(400):
        obj = pending(rnd, i)
        old = pod_info(obj)
        new = bound(rnd, obj, old)
        fast = bound_pod_info(old, new)
        assert fast is not None, new
        assert same_reading(fast, pod_info(new)), new
        taken += fast.devices is not None
    assert taken > 50  # records read, not only pods without one


def test_a_bind_event_that_moved_anything_else_is_read_whole() -> None:
    """Any change beyond the node, the device record and the status: no shortcut (None)."""
    changes = [
        lambda o: o["metadata"].setdefault("labels", {}).update(new="1"),
        lambda o: o["metadata"]["annotations"].update({"phalanx.io/gpu-pool": "other"}),
        lambda o: o["metadata"]["annotations"].update({NODE_POOLS_ANNOTATION: "other"}),
        lambda o: o["metadata"].update(ownerReferences=[{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "u"}]),
        lambda o: o["metadata"].update(creationTimestamp="2027-01-01T00:00:00Z"),
        lambda o: o["metadata"].update(name="other"),
        lambda o: o["spec"]["containers"][0]["resources"]["requests"].update(cpu="2"),
        lambda o: o["spec"].update(nodeSelector={"a": "b"}),
        lambda o: o["spec"].update(nodeName=""),
    ]
    rnd = random.Random(3)
    for i, change in enumerate(changes):
        obj = pending(rnd, i)
        old = pod_info(obj)
        new = bound(rnd, obj, old)
        change(new)
        assert bound_pod_info(old, new) is None, i
    obj = pending(rnd, 99)
    obj["spec"]["nodeName"] = "n0"  # already bound: its next event is no bind
    old = pod_info(obj)
    assert bound_pod_info(old, bound(rnd, obj, old)) is None


def test_the_cache_reads_a_bind_event_without_parsing_the_pod_again(monkeypatch: Any) -> None:
    import extender.cache as cache_module

    cache = Cache(LEVELS)
    cache.replace_nodes([node("n1")])
    obj = pod("a", uid="u-a", gpus=1)
    del obj["spec"]["nodeName"]
    obj["metadata"]["resourceVersion"] = "10"
    cache.pod_event("ADDED", obj)
    parsed: list[object] = []
    monkeypatch.setattr(cache_module, "pod_info", lambda o: parsed.append(o) or pod_info(o))
    done = json.loads(json.dumps(obj))
    done["spec"]["nodeName"] = "n1"
    done["metadata"]["resourceVersion"] = "11"
    done["metadata"]["annotations"][DEVICES_ANNOTATION] = encode_devices((DeviceAssignment(3, 1000, 81920),))
    cache.pod_event("MODIFIED", done)
    after = cache.pod("u-a")
    assert not parsed and after is not None and same_reading(after, pod_info(done))
    model = cache.node_model("n1")
    assert model is not None and [d.index for d in model.gpus if not d.is_idle] == [3]


# ---------------------------------------------------------------- a node's model


def reference_gpus(devices: tuple[GpuDevice, ...], taken: list[DeviceAssignment]) -> tuple[GpuDevice, ...]:
    """The node model's devices as built before: every device through DeviceState and back."""
    states = {d.index: DeviceState.of(d) for d in devices}
    for a in taken:
        if a.index in states:
            states[a.index].consume(a)
    return tuple(d.freeze() for d in states.values())


def test_a_node_models_devices_are_what_rebuilding_every_device_gives() -> None:
    rnd = random.Random(5)
    for case in range(150):
        memory = rnd.choice(["81920", "-5", "0"])  # a hostile label: below 0
        layout = None
        if rnd.random() < 0.3:  # MIG devices, a profile twice on one device, or an index taken twice
            entries = [{"index": rnd.choice([1, 4, 5]), "profile": rnd.choice(["1g.10gb", "3g.40gb"]), "slices": 2}]
            entries += [{"index": entries[0]["index"], "profile": rnd.choice(["1g.10gb", "3g.40gb"]), "slices": 1}]
            layout = json.dumps(entries)
        n = node("n1", gpus=rnd.choice([0, 2, 4]), labels={"nvidia.com/gpu.memory": memory}, layout=layout)
        cache = Cache(LEVELS)
        cache.replace_nodes([n])
        info = cache.node_infos()[0]
        taken = []
        for k in range(rnd.randrange(4)):
            index = rnd.randrange(6)
            a = rnd.choice([DeviceAssignment(index, 1000, 100), DeviceAssignment(index, 250, 10)])
            cache.assume(f"u{k}", "n1", (a,))
            taken.append(a)
        model = cache.node_model("n1")
        assert model is not None
        assert model.gpus == reference_gpus(info.devices, taken), (case, info.devices, taken)


# ---------------------------------------------------------------- a device choice per node state


SHAPES = [
    PodShape(Resources(1000, 1024, 1), GpuDemand.whole(1)),
    PodShape(Resources(1000, 1024, 1), GpuDemand.whole(2)),
    PodShape(Resources(1000, 1024, 1), GpuDemand.share(250)),
    PodShape(Resources(1000, 1024, 1), GpuDemand.share(500)),
    PodShape(Resources(100_000, 1024, 1), GpuDemand.share(500)),
]
WORKLOADS = [
    (WorkloadClass(1000, 500, 1, None, 0.7, 1024), WorkloadClass(1000, 1000, 1, None, 0.3, 1024)),
    (WorkloadClass(1000, 250, 1, None, 0.5, 1024), WorkloadClass(4000, 750, 1, None, 0.5, 1024)),
    (),
]


def random_node(rnd: random.Random) -> Node:
    """One of few states (as a cluster's nodes are), named apart."""
    free = [rnd.choice([1000, 750, 500, 0]) for _ in range(4)]
    gpus = tuple(GpuDevice(i, "A100", 81920, f, 81920 * f // 1000) for i, f in enumerate(free))
    cpu = rnd.choice([128_000, 8000])
    return Node(f"n{rnd.randrange(10**6)}", Resources(128_000, 10**6, 110), Resources(128_000 - cpu, 0, 1), gpus=gpus)


def test_a_device_choice_is_the_one_made_afresh_whatever_the_workload_lead_or_spread() -> None:
    sharing = Sharing(Cache(LEVELS))
    rnd = random.Random(11)
    differ = 0
    for i in range(3000):
        node_, shape = random_node(rnd), rnd.choice(SHAPES)
        workload = WORKLOADS[i // 500 % len(WORKLOADS)]  # as in the extender: a while, then another
        spread = rnd.random() < 0.2
        lead = rnd.choice([(), (), (3,), (2, 1)])
        got = sharing._take(node_, shape, spread, workload, lead)
        assert got == NodeState(node_).take(shape, spread=spread, workload=workload, lead=lead)
        other = WORKLOADS[(WORKLOADS.index(workload) + 1) % len(WORKLOADS)]
        differ += got != NodeState(node_).take(shape, spread=spread, workload=other, lead=lead)
    assert differ > 30  # the workload decides many choices: a memo shared across workloads would fail


def test_the_choices_kept_are_bounded() -> None:
    sharing = Sharing(Cache(LEVELS))
    workload = WORKLOADS[0]
    shape = SHAPES[2]
    for i in range(CHOSEN_STATES + 10):
        gpus = (GpuDevice(0, "A100", 81920), GpuDevice(1, "A100", 81920, 1000 - i % 1000))
        node_ = Node("n", Resources(10**9, 10**9, 10**6), Resources(i, 0, 0), gpus=gpus)
        sharing._take(node_, shape, False, workload, ())
    assert len(sharing._chosen[1]) <= CHOSEN_STATES


def test_mig_devices_keep_their_slices_in_the_model() -> None:
    """The untouched-device shortcut keeps MIG devices' slices exactly (a profile once each)."""
    layout = json.dumps([{"index": 4, "profile": "1g.10gb", "slices": 7}])
    cache = Cache(LEVELS)
    cache.replace_nodes([node("n1", gpus=4, mig={"1g.10gb": 7}, layout=layout)])
    model = cache.node_model("n1")
    assert model is not None and model.gpus[4].mig == (MigSlice("1g.10gb", 7),)
