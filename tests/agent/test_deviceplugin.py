"""The device plugins against a test kubelet speaking the real protocols over unix sockets: the
Registration service on kubelet.sock, the plugins' DevicePlugin service, the PodResourcesLister.

The node, drawn (GPU index: mode, uuid):

    GPU 0  whole or shared   GPU-0
    GPU 1  whole or shared   GPU-1
    GPU 2  whole or shared   GPU-2
    GPU 3  static MIG        1g.10gb MIG-3a @0, 1g.10gb MIG-3b @1, 1g.10gb+me MIG-3c @2

so it advertises nvidia.com/gpu (3 slots), phalanx.io/gpu-share (30), nvidia.com/mig-1g.10gb (2)
and nvidia.com/mig-1g.10gb.me (1). Pods' device records (`phalanx.io/gpu-devices`) are resolved
by a real Ledger over a test Backend.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from agent import cdi
from agent.contract import decode
from agent.deviceplugin import (
    API_VERSION,
    CLAIM_ANNOTATION,
    CLAIM_ENV,
    GPU_RESOURCE,
    NO_HOLDER,
    SHARE_RESOURCE,
    DevicePlugins,
    Slot,
    advertised,
    preferred,
    socket_name,
)
from agent.inventory import Gpu, Inventory, MigInstance
from agent.ledger import ContainerEdits, Ledger
from agent.mps import MPS_PIPE_DIRECTORY, MPS_SHM_DIRECTORY
from rpc import deviceplugin_pb2 as dp
from tests.kubelet import Kubelet, pod_resources

T = TypeVar("T")
MIG = "nvidia.com/mig-1g.10gb"
MIG_ME = "nvidia.com/mig-1g.10gb.me"
RESOURCES = {GPU_RESOURCE, SHARE_RESOURCE, MIG, MIG_ME}
MIB = 81559


def gpu(index: int, **kw: Any) -> Gpu:
    return Gpu(index, f"GPU-{index}", "NVIDIA-H100-80GB-HBM3", MIB, **kw)


MIG_GPU = gpu(
    3,
    mig_enabled=True,
    migs=(
        MigInstance("MIG-3a", "1g.10gb", 0, 1),
        MigInstance("MIG-3b", "1g.10gb", 1, 1),
        MigInstance("MIG-3c", "1g.10gb+me", 2, 1),
    ),
)
INVENTORY = Inventory("fake", "550.54", (gpu(0), gpu(1), gpu(2), MIG_GPU))


def eventually(check: Callable[[], T], what: str, timeout: float = 10.0) -> T:
    """Poll `check` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


# -- the node's records -------------------------------------------------------------------------


@dataclass
class Backend:
    """The hardware as agent.inventory.Backend: a fixed inventory, MIG calls recorded."""

    now: Inventory
    name: str = "test"
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def inventory(self) -> Inventory:
        return self.now

    def create_mig(self, index: int, profile: str, start: int) -> MigInstance:
        self.calls.append(("create", index, profile, start))
        return MigInstance(f"MIG-{index}-{start}", profile, start, 1)

    def destroy_mig(self, index: int, uuid: str) -> None:
        self.calls.append(("destroy", index, uuid))

    def close(self) -> None:
        pass


@dataclass
class Records:
    """The pods' `phalanx.io/gpu-devices` annotations, resolved through a real Ledger."""

    ledger: Ledger
    annotations: dict[str, str] = field(default_factory=dict)

    def resolve(self, namespace: str, name: str) -> ContainerEdits:
        key = f"{namespace}/{name}"
        grants = decode(self.annotations.get(key))
        if grants is None:
            raise LookupError(f"pod {key} has no device record")
        return self.ledger.edits(self.ledger.bind(key, "", grants))


@dataclass
class Node:
    kubelet: Kubelet
    records: Records
    plugins: DevicePlugins
    cdi_dir: Path

    def spec(self, resource: str, ids: list[str]) -> dict[str, Any]:
        path = cdi.spec_path(self.cdi_dir, cdi.claim_id(resource, ids))
        spec: dict[str, Any] = json.loads(path.read_text())
        return spec

    def env(self, resource: str, ids: list[str]) -> dict[str, str]:
        edits = self.spec(resource, ids)["devices"][0]["containerEdits"]
        return dict(e.split("=", 1) for e in edits["env"])


