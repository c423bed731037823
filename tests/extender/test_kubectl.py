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
