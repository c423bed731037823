"""`kubectl phalanx`: what it says would let a gang be placed, read from the solver's reason."""

from __future__ import annotations

import io

import pytest

from extender.kubectl import _change, _gang, render


@pytest.mark.parametrize(
    ("reason", "advice"),
    [
        ("waiting for gang quorum 3/8", "5 more member(s) must exist (or lower minCount to 3)"),
        ("waiting for gang quorum of sub-group leaders 0/1", "1 more member(s) of sub-group leaders must exist"),
        (
            "required topology does not fit: needs 80 GPUs within one rack; the largest rack has 64 GPUs free",
            "free capacity inside one rack",
        ),
        ("not enough capacity: only 3 of 8 members fit (minCount 8)", "lower minCount"),
        ("it fits the free capacity alone, but not next to higher-priority or earlier gangs", "raise its priority"),
        ("queue team-a: gpu limit 64, in use 60, gang needs 8", "raise queue team-a's gpu limit"),
        (
            "queue a: gpu fair share 32, in use 32, gang needs 16, while queue b waits below its share",
            "wait: queue b is below its fair share",
        ),
        ("something the plugin does not know", ""),
    ],
)
def test_the_advice_follows_the_binding_constraint(reason: str, advice: str) -> None:
    assert advice in _change(reason)
    assert bool(_change(reason)) == bool(advice)


def test_a_waiting_gang_renders_as_one_sentence_then_details() -> None:
    gang = {"key": "wl:ns/g", "members": 3, "minCount": 8, "bound": 0, "phase": "Pending"}
    gang["pendingReason"] = "waiting for gang quorum 3/8"
    out = io.StringIO()
    render("explain", _gang(gang), out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "gang wl:ns/g: waiting for gang quorum 3/8"
    assert lines[-1] == "  to place it: 5 more member(s) must exist (or lower minCount to 3)"


def test_queues_render_as_one_row_each_with_their_problems() -> None:
    """The read API's queue view as a table: GPU figures from the summary, then warnings."""
    gpu = {"allocated": "16", "deserved": "8", "fairShare": "32", "limit": "64"}
    queue = {
        "name": "team-a",
        "parent": "org",
        "weight": 2,
        "summary": {"gpu": gpu},
        "pendingPods": 3,
        "pendingGangs": 1,
        "oldestWait": "4m10s",
        "problems": ["queue team-a: spec.limit.tpu: unknown resource"],
    }
    out = io.StringIO()
    render("queues", {"queues": [queue]}, out)
    header, row, warning = out.getvalue().splitlines()
    assert header.split() == [
        "QUEUE",
        "PARENT",
        "WEIGHT",
        "GPU",
        "USED",
        "DESERVED",
        "FAIR",
        "LIMIT",
        "PENDING",
        "PODS",
        "GANGS",
        "OLDEST",
    ]
    assert row.split() == ["team-a", "org", "2", "16", "8", "32", "64", "3", "1", "4m10s"]
    assert warning == "warning: queue team-a: spec.limit.tpu: unknown resource"
