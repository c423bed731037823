"""The two backends: FakeBackend read from Node objects (every rule table-driven), the Ledger
over it, NvmlBackend over a scripted NVML (the call sequence as NVML documents it; no driver
here), and NvmlBackend on real hardware where NVML starts (compared with nvidia-smi).

Memory slices of one H100 80GB (the starts FakeBackend and the MIG table allow):

    slice   0   1   2   3   4   5   6   7
    7g      [==============================]
    4g      [==============]
    3g      [==============][==============]
    2g      [======][======][======]
    1g.20gb [======][======][======][======]
    1g      [==][==][==][==][==][==][==]
"""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from structlog.testing import capture_logs

from agent import backends
from agent.backends import (
    FAKE_HEALTH_ANNOTATION,
    IGNORED_XIDS,
    MIG_LAYOUT_ANNOTATION,
    FakeBackend,
    NvmlBackend,
    fake_gpu_uuid,
    fake_mig_uuid,
    mig_profile_name,
)
from agent.contract import Grant
from agent.inventory import BackendError, Gpu, Inventory
from agent.ledger import DEVICE_UNHEALTHY, UNKNOWN_DEVICE, BindRefused, Ledger
from solver.mig import load_tables

pynvml = pytest.importorskip("pynvml")

H100 = "NVIDIA-H100-80GB-HBM3"
DYNAMIC = {"phalanx.io/mig-mode": "dynamic"}