@pytest.fixture
def sockets() -> Iterator[Path]:
    """A short directory: unix socket paths must stay under ~107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_node(sockets: Path, *, kubelet_up: bool = True, lookup_timeout_s: float = 5.0) -> Node:
    (sockets / "device-plugins").mkdir()
    (sockets / "pod-resources").mkdir()
    kubelet = Kubelet(sockets / "device-plugins", sockets / "pod-resources" / "kubelet.sock")
    if kubelet_up:
        kubelet.start()
    records = Records(Ledger(Backend(INVENTORY)))
    plugins = DevicePlugins(
        records.resolve,
        plugin_dir=kubelet.plugin_dir,
        pod_resources_socket=kubelet.pod_resources_socket,
        cdi_dir=sockets / "cdi",
        poll_s=0.1,
        lookup_timeout_s=lookup_timeout_s,
    )
    plugins.update(INVENTORY)
    plugins.start()
    return Node(kubelet, records, plugins, sockets / "cdi")


@pytest.fixture
def node(sockets: Path) -> Iterator[Node]:
    n = make_node(sockets)
    eventually(lambda: n.kubelet.registered() == RESOURCES, "every resource registered")
    yield n
    n.plugins.stop()
    n.kubelet.stop()


# -- slots --------------------------------------------------------------------------------------


def healthy(slots: tuple[Slot, ...]) -> int:
    return sum(s.healthy for s in slots)


@pytest.mark.parametrize(
    ("case", "inventory", "slots_per_gpu", "expected"),
    [
        (
            "whole and shared GPUs beside static MIG slices",
            INVENTORY,
            1,
            {GPU_RESOURCE: (3, 3), SHARE_RESOURCE: (30, 30), MIG: (2, 2), MIG_ME: (1, 1)},
        ),
        (
            "slots_per_gpu multiplies the whole-GPU slots only",
            INVENTORY,
            4,
            {GPU_RESOURCE: (12, 12), SHARE_RESOURCE: (30, 30), MIG: (2, 2), MIG_ME: (1, 1)},
        ),
        (
            "an unhealthy GPU's slots are listed unhealthy",
            replace(INVENTORY, gpus=(gpu(0), gpu(1, healthy=False), gpu(2), replace(MIG_GPU, healthy=False))),
            1,
            {GPU_RESOURCE: (3, 2), SHARE_RESOURCE: (30, 20), MIG: (2, 0), MIG_ME: (1, 0)},
        ),
        (
            "a node cutting MIG slices per pod advertises every profile of its GPUs' table (H100: 4 GPUs)",
            replace(INVENTORY, dynamic_mig=True, gpus=(gpu(0), gpu(1), gpu(2), gpu(3, healthy=False))),
            1,
            {
                GPU_RESOURCE: (4, 3),
                SHARE_RESOURCE: (40, 30),
                MIG: (28, 21),  # 7 per H100
                MIG_ME: (4, 3),
                "nvidia.com/mig-1g.20gb": (16, 12),
                "nvidia.com/mig-2g.20gb": (12, 9),
                "nvidia.com/mig-3g.40gb": (8, 6),
                "nvidia.com/mig-4g.40gb": (4, 3),
                "nvidia.com/mig-7g.80gb": (4, 3),
            },
        ),
        (
            "only MIG GPUs: no whole or shared slots",
            replace(INVENTORY, gpus=(MIG_GPU,)),
            1,
            {MIG: (2, 2), MIG_ME: (1, 1)},
        ),
        ("no GPUs: nothing advertised", replace(INVENTORY, gpus=()), 1, {}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_advertised_slots(
    case: str, inventory: Inventory, slots_per_gpu: int, expected: dict[str, tuple[int, int]]
) -> None:
    """Each resource's slot count, and how many are healthy, follow the inventory."""
    got = advertised(inventory, slots_per_gpu=slots_per_gpu)
    assert {r: (len(s), healthy(s)) for r, s in got.items()} == expected


