"""Workload policies: the reference's worked examples, merge precedence, relations, types, and
the parser reporting every problem of a document with its path."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from extender.policy.evaluate import (
    NO_POLICY,
    SUBMISSION,
    Effective,
    Evaluation,
    effective_json,
    evaluate,
    merge,
)
from extender.policy.spec import Level, Policy, PolicyError, Scope, parse_policy


def policy(name: str, text: str, **scope: str) -> Policy:
    spec: dict[str, Any] = yaml.safe_load(text) or {}
    if scope:
        spec["scope"] = scope
    return parse_policy(name, spec)


def run(policies: Policy | list[Policy], submission: str | dict[str, Any] = "{}") -> Evaluation:
    effective = merge(policies if isinstance(policies, list) else [policies])
    return evaluate(effective, yaml.safe_load(submission) if isinstance(submission, str) else submission)


def rules_of(result: Evaluation) -> list[tuple[str, str]]:
    return [(v.field, v.rule) for v in result.violations]


def problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        parse_policy("bad", yaml.safe_load(text))
    return [str(p) for p in caught.value.violations]


# --- the reference's worked examples ------------------------------------------------------------

EXTENDED = """
defaults:
  compute:
    extendedResources:
      instances:
      - {resource: default/cpu, quantity: 5}
      - {resource: default/memory, quantity: 4M}
      attributes: {quantity: 3}
rules:
  compute:
    extendedResources:
      instances: {locked: [default/cpu]}
      attributes: {quantity: {required: true}}
"""
EXTENDED_SUBMISSION = """
compute:
  extendedResources:
  - {resource: added/cpu}
  - {resource: added/memory, quantity: 5M}
  - {resource: default/memory, exclude: true}