def node(
    name: str = "kwok-gpu-0",
    *,
    gpus: int | str | None = 1,
    product: str | None = H100,
    memory: str | None = "81559",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    allocatable: dict[str, str] | None = None,
    layout: list[dict[str, Any]] | None = None,
    health: dict[str, str] | str | None = None,
) -> dict[str, Any]:
    """A Node as the API server returns it."""
    all_labels = {k: v for k, v in {"nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": memory}.items() if v}
    all_labels |= labels or {}
    notes = dict(annotations or {})
    if layout is not None:
        notes[MIG_LAYOUT_ANNOTATION] = json.dumps(layout)
    if health is not None:
        notes[FAKE_HEALTH_ANNOTATION] = health if isinstance(health, str) else json.dumps(health)
    alloc = {"cpu": "32", "pods": "110", **({"nvidia.com/gpu": str(gpus)} if gpus is not None else {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels, "annotations": notes},
        "status": {"allocatable": alloc | (allocatable or {})},
    }


def shape(inventory: Inventory) -> list[tuple[Any, ...]]:
    """(index, model, MiB, mig, ((profile, start, size), ...)) per GPU."""
    return [
        (g.index, g.model, g.memory_mib, g.mig_enabled, tuple((m.profile, m.start, m.size) for m in g.migs))
        for g in inventory.gpus
    ]


def slices(*specs: str, size: int) -> tuple[tuple[str, int, int], ...]:
    """slices("1g.10gb@0", "1g.10gb@1", size=1) -> (("1g.10gb", 0, 1), ("1g.10gb", 1, 1))."""
    return tuple((p, int(s), size) for p, s in (spec.split("@") for spec in specs))


# -- FakeBackend: inventory ----------------------------------------------------------------------

WHOLE = (H100, 81559, False, ())

INVENTORY_CASES = [
    pytest.param(node(gpus=8), [(i, *WHOLE) for i in range(8)], id="eight whole H100s from allocatable and labels"),
    pytest.param(
        node(gpus=2, product=None, memory=None),
        [(0, "unknown", 81920, False, ()), (1, "unknown", 81920, False, ())],
        id="no product or memory label: model unknown, 80 GiB",
    ),
    pytest.param(node(gpus=1, memory="lots"), [(0, H100, 81920, False, ())], id="unreadable memory label: the default"),
    pytest.param(node(gpus=None), [], id="no nvidia.com/gpu: no GPUs"),
    pytest.param(node(gpus="many"), [], id="unreadable GPU count: no GPUs"),
    pytest.param(
        node(
            gpus=2,
            layout=[
                {"index": 2, "profile": "1g.10gb", "slices": 7},
                {"index": 3, "profile": "3g.40gb", "slices": 2},
            ],
        ),
        [
            (0, *WHOLE),
            (1, *WHOLE),
            (2, H100, 81559, True, tuple(("1g.10gb", s, 1) for s in range(7))),
            (3, H100, 81559, True, slices("3g.40gb@0", "3g.40gb@4", size=4)),
        ],
        id="static layout: MIG GPUs follow the whole ones at successive valid starts",
    ),
    pytest.param(
        node(gpus=0, layout=[{"index": 0, "profile": "1g.20gb", "slices": 4}]),
        [(0, H100, 81559, True, slices("1g.20gb@0", "1g.20gb@2", "1g.20gb@4", "1g.20gb@6", size=2))],
        id="static layout: a two-slice profile takes its aligned starts",
    ),
    pytest.param(
        node(
            gpus=0,
            layout=[{"index": 0, "profile": "1g.10gb", "slices": 2}, {"index": 0, "profile": "3g.40gb", "slices": 1}],
        ),
        [(0, H100, 81559, True, (("3g.40gb", 0, 4), ("1g.10gb", 4, 1), ("1g.10gb", 5, 1)))],
        id="static layout: two profiles on one GPU pack largest first without overlap",
    ),
    pytest.param(
        node(gpus=0, product="Tesla-T4", layout=[{"index": 0, "profile": "1g.4gb", "slices": 3}]),
        [(0, "Tesla-T4", 81559, True, slices("1g.4gb@0", "1g.4gb@1", "1g.4gb@2", size=1))],
        id="static layout on a model without a MIG table: starts 0, 1, 2",
    ),
    pytest.param(
        node(gpus=1, allocatable={"nvidia.com/mig-3g.40gb": "2", "nvidia.com/mig-1g.10gb.me": "1"}),
        [
            (0, *WHOLE),
            (1, H100, 81559, True, (("1g.10gb+me", 0, 1),)),
            (2, H100, 81559, True, slices("3g.40gb@0", "3g.40gb@4", size=4)),
        ],
        id="no layout: one GPU per advertised MIG profile, in name order (as the extender)",
    ),
    pytest.param(
        node(gpus=1, annotations={MIG_LAYOUT_ANNOTATION: "{not json"}),
        [(0, *WHOLE)],
        id="unreadable layout: ignored",
    ),
    pytest.param(
        node(
            gpus=2,
            layout=[{"index": 1, "profile": "1g.10gb", "slices": 7}, {"index": -1, "profile": "1g.10gb", "slices": 1}],
        ),
        [(0, *WHOLE), (1, *WHOLE)],
        id="a layout entry naming a whole GPU, or a negative index, is ignored",
    ),
]


@pytest.mark.parametrize(("obj", "expected"), INVENTORY_CASES)
def test_fake_inventory(obj: dict[str, Any], expected: list[tuple[Any, ...]]) -> None:
    inventory = FakeBackend.from_node(obj).inventory()
    assert shape(inventory) == expected
    assert (inventory.backend, inventory.driver_version, inventory.dynamic_mig) == ("fake", "fake", False)
    assert all(g.healthy and g.uuid == fake_gpu_uuid("kwok-gpu-0", g.index) for g in inventory.gpus)


# -- FakeBackend: dynamic MIG --------------------------------------------------------------------

CUT_CASES = [
    pytest.param((), (0, "3g.40gb", 4), "", id="3g at 4 on an idle GPU"),
    pytest.param((("4g.40gb", 0),), (0, "3g.40gb", 4), "", id="3g at 4 next to a 4g at 0"),
    pytest.param((("4g.40gb", 0),), (0, "3g.40gb", 0), "overlap in memory slices", id="overlap refused"),
    pytest.param((("1g.10gb", 5),), (0, "2g.20gb", 4), "overlap in memory slices", id="partial overlap refused"),
    pytest.param((), (0, "3g.40gb", 2), "cannot start at memory slice 2 (valid starts: [0, 4])", id="bad start"),
    pytest.param((), (0, "1g.10gb", 7), "cannot start at memory slice 7", id="1g cannot start at the last slice"),
    pytest.param((), (0, "5g.50gb", 0), "unknown profile 5g.50gb", id="unknown profile"),
    pytest.param((("1g.10gb+me", 0),), (0, "1g.10gb+me", 1), "exceeds its maximum of 1", id="max count of +me"),
    pytest.param((), (3, "1g.10gb", 0), "no such GPU", id="unknown GPU index"),
]


@pytest.mark.parametrize(("before", "cut", "error"), CUT_CASES)
def test_fake_dynamic_cut(before: tuple[tuple[str, int], ...], cut: tuple[int, str, int], error: str) -> None:
    backend = FakeBackend.from_node(node(gpus=2, labels=DYNAMIC))
    for profile, start in before:
        backend.create_mig(0, profile, start)
    index, profile, start = cut
    if error:
        with pytest.raises(BackendError) as refused:
            backend.create_mig(index, profile, start)
        assert error in str(refused.value)
        assert f"GPU {index}: cannot cut {profile} at memory slice {start}" in str(refused.value)
        assert len(backend.inventory().gpus[0].migs) == len(before)
        return
    mig = backend.create_mig(index, profile, start)
    gpu = backend.inventory().gpu(index)
    assert gpu is not None and gpu.mig_enabled and mig in gpu.migs
    assert (mig.profile, mig.start, mig.size) == (profile, start, 4)
    assert mig.uuid == fake_mig_uuid(gpu.uuid, profile, start)


@pytest.mark.parametrize(
    ("obj", "index", "error"),
    [
        pytest.param(node(gpus=1), 0, "dynamic MIG is off", id="node without the dynamic-MIG label"),
        pytest.param(node(gpus=1, labels={"phalanx.io/mig-mode": "static"}), 0, "dynamic MIG is off", id="other value"),
        pytest.param(node(gpus=1, product="Tesla-T4", labels=DYNAMIC), 0, "no MIG table for Tesla-T4", id="no table"),
        pytest.param(
            node(gpus=0, labels=DYNAMIC, layout=[{"index": 0, "profile": "1g.10gb", "slices": 1}]),
            0,
            "static MIG layout",
            id="a GPU of the static layout",
        ),
    ],
)
def test_fake_cut_refused_without_dynamic_mig(obj: dict[str, Any], index: int, error: str) -> None:
    backend = FakeBackend.from_node(obj)
    with pytest.raises(BackendError, match=error):
        backend.create_mig(index, "1g.10gb", 0)


def test_fake_dynamic_node_reports_dynamic_mig() -> None:
    assert FakeBackend.from_node(node(labels=DYNAMIC)).inventory().dynamic_mig
    assert not FakeBackend.from_node(node(product="Tesla-T4", labels=DYNAMIC)).inventory().dynamic_mig


def test_fake_dynamic_mig_label_is_configurable() -> None:
    backend = FakeBackend.from_node(node(labels={"example.com/mig": "on"}), dynamic_mig_label="example.com/mig=on")
    assert backend.inventory().dynamic_mig
    assert backend.create_mig(0, "7g.80gb", 0).size == 8


def test_fake_cutting_an_existing_slice_returns_it() -> None:
    backend = FakeBackend.from_node(node(labels=DYNAMIC))
    first = backend.create_mig(0, "2g.20gb", 2)
    assert backend.create_mig(0, "2g.20gb", 2) == first
    assert backend.inventory().gpus[0].migs == (first,)


def test_fake_destroy_returns_the_gpu_whole() -> None:
    backend = FakeBackend.from_node(node(labels=DYNAMIC))
    a, b = backend.create_mig(0, "3g.40gb", 0), backend.create_mig(0, "3g.40gb", 4)
    backend.destroy_mig(0, a.uuid)
    assert backend.inventory().gpus[0].migs == (b,)
    backend.destroy_mig(0, b.uuid)
    gpu = backend.inventory().gpus[0]
    assert (gpu.mig_enabled, gpu.migs) == (False, ())
    assert backend.create_mig(0, "3g.40gb", 0) == a  # same place, same UUID


def test_fake_destroying_what_is_gone_is_not_an_error() -> None:
    backend = FakeBackend.from_node(node(labels=DYNAMIC))
    backend.destroy_mig(0, "MIG-00000000-0000-0000-0000-000000000000")
    backend.destroy_mig(5, "MIG-00000000-0000-0000-0000-000000000000")
    assert backend.inventory().gpus[0].migs == ()


def test_fake_static_slices_cannot_be_destroyed() -> None:
    backend = FakeBackend.from_node(node(gpus=0, layout=[{"index": 0, "profile": "3g.40gb", "slices": 2}]))
    static = backend.inventory().gpus[0].migs[0]
    with pytest.raises(BackendError, match="static layout"):
        backend.destroy_mig(0, static.uuid)


def test_fake_concurrent_cuts_never_overlap() -> None:
    """Seven threads race for 1g slices, each start asked twice: seven distinct slices result."""
    backend = FakeBackend.from_node(node(labels=DYNAMIC))
    made: list[str] = []
    lock = threading.Lock()

    def cut(start: int) -> None:
        mig = backend.create_mig(0, "1g.10gb", start)
        with lock:
            made.append(mig.uuid)

    threads = [threading.Thread(target=cut, args=(s,)) for s in (*range(7), *range(7))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(made)) == 7
    assert [m.start for m in backend.inventory().gpus[0].migs] == list(range(7))


# -- FakeBackend: health, updates, UUIDs ---------------------------------------------------------


@pytest.mark.parametrize(
    ("health", "expected"),
    [
        pytest.param({"1": "XID 79"}, {1: "XID 79"}, id="one GPU marked with its reason"),
        pytest.param({"0": "XID 48", "2": "NVML: GPU is lost"}, {0: "XID 48", 2: "NVML: GPU is lost"}, id="two"),
        pytest.param({"1": ""}, {1: "injected fault"}, id="an empty reason still marks the GPU"),
        pytest.param({"9": "XID 79"}, {}, id="an index the node does not have changes nothing"),
    ],
)
def test_fake_health_annotation(health: dict[str, str], expected: dict[int, str]) -> None:
    gpus = FakeBackend.from_node(node(gpus=3, health=health)).inventory().gpus
    assert {g.index: g.health_reason for g in gpus if not g.healthy} == expected
    assert all(g.health_reason == "" for g in gpus if g.healthy)


@pytest.mark.parametrize("text", ["{nope", "[1, 2]", '{"one": "XID 79"}', '"XID 79"'], ids=str)
def test_fake_malformed_health_annotation_is_logged_and_ignored(text: str) -> None:
    with capture_logs() as logs:
        gpus = FakeBackend.from_node(node(gpus=2, health=text)).inventory().gpus
    assert all(g.healthy for g in gpus)
    assert [e["annotation"] for e in logs if e["log_level"] == "warning"] == [FAKE_HEALTH_ANNOTATION]


def test_fake_update_follows_the_node() -> None:
    backend = FakeBackend.from_node(node(gpus=2))
    backend.update(node(gpus=4, health={"3": "XID 79"}, labels=DYNAMIC))
    inventory = backend.inventory()
    assert [g.index for g in inventory.gpus] == [0, 1, 2, 3]
    assert inventory.dynamic_mig and not inventory.gpus[3].healthy
    backend.create_mig(1, "7g.80gb", 0)
    backend.update(node(gpus=4))  # the label goes: slices cut stay (as on hardware), no new cuts
    inventory = backend.inventory()
    assert not inventory.dynamic_mig and inventory.gpus[1].mig_enabled and inventory.gpus[3].healthy
    with pytest.raises(BackendError, match="dynamic MIG is off"):
        backend.create_mig(2, "7g.80gb", 0)


def test_fake_update_drops_slices_of_gpus_that_are_gone() -> None:
    backend = FakeBackend.from_node(node(gpus=2, labels=DYNAMIC))
    backend.create_mig(1, "7g.80gb", 0)
    backend.update(node(gpus=1, labels=DYNAMIC))
    backend.update(node(gpus=2, labels=DYNAMIC))
    assert backend.inventory().gpus[1].migs == ()


def test_fake_update_refuses_another_node() -> None:
    backend = FakeBackend.from_node(node("a"))
    with pytest.raises(ValueError, match="node a given node b"):
        backend.update(node("b"))


def test_fake_uuids_are_deterministic() -> None:
    """Another agent (or a restart) reading the same node sees the same UUIDs; other nodes differ."""
    obj = node(gpus=2, labels=DYNAMIC, layout=[{"index": 2, "profile": "1g.10gb", "slices": 2}])
    one, two = FakeBackend.from_node(obj), FakeBackend.from_node(obj)
    assert one.inventory() == two.inventory()
    assert one.create_mig(0, "1g.10gb", 3) == two.create_mig(0, "1g.10gb", 3)
    other = FakeBackend.from_node(node("kwok-gpu-1", gpus=2)).inventory()
    assert not {g.uuid for g in one.inventory().gpus} & {g.uuid for g in other.gpus}
    gpu = one.inventory().gpus[0]
    assert gpu.uuid.startswith("GPU-") and len(gpu.uuid) == 40
    assert gpu.migs[0].uuid == fake_mig_uuid(gpu.uuid, "1g.10gb", 3) and gpu.migs[0].uuid.startswith("MIG-")


def test_fake_accepts_explicit_tables() -> None:
    backend = FakeBackend.from_node(node(labels=DYNAMIC), tables=load_tables())
    assert backend.create_mig(0, "1g.20gb", 6).size == 2


# -- the Ledger over FakeBackend -----------------------------------------------------------------


def test_ledger_dynamic_grant_cuts_at_bind_and_release_destroys() -> None:
    backend = FakeBackend.from_node(node(gpus=1, labels=DYNAMIC))
    ledger = Ledger(backend)
    alloc = ledger.bind("team/train-0", "uid-1", (Grant(0, mig="3g.40gb", start=4),))
    mig = alloc.devices[0].mig
    assert mig is not None and (mig.profile, mig.start, mig.size) == ("3g.40gb", 4, 4)
    assert backend.inventory().gpus[0].migs == (mig,)
    assert ledger.edits(alloc).env["NVIDIA_VISIBLE_DEVICES"] == mig.uuid
    ledger.release("team/train-0")
    assert backend.inventory().gpus[0].migs == ()
    assert ledger.inventory.gpus[0].migs == ()


@pytest.mark.parametrize(
    ("grant", "reason", "message"),
    [
        pytest.param(Grant(1, milli=1000), DEVICE_UNHEALTHY, "GPU 1 (GPU-", id="a GPU the node marks unhealthy"),
        pytest.param(Grant(1, mig="1g.10gb", start=0), DEVICE_UNHEALTHY, "XID 79", id="a dynamic slice on it"),
        pytest.param(Grant(7, milli=1000), UNKNOWN_DEVICE, "GPU 7 is not on this node (GPUs: 0, 1)", id="unknown"),
    ],
)
def test_ledger_refuses_bad_devices(grant: Grant, reason: str, message: str) -> None:
    ledger = Ledger(FakeBackend.from_node(node(gpus=2, labels=DYNAMIC, health={"1": "XID 79"})))
    with pytest.raises(BindRefused) as refused:
        ledger.bind("team/p", "uid", (grant,))
    assert refused.value.reason == reason
    assert message in refused.value.message
    assert ledger.inventory.gpus[1].migs == ()


# -- NvmlBackend: the profile naming rule --------------------------------------------------------

H100_BYTES = 81559 * 2**20
H200_BYTES = 143771 * 2**20


@pytest.mark.parametrize(
    ("profile", "slices", "memory_mb", "gpu_bytes", "name"),
    [
        pytest.param(0, 1, 9984, H100_BYTES, "1g.10gb", id="H100 1g"),
        pytest.param(7, 1, 9984, H100_BYTES, "1g.10gb+me", id="H100 1g with media extensions"),
        pytest.param(9, 1, 20096, H100_BYTES, "1g.20gb", id="H100 1g with two memory slices"),
        pytest.param(2, 3, 40448, H100_BYTES, "3g.40gb", id="H100 3g"),
        pytest.param(4, 7, 81152, H100_BYTES, "7g.80gb", id="H100 7g"),
        pytest.param(0, 1, 4864, 40960 * 2**20, "1g.5gb", id="A100 40GB 1g"),
        pytest.param(4, 7, 40320, 40537 * 2**20, "7g.40gb", id="A100 40GB on an older driver's total"),
        pytest.param(0, 1, 16384, H200_BYTES, "1g.18gb", id="H200 1g"),
        pytest.param(2, 3, 67710, H200_BYTES, "3g.71gb", id="H200 3g: 70.5 rounds half away from zero"),
        pytest.param(4, 7, 134468, H200_BYTES, "7g.141gb", id="H200 7g"),
        pytest.param(13, 1, 9984, H100_BYTES, "1g.10gb-me", id="no media extensions"),
        pytest.param(15, 1, 9984, H100_BYTES, "1g.10gb+me.all", id="all media extensions"),
        pytest.param(10, 1, 9984, H100_BYTES, "1g.10gb+gfx", id="graphics"),
    ],
)
def test_mig_profile_name(profile: int, slices: int, memory_mb: int, gpu_bytes: int, name: str) -> None:
    assert mig_profile_name(profile, slices, memory_mb, gpu_bytes) == name


def test_profile_suffixes_use_nvml_constants() -> None:
    named = {
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1": "+me",
        "NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1": "+me",
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME": "+me.all",
        "NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME": "+me.all",
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME": "-me",
        "NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME": "-me",
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX": "+gfx",
        "NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX": "+gfx",
        "NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX": "+gfx",
    }
    assert {getattr(pynvml, k): v for k, v in named.items()} == backends._PROFILE_SUFFIX
    compute = {s: getattr(pynvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{s}_SLICE") for s in (1, 2, 3, 4, 6, 7, 8)}
    assert compute == backends._FULL_COMPUTE_INSTANCE


def test_every_table_profile_is_named_by_the_rule() -> None:
    """The names NVML profiles get on H100 (memory figures of config/mig-profiles.yaml) are the table's."""
    table = load_tables().table_for(H100)
    assert table is not None
    enum = {"1g.10gb": 0, "1g.10gb+me": 7, "1g.20gb": 9, "2g.20gb": 1, "3g.40gb": 2, "4g.40gb": 3, "7g.80gb": 4}
    for p in table.profiles:
        assert mig_profile_name(enum[p.name], p.compute_slices, p.memory_mib, H100_BYTES) == p.name


# -- NvmlBackend over a scripted NVML ------------------------------------------------------------


@dataclass(frozen=True)
class Handle:
    kind: str  # "gpu", "mig", "gi", "ci"
    gpu: int
    gi: int = -1
    ci: int = -1


@dataclass
class Instance:
    id: int
    profile_id: int
    start: int
    size: int
    cis: list[int] = field(default_factory=list)


@dataclass
class Device:
    uuid: str
    mig: bool = False
    instances: dict[int, Instance] = field(default_factory=dict)
    lost: bool = False
    name: str = "NVIDIA H100 80GB HBM3"
    total: int = H100_BYTES


# NVML_GPU_INSTANCE_PROFILE_* -> (profile id, compute slices, memory MiB, starts, memory slices): an H100 80GB
H100_GI = {
    0: (19, 1, 9984, tuple(range(7)), 1),
    7: (20, 1, 9984, tuple(range(7)), 1),
    9: (15, 1, 20096, (0, 2, 4, 6), 2),
    1: (14, 2, 20096, (0, 2, 4), 2),
    2: (9, 3, 40448, (0, 4), 4),
    3: (5, 4, 40448, (0,), 4),
    4: (0, 7, 81152, (0,), 8),
}
BY_ID = {v[0]: v for v in H100_GI.values()}


class ScriptedNvml:
    """The part of pynvml NvmlBackend calls, over in-memory GPUs, behaving as NVML's reference
    describes (errors are pynvml's own classes). It checks our call sequence, not a driver."""

    def __init__(self, *devices: Device) -> None:
        self.devices = list(devices)
        self.events: list[SimpleNamespace] = []
        self.fail_compute = False
        self.calls: list[str] = []
        for name in dir(pynvml):
            if name.startswith(("NVMLError", "NVML_", "nvmlEventType")) or name == "c_nvmlGpuInstancePlacement_t":
                setattr(self, name, getattr(pynvml, name))

    def xid(self, xid: int, gpu: int | None, instance: int = 0xFFFFFFFF) -> None:
        device = Handle("gpu", gpu) if gpu is not None else Handle("gpu", 99)
        self.events.append(SimpleNamespace(eventType=8, eventData=xid, device=device, gpuInstanceId=instance))

    def _dev(self, h: Handle) -> Device:
        if h.gpu >= len(self.devices):
            raise pynvml.NVMLError_InvalidArgument()
        if self.devices[h.gpu].lost:
            raise pynvml.NVMLError_GpuIsLost()
        return self.devices[h.gpu]

    def _gi(self, h: Handle) -> Instance:
        return self._dev(h).instances[h.gi]

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.65.06"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Handle:
        self._dev(Handle("gpu", i))
        return Handle("gpu", i)

    def nvmlDeviceGetUUID(self, h: Handle) -> str:
        d = self._dev(h)
        return d.uuid if h.kind == "gpu" else f"MIG-{d.uuid[4:12]}-{h.gi}-{h.ci}"

    def nvmlDeviceGetName(self, h: Handle) -> bytes:
        return self._dev(h).name.encode()  # older pynvml returns bytes

    def nvmlDeviceGetMemoryInfo(self, h: Handle) -> SimpleNamespace:
        return SimpleNamespace(total=self._dev(h).total)

    def nvmlDeviceGetMigMode(self, h: Handle) -> list[int]:
        return [int(self._dev(h).mig)] * 2

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Handle) -> int:
        return 7 if self._dev(h).mig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Handle, k: int) -> Handle:
        d = self._dev(h)
        migs = [Handle("mig", h.gpu, i.id, c) for i in sorted(d.instances.values(), key=lambda i: i.id) for c in i.cis]
        if k >= len(migs):
            raise pynvml.NVMLError_NotFound()
        return migs[k]

    def nvmlDeviceGetGpuInstanceId(self, m: Handle) -> int:
        return m.gi

    def nvmlDeviceGetComputeInstanceId(self, m: Handle) -> int:
        return m.ci

    def nvmlDeviceGetGpuInstanceById(self, h: Handle, gi: int) -> Handle:
        if gi not in self._dev(h).instances:
            raise pynvml.NVMLError_NotFound()
        return Handle("gi", h.gpu, gi)

    def nvmlGpuInstanceGetInfo(self, g: Handle) -> SimpleNamespace:
        i = self._gi(g)
        return SimpleNamespace(id=i.id, profileId=i.profile_id, placement=SimpleNamespace(start=i.start, size=i.size))

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: Handle, profile: int, version: int = 2) -> SimpleNamespace:
        if profile not in H100_GI:
            raise pynvml.NVMLError_NotSupported()
        pid, compute, mb, _, _ = H100_GI[profile]
        return SimpleNamespace(id=pid, sliceCount=compute, memorySizeMB=mb)

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, h: Handle, pid: int, placements: Any, count: Any) -> None:
        _, _, _, starts, size = BY_ID[pid]
        count._obj.value = len(starts)
        if placements is not None:
            for k, start in enumerate(starts):
                placements[k].start, placements[k].size = start, size

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, h: Handle, pid: int, placement: Any) -> Handle:
        d, p = self._dev(h), placement._obj
        taken = {s for i in d.instances.values() for s in range(i.start, i.start + i.size)}
        if taken & set(range(p.start, p.start + p.size)):
            raise pynvml.NVMLError_InsufficientResources()
        gi = max(d.instances, default=0) + 1
        d.instances[gi] = Instance(gi, pid, p.start, p.size)
        self.calls.append(f"create gi {gi}")
        return Handle("gi", h.gpu, gi)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, g: Handle, profile: int, engine: int) -> SimpleNamespace:
        if self.fail_compute:
            raise pynvml.NVMLError_InsufficientResources()
        return SimpleNamespace(id=profile)

    def nvmlGpuInstanceCreateComputeInstance(self, g: Handle, profile: int) -> Handle:
        i = self._gi(g)
        i.cis.append(len(i.cis))
        return Handle("ci", g.gpu, g.gi, i.cis[-1])

    def nvmlGpuInstanceGetComputeInstanceById(self, g: Handle, ci: int) -> Handle:
        return Handle("ci", g.gpu, g.gi, ci)

    def nvmlComputeInstanceDestroy(self, c: Handle) -> None:
        self._gi(c).cis.remove(c.ci)

    def nvmlGpuInstanceDestroy(self, g: Handle) -> None:
        if self._gi(g).cis:
            raise pynvml.NVMLError_InUse()
        del self._dev(g).instances[g.gi]
        self.calls.append(f"destroy gi {g.gi}")

    def nvmlEventSetCreate(self) -> str:
        return "events"

    def nvmlDeviceGetSupportedEventTypes(self, h: Handle) -> int:
        return int(pynvml.nvmlEventTypeXidCriticalError) | 1

    def nvmlDeviceRegisterEvents(self, h: Handle, types: int, events: str) -> None:
        self.calls.append(f"register {h.gpu}")

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> SimpleNamespace:
        assert timeout_ms == 0
        if not self.events:
            raise pynvml.NVMLError_Timeout()
        return self.events.pop(0)

    def nvmlEventSetFree(self, events: str) -> None:
        self.calls.append("free events")


