"""Prioritize's score band: fragmentation growth to scores, least growth highest."""

from __future__ import annotations

import pytest

from extender.verbs import _band


@pytest.mark.parametrize(
    ("case", "values", "low", "high", "want"),
    [
        ("one value takes the top of the band", {0.5}, 5, 9, {0.5: 9}),
        ("equal growth everywhere: all top", {1.0}, 0, 4, {1.0: 4}),
        ("least growth highest, most lowest", {0.0, 1.0}, 5, 9, {0.0: 9, 1.0: 5}),
        ("linear between, rounded", {0.0, 0.5, 1.0}, 0, 4, {0.0: 4, 0.5: 2, 1.0: 0}),
        ("negative growth (a fragmentation drop) ranks first", {-1.0, 0.0, 3.0}, 0, 4, {-1.0: 4, 0.0: 3, 3.0: 0}),
    ],
)
def test_band(case: str, values: set[float], low: int, high: int, want: dict[float, int]) -> None:
    assert _band(values, low, high) == want, case