def test_slot_ids_are_opaque_tokens_and_the_highest_are_unhealthy() -> None:
    """Slot ids name a resource's slot, not a device; an unhealthy GPU takes the last slots."""
    got = advertised(replace(INVENTORY, gpus=(gpu(0, healthy=False), gpu(1), MIG_GPU)))
    assert got[GPU_RESOURCE] == (Slot("gpu-slot-0"), Slot("gpu-slot-1", healthy=False))
    assert [s.id for s in got[MIG_ME]] == ["mig-1g.10gb.me-slot-0"]
    assert got[SHARE_RESOURCE][12].id == "share-slot-12"


def test_preferred_takes_required_then_lowest_slots() -> None:
    """The required slots first, then the lowest-numbered (numerically, not as text)."""
    assert preferred(["s-slot-10", "s-slot-2", "s-slot-7", "s-slot-1"], ["s-slot-7"], 3) == [
        "s-slot-7",
        "s-slot-1",
        "s-slot-2",
    ]


# -- registration and ListAndWatch --------------------------------------------------------------


def test_registers_every_resource_with_the_kubelet(node: Node) -> None:
    """One registration per resource: v1beta1, relative socket name, PreStart and preferred on."""
    with node.kubelet.lock:
        requests = list(node.kubelet.registrations)
    assert sorted(r.resource_name for r in requests) == sorted(RESOURCES)
    for r in requests:
        assert r.version == API_VERSION == "v1beta1"
        assert r.endpoint == socket_name(r.resource_name)
        assert "/" not in r.endpoint
        assert (node.kubelet.plugin_dir / r.endpoint).exists()
        assert r.options.pre_start_required
        assert r.options.get_preferred_allocation_available
    assert {r.endpoint for r in requests} >= {"phalanx-nvidia.com-gpu.sock", "phalanx-nvidia.com-mig-1g.10gb.me.sock"}
    with node.kubelet.plugin(MIG_ME) as stub:
        options = stub.GetDevicePluginOptions(dp.Empty(), timeout=10)
    assert options.pre_start_required
    assert options.get_preferred_allocation_available


def listed(response: Any) -> dict[str, str]:
    return {d.ID: d.health for d in response.devices}


def test_list_and_watch_pushes_a_gpu_turning_unhealthy(node: Node) -> None:
    """The stream lists the slots, then answers again when a GPU turns unhealthy."""
    with node.kubelet.plugin(GPU_RESOURCE) as stub:
        stream = stub.ListAndWatch(dp.Empty(), timeout=10)
        assert listed(next(stream)) == {f"gpu-slot-{i}": "Healthy" for i in range(3)}
        node.plugins.update(replace(INVENTORY, gpus=(gpu(0), gpu(1, healthy=False), gpu(2), MIG_GPU)))
        assert listed(next(stream)) == {"gpu-slot-0": "Healthy", "gpu-slot-1": "Healthy", "gpu-slot-2": "Unhealthy"}
        node.plugins.update(INVENTORY)
        assert listed(next(stream)) == {f"gpu-slot-{i}": "Healthy" for i in range(3)}
        stream.cancel()


def test_resources_come_and_go_with_the_inventory(node: Node, sockets: Path) -> None:
    """GPU 3 leaving MIG mode withdraws the MIG plugins and grows the whole-GPU slots."""
    mig_socket = node.kubelet.plugin_dir / socket_name(MIG)
    with node.kubelet.plugin(GPU_RESOURCE) as stub:
        stream = stub.ListAndWatch(dp.Empty(), timeout=10)
        assert len(next(stream).devices) == 3
        node.plugins.update(replace(INVENTORY, gpus=(gpu(0), gpu(1), gpu(2), gpu(3))))
        assert len(next(stream).devices) == 4
        stream.cancel()
    assert node.plugins.resources() == [GPU_RESOURCE, SHARE_RESOURCE]
    eventually(lambda: not mig_socket.exists(), "the MIG plugin's socket removed")
    node.plugins.update(INVENTORY)
    assert node.plugins.resources() == sorted(RESOURCES)
    eventually(mig_socket.exists, "the MIG plugin serving again")


# -- allocation -----------------------------------------------------------------------------------