def two_h100s() -> ScriptedNvml:
    """GPU 0 whole; GPU 1 in MIG mode holding a 3g at 4 and a 1g at 0."""
    mig = Device("GPU-11111111-aaaa", mig=True)
    mig.instances = {1: Instance(1, 9, 4, 4, [0]), 2: Instance(2, 19, 0, 1, [0])}
    return ScriptedNvml(Device("GPU-00000000-aaaa"), mig)


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> ScriptedNvml:
    scripted = two_h100s()
    monkeypatch.setattr(backends, "_nvml", lambda: scripted)
    return scripted


def test_nvml_inventory(nvml: ScriptedNvml) -> None:
    backend = NvmlBackend()
    inventory = backend.inventory()
    assert (inventory.backend, inventory.driver_version, inventory.dynamic_mig) == ("nvml", "580.65.06", False)
    assert shape(inventory) == [
        (0, H100, 81559, False, ()),
        (1, H100, 81559, True, (("1g.10gb", 0, 1), ("3g.40gb", 4, 4))),
    ]
    assert [g.uuid for g in inventory.gpus] == ["GPU-00000000-aaaa", "GPU-11111111-aaaa"]
    assert inventory.gpus[1].migs[0].uuid == "MIG-11111111-2-0"
    assert nvml.calls == ["init", "register 0", "register 1"]
    backend.close()
    backend.close()
    assert nvml.calls[-2:] == ["free events", "shutdown"]
    with pytest.raises(BackendError, match="closed"):
        backend.inventory()


