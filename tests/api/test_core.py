"""The allocation API's pure parts: Status errors, body validation, selectors, paging tokens,
the rate limit, request translation, usage history and the route table."""

from __future__ import annotations

import pytest

from extender.api import convert, models
from extender.api.core import (
    ApiError,
    RateLimiter,
    decode_continue,
    dry_run,
    encode_continue,
    field_selector,
    int_param,
    read_body,
)
from extender.api.monitor import EvictionLog, UsageHistory, percentile, period_seconds
from extender.objects import pod_info


def test_a_body_with_several_faults_names_each_field() -> None:
    body = b'{"metadata": {"name": "Bad_Name"}, "spec": {"resources": {"requests": {"cpu": "lots"}}, "x": 1}}'
    with pytest.raises(ApiError) as e:
        read_body(models.Allocation, body, "allocation in t")
    status = e.value.status()
    assert status["code"] == 400 and status["kind"] == "Status" and status["reason"] == "Invalid"
    assert {c["field"] for c in status["details"]["causes"]} == {
        "metadata.name",
        "spec.resources.requests.cpu",
        "spec.x",
    }


@pytest.mark.parametrize("body", [b"", b"[]", b"nul", b'"x"', b"\xff\xfe"])
def test_bodies_that_are_no_object_get_400_with_a_message(body: bytes) -> None:
    with pytest.raises(ApiError) as e:
        read_body(models.Job, body, "job")
    assert e.value.code == 400 and e.value.message.startswith("job: ")


def test_optional_bodies_may_be_empty() -> None:
    assert read_body(models.Cancel, b"", "cancel", empty_ok=True) == models.Cancel()


def test_field_selectors_parse_as_kubernetes_does_and_refuse_unknown_fields() -> None:
    fs = field_selector("status.phase=Running,metadata.name!=a", {"status.phase": "", "metadata.name": ""})
    assert [(f.path, f.value, f.equal) for f in fs] == [
        ("status.phase", "Running", True),
        ("metadata.name", "a", False),
    ]
    with pytest.raises(ApiError, match="not supported"):
        field_selector("spec.foo=1", {"status.phase": ""})
    with pytest.raises(ApiError, match="not field=value"):
        field_selector("status.phase", {"status.phase": ""})


def test_continue_tokens_round_trip_and_foreign_ones_are_refused() -> None:
    assert decode_continue(encode_continue("41", "ns/a-9")) == ("41", "ns/a-9")
    for bad in ("!!", "e30", "x" * 50):
        with pytest.raises(ApiError):
            decode_continue(bad)


def test_parameters_are_checked() -> None:
    assert int_param("", "limit", low=1, high=10, default=5) == 5
    assert int_param("7", "limit", low=1, high=10, default=5) == 7
    for bad in ("-1", "0", "11", "1e3", "٣"):
        with pytest.raises(ApiError):
            int_param(bad, "limit", low=1, high=10, default=5)
    assert dry_run("All") and not dry_run("")
    with pytest.raises(ApiError, match="only value is All"):
        dry_run("true")


def test_the_rate_limit_allows_a_burst_then_refuses_with_headers_and_refills() -> None:
    limiter = RateLimiter(per_minute=60, burst=3)
    for _ in range(3):
        headers = dict(limiter.take("team", now=100.0))
    assert headers["X-RateLimit-Remaining"] == "0"
    with pytest.raises(ApiError) as e:
        limiter.take("team", now=100.0)
    refused = dict(e.value.headers)
    assert e.value.code == 429 and refused["Retry-After"] == "1" and refused["X-RateLimit-Limit"] == "60"
    assert "team" in e.value.message
    limiter.take("other", now=100.0)  # per tenant
    limiter.take("team", now=101.0)  # a second later: one more


def test_an_allocation_becomes_a_pod_with_kubernetes_affinity() -> None:
    a = models.Allocation.model_validate(
        {
            "metadata": {"name": "a", "labels": {"app": "x"}},
            "spec": {
                "resources": {"requests": {"cpu": "8", "nvidia.com/gpu": "4"}},
                "priorityClass": "high",
                "ttl": "2h",
                "queue": "research",
                "gangScheduling": {"groupId": "g", "minMembers": 4},
                "scheduling": {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringScheduling": {
                                "nodeSelectorTerms": [
                                    {"matchExpressions": [{"key": "gpu-memory", "operator": "Gte", "values": ["80"]}]}
                                ]
                            }
                        }
                    },
                    "tolerations": [{"key": "gpu-only", "operator": "Exists", "effect": "NoSchedule"}],
                },
            },
        }
    )
    pod = convert.allocation_pod(a, "ns", "phalanx")
    spec = pod["spec"]
    assert spec["schedulerName"] == "phalanx" and spec["activeDeadlineSeconds"] == 7200
    assert spec["containers"][0]["resources"] == {
        "requests": {"cpu": "8", "nvidia.com/gpu": "4"},
        "limits": {"nvidia.com/gpu": "4"},
    }
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"] == [{"key": "gpu-memory", "operator": "Gt", "values": ["79"]}]
    assert spec["tolerations"] == [{"key": "gpu-only", "operator": "Exists", "effect": "NoSchedule"}]
    labels = pod["metadata"]["labels"]
    assert labels["phalanx.io/workload"] == "g" and labels["phalanx.io/queue"] == "research" and labels["app"] == "x"
    info = pod_info({**pod, "metadata": {**pod["metadata"], "uid": "u"}})
    assert info.demand.count == 4 and info.requests.cpu_milli == 8000


