"""The extender serving a real kube-scheduler on the real local control plane.

Every placement here is made by kube-scheduler calling Phalanx over HTTP and bound by Phalanx;
the tests read the results back from the API server. Waits poll with generous deadlines.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.local.cluster import LocalCluster
from extender.app import Extender, Options
from extender.kube import RestKube
from extender.objects import DEVICES_ANNOTATION

pytestmark = pytest.mark.e2e

NS = "default"
NODE = "gpu-b0-r1-n03"  # pinned by nodeSelector so device sharing is observable
DEADLINE_S = 90


def wait(what: str, probe: Callable[[], Any], deadline_s: float = DEADLINE_S) -> Any:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {deadline_s}s waiting for {what}")


def start_extender(kube: RestKube, *, port: int = 0, journal: Path | None = None) -> Extender:
    extender = Extender(kube, Options(port=port, bind_journal=journal))
    extender.start()
    wait("extender ready", extender.ready)
    return extender


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster) -> RestKube:
    return RestKube.from_kubeconfig(str(cluster.kubeconfig_path))


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the extender journals the binds it answers before they land, as the chart runs it."""
    return tmp_path_factory.mktemp("extender") / "binds.jsonl"


@pytest.fixture(scope="module")
def extender(cluster: LocalCluster, kube: RestKube, journal: Path) -> Iterator[dict[str, Extender]]:
    holder = {"current": start_extender(kube, journal=journal)}
    # The scheduler keeps calling the same URL across an extender restart: fix the port.
    cluster.restart_scheduler(holder["current"].server.url)
    yield holder
    cluster.restart_scheduler(None)
    holder["current"].stop()
    for p in pods(kube, "e2e-extender"):
        kube.request(
            "DELETE", f"/api/v1/namespaces/{NS}/pods/{p['metadata']['name']}", query={"gracePeriodSeconds": "0"}
        )


def pod(
    name: str, *, annotations: dict[str, str] | None = None, limits: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"suite": "e2e-extender"}, "annotations": annotations or {}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {"name": "c", "image": "x", "resources": {"limits": limits or {}, "requests": {"cpu": "100m"}}}
            ],
        },
    }


def create(kube: RestKube, body: dict[str, Any]) -> None:
    r = kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=body)
    assert r.status == 201, r.body


def pods(kube: RestKube, suite: str) -> list[dict[str, Any]]:
    r = kube.request("GET", f"/api/v1/namespaces/{NS}/pods", query={"labelSelector": f"suite={suite}"})
    return list(r.body["items"])


def get(kube: RestKube, name: str) -> dict[str, Any]:
    return dict(kube.request("GET", f"/api/v1/namespaces/{NS}/pods/{name}").body)


def bound(kube: RestKube, name: str) -> dict[str, Any] | None:
    p = get(kube, name)
    return p if p["spec"].get("nodeName") else None


def devices(p: dict[str, Any]) -> list[dict[str, Any]]:
    return list(json.loads(p["metadata"]["annotations"][DEVICES_ANNOTATION]))


def usage_by_device(kube: RestKube) -> dict[int, int]:
    per: dict[int, int] = defaultdict(int)
    for p in pods(kube, "e2e-extender"):
        if p["spec"].get("nodeName") == NODE and DEVICES_ANNOTATION in p["metadata"].get("annotations", {}):
            for d in devices(p):
                per[d["index"]] += d["milli"]
    return dict(per)


def failed_scheduling(kube: RestKube, name: str) -> list[str]:
    r = kube.request("GET", f"/api/v1/namespaces/{NS}/events", query={"fieldSelector": f"involvedObject.name={name}"})
    return [e["message"] for e in r.body["items"] if e["reason"] == "FailedScheduling"]


def test_fractional_pods_share_a_gpu_without_exceeding_it(extender: dict[str, Extender], kube: RestKube) -> None:
    for i in range(4):
        create(kube, pod(f"frac-{i}", annotations={"gpu-fraction": "0.3"}))
    placed = [wait(f"frac-{i} bound", lambda i=i: bound(kube, f"frac-{i}")) for i in range(4)]
    used = usage_by_device(kube)
    assert all(milli <= 1000 for milli in used.values()), used
    # Packed onto two devices (the fragmentation measure or best fit decides which shares go
    # where), never spread over four.
    assert len(used) == 2 and sum(used.values()) == 1200, used
    assert all(p["spec"]["nodeName"] == NODE for p in placed)