def test_nvml_reports_dynamic_mig_as_told(nvml: ScriptedNvml) -> None:
    assert NvmlBackend(dynamic_mig=True).inventory().dynamic_mig


def test_nvml_xid_marks_the_gpu_until_restart(nvml: ScriptedNvml) -> None:
    backend = NvmlBackend()
    nvml.xid(79, gpu=1)
    for _ in range(2):  # sticky: the next read has no event and the GPU stays unhealthy
        gpus = backend.inventory().gpus
        assert [(g.healthy, g.health_reason) for g in gpus] == [(True, ""), (False, "XID 79")]
    nvml.xid(48, gpu=1)
    assert backend.inventory().gpus[1].health_reason == "XID 79"  # the first reason stays


@pytest.mark.parametrize("xid", sorted(IGNORED_XIDS))
def test_nvml_application_xids_leave_the_gpu_healthy(nvml: ScriptedNvml, xid: int) -> None:
    backend = NvmlBackend()
    nvml.xid(xid, gpu=0)
    assert all(g.healthy for g in backend.inventory().gpus)


def test_nvml_xid_on_a_gpu_instance_names_it(nvml: ScriptedNvml) -> None:
    backend = NvmlBackend()
    nvml.xid(94, gpu=1, instance=2)
    assert backend.inventory().gpus[1].health_reason == "XID 94 (GPU instance 2)"


