"""`make run`'s report (deploy/local/run.py): pods per sample object, device records and the
scheduler's reasons in a few words."""

from __future__ import annotations

import pytest
import yaml

from deploy.local.run import DEFAULT_SAMPLES, _first_reason, devices_summary, expected_pods


@pytest.mark.parametrize(
    ("record", "summary"),
    [
        ('[{"index":0,"milli":1000,"memoryMiB":81920},{"index":1,"milli":1000,"memoryMiB":81920}]', "GPUs 0-1"),
        ('[{"index":3,"milli":1000,"memoryMiB":81920}]', "GPU 3"),
        ('[{"index":0,"milli":1000},{"index":2,"milli":1000}]', "GPUs 0,2"),
        ('[{"index":2,"milli":500,"memoryMiB":0}]', "GPU 2: 0.5"),
        ('[{"index":0,"milli":300,"memoryMiB":20480}]', "GPU 0: 0.3 + 20480 MiB"),
        ('[{"index":0,"milli":0,"memoryMiB":10240}]', "GPU 0: 10240 MiB"),
        ('[{"index":4,"mig":"1g.10gb"}]', "GPU 4: MIG 1g.10gb"),
        ("not json", "not json"),
        ('{"index": 1}', '{"index": 1}'),
    ],
)
def test_device_records_in_a_few_words(record: str, summary: str) -> None:
    assert devices_summary(record) == summary


def test_the_schedulers_message_is_cut_to_its_first_reason() -> None:
    message = (
        "0/64 nodes are available: 56 required topology does not fit: needs 96 GPUs within one rack; the "
        "largest rack has 64 GPUs free, 8 Insufficient nvidia.com/gpu. preemption: 0/64 nodes are available."
    )
    reason = "56 required topology does not fit: needs 96 GPUs within one rack; the largest rack has 64 GPUs free"
    assert _first_reason(message) == reason
    assert _first_reason("no nodes") == "no nodes"


def test_the_samples_make_the_pods_the_report_waits_for() -> None:
    counts = {}
    for path in sorted(DEFAULT_SAMPLES.glob("*.yaml")):
        for obj in yaml.safe_load_all(path.read_text()):
            if obj:
                counts[f"{obj['kind']}/{obj['metadata']['name']}"] = expected_pods(obj)
    assert counts["JobSet/llm-pretrain"] == 8 and counts["JobSet/too-big-for-a-rack"] == 12
    assert counts["Deployment/chat-infer"] == 4 and counts["Pod/train-whole-4"] == 1
    assert expected_pods({"kind": "ConfigMap", "metadata": {"name": "x"}}) == 0
