"""RI gangs in the extender: owner walks to the root, waiting keys re-keyed when an owner
arrives, and workload types from the ConfigMap with last-good semantics."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from benchmarks import ri_samples
from extender.app import Extender, Options
from extender.gangs.sources import COSCHEDULING_POD_GROUP
from extender.ri.model import GVK
from extender.workload_types import KEY_PREFIX
from tests.extender.fakes import FakeKube, mark_listed, pod

JOBSET = GVK("jobset.x-k8s.io", "v1alpha2", "JobSet")
JOB = GVK("batch", "v1", "Job")


@pytest.fixture
def ext() -> Iterator[Extender]:
    extender = Extender(FakeKube(), Options(port=0))
    extender.server.server_close()  # in-process only
    mark_listed(extender)
    yield extender


def keyed(ext: Extender) -> dict[str, str]:
    """Pod uid -> gang key, once the owned pods have been keyed (outside the cache's lock)."""
    ext.gangs.membership.settle()
    return ext.gangs.membership._key_of


def jobset_objects() -> tuple[dict, dict, dict]:  # type: ignore[type-arg]
    cr, pods = ri_samples.jobset("llm", rjobs=(("workers", 1, 2),))
    cr["metadata"]["uid"] = "js-uid"
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "llm-workers-0",
            "namespace": cr["metadata"]["namespace"],
            "uid": "job-uid",
            "ownerReferences": [
                {
                    "apiVersion": "jobset.x-k8s.io/v1alpha2",
                    "kind": "JobSet",
                    "name": "llm",
                    "uid": "js-uid",
                    "controller": True,
                }
            ],
        },
    }
    pod = copy.deepcopy(pods[0])
    pod["metadata"]["ownerReferences"][0]["uid"] = "job-uid"
    return cr, job, pod


def test_a_pod_finds_its_jobset_through_its_job(ext: Extender) -> None:
    cr, job, pod = jobset_objects()
    ext._ri_event(JOBSET, "ADDED", cr)
    ext._ri_event(JOB, "ADDED", job)
    ext.cache.pod_event("ADDED", pod)
    uid = pod["metadata"]["uid"]
    assert keyed(ext)[uid] == f"ri:{cr['metadata']['namespace']}/llm/jobset/llm"


def test_a_pod_seen_before_its_job_waits_and_is_re_keyed_when_the_job_arrives(ext: Extender) -> None:
    """A lagging watch must never let a member be scheduled alone."""
    cr, job, pod = jobset_objects()
    ext._ri_event(JOBSET, "ADDED", cr)
    ext.cache.pod_event("ADDED", pod)
    uid = pod["metadata"]["uid"]
    assert keyed(ext)[uid].startswith("ri-wait:")
    info = ext.cache.pod(uid)
    answer = ext.gangs.filter(info, ["n0"])
    assert answer is not None and answer.passed == [] and "waiting for owner" in answer.message
    ext._ri_event(JOB, "ADDED", job)
    assert keyed(ext)[uid].startswith("ri:")


def test_the_gang_takes_the_topology_a_member_states_whichever_member_resolves_it(ext: Extender) -> None:
    """An MPI launcher or a Ray head states no topology while its workers do: the gang is in one
    rack whether the launcher or a worker is resolved first."""
    cr, job, first = jobset_objects()
    second = copy.deepcopy(first)
    second["metadata"] |= {"name": "llm-workers-0-1", "uid": "pod-2"}
    second["metadata"].setdefault("annotations", {})["kai.scheduler/topology-required-placement"] = "rack"
    ext._ri_event(JOBSET, "ADDED", cr)
    ext._ri_event(JOB, "ADDED", job)
    for obj in (first, second):
        ext.cache.pod_event("ADDED", obj)
    key = keyed(ext)[first["metadata"]["uid"]]
    members = [ext.cache.pod(first["metadata"]["uid"]), ext.cache.pod("pod-2")]
    assert all(members)
    for resolving in members:
        assert resolving is not None
        resolution = ext.ri.resolve(resolving, key, [m for m in members if m is not None])
        assert resolution.spec is not None and resolution.spec.topology.required == "rack"