def test_nvml_xid_on_an_unknown_device_marks_every_gpu(nvml: ScriptedNvml) -> None:
    backend = NvmlBackend()
    nvml.xid(79, gpu=None)
    assert [g.health_reason for g in backend.inventory().gpus] == ["XID 79", "XID 79"]


def test_nvml_error_reading_a_gpu_marks_it_unhealthy_for_that_read(nvml: ScriptedNvml) -> None:
    backend = NvmlBackend()
    before = backend.inventory().gpus[0]
    nvml.devices[0].lost = True
    lost = backend.inventory().gpus[0]
    assert (lost.healthy, lost.health_reason) == (False, "NVML: GPU is lost")
    assert (lost.uuid, lost.model, lost.memory_mib) == (before.uuid, before.model, before.memory_mib)
    nvml.devices[0].lost = False
    assert backend.inventory().gpus[0] == before


def test_nvml_create_and_destroy(nvml: ScriptedNvml) -> None:
    backend = NvmlBackend()
    mig = backend.create_mig(1, "2g.20gb", 2)
    assert (mig.profile, mig.start, mig.size, mig.uuid) == ("2g.20gb", 2, 2, "MIG-11111111-3-0")
    assert nvml.devices[1].instances[3] == Instance(3, 14, 2, 2, [0])
    assert backend.create_mig(1, "2g.20gb", 2) == mig  # what exists is returned
    assert "create gi 4" not in nvml.calls
    assert mig in backend.inventory().gpus[1].migs
    backend.destroy_mig(1, mig.uuid)
    assert 3 not in nvml.devices[1].instances
    backend.destroy_mig(1, mig.uuid)  # gone: not an error
    backend.destroy_mig(0, "MIG-none")


