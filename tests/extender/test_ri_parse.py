"""Parsing and validation: the spec's examples parse, every best-practice violation is reported with its path."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from benchmarks import ri_samples as samples
from extender.ri import GVK, InvalidDefinition, Violation, parse

MINIMAL = """
rootComponent:
  name: "minimal"
  kind:
    group: "minimal.org"
    version: "v1"
    kind: "minimalRI"
  statusDefinition:
    statusMappings:
      running:
        byConditions:
        - type: "Running"
          status: "True"
"""

# The spec's "Child Components" section: it spells the owner `ownerName`.
PYTORCH_SPEC_SECTIONS = """
rootComponent:
  name: "pytorchjob"
  kind:
    group: "kubeflow.org"
    version: "v1"
    kind: "PyTorchJob"
  statusDefinition:
    statusMappings:
      running:
        byConditions:
        - type: "Running"
          status: "True"
childComponents:
- name: "worker"
  ownerName: "pytorchjob"
  kind:
    group: "apps"
    version: "v1"
    kind: "StatefulSet"
  specDefinition:
    podTemplateSpecPath: ".spec.pytorchReplicaSpecs.Worker.template"
"""


def base() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(MINIMAL)
    return doc


def child(name: str, owner: str = "minimal", **extra: Any) -> dict[str, Any]:
    return {"name": name, "ownerRef": owner, "kind": {"group": "apps", "version": "v1", "kind": "Deployment"}, **extra}


def violations(doc: dict[str, Any] | str) -> list[str]:
    with pytest.raises(InvalidDefinition) as info:
        parse(doc)
    return [str(v) for v in info.value.violations]


def test_minimal_example_parses() -> None:
    ri = parse(MINIMAL)
    assert ri.root == GVK("minimal.org", "v1", "minimalRI")
    assert ri.kinds() == (ri.root,)


def test_spec_sections_with_owner_name_spelling_parse() -> None:
    ri = parse(PYTORCH_SPEC_SECTIONS)
    assert ri.components[1].owner_ref == "pytorchjob"


def test_kserve_example_parses_verbatim() -> None:
    """The spec's KServe example, tabs and all, with the spec/structureDefinition wrapper."""
    ri = parse(samples.kserve_example_text())
    assert ri.root == GVK("serving.kserve.io", "v1beta1", "InferenceService")
    assert [c.name for c in ri.components] == ["inferenceservice", "predictor", "transformer"]
    assert ri.kinds() == (ri.root, GVK("apps", "v1", "Deployment"))
    assert [g.name for g in ri.pod_groups] == ["service"]
    predictor = ri.components[1].spec_definition
    assert predictor is not None and predictor.fragmented_pod_spec_definition == {
        "containerPath": ".spec.predictor.model"
    }


def test_json_yaml_and_mapping_inputs_agree() -> None:
    doc = yaml.safe_load(PYTORCH_SPEC_SECTIONS)
    for given in (doc, json.dumps(doc), PYTORCH_SPEC_SECTIONS, {"spec": {"structureDefinition": doc}}):
        assert parse(given).kinds() == (GVK("kubeflow.org", "v1", "PyTorchJob"), GVK("apps", "v1", "StatefulSet"))


def test_status_mappings_as_single_mapping_or_list() -> None:
    doc = base()
    doc["rootComponent"]["statusDefinition"]["statusMappings"]["failed"] = [
        {"byConditions": [{"type": "Failed", "status": "True"}]},
        {"byPhase": "Error"},
    ]
    mappings = parse(doc).root_component.status_definition.status_mappings  # type: ignore[union-attr]
    assert len(mappings["running"]) == 1 and len(mappings["failed"]) == 2
    assert mappings["failed"][1].by_phase == ["Error"]


def test_fragmented_pod_definition_spelling_is_accepted() -> None:
    doc = base()
    doc["rootComponent"]["specDefinition"] = {"fragmentedPodDefinition": {"labelsPath": ".spec.labels"}}
    spec = parse(doc).root_component.spec_definition
    assert spec is not None and spec.fragmented_pod_spec_definition == {"labelsPath": ".spec.labels"}


def test_both_spellings_at_once_is_a_violation() -> None:
    doc = base()
    doc["childComponents"] = [{**child("a"), "ownerName": "minimal"}]
    assert violations(doc) == ["childComponents[0]: give either ownerRef or ownerName (the same field), not both"]


