"""User-supplied jq has a budget: forbidden constructs are rejected at validation, slow programs
at registration (timed on probe pods), and a definition that overruns at run time is switched off."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from benchmarks import ri_samples as samples
from extender.ri import REASON_BUDGET, InvalidDefinition, jqx, parse
from extender.ri.budget import BASE_S, HARD_FACTOR, OVERRUNS_TO_TRIP, WINDOW, Breaker, budget_s
from extender.ri.probe import PROBE_DOCS, check
from extender.ri.registry import WorkloadType, load_defaults

RI = """
rootComponent:
  name: job
  kind: {group: example.com, version: v1, kind: Job}
  statusDefinition:
    statusMappings:
      running:
        byConditions: [{type: Running, status: "True"}]
optimizationInstructions:
  gangScheduling:
    podGroups:
    - name: all
      members:
      - componentName: job
        groupByKeyPaths: ['.metadata.labels["job"]']
"""
KEY_PATH = "optimizationInstructions.gangScheduling.podGroups[0].members[0].groupByKeyPaths[0]"


def ri_doc(key: str = '.metadata.labels["job"]') -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(RI)
    doc["optimizationInstructions"]["gangScheduling"]["podGroups"][0]["members"][0]["groupByKeyPaths"] = [key]
    return doc


def pod(name: str = "p0", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml", "labels": {"job": "j1", **labels}}}


@pytest.mark.parametrize(
    ("key", "construct"),
    [
        pytest.param("[..] | length", "'..'", id="recursive descent"),
        pytest.param("[recurse] | length", "'recurse'", id="recurse"),
        pytest.param("[paths] | length", "'paths'", id="paths"),
        pytest.param("walk(.) | .kind", "'walk'", id="walk"),
        pytest.param("[limit(3; repeat(1))] | length", "'repeat'", id="repeat"),
        pytest.param("0 | until(. > 5; . + 1)", "'until'", id="until"),
        pytest.param("[0 | while(. < 5; . + 1)] | length", "'while'", id="while"),
        pytest.param("def f: f; f", "'def'", id="def recursion"),
        pytest.param("[range(1000000)] | length", "literal bound 1000000", id="range with a huge literal"),
        pytest.param("[range(0; 10; 1)] | length", "range/3", id="range with a step"),
        pytest.param("[limit(100000000; .[])] | length", "literal bound 100000000", id="limit with a huge n"),
        pytest.param("[input] | length", "'input'", id="input"),
        pytest.param("[inputs] | length", "'inputs'", id="inputs"),
        pytest.param("env.HOME", "'env'", id="env"),
        pytest.param("$ENV.HOME", "'$ENV'", id="$ENV"),
        pytest.param("$__loc__.line", "'$__loc__'", id="$__loc__"),
        pytest.param('"x" * 5 | length', "string literal", id="string repetition"),
        pytest.param(".metadata.name * 1000000 | length", "literal above 10000", id="repetition by a huge literal"),
        pytest.param("[.a, .b] | combinations | length", "'combinations'", id="combinations"),
        pytest.param('.metadata.name | test("(a+)+$")', "catastrophic backtracking", id="nested quantifier regex"),
        pytest.param('.metadata.name | test("(a)\\\\1")', "backreference", id="backreference regex"),
        pytest.param(".metadata.name | test(.metadata.labels.re)", "plain string literal", id="regex from the pod"),
        pytest.param('"\\([recurse] | length)"', "'recurse'", id="hidden in a string interpolation"),
        pytest.param("debug", "'debug'", id="debug writes to stderr"),
        pytest.param("[.metadata.labels | infinite] | length", "'infinite'", id="infinite"),
    ],
)
def test_forbidden_jq_is_rejected_with_its_path_and_construct(key: str, construct: str) -> None:
    with pytest.raises(InvalidDefinition) as e:
        parse(ri_doc(key))
    messages = [str(v) for v in e.value.violations]
    assert any(m.startswith(KEY_PATH) and construct in m for m in messages), messages


@pytest.mark.parametrize(
    "key",
    [
        pytest.param('.metadata.labels["job"]', id="a label"),
        pytest.param(".metadata.name | .recurse", id="a field named like a builtin"),
        pytest.param('.metadata.name | test("^[a-z]+-[0-9]+$")', id="a linear regex literal"),
        pytest.param('.metadata.name | split("-") | .[0]', id="split on a string"),
        pytest.param("[range(4)] | length", id="small literal range"),
        pytest.param('"\\(.metadata.name)-x"', id="string interpolation"),
        pytest.param("(.a // 2147483647) * (.b // 1)", id="multiplying numbers with a big default"),
        pytest.param(".metadata.name # recurse in a comment", id="comment"),
    ],
)
def test_bounded_jq_is_accepted(key: str) -> None:
    parse(ri_doc(key))


def test_range_over_a_document_bound_is_capped_at_run_time() -> None:
    """`range(.spec.replicas)` (the shipped LeaderWorkerSet counts instances so) errors past the cap."""
    doc = jqx.Doc({"spec": {"replicas": 2_000_000_000}})
    with pytest.raises(jqx.JqRuntimeError, match="range over more than"):
        doc.all(".spec.replicas | range(.)")
    assert jqx.Doc({"spec": {"replicas": 3}}).all("[.spec.replicas | range(.)]") == [[0, 1, 2]]


def test_a_slow_program_is_rejected_by_timing_naming_its_path() -> None:
    """Legal but slow (a product of two 10,000-ranges): the probe kills it and names the path."""
    slow = "[range(10000) as $a | range(10000) | select(. == $a)] | length"
    ri = parse(ri_doc(slow))
    violations = check(ri.definition)
    assert [v.path for v in violations] == [KEY_PATH]
    assert "jq too slow" in violations[0].message


def test_a_slow_program_is_rejected_at_registration() -> None:
    body = {
        "name": "Job",
        "group": "example.com",
        "resourceInterfaces": [ri_doc("[range(10000) as $a | range(10000)] | length")],
    }
    with pytest.raises(InvalidDefinition, match=r"resourceInterfaces\[0\]\.optimizationInstructions.*jq too slow"):
        WorkloadType.from_body(body)


def test_shipped_definitions_pass_the_probe_with_room_to_spare() -> None:
    """Every shipped RI, all its expressions as one program, within a fifth of the budget on both probe pods."""
    for wt in load_defaults():
        for ri in wt.interfaces:
            assert check(ri.definition, share=0.2) == [], ri.root
    assert 2_000 < len(yaml.safe_dump(PROBE_DOCS[0])) < 10_000


def test_probe_pod_is_the_size_of_a_sample_pod() -> None:
    """The realistic probe pod is within 4x the size of a controller's pod from the samples."""
    _, pods = samples.pytorchjob("probe", workers=1)
    sample, probe = len(jqx.Doc(pods[0]).text), len(jqx.Doc(PROBE_DOCS[0]).text)
    assert sample / 4 < probe < sample * 4