def test_plain_pods_and_pods_of_unwatched_owners_are_not_gang_members(ext: Extender) -> None:
    _, _, pod = jobset_objects()
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ReplicationController", "name": "x", "uid": "rc"}
    ]
    ext.cache.pod_event("ADDED", pod)
    assert pod["metadata"]["uid"] not in keyed(ext)


WIDGET = {
    "name": "Widget",
    "group": "example.com",
    "resourceInterfaces": [
        {
            "structureDefinition": {
                "rootComponent": {
                    "name": "widget",
                    "kind": {"group": "example.com", "version": "v1", "kind": "Widget"},
                    "statusDefinition": {
                        "statusMappings": {"running": [{"byConditions": [{"type": "Ready", "status": "True"}]}]}
                    },
                }
            }
        }
    ],
}


def test_configmap_entries_register_types_and_a_broken_one_keeps_the_last_good(ext: Extender) -> None:
    warnings: list[str] = []
    ext.workload_types.warn = warnings.append
    key = KEY_PREFIX + "example.com.Widget.yaml"
    ext.workload_types.sync({key: yaml.safe_dump(WIDGET)})
    assert ext.registry.get("Widget") is not None
    broken = copy.deepcopy(WIDGET)
    del broken["resourceInterfaces"][0]["structureDefinition"]["rootComponent"]["kind"]["version"]
    ext.workload_types.sync({key: yaml.safe_dump(broken)})
    assert ext.registry.get("Widget") is not None, "the last good definition stays"
    assert warnings and "kind.version" in warnings[0] and key in warnings[0]
    ext.workload_types.sync({})
    assert ext.registry.get("Widget") is None


def test_an_empty_configmap_entry_hides_a_shipped_type(ext: Extender) -> None:
    assert ext.registry.get("PyTorchJob") is not None
    key = KEY_PREFIX + "kubeflow.org.PyTorchJob.yaml"
    ext.workload_types.sync({key: ""})
    assert ext.registry.get("PyTorchJob") is None
    ext.workload_types.sync({})
    assert ext.registry.get("PyTorchJob") is not None


def test_the_api_rejects_invalid_bodies_with_every_violation_and_unknown_names(ext: Extender) -> None:
    status, body = ext.workload_types.api(
        "POST", "", b'{"name": "Widget", "group": "example.com", "resourceInterfaces": [{}]}'
    )
    assert status == 400 and body["violations"] and all("path" in v for v in body["violations"])
    assert ext.workload_types.api("GET", "/Gadget", b"")[0] == 404
    assert ext.workload_types.api("DELETE", "/Gadget", b"")[0] == 404
    status, body = ext.workload_types.api("GET", "", b"")
    assert status == 200 and {"PyTorchJob", "JobSet", "LeaderWorkerSet"} <= {t["name"] for t in body["workloadTypes"]}


def test_resource_interface_jq_never_runs_under_the_cache_lock(ext: Extender) -> None:
    """User-supplied jq may be slow: keying owned pods must not stall the cache (and so every
    verb) while it runs."""
    cr, job, pod = jobset_objects()
    ext._ri_event(JOBSET, "ADDED", cr)
    ext._ri_event(JOB, "ADDED", job)
    held: list[bool] = []
    real = ext.ri.key

    def key(info: Any) -> str:
        held.append(ext.cache._lock._is_owned())  # type: ignore[attr-defined]
        return real(info)

    ext.ri.key = key  # type: ignore[method-assign]
    ext.cache.pod_event("ADDED", pod)
    assert keyed(ext)[pod["metadata"]["uid"]].startswith("ri:")
    assert held and not any(held)


def test_members_of_a_definition_switched_off_for_its_budget_wait_and_are_never_bound_alone(ext: Extender) -> None:
    cr, job, pod = jobset_objects()
    ext._ri_event(JOBSET, "ADDED", cr)
    ext._ri_event(JOB, "ADDED", job)
    ri = ext.registry.lookup("jobset.x-k8s.io", "v1alpha2", "JobSet")
    assert ri is not None
    ri.breaker.tripped_because = "test: over budget"
    ext.cache.pod_event("ADDED", pod)
    info = ext.cache.pod(pod["metadata"]["uid"])
    answer = ext.gangs.filter(info, ["n0"])
    assert answer is not None and answer.passed == [] and "time budget" in answer.message