def test_partial_gvk_is_reported_with_its_path() -> None:
    doc = base()
    doc["childComponents"] = [child("a"), {**child("b"), "kind": {"group": "apps", "kind": "Deployment"}}]
    doc["additionalChildKinds"] = [{"version": "v1", "kind": "Service"}]
    assert violations(doc) == [
        "childComponents[1].kind.version: required",
        'additionalChildKinds[0].group: required (use "" for the core API group)',
    ]


def test_root_needs_status_definition_and_no_owner() -> None:
    doc = base()
    del doc["rootComponent"]["statusDefinition"]
    doc["rootComponent"]["ownerRef"] = "x"
    assert violations(doc) == [
        "rootComponent.statusDefinition: required for the root component",
        "rootComponent.ownerRef: the root component has no owner",
    ]


def test_relative_and_uncompilable_paths() -> None:
    doc = base()
    doc["childComponents"] = [
        child("a", specDefinition={"podTemplateSpecPath": "spec.template"}),
        child(
            "b",
            specDefinition={"podSpecPath": ".spec.b[", "metadataPath": ".spec.meta"},
            podSelector={"componentTypeSelector": {"keyPath": ".metadata.labels.x", "value": "b"}},
        ),
    ]
    found = violations(doc)
    assert (
        "childComponents[1].kind: duplicate child kind (also childComponents[0]); "
        "tell them apart with componentTypeSelector" in found
    )
    assert (
        "childComponents[0].specDefinition.podTemplateSpecPath: must be an absolute path starting with '.': "
        "'spec.template'" in found
    )
    assert any(v.startswith("childComponents[1].specDefinition.podSpecPath: jq does not compile:") for v in found)


def test_every_violation_is_reported_at_once() -> None:
    """One document breaking many rules: one exception, every violation with its path."""
    doc = base()
    doc["childComponents"] = [
        child("a", owner="b"),
        child("b", owner="a"),
        child("c", owner="ghost"),
        {**child("d"), "kind": {"group": "apps", "version": "v1"}},
        child("a"),
    ]
    doc["additionalChildKinds"] = [
        {"group": "apps", "version": "v1", "kind": "Deployment"},
        {"group": "", "version": "v1", "kind": "Service"},
        {"group": "", "version": "v1", "kind": "Service"},
    ]
    doc["optimizationInstructions"] = {
        "gangScheduling": {"podGroups": [{"name": "g", "members": [{"componentName": "nope", "filters": ["any("]}]}]}
    }
    with pytest.raises(InvalidDefinition) as info:
        parse(doc)
    found = {str(v) for v in info.value.violations}
    expected = {
        "childComponents[3].kind.kind: required",
        "childComponents[4].name: duplicate component name 'a' (also childComponents[0])",
        "childComponents[0].ownerRef: ownership cycle through 'a'",
        "childComponents[1].ownerRef: ownership cycle through 'b'",
        "childComponents[2].ownerRef: names no component: 'ghost'",
        "additionalChildKinds[0]: already defined explicitly as childComponents[0]",
        "additionalChildKinds[2]: duplicate child kind (also additionalChildKinds[1])",
        "optimizationInstructions.gangScheduling.podGroups[0].members[0].componentName: names no component: 'nope'",
    }
    assert expected <= found
    assert any(v.startswith("childComponents[1].kind: duplicate child kind") for v in found)
    assert any(
        v.startswith("optimizationInstructions.gangScheduling.podGroups[0].members[0].filters[0]: jq") for v in found
    )
    assert str(info.value).startswith(f"invalid resource interface ({len(info.value.violations)} violations):")
    assert all(isinstance(v, Violation) for v in info.value.violations)