"""


def test_extended_resources_worked_example() -> None:
    """Itemized: default instances, an attribute default filling an added item, an exclusion."""
    result = run(policy("res", EXTENDED), EXTENDED_SUBMISSION)
    assert result.violations == ()
    assert result.values == {
        "compute": {
            "extendedResources": [
                {"resource": "default/cpu", "quantity": 5},
                {"resource": "added/cpu", "quantity": 3},
                {"resource": "added/memory", "quantity": "5M"},
            ]
        }
    }
    sources = result.sources
    assert sources["compute.extendedResources[default/cpu]"] == "policy res (defaults)"
    assert sources["compute.extendedResources[default/cpu].quantity"] == "policy res (defaults)"
    assert sources["compute.extendedResources[added/cpu]"] == SUBMISSION
    assert sources["compute.extendedResources[added/cpu].quantity"] == "policy res (defaults)"
    assert sources["compute.extendedResources[added/memory].quantity"] == SUBMISSION
    assert "compute.extendedResources[default/memory]" not in sources
    assert result.defaulted == {
        "compute.extendedResources[default/cpu]",
        "compute.extendedResources[added/cpu].quantity",
    }


@pytest.mark.parametrize(
    "item",
    [
        pytest.param({"resource": "default/cpu", "exclude": True}, id="a locked instance cannot be excluded"),
        pytest.param({"resource": "default/cpu", "quantity": 6}, id="a locked instance cannot be modified"),
        pytest.param({"resource": "default/cpu", "quantity": "6"}, id="a quantity is compared by value"),
    ],
)
def test_locked_instance_rejected(item: dict[str, Any]) -> None:
    result = run(policy("res", EXTENDED), {"compute": {"extendedResources": [item]}})
    assert rules_of(result) == [("compute.extendedResources[default/cpu]", "locked")]
    assert "locked" in result.violations[0].message and result.violations[0].policy == "res"


@pytest.mark.parametrize("quantity", [5, "5", "5000m"], ids=["same number", "same text", "same amount in milli"])
def test_locked_instance_given_unchanged_is_fine(quantity: object) -> None:
    result = run(
        policy("res", EXTENDED), {"compute": {"extendedResources": [{"resource": "default/cpu", "quantity": quantity}]}}
    )
    assert result.violations == ()
    assert result.sources["compute.extendedResources[default/cpu]"] == SUBMISSION


def test_attribute_rules_check_every_effective_item() -> None:
    """`attributes.quantity.required` with no attribute default: an added item without one is rejected."""
    text = EXTENDED.replace("attributes: {quantity: 3}", "attributes: {}")
    result = run(policy("res", text), EXTENDED_SUBMISSION)
    assert rules_of(result) == [("compute.extendedResources[added/cpu].quantity", "required")]


PRIORITY = """
defaults: {priorityClass: build}
rules: {priorityClass: {canEdit: false}}
"""


@pytest.mark.parametrize(
    ("submission", "violations", "value", "source"),
    [
        pytest.param("priorityClass: train", [("priorityClass", "canEdit")], "train", SUBMISSION, id="train: rejected"),
        pytest.param("priorityClass: build", [], "build", SUBMISSION, id="the default itself: admitted"),
        pytest.param("{}", [], "build", "policy fixed (defaults)", id="nothing: the default"),
    ],
)
def test_can_edit(submission: str, violations: list[tuple[str, str]], value: str, source: str) -> None:
    result = run(policy("fixed", PRIORITY), submission)
    assert rules_of(result) == violations
    assert result.values["priorityClass"] == value
    assert result.sources["priorityClass"] == source
    assert result.defaulted == (set() if source == SUBMISSION else {"priorityClass"})
    if violations:
        assert result.violations[0].message == (
            'priorityClass: "train" differs from the default "build" and canEdit is false (policy fixed)'
        )


def test_can_edit_without_default_forbids_the_field() -> None:
    result = run(policy("p", "rules: {priorityClass: {canEdit: false}}"), "priorityClass: x")
    assert rules_of(result) == [("priorityClass", "canEdit")]
    assert run(policy("p", "rules: {priorityClass: {canEdit: false}}")).violations == ()


DEFAULTS_EXAMPLE = """
defaults: {terminateAfterPreemption: true, backoffLimit: 500}
"""


def test_defaults_example() -> None:
    """The reference's image/imagePullPolicy/runAsUid example in our vocabulary: defaults fill what
    the submission leaves out, the submission's own values stay; with canEdit false it fails."""
    result = run(policy("d", DEFAULTS_EXAMPLE), "{priorityClass: train, backoffLimit: 501}")
    assert result.violations == ()
    assert result.values == {"priorityClass": "train", "terminateAfterPreemption": True, "backoffLimit": 501}
    assert result.sources == {
        "priorityClass": SUBMISSION,
        "terminateAfterPreemption": "policy d (defaults)",
        "backoffLimit": SUBMISSION,
    }
    assert result.defaulted == {"terminateAfterPreemption"}
    frozen = policy("d", DEFAULTS_EXAMPLE + "rules: {backoffLimit: {canEdit: false}}")
    assert rules_of(run(frozen, "{backoffLimit: 501}")) == [("backoffLimit", "canEdit")]


STEP = "rules: {compute: {cpuCoreRequest: {min: 1, max: 7, step: 2}}}"


@pytest.mark.parametrize("cores", [1, 3, 5, 7, 5.0])
def test_step_allows(cores: float) -> None:
    assert run(policy("s", STEP), {"compute": {"cpuCoreRequest": cores}}).violations == ()


@pytest.mark.parametrize(
    ("cores", "rules"),
    [
        pytest.param(2, {"step"}, id="2: off the step"),
        pytest.param(0, {"min", "step"}, id="0: below min, and off the step counted from min"),
        pytest.param(9, {"max"}, id="9: above max"),
        pytest.param(3.5, {"step"}, id="3.5: off the step"),
    ],
)
def test_step_rejects(cores: float, rules: set[str]) -> None:
    result = run(policy("s", STEP), {"compute": {"cpuCoreRequest": cores}})
    assert {v.rule for v in result.violations} == rules
    for v in result.violations:
        assert v.rule in v.message and "compute.cpuCoreRequest" in v.message and v.policy == "s"