def test_get_preferred_allocation_includes_the_required_slots(node: Node) -> None:
    """Per container: the required slots, then the lowest available, up to the size."""
    request = dp.PreferredAllocationRequest(
        container_requests=[
            dp.ContainerPreferredAllocationRequest(
                available_deviceIDs=["share-slot-12", "share-slot-3", "share-slot-0", "share-slot-20"],
                must_include_deviceIDs=["share-slot-12"],
                allocation_size=2,
            ),
            dp.ContainerPreferredAllocationRequest(available_deviceIDs=["share-slot-5"], allocation_size=1),
        ]
    )
    with node.kubelet.plugin(SHARE_RESOURCE) as stub:
        response = stub.GetPreferredAllocation(request, timeout=10)
    assert [list(r.deviceIDs) for r in response.container_responses] == [
        ["share-slot-12", "share-slot-0"],
        ["share-slot-5"],
    ]


def test_allocate_names_a_claim_per_container(node: Node) -> None:
    """Each container gets the CDI device of its claim, the claim annotation and env."""
    request = dp.AllocateRequest(
        container_requests=[
            dp.ContainerAllocateRequest(devices_ids=["gpu-slot-2", "gpu-slot-0"]),
            dp.ContainerAllocateRequest(devices_ids=["gpu-slot-1"]),
        ]
    )
    with node.kubelet.plugin(GPU_RESOURCE) as stub:
        response = stub.Allocate(request, timeout=10)
    first, second = response.container_responses
    claim = cdi.claim_id(GPU_RESOURCE, ["gpu-slot-0", "gpu-slot-2"])
    assert [d.name for d in first.cdi_devices] == [f"phalanx.io/gpu={claim}"]
    assert dict(first.annotations) == {CLAIM_ANNOTATION: claim}
    assert dict(first.envs) == {CLAIM_ENV: claim}
    assert len(claim) == 16
    assert second.annotations[CLAIM_ANNOTATION] != claim
    assert cdi.claim_id(SHARE_RESOURCE, ["gpu-slot-0", "gpu-slot-2"]) != claim  # the resource is part of it


# -- PreStartContainer ----------------------------------------------------------------------------


def test_prestart_writes_the_records_gpus_not_the_slots(node: Node) -> None:
    """Slots 0 and 1 for a pod whose record says GPUs 1 and 2: the spec names GPU-1 and GPU-2."""
    node.records.annotations["default/train"] = '[{"index": 1, "milli": 1000}, {"index": 2, "milli": 1000}]'
    ids = ["gpu-slot-0", "gpu-slot-1"]
    node.kubelet.list_pods(pod_resources("default", "train", {"main": {GPU_RESOURCE: ids}}))
    node.kubelet.prestart(GPU_RESOURCE, ids)
    claim = cdi.claim_id(GPU_RESOURCE, ids)
    assert node.spec(GPU_RESOURCE, ids) == {
        "cdiVersion": "0.6.0",
        "kind": "phalanx.io/gpu",
        "devices": [
            {
                "name": claim,
                "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-1,GPU-2", "PHALANX_GPU_DEVICES=GPU-1,GPU-2"]},
            }
        ],
    }
    assert [p.name for p in node.cdi_dir.iterdir()] == [f"phalanx.io-gpu-{claim}.json"]  # no temporary file left


def test_prestart_gives_two_shares_of_one_gpu_their_own_limits(node: Node) -> None:
    """Two pods sharing GPU 0: both see only GPU-0, each with its own MPS limits."""
    node.records.annotations["ml/a"] = '[{"index": 0, "milli": 600, "memoryMiB": 40000}]'
    node.records.annotations["ml/b"] = '[{"index": 0, "milli": 300, "memoryMiB": 20000}]'
    node.kubelet.list_pods(
        pod_resources("ml", "a", {"main": {SHARE_RESOURCE: ["share-slot-0"]}}),
        pod_resources("ml", "b", {"main": {SHARE_RESOURCE: ["share-slot-1"]}}),
    )
    node.kubelet.prestart(SHARE_RESOURCE, ["share-slot-0"])
    node.kubelet.prestart(SHARE_RESOURCE, ["share-slot-1"])
    a, b = node.env(SHARE_RESOURCE, ["share-slot-0"]), node.env(SHARE_RESOURCE, ["share-slot-1"])
    assert a["NVIDIA_VISIBLE_DEVICES"] == b["NVIDIA_VISIBLE_DEVICES"] == "GPU-0"
    assert (a["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], b["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]) == ("60", "30")
    assert (a["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], b["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]) == ("0=40000M", "0=20000M")
    mounts = node.spec(SHARE_RESOURCE, ["share-slot-0"])["devices"][0]["containerEdits"]["mounts"]
    assert mounts == [
        {"hostPath": MPS_PIPE_DIRECTORY, "containerPath": MPS_PIPE_DIRECTORY, "options": ["rw", "bind"]},
        {"hostPath": MPS_SHM_DIRECTORY, "containerPath": "/dev/shm", "options": ["rw", "bind"]},
    ]