@pytest.mark.parametrize(
    ("index", "profile", "start", "error"),
    [
        pytest.param(0, "1g.10gb", 0, "MIG mode is off", id="a GPU not in MIG mode"),
        pytest.param(1, "5g.50gb", 0, "has no such profile (it has: 1g.10gb, 1g.10gb+me", id="unknown profile"),
        pytest.param(1, "3g.40gb", 0, "1g.10gb@0 and 3g.40gb@0 overlap", id="overlap, in the table's words"),
        pytest.param(1, "2g.20gb", 1, "cannot start at memory slice 1", id="bad start, in the table's words"),
        pytest.param(5, "1g.10gb", 0, "NVML: Invalid Argument", id="no such GPU"),
    ],
)
def test_nvml_refused_cuts(nvml: ScriptedNvml, index: int, profile: str, start: int, error: str) -> None:
    with pytest.raises(BackendError) as refused:
        NvmlBackend().create_mig(index, profile, start)
    assert f"GPU {index}: cannot cut {profile} at memory slice {start}: " in str(refused.value)
    assert error in str(refused.value)


def test_nvml_bad_start_without_a_table_lists_the_placements(nvml: ScriptedNvml) -> None:
    nvml.devices[1].name = "NVIDIA Future GPU"
    with pytest.raises(BackendError, match=r"not a placement start \(valid starts: \[0, 2, 4\]\)"):
        NvmlBackend().create_mig(1, "2g.20gb", 1)