def test_step_of_numbers_is_exact_decimal() -> None:
    """0.3 is a multiple of 0.1 (it is not in binary floating point)."""
    fine = policy("s", "rules: {compute: {gpuPortionRequest: {step: 0.1}}}")
    assert run(fine, {"compute": {"gpuPortionRequest": 0.3}}).violations == ()
    assert rules_of(run(fine, {"compute": {"gpuPortionRequest": 0.35}})) == [("compute.gpuPortionRequest", "step")]


ANNOTATIONS = """
defaults:
  annotations:
    instances: [{name: HOME, value: /home/u}, {name: USER, value: u}, {name: TEAM, value: a}]
rules:
  annotations:
    instances: {locked: [HOME, USER], canAdd: false}
"""


@pytest.mark.parametrize(
    ("items", "violations"),
    [
        pytest.param([{"name": "HOME", "exclude": True}], [("annotations[HOME]", "locked")], id="exclude locked HOME"),
        pytest.param([{"name": "USER", "value": "root"}], [("annotations[USER]", "locked")], id="modify locked USER"),
        pytest.param([{"name": "USER", "value": "u"}], [], id="locked USER given unchanged"),
        pytest.param(
            [{"name": "EXTRA", "value": "1"}], [("annotations[EXTRA]", "canAdd")], id="canAdd false: a new key"
        ),
        pytest.param([{"name": "TEAM", "value": "b"}], [], id="an unlocked default may be modified"),
        pytest.param([{"name": "TEAM", "exclude": True}], [], id="an unlocked default may be excluded"),
        pytest.param([{"name": "NOPE", "exclude": True}], [], id="excluding a key that is no default: dropped"),
        pytest.param([{"value": "x"}], [("annotations[0]", "key")], id="an item without its key attribute"),
        pytest.param([{"name": "TEAM"}, {"name": "TEAM"}], [("annotations[TEAM]", "key")], id="a key given twice"),
    ],
)
def test_locked_and_can_add(items: list[dict[str, Any]], violations: list[tuple[str, str]]) -> None:
    assert rules_of(run(policy("env", ANNOTATIONS), {"annotations": items})) == violations


def test_can_add_violation_names_the_default_keys() -> None:
    result = run(policy("env", ANNOTATIONS), {"annotations": [{"name": "EXTRA"}]})
    assert result.violations[0].message == (
        "annotations[EXTRA]: is not among the default instances (HOME, USER, TEAM) and canAdd is false (policy env)"
    )


def test_max_message() -> None:
    result = run(
        policy("gpu-limits", "rules: {compute: {gpuDeviceRequest: {max: 8}}}"), "compute: {gpuDeviceRequest: 16}"
    )
    [violation] = result.violations
    assert (violation.field, violation.rule, violation.policy) == ("compute.gpuDeviceRequest", "max", "gpu-limits")
    assert violation.message == "compute.gpuDeviceRequest: 16 is above max 8 (policy gpu-limits)"


def test_quantities_compare_by_amount() -> None:
    limits = policy("mem", "rules: {compute: {cpuMemoryRequest: {min: 1Gi, max: 4G}}}")
    for text, rules in (("1024Mi", []), ("4000M", []), ("1000Mi", ["min"]), ("4Gi", ["max"])):
        assert [v.rule for v in run(limits, {"compute": {"cpuMemoryRequest": text}}).violations] == rules, text


# --- merge precedence ---------------------------------------------------------------------------

CLUSTER = """
defaults: {compute: {gpuDeviceRequest: 1}, nodePools: [a]}
rules:
  compute: {gpuDeviceRequest: {max: 8, required: true}}
  nodePools: {options: [a, b, c]}
"""
QUEUE = """
defaults: {compute: {gpuDeviceRequest: 2}, priorityClass: train}
rules:
  compute: {gpuDeviceRequest: {max: 4, step: 2}}
  nodePools: {options: [b, c, d]}
"""
NAMESPACE = """
defaults: {compute: {gpuDeviceRequest: 4}, nodePools: [b]}
rules:
  compute: {gpuDeviceRequest: {min: 2, max: 6, canEdit: true}}
"""