def test_whole_gpu_pods_never_land_on_a_shared_gpu(extender: dict[str, Extender], kube: RestKube) -> None:
    wait("shares placed", lambda: len(usage_by_device(kube)) == 2)
    shared = set(usage_by_device(kube))
    create(kube, pod("whole-6", limits={"nvidia.com/gpu": "6"}))
    placed = wait("whole-6 bound", lambda: bound(kube, "whole-6"))
    indices = {d["index"] for d in devices(placed)}
    assert len(indices) == 6 and not indices & shared


def test_a_pod_that_fits_nowhere_stays_pending_with_our_reason(extender: dict[str, Extender], kube: RestKube) -> None:
    create(kube, pod("too-much-memory", annotations={"gpu-memory": "100000"}))
    messages = wait("FailedScheduling event", lambda: failed_scheduling(kube, "too-much-memory"))
    assert any("no GPU has the requested share free" in m for m in messages), messages
    assert not get(kube, "too-much-memory")["spec"].get("nodeName")


def restart(
    extender: dict[str, Extender], kube: RestKube, journal: Path, between: Callable[[], None] = lambda: None
) -> Extender:
    """Stop the extender, run `between`, start a fresh one at the same URL and journal."""
    url = extender["current"].server.url
    extender["current"].stop()
    between()
    extender["current"] = fresh = start_extender(kube, port=int(url.rsplit(":", 1)[1]), journal=journal)
    return fresh


def test_restarted_extender_keeps_every_device_assignment(
    extender: dict[str, Extender], kube: RestKube, journal: Path
) -> None:
    wait("whole-6 bound", lambda: bound(kube, "whole-6"))
    before = extender["current"].cache.node_model(NODE)
    fresh = restart(extender, kube, journal)
    after = fresh.cache.node_model(NODE)
    assert before is not None and after is not None
    assert [(d.index, d.free_milli, d.free_memory_mib) for d in after.gpus] == [
        (d.index, d.free_milli, d.free_memory_mib) for d in before.gpus
    ]
    # And it keeps scheduling against that accounting: one more share fits only on a shared device.
    create(kube, pod("frac-after-restart", annotations={"gpu-fraction": "0.1"}))
    placed = wait("frac-after-restart bound", lambda: bound(kube, "frac-after-restart"))
    used = usage_by_device(kube)
    assert devices(placed)[0]["index"] in used and all(m <= 1000 for m in used.values())


def test_a_bind_answered_but_not_landed_before_a_restart_is_landed_by_the_next_extender(
    extender: dict[str, Extender], kube: RestKube, journal: Path
) -> None:
    """The extender answered kube-scheduler's bind (which then keeps the pod assumed on its node
    for good) and stopped before the Binding landed: the journal line it wrote first is all
    that is left, and the next extender lands it. The pod names a scheduler nobody runs, so
    only that journal line can bind it."""
    body = pod("answered-then-restarted")
    body["spec"]["schedulerName"] = "nobody"
    create(kube, body)
    uid = get(kube, "answered-then-restarted")["metadata"]["uid"]
    wait("the watch has the pod", lambda: extender["current"].cache.pod(uid) is not None)

    def answered_not_landed() -> None:
        with journal.open("ab") as f:
            line = {"uid": uid, "namespace": NS, "name": "answered-then-restarted", "node": NODE, "record": ""}
            f.write(json.dumps(line).encode() + b"\n")

    fresh = restart(extender, kube, journal, answered_not_landed)
    assert (
        wait("the journalled bind landed", lambda: bound(kube, "answered-then-restarted"))["spec"]["nodeName"] == NODE
    )
    assert fresh.landings is not None
    wait(
        "the journal has nothing open", lambda: fresh.landings is not None and fresh.landings.journal.open_count() == 0
    )
