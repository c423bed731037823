"""The local kube-scheduler's configuration (deploy/local/scheduler_config.py): which extender
entries carry which verbs. kube-scheduler itself validates the rendered file in the e2e tests
(tests/e2e/test_manifests.py, test_chart.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from deploy.local.scheduler_config import ExtenderTLS, ManagedResource, SchedulerSettings, extender_config

VERBS = ("filterVerb", "prioritizeVerb", "preemptVerb", "bindVerb")


def _verbs(entry: dict[str, object]) -> list[str]:
    return [v for v in VERBS if entry.get(v)]


def test_bind_is_an_entry_of_its_own_at_the_same_url() -> None:
    tls = ExtenderTLS("/c.pem", "/k.pem", "/ca.pem")
    cycle, binder = extender_config("https://127.0.0.1:8443/", tls=tls, http_timeout="20s")
    assert _verbs(cycle) == ["filterVerb", "prioritizeVerb", "preemptVerb"] and cycle["weight"] == 1
    assert _verbs(binder) == ["bindVerb"] and "weight" not in binder
    for entry in (cycle, binder):  # one extender: everything but the verbs is the same
        assert entry["urlPrefix"] == "https://127.0.0.1:8443" and entry["enableHTTPS"] is True
        assert entry["tlsConfig"] == {"certFile": "/c.pem", "keyFile": "/k.pem", "caFile": "/ca.pem"}
        assert entry["httpTimeout"] == "20s" and entry["nodeCacheCapable"] is True
        assert entry["managedResources"] == [] and entry["ignorable"] is False


def test_with_managed_resources_every_verb_stays_in_one_entry() -> None:
    """kube-scheduler refuses a managed resource named in two entries, and a binder entry with
    none would be asked to bind pods its filter never saw."""
    (entry,) = extender_config("http://127.0.0.1:8888", managed_resources=[ManagedResource("nvidia.com/gpu")])
    assert _verbs(entry) == list(VERBS)
    assert entry["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}]


def test_the_rendered_file_has_both_entries_and_vanilla_none() -> None:
    kubeconfig = Path("/tmp/kubeconfig")
    rendered = yaml.safe_load(SchedulerSettings(extender_url="http://127.0.0.1:8888").render(kubeconfig))
    assert [_verbs(e) for e in rendered["extenders"]] == [["filterVerb", "prioritizeVerb", "preemptVerb"], ["bindVerb"]]
    assert "extenders" not in yaml.safe_load(SchedulerSettings().render(kubeconfig))