def three_levels() -> list[Policy]:
    return [
        policy("a-cluster", CLUSTER),
        policy("m-namespace", NAMESPACE, namespace="team-a"),
        policy("z-queue", QUEUE, queue="research"),
    ]


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 0, 2)], ids=str)
def test_merge_precedence(order: tuple[int, int, int]) -> None:
    """Defaults from the most specific policy, rules most restrictive, each with its source."""
    effective = merge([three_levels()[i] for i in order])
    assert effective.policies == ("m-namespace", "z-queue", "a-cluster")
    result = evaluate(effective, {})
    assert result.values == {"compute": {"gpuDeviceRequest": 4}, "nodePools": ["b"], "priorityClass": "train"}
    assert result.sources["compute.gpuDeviceRequest"] == "policy m-namespace (defaults)"
    assert result.sources["priorityClass"] == "policy z-queue (defaults)"
    assert result.violations == ()
    rules = effective.rules["compute.gpuDeviceRequest"]
    assert rules.max is not None and (rules.max.value.text, rules.max.policy) == (4, "z-queue")
    assert rules.min is not None and (rules.min.value.text, rules.min.policy) == (2, "m-namespace")
    assert rules.required is not None and rules.required.policy == "a-cluster"
    assert rules.step is not None and rules.step.policy == "z-queue"
    options = effective.rules["nodePools"].options
    assert options is not None and (options.value, options.policy) == (("b", "c"), "z-queue, a-cluster")


@pytest.mark.parametrize(
    ("submission", "violations"),
    [
        pytest.param({"compute": {"gpuDeviceRequest": 6}}, [("max", "z-queue")], id="6: the queue's max 4 wins"),
        pytest.param({"compute": {"gpuDeviceRequest": 3}}, [("step", "z-queue")], id="3: the queue's step"),
        pytest.param({"nodePools": ["a"]}, [("options", "z-queue, a-cluster")], id="a: not in the intersection"),
        pytest.param({"nodePools": ["c", "b"]}, [], id="c, b: both in the intersection"),
    ],
)
def test_merged_rules_name_their_policy(submission: dict[str, Any], violations: list[tuple[str, str]]) -> None:
    result = evaluate(merge(three_levels()), submission)
    assert [(v.rule, v.policy) for v in result.violations] == violations
    for v in result.violations:
        assert v.policy.split(", ")[0] in v.message


def test_within_a_level_the_first_name_wins() -> None:
    first, second = policy("10-a", "defaults: {backoffLimit: 1}"), policy("20-a", "defaults: {backoffLimit: 2}")
    for policies in ([first, second], [second, first]):
        result = evaluate(merge(policies), {})
        assert (result.values, result.sources) == ({"backoffLimit": 1}, {"backoffLimit": "policy 10-a (defaults)"})


def test_merge_of_itemized_defaults_and_rules() -> None:
    """Instances per key from the most specific policy; locked is the union; canAdd false wins."""
    cluster = policy(
        "c",
        """
defaults: {tolerations: {instances: [{key: gpu, effect: NoSchedule}, {key: spot}], attributes: {seconds: 30}}}
rules: {tolerations: {instances: {locked: [gpu], canAdd: true}}}
""",
    )
    namespace = policy(
        "n",
        """
defaults: {tolerations: {instances: [{key: spot, operator: Exists}], attributes: {seconds: 60}}}
rules: {tolerations: {instances: {locked: [spot], canAdd: false}}}
""",
        namespace="x",
    )
    effective = merge([cluster, namespace])
    result = evaluate(effective, {})
    assert result.values == {
        "tolerations": [
            {"key": "spot", "operator": "Exists", "seconds": 60},
            {"key": "gpu", "effect": "NoSchedule", "seconds": 60},
        ]
    }
    assert result.sources["tolerations[gpu]"] == "policy c (defaults)"
    assert result.sources["tolerations[gpu].seconds"] == "policy n (defaults)"
    rejected = evaluate(effective, {"tolerations": [{"key": "gpu", "exclude": True}, {"key": "new"}]})
    assert [(v.field, v.rule, v.policy) for v in rejected.violations] == [
        ("tolerations[gpu]", "locked", "c"),
        ("tolerations[new]", "canAdd", "n"),
    ]