def test_nvml_failed_compute_instance_removes_the_gpu_instance(nvml: ScriptedNvml) -> None:
    nvml.fail_compute = True
    with pytest.raises(BackendError, match=r"GPU 1: cannot cut 1g\.10gb at memory slice 1: NVML: "):
        NvmlBackend().create_mig(1, "1g.10gb", 1)
    assert sorted(nvml.devices[1].instances) == [1, 2]
    assert "destroy gi 3" in nvml.calls


def test_nvml_init_failure_is_a_backend_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_driver() -> None:
        raise pynvml.NVMLError_DriverNotLoaded()

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    with pytest.raises(BackendError, match=r"NVML cannot start \(Driver Not Loaded\): no NVIDIA driver"):
        NvmlBackend()


# -- NvmlBackend on this machine's hardware ------------------------------------------------------


def nvml_starts() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_nvml_without_a_driver_is_a_clear_backend_error() -> None:
    if nvml_starts():
        pytest.skip("NVML starts here: this test needs a machine without an NVIDIA driver")
    with pytest.raises(BackendError) as refused:
        NvmlBackend()
    assert not isinstance(refused.value, pynvml.NVMLError)
    assert str(refused.value).startswith("NVML cannot start (")
    assert "no NVIDIA driver on this node" in str(refused.value)


