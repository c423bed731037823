"""Configuration: validation names the field; a bad ConfigMap never replaces the good one."""

from __future__ import annotations

import pytest

from extender.app import Extender, Options
from extender.config import ConfigError, PhalanxConfig, parse
from solver.params import PlacementMode
from tests.extender.fakes import FakeKube


def configmap(text: str) -> dict:  # type: ignore[type-arg]
    return {
        "metadata": {"name": "phalanx-config", "namespace": "phalanx-system", "uid": "cm1"},
        "data": {"config.yaml": text},
    }


def test_defaults_resolve_to_solver_parameters() -> None:
    params = PhalanxConfig().solver_params()
    assert params.time_limit_s == 1.0 and params.placement_mode is PlacementMode.COMPACT_FIRST


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("solver: {timeLimitSeconds: 0}", "solver.timeLimitSeconds: Input should be greater than 0"),
        ("gpu: {placementMode: Sideways}", "gpu.placementMode"),
        ("topology: {levels: [rack, rack]}", "topology.levels: Value error, levels must be distinct"),
        ("solver: {typo: 1}", "solver.typo: Extra inputs are not permitted"),
        ("- a list", "expected a mapping"),
        ("solver: [unclosed", "not valid YAML"),
    ],
)
def test_invalid_configuration_names_the_field(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match="cm") as e:
        parse(text, source="cm")
    assert fragment in str(e.value)


def test_configmap_update_applies_and_a_bad_one_is_rejected_with_an_event() -> None:
    kube = FakeKube()
    extender = Extender(kube, Options(port=0))
    try:
        extender._config_event("ADDED", configmap("gpu: {placementMode: LowLoadFirst}"))
        assert extender.verbs.config.gpu.placement_mode == "LowLoadFirst"
        extender._config_event("MODIFIED", configmap("solver: {workers: -3}"))
        assert extender.verbs.config.gpu.placement_mode == "LowLoadFirst"  # last good kept
        events = [body for method, path, body in kube.calls if path.endswith("/events")]
        assert events and events[-1]["reason"] == "InvalidConfig"
        assert "solver.workers" in events[-1]["message"]
        assert events[-1]["involvedObject"]["kind"] == "ConfigMap"
    finally:
        extender.server.server_close()