def test_empty_options_intersection_says_nothing_is_allowed() -> None:
    one = policy("one", "rules: {priorityClass: {options: [build]}}")
    other = policy("other", "rules: {priorityClass: {options: [{value: train, displayed: Training}]}}")
    [violation] = evaluate(merge([one, other]), {"priorityClass": "build"}).violations
    assert violation.rule == "options"
    assert "nothing in common" in violation.message and "policies one, other" in violation.message


def test_scope_applies() -> None:
    cases = {Scope(): True, Scope(Level.NAMESPACE, "ns"): True, Scope(Level.QUEUE, "q"): False}
    for scope, applies in cases.items():
        assert scope.applies("ns", "other") is applies


def test_effective_json_names_every_source() -> None:
    doc = effective_json(merge(three_levels()))
    assert doc["policies"] == ["m-namespace", "z-queue", "a-cluster"]
    assert doc["defaults"]["compute"]["gpuDeviceRequest"] == {"value": 4, "policy": "m-namespace"}
    gpu = doc["rules"]["compute"]["gpuDeviceRequest"]
    assert gpu["max"] == {"value": 4, "policy": "z-queue"}
    assert gpu["step"] == {"value": 2, "policy": "z-queue", "from": 0}
    assert doc["rules"]["nodePools"]["options"] == {"value": ["b", "c"], "policy": "z-queue, a-cluster"}
    itemized = effective_json(merge([policy("res", EXTENDED)]))
    assert itemized["defaults"]["compute"]["extendedResources"]["attributes"] == {
        "quantity": {"value": 3, "policy": "res"}
    }
    assert itemized["rules"]["compute"]["extendedResources"]["instances"] == {
        "locked": [{"value": "default/cpu", "policy": "res"}]
    }


# --- relations, types, required ------------------------------------------------------------------

ANY_POLICY = policy("any", "rules: {backoffLimit: {min: 0}}")


@pytest.mark.parametrize(
    ("submission", "violations"),
    [
        ({"compute": {"gpuRequestType": "portion", "gpuDeviceRequest": 1}}, []),
        ({"compute": {"gpuRequestType": "portion", "gpuDeviceRequest": 2}}, [("compute.gpuRequestType", "relation")]),
        ({"compute": {"gpuRequestType": "memory"}}, [("compute.gpuRequestType", "relation")]),
        ({"compute": {"gpuRequestType": "half", "gpuDeviceRequest": 1}}, [("compute.gpuRequestType", "options")]),
        ({"compute": {"cpuCoreRequest": 2, "cpuCoreLimit": 1.5}}, [("compute.cpuCoreLimit", "relation")]),
        ({"compute": {"cpuCoreRequest": 2, "cpuCoreLimit": 2}}, []),
        ({"compute": {"cpuMemoryRequest": "1Gi", "cpuMemoryLimit": "1G"}}, [("compute.cpuMemoryLimit", "relation")]),
        ({"compute": {"gpuMemoryRequest": "10G", "gpuMemoryLimit": "10Gi"}}, []),
        ({"compute": {"gpuPortionRequest": 0.5, "gpuPortionLimit": 0.25}}, [("compute.gpuPortionLimit", "relation")]),
        ({"podAffinityTopology": "rack"}, [("podAffinityTopology", "relation")]),
        ({"podAffinitySchedulingRule": "required"}, [("podAffinitySchedulingRule", "relation")]),
        ({"podAffinitySchedulingRule": "required", "podAffinityTopology": "rack"}, []),
        (
            {"podAffinitySchedulingRule": "sometimes", "podAffinityTopology": "rack"},
            [("podAffinitySchedulingRule", "options")],
        ),
    ],
    ids=lambda v: str(v) if isinstance(v, dict) else "",
)
def test_relations(submission: dict[str, Any], violations: list[tuple[str, str]]) -> None:
    result = evaluate(merge([ANY_POLICY]), submission)
    assert rules_of(result) == violations
    for v in result.violations:
        assert v.policy == "" and v.rule in v.message


