"""Workload types: the POST body, its validation (every violation), the registry and its ConfigMap form."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest
import yaml

from extender.ri import GVK, InvalidDefinition
from extender.ri.registry import Registry, WorkloadType, WorkloadTypeBody, load_defaults


def ri_doc(version: str = "v1", kind: str = "Notebook", group: str = "example.com") -> dict[str, Any]:
    return {
        "rootComponent": {
            "name": "notebook",
            "kind": {"group": group, "version": version, "kind": kind},
            "statusDefinition": {"statusMappings": {"running": {"byPhase": "Running"}}},
        },
        "childComponents": [
            {
                "name": "server",
                "ownerRef": "notebook",
                "kind": {"group": "apps", "version": "v1", "kind": "StatefulSet"},
                "specDefinition": {"podTemplateSpecPath": ".spec.template"},
            }
        ],
        "additionalChildKinds": [{"group": "", "version": "v1", "kind": "Service"}],
    }


def body(*versions: str, **extra: Any) -> dict[str, Any]:
    return {"name": "Notebook", "group": "example.com", "resourceInterfaces": [ri_doc(v) for v in versions], **extra}


def violations(given: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidDefinition) as info:
        WorkloadType.from_body(given)
    return [str(v) for v in info.value.violations]


def test_body_with_one_ri_per_version() -> None:
    wt = WorkloadType.from_body(body("v1", "v1beta1", categoryId="cat-1", priorityId="prio-1"))
    assert (wt.name, wt.group, wt.versions(), wt.category_id, wt.priority_id) == (
        "Notebook",
        "example.com",
        ("v1", "v1beta1"),
        "cat-1",
        "prio-1",
    )
    assert wt.interface("v1beta1") is wt.interfaces[1] and wt.interface("v2") is None
    assert WorkloadTypeBody.model_validate(body("v1")).resource_interfaces[0]["rootComponent"]["name"] == "notebook"


def test_body_violations_are_all_reported_with_paths() -> None:
    given = body("v1", "v1")
    given["resourceInterfaces"].append(ri_doc("v2", kind="Other", group="other.io"))
    given["resourceInterfaces"].append(copy.deepcopy(ri_doc("v3")))
    del given["resourceInterfaces"][3]["childComponents"][0]["ownerRef"]
    assert violations(given) == [
        "resourceInterfaces[1].rootComponent.kind.version: duplicate version 'v1' (also resourceInterfaces[0])",
        "resourceInterfaces[2].rootComponent.kind.kind: must equal the workload type name 'Notebook', not 'Other'",
        "resourceInterfaces[2].rootComponent.kind.group: must equal the workload type group 'example.com', "
        "not 'other.io'",
        "resourceInterfaces[3].childComponents[0].ownerRef: required: the component that owns this one",
    ]


def test_body_shape_violations() -> None:
    assert violations({"group": "x", "resourceInterfaces": [], "colour": 1}) == [
        "name: required",
        "resourceInterfaces: List should have at least 1 item after validation, not 0",
        "colour: Extra inputs are not permitted",
    ]


def test_registry_add_replace_get_list_delete_lookup() -> None:
    registry = Registry()
    first = WorkloadType.from_body(body("v1"))
    assert registry.put(first) is None and registry.generation == 1
    second = WorkloadType.from_body(body("v1", "v2"))
    assert registry.put(second) is first
    assert registry.get("Notebook") is second and registry.get("Notebook", "example.com") is second
    assert registry.get("Notebook", "other.io") is None
    assert registry.lookup("example.com", "v2", "Notebook") is second.interfaces[1]
    assert registry.lookup("example.com", "v3", "Notebook") is None
    assert registry.list() == [second]
    assert registry.delete("Notebook") is second and registry.list() == [] and registry.delete("Notebook") is None
    assert registry.lookup("example.com", "v1", "Notebook") is None


def test_watched_kinds_cover_root_child_and_additional_kinds() -> None:
    registry = Registry([WorkloadType.from_body(body("v1", "v2"))])
    assert registry.watched_kinds() == {
        GVK("example.com", "v1", "Notebook"),
        GVK("example.com", "v2", "Notebook"),
        GVK("apps", "v1", "StatefulSet"),
        GVK("", "v1", "Service"),
    }


def test_configmap_round_trip() -> None:
    registry = Registry(load_defaults())
    data = registry.to_configmap_data()
    assert sorted(data)[:2] == ["jobset.x-k8s.io.JobSet.yaml", "kubeflow.org.MPIJob.yaml"]
    restored, problems = Registry.from_configmap_data(data)
    assert problems == []
    assert [wt.key for wt in restored.list()] == [wt.key for wt in registry.list()]
    assert restored.watched_kinds() == registry.watched_kinds()
    assert restored.to_configmap_data() == data


def test_configmap_entries_that_do_not_validate_are_reported_and_skipped() -> None:
    broken = body("v1")
    del broken["resourceInterfaces"][0]["rootComponent"]["kind"]["version"]
    data = {
        "example.com.Notebook.yaml": yaml.safe_dump(broken),
        "x.Y.yaml": "{: nope",
        "ok.yaml": yaml.safe_dump(body("v1")),
    }
    registry, problems = Registry.from_configmap_data(data)
    assert str(problems[0]) == ("example.com.Notebook.yaml:resourceInterfaces[0].rootComponent.kind.version: required")
    assert problems[1].path == "x.Y.yaml" and problems[1].message.startswith("not YAML")
    assert [wt.name for wt in registry.list()] == ["Notebook"]


def test_core_group_configmap_key() -> None:
    given = {"name": "Pod", "group": "", "resourceInterfaces": [ri_doc(kind="Pod", group="")]}
    assert WorkloadType.from_body(given).configmap_key == "core.Pod.yaml"


def test_registry_is_safe_under_concurrent_writers_and_readers() -> None:
    registry = Registry()
    bodies = []
    for i in range(8):
        b = body("v1")
        b["name"] = f"Kind{i}"
        for ri in b["resourceInterfaces"]:
            ri["rootComponent"]["kind"]["kind"] = f"Kind{i}"
        bodies.append(WorkloadType.from_body(b))
    errors: list[BaseException] = []

    def churn(wt: WorkloadType) -> None:
        try:
            for _ in range(200):
                registry.put(wt)
                registry.watched_kinds()
                registry.lookup("example.com", "v1", wt.name)
                registry.delete(wt.name)
        except BaseException as error:  # pragma: no cover - the assertion below reports it
            errors.append(error)

    threads = [threading.Thread(target=churn, args=(wt,)) for wt in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and registry.list() == [] and registry.generation == 8 * 200 * 2
