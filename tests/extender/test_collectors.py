"""/metrics read from state: GPU allocation and fragmentation per pool and model, gangs by what
they wait for, watch lists; plus the process collectors and the event counters."""

from __future__ import annotations

import re

from prometheus_client import generate_latest

from extender.app import Extender, Options
from extender.collectors import reason_class
from extender.objects import DEVICES_ANNOTATION, encode_devices
from solver import DeviceAssignment
from tests.extender.fakes import FakeKube, node, pod


def sample(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if not line.startswith(name + ("{" if labels else " ")):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0])) if labels else {}
        if all(got.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name} {labels} in\n{text}")


def test_gpu_allocation_and_fragmentation_by_pool_and_model() -> None:
    ext = Extender(FakeKube(), Options(port=0))
    try:
        record = encode_devices((DeviceAssignment(0, 500, 40960),))
        annotations = {"gpu-fraction": "0.5", DEVICES_ANNOTATION: record}
        half = pod("half", uid="u1", node_name="n0", annotations=annotations)
        whole = pod("whole", uid="u2", gpus=1, node_name="n1")
        whole["metadata"]["annotations"][DEVICES_ANNOTATION] = encode_devices((DeviceAssignment(0),))
        ext.cache.replace_nodes([node("n0", gpus=2), node("n1", gpus=2)])
        ext.cache.replace_pods([half, whole])
        text = generate_latest(ext.metrics.registry).decode()
        labels = {"pool": "-", "model": "A100"}
        assert sample(text, "phalanx_gpu_devices", **labels) == 4
        assert sample(text, "phalanx_gpu_allocated", **labels) == 1.5
        # Free: 0.5 on n0's GPU 0 (partly used), 1 + 1 idle: 0.5 of 2.5 stranded.
        assert sample(text, "phalanx_gpu_fragmentation_ratio", **labels) == 0.2
        assert 0 < sample(text, "phalanx_gpu_memory_allocated_ratio", **labels) < 1
        assert sample(text, "process_resident_memory_bytes") > 0
        assert "python_gc_objects_collected_total" in text
        assert sample(text, "phalanx_leading") == 1  # no HA: it always leads
    finally:
        ext.server.server_close()


def test_rejected_configuration_and_gang_cycle_counters() -> None:
    ext = Extender(FakeKube(), Options(port=0))
    try:
        bad = {
            "metadata": {"name": "phalanx-config", "namespace": "phalanx-system"},
            "data": {"config.yaml": "solver: {timeLimitSeconds: -1}"},
        }
        ext._config_event("MODIFIED", bad)
        ext.metrics.planned(again=False)
        ext.metrics.planned(again=True)
        ext.metrics.scheduled(0.3)
        ext.metrics.timed_out()
        text = generate_latest(ext.metrics.registry).decode()
        assert sample(text, "phalanx_config_rejections_total", source="configmap") == 1
        assert sample(text, "phalanx_gang_plans_total", kind="replan") == 1
        assert sample(text, "phalanx_gang_timeouts_total") == 1
        assert sample(text, "phalanx_gang_quorum_to_bound_seconds_count") == 1
        assert "phalanx_gangs_pending" in text and "phalanx_gang_reservations 0.0" in text
    finally:
        ext.server.server_close()


def test_pending_reasons_fall_in_few_classes() -> None:
    assert reason_class("waiting for gang quorum 3/4") == "WaitingForQuorum"
    assert reason_class("required topology does not fit: needs 80 GPUs within one rack") == "RequiredTopology"
    assert reason_class("waiting for Workload default/w") == "WaitingForDefinition"
    assert reason_class("anything else, with a name in it") == "Other"
