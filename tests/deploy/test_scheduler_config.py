"""The local kube-scheduler's configuration (deploy/local/scheduler_config.py): which extender
entries carry which verbs. kube-scheduler itself validates the rendered file in the e2e tests
(tests/e2e/test_manifests.py, test_chart.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from deploy.local.scheduler_config import ExtenderTLS, ManagedResource, SchedulerSettings, extender_config

ROOT = Path(__file__).resolve().parents[2]
VERBS = ("filterVerb", "prioritizeVerb", "preemptVerb", "bindVerb")


def _verbs(entry: dict[str, object]) -> list[str]:
    return [v for v in VERBS if entry.get(v)]


def test_prioritize_and_bind_are_entries_of_their_own_at_the_same_url() -> None:
    tls = ExtenderTLS("/c.pem", "/k.pem", "/ca.pem")
    cycle, scorer, binder = extender_config("https://127.0.0.1:8443/", tls=tls, http_timeout="20s")
    assert _verbs(cycle) == ["filterVerb", "preemptVerb"] and "weight" not in cycle
    assert _verbs(scorer) == ["prioritizeVerb"] and scorer["weight"] == 1
    assert _verbs(binder) == ["bindVerb"] and "weight" not in binder
    for entry in (cycle, scorer, binder):  # one extender: everything but the verbs is the same
        assert entry["urlPrefix"] == "https://127.0.0.1:8443" and entry["enableHTTPS"] is True
        assert entry["tlsConfig"] == {"certFile": "/c.pem", "keyFile": "/k.pem", "caFile": "/ca.pem"}
        assert entry["httpTimeout"] == "20s" and entry["nodeCacheCapable"] is True
        assert entry["ignorable"] is False
    assert cycle["managedResources"] == binder["managedResources"] == []  # every pod


def test_prioritize_is_asked_only_for_pods_with_gpu_resources() -> None:
    """A pod without GPUs is offered only the nodes Phalanx ranks first (extender/verbs.py
    `_sample`), which prioritize would score alike: kube-scheduler skips the call."""
    _, scorer, _ = extender_config("http://127.0.0.1:8888")
    managed = [r["name"] for r in scorer["managedResources"]]
    assert managed[:4] == ["nvidia.com/gpu", "phalanx.io/gpu-share", "nvidia.com/gpumem", "nvidia.com/gpucores"]
    assert {"nvidia.com/mig-1g.10gb", "nvidia.com/mig-1g.5gb.me", "nvidia.com/mig-7g.141gb"} <= set(managed)
    assert len(managed) == len(set(managed)) and not any(r["ignoredByScheduler"] for r in scorer["managedResources"])


def test_the_chart_asks_prioritize_for_the_same_resources() -> None:
    """The Helm chart's scorer entry manages whole GPUs, the node agent's share slots and its
    ignoredResources (HAMi shares, every MIG profile): the same list as the local cluster's."""
    values = yaml.safe_load((ROOT / "charts/phalanx/values.yaml").read_text())
    _, scorer, _ = extender_config("http://127.0.0.1:8888")
    chart = ["nvidia.com/gpu", "phalanx.io/gpu-share", *values["kubeScheduler"]["ignoredResources"]]
    assert sorted(chart) == sorted(r["name"] for r in scorer["managedResources"])


def test_with_managed_resources_every_verb_stays_in_one_entry() -> None:
    """kube-scheduler refuses a managed resource named in two entries, and a binder entry with
    none would be asked to bind pods its filter never saw."""
    (entry,) = extender_config("http://127.0.0.1:8888", managed_resources=[ManagedResource("nvidia.com/gpu")])
    assert _verbs(entry) == list(VERBS)
    assert entry["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}]


def test_the_rendered_file_has_the_three_entries_and_vanilla_none() -> None:
    kubeconfig = Path("/tmp/kubeconfig")
    rendered = yaml.safe_load(SchedulerSettings(extender_url="http://127.0.0.1:8888").render(kubeconfig))
    entries = [_verbs(e) for e in rendered["extenders"]]
    assert entries == [["filterVerb", "preemptVerb"], ["prioritizeVerb"], ["bindVerb"]]
    assert "extenders" not in yaml.safe_load(SchedulerSettings().render(kubeconfig))