def test_prestart_names_the_pod_through_any_of_its_containers(node: Node) -> None:
    """An init container holding a subset of the app container's slots names the same pod."""
    node.records.annotations["default/mig"] = '[{"index": 3, "mig": "1g.10gb"}, {"index": 3, "mig": "1g.10gb"}]'
    node.kubelet.list_pods(
        pod_resources("default", "other", {"main": {GPU_RESOURCE: ["gpu-slot-0"]}}),
        pod_resources("default", "mig", {"app": {MIG: ["mig-1g.10gb-slot-0", "mig-1g.10gb-slot-1"]}}),
    )
    node.kubelet.prestart(MIG, ["mig-1g.10gb-slot-1"])
    assert node.env(MIG, ["mig-1g.10gb-slot-1"])["NVIDIA_VISIBLE_DEVICES"] == "MIG-3a,MIG-3b"


def test_prestart_waits_for_pod_resources_to_list_the_container(node: Node) -> None:
    """The container shows up in List a moment later: PreStartContainer still succeeds."""
    node.records.annotations["default/late"] = '[{"index": 2, "milli": 1000}]'
    later = threading.Timer(
        0.5, node.kubelet.list_pods, [pod_resources("default", "late", {"main": {GPU_RESOURCE: ["gpu-slot-2"]}})]
    )
    later.start()
    try:
        node.kubelet.prestart(GPU_RESOURCE, ["gpu-slot-2"])
    finally:
        later.join()
    assert node.env(GPU_RESOURCE, ["gpu-slot-2"])["NVIDIA_VISIBLE_DEVICES"] == "GPU-2"


@pytest.mark.parametrize(
    ("annotation", "message"),
    [
        ('[{"index": 7, "milli": 1000}]', "pod default/ghost: GPU 7 is not on this node (GPUs: 0, 1, 2, 3)"),
        ('[{"index": 3, "milli": 1000}]', "pod default/ghost: GPU 3 is in MIG mode; the record asks a share of it"),
        (None, "pod default/ghost has no device record"),
    ],
    ids=["record names a GPU the node lacks", "record asks a share of a MIG GPU", "no record"],
)
def test_prestart_refuses_a_pod_the_ledger_refuses(node: Node, annotation: str | None, message: str) -> None:
    """FAILED_PRECONDITION with the ledger's reason, naming the pod; no spec written."""
    if annotation is not None:
        node.records.annotations["default/ghost"] = annotation
    node.kubelet.list_pods(pod_resources("default", "ghost", {"main": {GPU_RESOURCE: ["gpu-slot-0"]}}))
    with pytest.raises(grpc.RpcError) as refused:
        node.kubelet.prestart(GPU_RESOURCE, ["gpu-slot-0"])
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == message
    assert not node.cdi_dir.exists() or not list(node.cdi_dir.iterdir())


def test_prestart_refuses_slots_no_container_holds(sockets: Path) -> None:
    """No listed container holds the slots: FAILED_PRECONDITION once the retries ran out."""
    n = make_node(sockets, lookup_timeout_s=0.5)
    try:
        eventually(lambda: n.kubelet.registered() == RESOURCES, "every resource registered")
        n.kubelet.list_pods(pod_resources("default", "other", {"main": {GPU_RESOURCE: ["gpu-slot-0"]}}))
        with pytest.raises(grpc.RpcError) as refused:
            n.kubelet.prestart(GPU_RESOURCE, ["gpu-slot-1"])
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.details() == f"{NO_HOLDER} nvidia.com/gpu [gpu-slot-1] after 0.5s (not listed)"
    finally:
        n.plugins.stop()
        n.kubelet.stop()


