"""The workload controllers' build and install steps that need no Go and no cluster
(deploy/local/controllers.py): requirement order, patched sources, webhook configurations."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deploy.local import controllers
from deploy.local.controllers import ControllerSpec, SourcePatch


def test_a_controller_starts_after_those_it_needs_each_once() -> None:
    assert controllers.with_requirements(("trainer",)) == ("jobset", "trainer")
    assert controllers.with_requirements(("lws", "trainer", "jobset")) == ("lws", "jobset", "trainer")


def test_an_unknown_controller_is_named_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown controller 'volcano'; known: jobset, lws, trainer"):
        controllers.with_requirements(("jobset", "volcano"))


def test_every_controller_has_a_way_to_start() -> None:
    for spec in controllers.CONTROLLERS.values():
        assert (spec.configuration is None) != (spec.flags is None), spec.name
        assert set(spec.requires) <= set(controllers.CONTROLLERS), spec.name


def module(tmp_path: Path) -> Path:
    source = tmp_path / "module"
    (source / "cmd").mkdir(parents=True)
    (source / "go.mod").write_text("module example.com/op\n")
    (source / "cmd" / "main.go").write_text('package main\n\nconst port = ":8080"\n')
    (source / "cmd" / "main.go").chmod(0o444)  # as in the module cache
    return source


def spec(*patches: SourcePatch) -> ControllerSpec:
    return ControllerSpec(name="op", module="example.com/op", version="v1.0.0", crds=(), patches=patches)


def test_patches_apply_to_a_copy_named_by_their_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHALANX_CACHE_DIR", str(tmp_path / "cache"))
    source = module(tmp_path)
    patched = controllers.patched_source(spec(SourcePatch("cmd/main.go", old='":8080"', new="addr()")), source)
    assert patched != source and patched.parent == tmp_path / "cache" / "bin" / "src"
    assert (patched / "cmd" / "main.go").read_text() == "package main\n\nconst port = addr()\n"
    assert (source / "cmd" / "main.go").read_text() == 'package main\n\nconst port = ":8080"\n'  # untouched
    other = controllers.patched_source(spec(SourcePatch("cmd/main.go", old='":8080"', new="other()")), source)
    assert other != patched  # another patch, another folder (and another build stamp)
    build = controllers.target(spec(SourcePatch("cmd/main.go", old='":8080"', new="addr()")), source)
    assert build.command[:4] == ("go", "build", "-C", str(patched))
    whole = controllers.patched_source(spec(SourcePatch("cmd/main.go", new="package main\n")), source)
    assert (whole / "cmd" / "main.go").read_text() == "package main\n"


def test_a_patch_whose_text_moved_fails_the_build_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHALANX_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(RuntimeError, match=r"op v1.0.0: cmd/main.go holds '\":9090\"' 0 times, not once"):
        controllers.patched_source(spec(SourcePatch("cmd/main.go", old='":9090"', new="x")), module(tmp_path))


def test_an_unpatched_controller_builds_in_the_module_itself(tmp_path: Path) -> None:
    assert controllers.patched_source(spec(), tmp_path) == tmp_path


def hook(name: str, resource: str, path: str) -> dict[str, object]:
    return {
        "name": name,
        "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": path}},
        "rules": [{"apiGroups": ["kubeflow.org"], "resources": [resource], "operations": ["CREATE"]}],
    }


def test_webhooks_point_at_the_loopback_url_and_keep_only_the_served_resources(tmp_path: Path) -> None:
    manifests = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "validating-webhook-configuration"},
        "webhooks": [hook("tf", "tfjobs", "/validate-tf"), hook("pt", "pytorchjobs", "/validate-pt")],
    }
    (tmp_path / "manifests.yaml").write_text(yaml.safe_dump(manifests))
    only = ControllerSpec(
        name="op", module="m", version="v1", crds=(), webhooks="manifests.yaml", webhook_resources=("pytorchjobs",)
    )
    (doc,) = controllers.webhook_configurations(only, tmp_path, "https://127.0.0.1:9443", b"CA")
    assert doc["metadata"] == {"name": "op-validating-webhook-configuration"}
    assert [h["name"] for h in doc["webhooks"]] == ["pt"]
    assert doc["webhooks"][0]["clientConfig"] == {"url": "https://127.0.0.1:9443/validate-pt", "caBundle": "Q0E="}


def test_kustomize_patches_replace_whole_webhooks_and_skip_field_edits(tmp_path: Path) -> None:
    manifests = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mutating"},
        "webhooks": [hook("pods", "pods", "/mutate-pod")],
    }
    selected = hook("pods", "pods", "/mutate-pod") | {"objectSelector": {"matchLabels": {"mine": "yes"}}}
    patch = [
        {"op": "replace", "path": "/webhooks/0", "value": selected},
        {"op": "replace", "path": "/webhooks/0/clientConfig/service/name", "value": "other"},
    ]
    (tmp_path / "manifests.yaml").write_text(yaml.safe_dump(manifests))
    (tmp_path / "patch.yaml").write_text(yaml.safe_dump(patch))
    patched = ControllerSpec(
        name="op", module="m", version="v1", crds=(), webhooks="manifests.yaml", webhook_patches=("patch.yaml",)
    )
    (doc,) = controllers.webhook_configurations(patched, tmp_path, "https://127.0.0.1:1", b"CA")
    assert doc["webhooks"][0]["objectSelector"] == {"matchLabels": {"mine": "yes"}}
    assert doc["webhooks"][0]["clientConfig"]["url"] == "https://127.0.0.1:1/mutate-pod"
