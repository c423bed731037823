"""Configuration: validation names the field; a bad ConfigMap never replaces the good one."""

from __future__ import annotations

import pytest

from extender.app import Extender, Options
from extender.config import ConfigError, PhalanxConfig, parse, unmatched_levels, unmatched_levels_message
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


POOL = "gpu: {{pools: [{{name: p, spec: {{nodeManagerConfig: {{nodeSelector: {{nodeSelectorTerms: [{term}]}}}}}}}}]}}"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("topology: {levels: []}", "topology.levels: Tuple should have at least 1", id="no levels"),
        pytest.param(
            "topology: {levels: [a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p, q]}",
            "topology.levels",
            id="17 levels: too many",
        ),
        pytest.param(
            "topology: {levels: ['rack name']}",
            "topology.levels: Value error, 'rack name'",
            id="level with a space is no label key",
        ),
        pytest.param("topology: {levels: ['a/b/c']}", "at most one '/'", id="level with two slashes"),
        pytest.param("topology: {levels: ['/rack']}", "at most one '/'", id="level with an empty prefix"),
        pytest.param(
            "topology: {levels: ['Bad_Prefix/rack']}", "prefix must be a DNS subdomain", id="level prefix upper case"
        ),
        pytest.param(f"topology: {{levels: [{'x' * 64}]}}", "1-63 characters", id="level name over 63"),
        pytest.param("topology: {levels: ['', rack]}", "topology.levels", id="empty level"),
        pytest.param(
            "topology: {levels: [kubernetes.io/hostname, rack]}", "may only be the last level", id="host level not last"
        ),
        pytest.param(
            "solver: {seed: 2147483648}",
            "solver.seed: Input should be less than or equal to 2147483647",
            id="seed above int32",
        ),
        pytest.param("solver: {seed: -2147483649}", "solver.seed", id="seed below int32"),
        pytest.param("solver: {seed: 1.5}", "solver.seed", id="fractional seed"),
        pytest.param("solver: {timeLimitSeconds: -1}", "solver.timeLimitSeconds", id="negative time limit"),
        pytest.param("solver: {timeLimitSeconds: 61}", "solver.timeLimitSeconds", id="time limit over 60 s"),
        pytest.param("solver: {timeLimitSeconds: .nan}", "solver.timeLimitSeconds", id="time limit NaN"),
        pytest.param(
            "solver: {workers: 0}", "solver.workers: Input should be greater than or equal to 1", id="no workers"
        ),
        pytest.param("solver: {workers: 65}", "solver.workers", id="65 workers"),
        pytest.param("gpu: {defaultMemoryMiB: 0}", "gpu.defaultMemoryMiB", id="no default GPU memory"),
        pytest.param("gpu: {defaultMemoryMiB: 2000000}", "gpu.defaultMemoryMiB", id="default GPU memory over 1 TiB"),
        pytest.param("gpu: {models: [{match: H100, tflops: .inf}]}", "gpu.models.0.tflops", id="infinite TFLOPs"),
        pytest.param("gpu: {models: [{match: H100, tflops: 0}]}", "gpu.models.0.tflops", id="zero TFLOPs"),
        pytest.param(
            "gpu: {models: [{match: H100, tflops: 200000}]}",
            "gpu.models.0.tflops",
            id="TFLOPs above the device-record bound",
        ),
        pytest.param("gpu: {models: [{match: ' ', tflops: 1}]}", "gpu.models.0.match", id="blank model match"),
        pytest.param(
            "gpu: {models: [{match: H100, tflops: 1}, {match: h100, tflops: 2}]}",
            "gpu.models: Value error, model matches",
            id="repeated model match",
        ),
        pytest.param("gpu: {dynamicMigLabel: 'no-equals'}", "gpu.dynamicMigLabel", id="MIG label without value"),
        pytest.param("gpu: {dynamicMigLabel: 'bad key=x'}", "gpu.dynamicMigLabel", id="MIG label bad key"),
        pytest.param("gpu: {dynamicMigLabel: 'k=bad value'}", "gpu.dynamicMigLabel", id="MIG label bad value"),
        pytest.param("gpu: {placementMode: compact}", "gpu.placementMode", id="placement mode spelling"),
        pytest.param("server: {logLevel: trace}", "server.logLevel", id="unknown log level"),
        pytest.param(
            "gpu: {pools: [{name: Pool_1, spec: {nodeManagerConfig: {nodeSelector: "
            "{nodeSelectorTerms: [{matchFields: [{key: metadata.name, operator: In, values: [n]}]}]}}}}]}",
            "gpu.pools.0.name",
            id="pool name not a DNS label",
        ),
        pytest.param(POOL.format(term="{}"), "an empty term matches no node", id="empty selector term"),
        pytest.param(
            POOL.format(term="{matchExpressions: [{key: 'a b', operator: Exists}]}"),
            "'a b'",
            id="selector key not a label key",
        ),
        pytest.param(
            POOL.format(term="{matchExpressions: [{key: a, operator: Equals, values: [x]}]}"),
            "nodeSelectorTerms",
            id="unknown selector operator",
        ),
        pytest.param(
            POOL.format(term="{matchExpressions: [{key: a, operator: In}]}"),
            "operator In needs at least one value",
            id="In without values",
        ),
        pytest.param(
            POOL.format(term="{matchExpressions: [{key: a, operator: Exists, values: [x]}]}"),
            "operator Exists takes no values",
            id="Exists with values",
        ),
        pytest.param(
            POOL.format(term="{matchExpressions: [{key: a, operator: Gt, values: [big]}]}"),
            "exactly one integer value",
            id="Gt with a non-integer",
        ),
        pytest.param(
            POOL.format(term="{matchFields: [{key: metadata.labels, operator: In, values: [x]}]}"),
            "nodeSelectorTerms",
            id="matchFields on another field",
        ),
        pytest.param(
            "gpu: {pools: [{name: p, spec: {nodeManagerConfig: {nodeSelector: {nodeSelectorTerms: "
            "[{matchFields: [{key: metadata.name, operator: In, values: [n]}]}]}}, "
            "qosConfig: {defaultQoS: high, definitions: [{name: low, priority: 0}]}}}]}",
            "defaultQoS 'high' has no definition",
            id="default QoS undefined",
        ),
        pytest.param(
            "gpu: {pools: [{name: p, spec: {nodeManagerConfig: {nodeSelector: {nodeSelectorTerms: "
            "[{matchFields: [{key: metadata.name, operator: In, values: [n]}]}]}}, "
            "qosConfig: {defaultQoS: low, definitions: [{name: low, priority: 0}, {name: low, priority: 1}]}}}]}",
            "QoS definition names must be distinct",
            id="QoS defined twice",
        ),
        pytest.param(
            "gpu: {pools: [{name: p, spec: {nodeManagerConfig: {nodeSelector: {nodeSelectorTerms: "
            "[{matchFields: [{key: metadata.name, operator: In, values: [n]}]}]}}, "
            "qosConfig: {defaultQoS: low, definitions: [{name: low, priority: 4294967296}]}}}]}",
            "priority",
            id="QoS priority above int32",
        ),
        pytest.param(
            "gpu: {pools: [{name: p, spec: {nodeManagerConfig: {nodeSelector: {nodeSelectorTerms: "
            "[{matchFields: [{key: metadata.name, operator: In, values: [n]}]}]}}, "
            "schedulingConfig: {placement: {gpuFilters: [{type: model, params: {models: ['']}}]}}}}]}",
            "non-empty substring",
            id="empty GPU filter model",
        ),
    ],
)
def test_configuration_the_code_cannot_use_is_rejected_naming_the_field(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse(text, source="cm")
    assert fragment in str(e.value)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty document: the defaults"),
        pytest.param("topology: {levels: [kubernetes.io/hostname]}", id="host level alone"),
        pytest.param("topology: {levels: [topology.kubernetes.io/zone, rack]}", id="prefixed and bare keys"),
        pytest.param("solver: {seed: 2147483647, workers: 64, timeLimitSeconds: 60}", id="bounds inclusive"),
        pytest.param("solver: {seed: -2147483648}", id="lowest int32 seed"),
        pytest.param(
            POOL.format(
                term="{matchExpressions: [{key: a.io/b, operator: Gt, values: ['3']}], "
                "matchFields: [{key: metadata.name, operator: NotIn, values: [n]}]}"
            ),
            id="pool with Gt and matchFields",
        ),
    ],
)
def test_good_configuration_is_accepted(text: str) -> None:
    parse(text, source="cm")


def test_default_configuration_validates_field_by_field() -> None:
    """The defaults pass their own validation (model_dump round trip through the aliases)."""
    dumped = PhalanxConfig().model_dump(by_alias=True)
    assert PhalanxConfig.model_validate(dumped) == PhalanxConfig()


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        pytest.param([], [], id="no nodes: nothing to judge"),
        pytest.param(
            [{"kubernetes.io/hostname": "n1"}],
            ["topology.phalanx.io/block", "topology.phalanx.io/rack"],
            id="nodes without block and rack labels",
        ),
        pytest.param(
            [
                {"kubernetes.io/hostname": "n1", "topology.phalanx.io/rack": "r1"},
                {"kubernetes.io/hostname": "n2", "topology.phalanx.io/block": "b1"},
            ],
            [],
            id="each level carried by some node",
        ),
    ],
)
def test_unmatched_levels_names_levels_no_node_carries(labels: list[dict[str, str]], expected: list[str]) -> None:
    assert unmatched_levels(PhalanxConfig(), labels) == expected
    if expected:
        assert all(level in unmatched_levels_message(expected) for level in expected)