def test_selectors_must_be_mutually_exclusive() -> None:
    doc = base()
    key = '.metadata.labels["role"]'
    doc["childComponents"] = [
        child(
            "a",
            specDefinition={"podSpecPath": ".spec.a"},
            podSelector={"componentTypeSelector": {"keyPath": key, "value": "x"}},
        ),
        child(
            "b",
            specDefinition={"podSpecPath": ".spec.b"},
            podSelector={"componentTypeSelector": {"keyPath": key, "value": "x"}},
        ),
        child("c", specDefinition={"podSpecPath": ".spec.c"}, podSelector={"componentTypeSelector": {"keyPath": key}}),
        child(
            "d",
            specDefinition={"podSpecPath": ".spec.d"},
            podSelector={"componentTypeSelector": {"keyPath": key, "value": "y"}},
        ),
    ]
    found = violations(doc)
    assert found == [
        "childComponents[1].podSelector.componentTypeSelector: not mutually exclusive with childComponents[0] "
        "(same key and value)",
        "childComponents[2].podSelector.componentTypeSelector: not mutually exclusive with childComponents[0] "
        "(same key, one without value)",
        "childComponents[2].podSelector.componentTypeSelector: not mutually exclusive with childComponents[1] "
        "(same key, one without value)",
        "childComponents[3].podSelector.componentTypeSelector: not mutually exclusive with childComponents[2] "
        "(same key, one without value)",
    ]


def test_several_pod_defining_components_need_selectors() -> None:
    doc = base()
    doc["childComponents"] = [
        child("a", specDefinition={"podSpecPath": ".spec.a"}),
        {
            **child("b", specDefinition={"podSpecPath": ".spec.b"}),
            "kind": {"group": "batch", "version": "v1", "kind": "Job"},
        },
    ]
    why = "componentTypeSelector required: several components define pods (a, b)"
    assert violations(doc) == [f"childComponents[0].podSelector: {why}", f"childComponents[1].podSelector: {why}"]


def test_instances_need_an_instance_selector_and_vice_versa() -> None:
    doc = base()
    doc["childComponents"] = [
        child("a", instanceIdPath=".spec.jobs[].name", specDefinition={"podTemplateSpecPath": ".spec.jobs[].template"}),
        {
            **child("b", podSelector={"componentInstanceSelector": {"idPath": ".metadata.labels.x"}}),
            "kind": {"group": "batch", "version": "v1", "kind": "Job"},
        },
    ]
    why = "componentTypeSelector required: several components define pods (a, b)"
    assert violations(doc) == [
        "childComponents[0].podSelector.componentInstanceSelector: "
        "required: the component has instances (instanceIdPath)",
        "childComponents[1].instanceIdPath: required by componentInstanceSelector",
        f"childComponents[0].podSelector: {why}",
        f"childComponents[1].podSelector: {why}",
    ]


def test_pod_template_excludes_pod_spec_and_unknown_fields_are_reported() -> None:
    doc = base()
    doc["rootComponent"]["specDefinition"] = {"podTemplateSpecPath": ".spec.t", "podSpecPath": ".spec.p"}
    doc["rootComponent"]["statusDefinition"]["statusMappings"]["stuck"] = {"byPhase": "Stuck"}
    doc["rootComponent"]["colour"] = "blue"
    assert violations(doc) == [
        "rootComponent.colour: unknown field",
    ]
    del doc["rootComponent"]["colour"]
    assert violations(doc) == [
        "rootComponent.specDefinition: podTemplateSpecPath excludes podSpecPath and metadataPath",
        "rootComponent.statusDefinition.statusMappings.stuck: unknown status; "
        "use one of failed, completed, running, initializing, pending",
    ]


def test_empty_status_mapping_is_a_violation() -> None:
    doc = base()
    doc["rootComponent"]["statusDefinition"]["statusMappings"]["failed"] = {}
    assert violations(doc) == [
        "rootComponent.statusDefinition.statusMappings.failed[0]: a status mapping needs byConditions or byPhase"
    ]


def test_bare_word_keys_are_literals_but_other_broken_keys_are_not() -> None:
    doc = base()
    doc["optimizationInstructions"] = {
        "gangScheduling": {
            "podGroups": [{"name": "g", "members": [{"componentName": "minimal", "groupByKeyPaths": ["no-gpu"]}]}]
        }
    }
    parse(copy.deepcopy(doc))
    doc["optimizationInstructions"]["gangScheduling"]["podGroups"][0]["members"][0]["groupByKeyPaths"] = ["a b"]
    assert violations(doc)[0].startswith(
        "optimizationInstructions.gangScheduling.podGroups[0].members[0].groupByKeyPaths[0]: jq does not compile"
    )


def test_not_a_mapping() -> None:
    assert violations("- a\n- b\n") == ["a resource interface must be a mapping"]
    assert violations({"childComponents": []}) == ["rootComponent: required"]