@pytest.mark.parametrize(
    ("submission", "field"),
    [
        ({"compute": {"gpuDeviceRequest": "eight"}}, "compute.gpuDeviceRequest"),
        ({"compute": {"gpuDeviceRequest": 1.5}}, "compute.gpuDeviceRequest"),
        ({"compute": {"gpuDeviceRequest": True}}, "compute.gpuDeviceRequest"),
        ({"compute": {"cpuMemoryRequest": "lots"}}, "compute.cpuMemoryRequest"),
        ({"compute": {"gpuPortionRequest": "0.5"}}, "compute.gpuPortionRequest"),
        ({"nodePools": "a"}, "nodePools"),
        ({"nodePools": ["a", 1]}, "nodePools"),
        ({"terminateAfterPreemption": "yes"}, "terminateAfterPreemption"),
        ({"compute": 5}, "compute"),
        ({"tolerations": {"key": "a"}}, "tolerations"),
        ({"tolerations": ["a"]}, "tolerations[0]"),
        ({"tolerations": [{"key": "a", "seconds": "10"}]}, "tolerations[a].seconds"),
        ({"tolerations": [{"key": "a", "exclude": "yes"}]}, "tolerations[a].exclude"),
    ],
    ids=lambda v: str(v) if isinstance(v, dict) else v,
)
def test_wrong_types(submission: dict[str, Any], field: str) -> None:
    result = evaluate(merge([ANY_POLICY]), submission)
    assert rules_of(result) == [(field, "type")]
    assert result.violations[0].message.startswith(f"{field}: wrong type: expected ")


def test_unknown_submission_fields_are_ignored() -> None:
    result = evaluate(merge([ANY_POLICY]), {"image": "ubuntu", "compute": {"gpus": 3}, "backoffLimit": 2})
    assert (result.violations, result.values) == ((), {"backoffLimit": 2})


@pytest.mark.parametrize(
    ("submission", "violations"),
    [
        pytest.param({}, [("compute.gpuDeviceRequest", "required"), ("tolerations", "required")], id="nothing"),
        pytest.param({"compute": {"gpuDeviceRequest": 1}, "tolerations": [{"key": "a"}]}, [], id="both given"),
        pytest.param(
            {"compute": {"gpuDeviceRequest": None}, "tolerations": []},
            [("compute.gpuDeviceRequest", "required"), ("tolerations", "required")],
            id="null and []",
        ),
    ],
)
def test_required(submission: dict[str, Any], violations: list[tuple[str, str]]) -> None:
    required = policy("req", "rules: {compute: {gpuDeviceRequest: {required: true}}, tolerations: {required: true}}")
    assert rules_of(run(required, submission)) == violations


def test_required_satisfied_by_a_default() -> None:
    required = policy("req", "defaults: {nodePools: [a]}\nrules: {nodePools: {required: true}}")
    result = run(required)
    assert (result.violations, result.defaulted) == ((), {"nodePools"})
    assert rules_of(run(required, {"nodePools": []})) == [("nodePools", "required")]


def test_only_limits_the_fields_looked_at() -> None:
    """A pod template is evaluated without workload-level fields, and the reverse."""
    effective = merge(
        [
            policy(
                "p",
                "defaults: {backoffLimit: 3}\n"
                "rules: {backoffLimit: {required: true}, compute: {gpuDeviceRequest: {required: true}}}",
            )
        ]
    )
    pod = evaluate(
        effective,
        {"compute": {"gpuRequestType": "portion", "gpuDeviceRequest": 1}},
        only={"compute.gpuDeviceRequest", "compute.gpuRequestType"},
    )
    assert (pod.violations, pod.defaulted) == ((), frozenset())
    workload = evaluate(effective, {}, only={"backoffLimit"})
    assert (workload.violations, workload.values) == ((), {"backoffLimit": 3})