def test_breaker_trips_after_repeated_overruns_and_reports_once() -> None:
    tripped: list[tuple[str, str]] = []
    breaker = Breaker("example.com/v1 Job", on_trip=lambda name, message: tripped.append((name, message)))
    over = budget_s(1000) * 2
    for _ in range(OVERRUNS_TO_TRIP - 1):
        breaker.record(over, 1000)
    assert not breaker.tripped
    breaker.record(over, 1000)
    assert breaker.tripped and len(tripped) == 1
    assert tripped[0][0] == "example.com/v1 Job" and "over budget" in tripped[0][1]
    breaker.record(over, 1000)
    assert len(tripped) == 1


def test_breaker_forgives_overruns_spread_out_over_many_runs() -> None:
    breaker = Breaker("x")
    for _ in range(OVERRUNS_TO_TRIP * 2):
        breaker.record(budget_s(0) * 2, 0)
        for _ in range(WINDOW):
            breaker.record(BASE_S / 10, 0)
    assert not breaker.tripped and breaker.overruns == OVERRUNS_TO_TRIP * 2


def test_breaker_trips_at_once_on_a_single_huge_overrun() -> None:
    breaker = Breaker("x")
    breaker.record(budget_s(100) * (HARD_FACTOR + 1), 100)
    assert breaker.tripped and f"{HARD_FACTOR}x" in breaker.tripped_because


def test_a_tripped_definition_stops_keying_its_pods_and_says_why() -> None:
    ri = parse(ri_doc())
    told: list[str] = []
    ri.on_budget_trip(lambda name, message: told.append(message))
    assert ri.gang_key(pod()) == "all/j1"
    for _ in range(OVERRUNS_TO_TRIP):
        ri.breaker.record(1.0, 100)  # as if three evaluations had taken a second each
    assert told and ri.gang_key(pod()) is None
    assert ri.classify(pod()).reason == REASON_BUDGET
    evaluation = ri.evaluate({"metadata": {"name": "j1"}}, [pod("p0"), pod("p1")])
    assert evaluation.gangs == () and evaluation.problems == (REASON_BUDGET,)
    assert {u.reason for u in evaluation.unassigned} == {REASON_BUDGET}


def test_every_evaluation_is_measured() -> None:
    ri = parse(ri_doc())
    ri.gang_key(pod())
    ri.evaluate({"metadata": {"name": "j1"}}, [pod()])
    assert ri.breaker.runs >= 2 and ri.breaker.seconds > 0


def test_registry_hands_the_trip_handler_to_every_definition() -> None:
    from extender.ri.registry import Registry

    registry = Registry(load_defaults())
    told: list[str] = []
    registry.on_budget_trip(lambda name, message: told.append(name))
    ri = registry.lookup("kubeflow.org", "v1", "PyTorchJob")
    assert ri is not None
    ri.breaker.record(1.0, 100)
    assert told == ["kubeflow.org/v1 PyTorchJob"]