def test_a_pod_deleted_while_it_is_rekeyed_is_not_indexed_again(ext: Extender) -> None:
    cr, job, pod = jobset_objects()
    ext._ri_event(JOBSET, "ADDED", cr)
    ext._ri_event(JOB, "ADDED", job)
    ext.cache.pod_event("ADDED", pod)
    uid = pod["metadata"]["uid"]
    stale = ext.cache.pod(uid)
    ext.cache.pod_event("DELETED", pod)
    membership = ext.gangs.membership
    membership._pod_changed(stale, stale)  # a rekey that read the pod just before it was deleted
    membership.settle()
    assert uid not in membership._key_of and not any(uid in m for m in membership._members.values())


def test_pods_no_resource_interface_could_take_are_keyed_at_once(ext: Extender) -> None:
    pod = {
        "metadata": {
            "name": "web-1",
            "namespace": "default",
            "uid": "ds-pod",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "web", "uid": "ds"}],
        },
        "spec": {"containers": [{"name": "c"}]},
        "status": {"phase": "Pending"},
    }
    ext.cache.pod_event("ADDED", pod)
    assert "ds-pod" not in ext.gangs.membership._unkeyed  # no jq ever runs for it


def test_a_pod_group_gang_takes_the_topology_another_member_states(ext: Extender) -> None:
    """The same for a coscheduling PodGroup without topology of its own: a launcher without
    the KAI annotation resolves to the rack its workers ask for."""
    ext.gang_objects.replace(
        COSCHEDULING_POD_GROUP, [{"metadata": {"name": "mpi", "namespace": "default"}, "spec": {"minMember": 2}}]
    )
    launcher = pod("launcher")
    worker = pod("worker", gpus=8, annotations={"kai.scheduler/topology-required-placement": "rack"})
    for p in (launcher, worker):
        p["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "mpi"}
        ext.cache.pod_event("ADDED", p)
    ext.gangs.membership.settle()
    for p in (launcher, worker):
        info = ext.cache.pod(p["metadata"]["uid"])
        assert info is not None
        resolved = ext.gangs._resolve(info)
        assert resolved is not None and resolved[1].spec is not None
        assert resolved[1].spec.topology.required == "rack", p["metadata"]["name"]


def test_the_stated_topology_is_computed_once_per_change_of_the_members(
    ext: Extender, monkeypatch: pytest.MonkeyPatch
) -> None:
    """filter resolves a gang per call: the members are scanned again only when they changed."""
    ext.gang_objects.replace(
        COSCHEDULING_POD_GROUP, [{"metadata": {"name": "g", "namespace": "default"}, "spec": {"minMember": 2}}]
    )
    first, second = pod("a"), pod("b", annotations={"kai.scheduler/topology-required-placement": "rack"})
    for p in (first, second):
        p["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "g"}
        ext.cache.pod_event("ADDED", p)
    membership = ext.gangs.membership
    scans = 0
    member_pods = membership.member_pods

    def counting(key: str) -> list[Any]:
        nonlocal scans
        scans += 1
        return member_pods(key)

    monkeypatch.setattr(membership, "member_pods", counting)
    info = ext.cache.pod("uid-a")
    assert info is not None
    for _ in range(5):
        resolved = ext.gangs._resolve(info)
        assert resolved is not None and resolved[1].spec is not None and resolved[1].spec.topology.required == "rack"
    assert scans == 1
    second["metadata"]["annotations"] = {}  # the worker no longer asks for a rack
    second["metadata"]["resourceVersion"] = "2"
    ext.cache.pod_event("MODIFIED", second)
    resolved = ext.gangs._resolve(info)
    assert resolved is not None and resolved[1].spec is not None and not resolved[1].spec.topology.any
    assert scans == 2