def test_a_job_is_a_workload_and_its_indexed_pods() -> None:
    j = models.Job.model_validate(
        {
            "metadata": {"name": "j"},
            "spec": {
                "parallelism": 3,
                "priority": 200,
                "template": {
                    "spec": {
                        "resources": {"requests": {"nvidia.com/gpu": "8"}},
                        "scheduling": {
                            "gangScheduling": {"minMembers": 2, "timeout": "10m"},
                            "topology": {"required": "rack"},
                        },
                    }
                },
            },
        }
    )
    wl = convert.workload(
        "ns",
        "j",
        j.spec.template.spec.scheduling.gangScheduling,
        members=3,
        priority=200,
        scheduling=j.spec.template.spec.scheduling,
        labels={},
    )
    group = wl["spec"]["gangGroups"][0]
    assert group == {
        "name": "members",
        "maxCount": 3,
        "minCount": 2,
        "scheduleTimeoutSeconds": 600,
        "priority": 200,
        "topologyRequest": {"required": "rack"},
    }
    pods = convert.job_pods("j", "ns", j.spec, {}, "phalanx")
    assert [p["metadata"]["name"] for p in pods] == ["j-0", "j-1", "j-2"]
    assert {p["metadata"]["labels"]["phalanx.io/workload"] for p in pods} == {"j"}


def test_quota_resources_map_to_queue_resources_and_others_are_named() -> None:
    q = models.Quota.model_validate(
        {"metadata": {"name": "q"}, "spec": {"hard": {"nvidia.com/gpu": "100", "cpu": "10"}, "soft": {"memory": "1Ti"}}}
    )
    queue = convert.queue_of_quota(q)
    assert queue["spec"] == {"limit": {"gpu": "100", "cpu": "10"}, "deserved": {"memory": "1Ti"}}
    assert [c["field"] for c in convert.unknown_quota_resources({"pods": "1", "cpu": "1"}, "hard")] == [
        "spec.hard.pods"
    ]


def test_usage_history_peak_average_and_trend() -> None:
    history = UsageHistory()
    pod = pod_info(
        {
            "metadata": {"name": "p", "namespace": "t", "uid": "u"},
            "spec": {
                "nodeName": "n",
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "2", "nvidia.com/gpu": "4"}}}],
            },
            "status": {"phase": "Running"},
        }
    )
    history.sample([pod], now=1000.0)
    history.sample([], now=1060.0)  # released: a known tenant's zero is a sample too
    report = history.report("t", 3600, {"cpu": 2.0, "memory": 0.0, "gpu": 4.0}, now=1120.0)
    assert report["resources"]["gpu"] == {"peak": 4.0, "avg": 8.0 / 3}
    assert history.trend("t", 120, now=1120.0) == {"cpu": 2.0, "memory": 0.0, "gpu": 4.0}
    assert history.trend("t", 3600, now=1120.0) == {}  # the history does not reach back an hour


def test_eviction_notices_resume_after_a_number_per_node() -> None:
    log = EvictionLog(most=3)
    for i in range(4):
        log.add("ns", f"p{i}", "n1" if i % 2 else "n2", "drained")
    assert [n.name for n in log.since(0)] == ["p1", "p2", "p3"]  # the oldest dropped
    assert [n.name for n in log.since(2, "n1")] == ["p3"]


def test_percentiles_and_periods() -> None:
    assert percentile([], 99) == 0.0 and percentile([1.0, 2.0, 3.0], 50) == 2.0
    assert period_seconds("24h") == 86400 and period_seconds("7d") == 604800
    with pytest.raises(ValueError):
        period_seconds("1y")


def test_durations_longer_than_a_year_are_refused() -> None:
    with pytest.raises(ApiError) as e:
        read_body(models.Boost, b'{"newPriority": 5, "duration": "999999999h"}', "boost")
    assert e.value.code == 400 and e.value.causes[0]["field"] == "duration"


def test_eviction_streams_move_past_other_nodes_notices() -> None:
    import threading
    import time

    log = EvictionLog()
    for i in range(3):
        log.add("ns", f"p{i}", "elsewhere", "drained")
    stop = threading.Event()
    started = time.monotonic()
    got = []
    for notice in log.follow("here", 0, time.monotonic() + 0.5, stop):
        got.append(notice)
        if len(got) > 50:
            break
    assert time.monotonic() - started >= 0.4 and len(got) <= 2, got  # no spin: it waited


def test_a_replayed_pod_keeps_its_spec_but_not_its_placement() -> None:
    old = {
        "metadata": {
            "name": "j-1",
            "namespace": "ns",
            "uid": "u",
            "resourceVersion": "5",
            "labels": {"phalanx.io/job": "j", "phalanx.io/job-index": "1"},
            "annotations": {"phalanx.io/gpu-devices": "[...]", "keep": "me"},
        },
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "volumeMounts": [{"name": "kube-api-access-x"}, {"name": "data"}]}],
            "volumes": [{"name": "kube-api-access-x"}, {"name": "data"}],
        },
        "status": {"phase": "Running"},
    }
    pod = convert.replayable(old, "abcde")
    assert pod["metadata"] == {"name": "j-1-abcde", "namespace": "ns", "labels": old["metadata"]["labels"],
                               "annotations": {"keep": "me"}}  # fmt: skip
    assert "nodeName" not in pod["spec"] and "status" not in pod
    assert pod["spec"]["volumes"] == [{"name": "data"}]
    assert pod["spec"]["containers"][0]["volumeMounts"] == [{"name": "data"}]