def test_no_policy_passes_everything_untouched() -> None:
    submission = {"compute": {"gpuDeviceRequest": "eight", "gpuRequestType": "x"}}
    result = evaluate(NO_POLICY, submission)
    assert (result.violations, result.defaulted, result.values) == ((), frozenset(), submission)
    assert merge([]) is NO_POLICY and isinstance(NO_POLICY, Effective) and NO_POLICY.empty


# --- parsing: every problem, with its path ----------------------------------------------------------


def test_every_problem_at_once() -> None:
    found = problems(
        """
scope: {namespace: a, queue: b}
imposedAssets: [x]
defaults: {compute: {gpuDeviceRequest: 16, gpuRequestType: half}, imagePullPolicy: Always}
rules:
  compute:
    gpuDeviceRequest: {max: eight, Step: 2}
    cpuCoreRequest: {min: 5, max: 1, step: 0}
    gpuMemoryRequest: {step: 1}
    extendedResources: {instances: {Locked: [x], canAdd: maybe}, attributes: {foo: {}}}
  nodePools: {options: []}
  priorityClass: {canEdit: false, required: true}
"""
    )
    assert found == [
        "spec.imposedAssets: unknown section (expected one of scope, defaults, rules)",
        "spec.scope: give a namespace or a queue, not both",
        "spec.defaults.imagePullPolicy: unknown field (expected one of compute, nodePools, priorityClass, tolerations,"
        " podAffinitySchedulingRule, podAffinityTopology, terminateAfterPreemption, backoffLimit, annotations, labels)",
        'spec.defaults.compute.gpuRequestType: "half" is not among the options "portion", "memory", "migProfile"',
        "spec.rules.compute.gpuDeviceRequest.Step: unknown rule; did you mean step?",
        'spec.rules.compute.gpuDeviceRequest.max: expected an integer, got "eight"',
        "spec.rules.compute.cpuCoreRequest.min: min 5 is above max 1",
        "spec.rules.compute.cpuCoreRequest.step: step must be above 0, got 0",
        "spec.rules.compute.gpuMemoryRequest.step: rule step does not apply to quantity fields"
        " (their rules: canEdit, required, min, max)",
        "spec.rules.compute.extendedResources.instances.Locked: unknown instances rule; did you mean locked?",
        'spec.rules.compute.extendedResources.instances.canAdd: expected true or false, got "maybe"',
        "spec.rules.compute.extendedResources.attributes.foo: unknown attribute (expected one of resource, quantity)",
        "spec.rules.nodePools.options: expected a non-empty list of strings or of {value, displayed}, got []",
        "spec.rules.priorityClass: required and canEdit: false without a default: nothing can pass",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "defaults: {compute: {gpuDeviceRequest: 16}}\nrules: {compute: {gpuDeviceRequest: {max: 8}}}",
            "spec.defaults.compute.gpuDeviceRequest: the default breaks this policy's own rule: 16 is above max 8",
            id="a default above the policy's max",
        ),
        pytest.param(
            "defaults: {annotations: {instances: [{name: a, value: x}]}}\n"
            "rules: {annotations: {attributes: {value: {options: [y]}}}}",
            'spec.defaults.annotations.instances[a].value: the default breaks this policy\'s own rule: "x" is not'
            ' among the options "y"',
            id="a default instance outside its attribute's options",
        ),
        pytest.param(
            "defaults: {compute: {extendedResources: {attributes: {quantity: 9, resource: r}}}}\n"
            "rules: {compute: {extendedResources: {attributes: {quantity: {max: 8}}}}}",
            "spec.defaults.compute.extendedResources.attributes.resource: the key attribute takes no default",
            id="a default for the key attribute",
        ),
        pytest.param(
            "defaults: {nodePools: a}", 'spec.defaults.nodePools: expected a list of strings, got "a"', id="array"
        ),
        pytest.param(
            "defaults: {compute: {cpuMemoryRequest: 5X}}",
            "spec.defaults.compute.cpuMemoryRequest: expected a quantity",
            id="quantity",
        ),
        pytest.param(
            "defaults: {tolerations: [{key: a}]}",
            "spec.defaults.tolerations: expected {instances: [...], attributes: {...}}",
            id="itemized defaults as a bare list",
        ),
        pytest.param(
            "defaults: {labels: {instances: [{value: x}]}}",
            "spec.defaults.labels.instances[0]: an instance needs its key attribute name",
            id="instance without key",
        ),
        pytest.param(
            "defaults: {labels: {instances: [{name: a, colour: x}]}}",
            "spec.defaults.labels.instances[0].colour: unknown attribute",
            id="unknown attribute",
        ),
        pytest.param(
            "scope: {namespace: ''}", "spec.scope.namespace: expected a non-empty string", id="empty namespace"
        ),
        pytest.param(
            "scope: {Namespace: a}", "spec.scope.Namespace: unknown scope; did you mean namespace?", id="scope case"
        ),
        pytest.param("scope: team-a", "spec.scope: expected {namespace: <name>}", id="scope not an object"),
        pytest.param(
            "rules: {compute: {cpuCoreRequest: 3}}",
            "spec.rules.compute.cpuCoreRequest: expected an object of rules",
            id="rules not an object",
        ),
        pytest.param(
            "rules: {compute: {cpuCoreRequest: {defaultFrom: x}}}",
            "spec.rules.compute.cpuCoreRequest.defaultFrom: unknown rule",
            id="defaultFrom is not supported",
        ),
        pytest.param(
            "rules: {compute: [1]}",
            "spec.rules.compute: expected an object of compute fields",
            id="group not an object",
        ),
        pytest.param(
            "rules: {compute: {gpuRequestType: {options: [half]}}}",
            'spec.rules.compute.gpuRequestType.options[0]: "half" is not one of portion, memory, migProfile',
            id="options outside the field's own",
        ),
        pytest.param(
            "rules: {priorityClass: {options: [{value: a, shown: b}]}}",
            "spec.rules.priorityClass.options[0].shown: unknown option attribute",
            id="option object",
        ),
        pytest.param(
            "rules: {tolerations: {instances: {locked: [a, 3]}}}",
            "spec.rules.tolerations.instances.locked[1]: expected an instance key",
            id="locked key not a string",
        ),
        pytest.param(
            "rules: {tolerations: {max: 3}}",
            "spec.rules.tolerations.max: rule max does not apply to itemized fields",
            id="max on itemized",
        ),
        pytest.param(
            "rules: {compute: {gpuPortionRequest: {step: -0.1}}}",
            "spec.rules.compute.gpuPortionRequest.step: step must be above 0",
            id="negative step",
        ),
        pytest.param("[1, 2]", "spec: expected an object", id="spec not an object"),
        pytest.param(
            "defaults: {compute: {gpuPortionRequest: 0}}\nrules: {compute: {gpuPortionRequest: {step: 0}}}",
            "spec.rules.compute.gpuPortionRequest.step: step must be above 0",
            id="a zero step is reported, not used on the default",
        ),
    ],
)
def test_problem(text: str, expected: str) -> None:
    assert any(p.startswith(expected) for p in problems(text)), problems(text)


def test_policy_error_message_lists_every_problem() -> None:
    with pytest.raises(PolicyError, match=r"workload policy bad: 2 problem\(s\):\n  - spec.x: .*\n  - spec.y: "):
        parse_policy("bad", {"x": 1, "y": 2})


def test_valid_policy_parses_with_nulls_as_absent() -> None:
    parsed = policy(
        "ok", "scope: {queue: q}\ndefaults: {compute: null, nodePools: null}\nrules: {backoffLimit: {max: null}}"
    )
    assert parsed.scope == Scope(Level.QUEUE, "q")
    assert parsed.defaults.values == {} and parsed.rules["backoffLimit"].max is None