# -- kubelet restarts -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "delete_plugin_sockets",
    [True, False],
    ids=["kubelet deletes the plugin sockets and makes a new kubelet.sock", "only kubelet.sock is new"],
)
def test_a_restarted_kubelet_gets_every_plugin_again(node: Node, delete_plugin_sockets: bool) -> None:
    """Every resource registers again, and the plugins answer on their sockets."""
    node.kubelet.restart(delete_plugin_sockets=delete_plugin_sockets)
    eventually(lambda: node.kubelet.registered() == RESOURCES, "every resource registered again")
    for resource in RESOURCES:
        with node.kubelet.plugin(resource) as stub:
            assert next(stub.ListAndWatch(dp.Empty(), timeout=10)).devices


def test_a_deleted_plugin_socket_is_served_and_registered_again(node: Node) -> None:
    """Only one plugin's socket is removed: that plugin alone registers again."""
    with node.kubelet.lock:
        node.kubelet.registrations.clear()
    (node.kubelet.plugin_dir / socket_name(SHARE_RESOURCE)).unlink()
    eventually(lambda: node.kubelet.registered() == {SHARE_RESOURCE}, "the share plugin registered again")
    with node.kubelet.plugin(SHARE_RESOURCE) as stub:
        assert len(next(stub.ListAndWatch(dp.Empty(), timeout=10)).devices) == 30


def test_plugins_wait_for_a_kubelet_that_is_not_up(sockets: Path) -> None:
    """No kubelet.sock at start: the plugins serve, keep trying, and register once it appears."""
    n = make_node(sockets, kubelet_up=False)
    try:
        eventually(lambda: (n.kubelet.plugin_dir / socket_name(GPU_RESOURCE)).exists(), "the plugins serving")
        assert n.kubelet.registered() == set()
        n.kubelet.start()
        eventually(lambda: n.kubelet.registered() == RESOURCES, "every resource registered")
    finally:
        n.plugins.stop()
        n.kubelet.stop()


# -- CDI spec garbage -------------------------------------------------------------------------------


def test_stale_cdi_specs_are_removed(node: Node) -> None:
    """A spec whose claim no container holds goes; live, fresh and foreign specs stay."""
    node.records.annotations["default/a"] = '[{"index": 0, "milli": 1000}]'
    node.records.annotations["default/b"] = '[{"index": 1, "milli": 1000}]'
    a, b = (
        pod_resources("default", "a", {"main": {GPU_RESOURCE: ["gpu-slot-0"]}}),
        pod_resources("default", "b", {"main": {GPU_RESOURCE: ["gpu-slot-1"]}}),
    )
    node.kubelet.list_pods(a, b)
    node.kubelet.prestart(GPU_RESOURCE, ["gpu-slot-0"])
    node.kubelet.prestart(GPU_RESOURCE, ["gpu-slot-1"])
    old = time.time() - 600
    for path in node.cdi_dir.iterdir():
        os.utime(path, (old, old))
    foreign = node.cdi_dir / "nvidia.yaml"
    foreign.write_text("cdiVersion: 0.6.0\n")
    os.utime(foreign, (old, old))
    fresh = cdi.write_spec(node.cdi_dir, cdi.claim_id(GPU_RESOURCE, ["gpu-slot-2"]), ContainerEdits({}))

    node.kubelet.list_pods(a)  # pod b is gone
    gone = cdi.claim_id(GPU_RESOURCE, ["gpu-slot-1"])
    assert node.plugins.collect_garbage() == [gone]
    assert sorted(p.name for p in node.cdi_dir.iterdir()) == sorted(
        [f"phalanx.io-gpu-{cdi.claim_id(GPU_RESOURCE, ['gpu-slot-0'])}.json", fresh.name, "nvidia.yaml"]
    )
    assert node.plugins.collect_garbage() == []


def test_garbage_collection_keeps_everything_when_the_kubelet_does_not_answer(node: Node) -> None:
    """pod-resources down: nothing is known stale, nothing is removed."""
    path = cdi.write_spec(node.cdi_dir, "0123456789abcdef", ContainerEdits({}))
    os.utime(path, (0, 0))
    node.kubelet.servers.pop("pods").stop(None).wait()
    assert node.plugins.collect_garbage() == []
    assert path.exists()