def test_nvml_inventory_matches_nvidia_smi() -> None:
    if not nvml_starts():
        pytest.skip("no NVIDIA driver here: NVML does not start")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not on PATH")
    query = [smi, "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"]
    rows = [
        [c.strip() for c in line.split(",")]
        for line in subprocess.run(query, check=True, capture_output=True, text=True, timeout=60).stdout.splitlines()
        if line.strip()
    ]
    backend = NvmlBackend()
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    expected = [(int(i), uuid, "-".join(name.split()), int(mib)) for i, uuid, name, mib in rows]
    assert [(g.index, g.uuid, g.model, g.memory_mib) for g in inventory.gpus] == expected
    assert all(g.healthy for g in inventory.gpus), [g.health_reason for g in inventory.gpus]
    tables = load_tables()
    for gpu in inventory.gpus:
        table = tables.table_for(gpu.model)
        if gpu.mig_enabled and table is not None:
            assert all(table.profile(m.profile) is not None for m in gpu.migs), gpu.migs


def test_gpu_and_inventory_types_are_the_shared_ones() -> None:
    inventory = FakeBackend.from_node(node()).inventory()
    assert isinstance(inventory, Inventory) and all(isinstance(g, Gpu) for g in inventory.gpus)
    assert ctypes.sizeof(pynvml.c_nvmlGpuInstancePlacement_t) == 8  # two uints, as create_mig fills them
