"""The allocation API (extender/api) with a real HTTP client against the local cluster: jobs
placed as gangs, status, boost, cancel; list and watch against the API server's own view; a
watch resumed across an extender restart; 422 proofs; dry runs; 409; 429; drains that follow
gangs; and a fuzz of the endpoints.

The cluster (config/cluster.yaml): blocks b0 and b1 of 4 racks x 8 nodes x 8 GPUs. Each test
confines its pods to racks of its own with a node selector, and deletes what it made.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.local.cluster import LocalCluster
from extender.api.core import RateLimiter
from extender.app import Extender, Options
from extender.kube import RestKube
from tests.e2e import crds
from tests.e2e.test_extender import wait

pytestmark = pytest.mark.e2e

NS = "default"
RACK = "topology.phalanx.io/rack"
WORKLOADS = f"/apis/phalanx.io/v1alpha1/namespaces/{NS}/workloads"
QUEUES = "/apis/phalanx.io/v1alpha1/queues"
CONFIG = {"api": {"requestsPerMinute": 6_000_000, "burst": 1_000_000, "maxInFlight": 256}}


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster) -> RestKube:
    k = RestKube.from_kubeconfig(str(cluster.kubeconfig_path))
    crds.install(k, NS)
    return k


def start(kube: RestKube, config: Path) -> Extender:
    ext = Extender(kube, Options(port=0, config_file=config))
    ext.start()
    wait("extender ready", ext.ready)
    return ext


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("api") / "config.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


@pytest.fixture(scope="module")
def extender(cluster: LocalCluster, kube: RestKube, config_file: Path) -> Iterator[dict[str, Any]]:
    holder: dict[str, Any] = {"ext": start(kube, config_file)}
    cluster.restart_scheduler(holder["ext"].server.url)
    yield holder
    cluster.restart_scheduler(None)
    holder["ext"].stop()


class Client:
    """A plain HTTP client: what a tenant's script would use."""

    def __init__(self, base: str, token: str) -> None:
        self.base = base
        self.token = token

    def call(
        self, method: str, path: str, body: Any = None, *, token: str | None = None, raw: bytes | None = None
    ) -> tuple[int, Any, dict[str, str]]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.base + path, data=data, method=method)
        tok = self.token if token is None else token
        if tok:
            req.add_header("Authorization", f"Bearer {tok}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                text = r.read()
                if r.headers.get("Content-Type") == "text/event-stream":
                    return r.status, text.decode(), dict(r.headers)
                return r.status, json.loads(text) if text else None, dict(r.headers)
        except urllib.error.HTTPError as e:
            text = e.read()
            try:
                parsed = json.loads(text) if text else None
            except ValueError:
                parsed = text.decode(errors="replace")
            return e.code, parsed, dict(e.headers)


@pytest.fixture(scope="module")
def client(extender: dict[str, Any], kube: RestKube) -> Client:
    token = kube.headers["Authorization"].split(" ", 1)[1]
    return Client(extender["ext"].server.url, token)


@pytest.fixture
def cleanup(kube: RestKube) -> Iterator[list[str]]:
    suites: list[str] = []
    yield suites
    for suite in suites:
        crds.delete_suite(kube, NS, suite)


def pods(kube: RestKube, selector: str) -> list[dict[str, Any]]:
    return kube.request("GET", f"/api/v1/namespaces/{NS}/pods", query={"labelSelector": selector}).body["items"]


def job(name: str, suite: str, racks: list[str], *, n: int = 4, gpus: int = 8, required: str = RACK) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": RACK, "operator": "In", "values": racks}]}
    return {
        "metadata": {"name": name, "labels": {"suite": suite}},
        "spec": {
            "parallelism": n,
            "priority": 100,
            "template": {
                "metadata": {"labels": {"suite": suite}},
                "spec": {
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(gpus)}},
                    "scheduling": {
                        "gangScheduling": {"minMembers": n, "timeout": "600s"},
                        "affinity": {"nodeAffinity": {"requiredDuringScheduling": {"nodeSelectorTerms": [term]}}},
                        "topology": {"required": required},
                    },
                },
            },
        },
    }


def all_bound(kube: RestKube, suite: str, count: int) -> list[dict[str, Any]] | None:
    """The suite's pods once there are `count` and all have a node (None until then)."""
    found = pods(kube, f"suite={suite}")
    return found if len(found) == count and all(p["spec"].get("nodeName") for p in found) else None


def rack_of(kube: RestKube, node: str) -> str:
    return str(kube.request("GET", f"/api/v1/nodes/{node}").body["metadata"]["labels"][RACK])


def test_a_job_is_placed_as_a_gang_then_boosted_and_cancelled(
    client: Client, kube: RestKube, cleanup: list[str]
) -> None:
    cleanup.append("api-job")
    status, body, _ = client.call("POST", f"/api/v1/namespaces/{NS}/jobs", job("train", "api-job", ["b0-r0", "b0-r1"]))
    assert status == 201, body
    assert body["status"]["phase"] == "Queued" and body["status"]["members"] == 4

    def placed() -> Any:
        s, b, _ = client.call("GET", f"/api/v1/namespaces/{NS}/jobs/train/status")
        return b if s == 200 and b["status"]["phase"] == "Running" else None

    b = wait("job running", placed, 60)
    nodes = {a["node"] for a in b["status"]["allocations"]}
    assert len(nodes) == 4 and len({rack_of(kube, n) for n in nodes}) == 1, b
    live = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods(kube, "suite=api-job")}
    assert live == {a["name"]: a["node"] for a in b["status"]["allocations"]}

    s, boosted, _ = client.call(
        "POST",
        f"/api/v1/namespaces/{NS}/jobs/train/boost",
        {"newPriority": 500, "duration": "3s", "reason": "incident"},
    )
    assert s == 200 and boosted["previousPriority"] == 100 and boosted["newPriority"] == 500, boosted
    workload = kube.request("GET", f"{WORKLOADS}/train").body
    assert workload["spec"]["gangGroups"][0]["priority"] == 500
    wait(
        "status shows the boost",
        lambda: client.call("GET", f"/api/v1/namespaces/{NS}/jobs/train")[1]["status"].get("boost"),
    )

    wait(  # the boost runs out: the priority it had comes back
        "boost expired",
        lambda: kube.request("GET", f"{WORKLOADS}/train").body["spec"]["gangGroups"][0]["priority"] == 100,
        30,
    )
    s, dry, _ = client.call("POST", f"/api/v1/namespaces/{NS}/jobs/train/cancel?dryRun=All", {})
    assert s == 200 and len(dry["status"]["wouldDelete"]) == 4 and len(pods(kube, "suite=api-job")) == 4, dry
    s, cancelled, _ = client.call("POST", f"/api/v1/namespaces/{NS}/jobs/train/cancel", {"gracePeriodSeconds": 0})
    assert s == 200 and cancelled["status"]["phase"] == "Cancelling", cancelled
    wait("job's pods gone", lambda: not pods(kube, "suite=api-job"))
    wait("job gone", lambda: client.call("GET", f"/api/v1/namespaces/{NS}/jobs/train/status")[0] == 404)


def test_a_gang_that_can_never_fit_gets_422_with_the_explanation(
    client: Client, kube: RestKube, cleanup: list[str]
) -> None:
    cleanup.append("api-never")
    too_big = job("too-big", "api-never", ["b1-r0"], n=9)  # 9 x 8 GPUs in one rack of 8 nodes x 8
    status, body, _ = client.call("POST", f"/api/v1/namespaces/{NS}/jobs", too_big)
    assert status == 422, body
    assert body["kind"] == "Status" and body["reason"] == "Unschedulable"
    assert "never" in body["message"], body
    assert "needs 72 GPUs (9 pods); eligible nodes have room for 64 GPUs" in body["details"]["explanation"], body
    assert not pods(kube, "suite=api-never") and kube.request("GET", f"{WORKLOADS}/too-big").status == 404
    # Enough GPUs in the two racks it may use, but it must be in one: the topology is the proof.
    status, body, _ = client.call(
        "POST", f"/api/v1/namespaces/{NS}/jobs", job("too-wide", "api-never", ["b1-r0", "b1-r1"], n=9)
    )
    assert status == 422, body
    assert "needs 72 GPUs within one rack; the largest rack has 64 GPUs free" in body["details"]["explanation"], body


def test_a_dry_run_returns_the_plan_the_real_submission_then_gets(
    client: Client, kube: RestKube, cleanup: list[str]
) -> None:
    cleanup.append("api-dry")
    spec = job("what-if", "api-dry", ["b1-r1", "b1-r2"], n=6, gpus=4)
    status, body, _ = client.call("POST", f"/api/v1/namespaces/{NS}/jobs?dryRun=All", spec)
    assert status == 200, body
    plan = body["status"]["dryRun"]
    assert plan["placeable"] is True and len(plan["placement"]) == 6, plan
    assert not pods(kube, "suite=api-dry") and kube.request("GET", f"{WORKLOADS}/what-if").status == 404
    status, body, _ = client.call("POST", f"/api/v1/namespaces/{NS}/jobs", spec)
    assert status == 201, body
    bound = wait("all bound", lambda: all_bound(kube, "api-dry", 6), 60)
    assert sorted(p["spec"]["nodeName"] for p in bound) == sorted(plan["placement"].values())


def test_allocations_list_and_watch_agree_with_the_api_server_and_resume_across_a_restart(
    client: Client,
    kube: RestKube,
    extender: dict[str, Any],
    cluster: LocalCluster,
    config_file: Path,
    cleanup: list[str],
) -> None:
    cleanup.append("api-alloc")

    def alloc(name: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "labels": {"suite": "api-alloc"}},
            "spec": {
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "1"}},
                "scheduling": {"nodeSelector": {RACK: "b1-r3"}},
            },
        }

    for i in range(3):
        s, b, _ = client.call("POST", f"/api/v1/namespaces/{NS}/allocations", alloc(f"a-{i}"))
        assert s == 201, b
    wait("bound", lambda: all_bound(kube, "api-alloc", 3), 60)

    def listed() -> dict[str, str] | None:
        s, b, _ = client.call("GET", f"/api/v1/namespaces/{NS}/allocations?labelSelector=suite%3Dapi-alloc&limit=2")
        assert s == 200, b
        items = list(b["items"])
        if "continue" in b["metadata"]:
            s, more, _ = client.call(
                "GET",
                f"/api/v1/namespaces/{NS}/allocations?labelSelector=suite%3Dapi-alloc&continue={b['metadata']['continue']}",
            )
            items += more["items"]
        got = {i["metadata"]["name"]: i["status"].get("nodeName", "") for i in items}
        return got if all(got.values()) and len(got) == 3 else None

    got = wait("list shows the placements", listed, 30)
    assert got == {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods(kube, "suite=api-alloc")}
    s, b, _ = client.call(
        "GET",
        f"/api/v1/namespaces/{NS}/allocations?labelSelector=suite%3Dapi-alloc&fieldSelector=status.nodeName%3D{got['a-0']}",
    )
    assert s == 200 and "a-0" in {i["metadata"]["name"] for i in b["items"]}, b
    rv = client.call("GET", f"/api/v1/namespaces/{NS}/allocations?labelSelector=suite%3Dapi-alloc")[1]["metadata"][
        "resourceVersion"
    ]

    # Changes while the extender restarts; a watch from the listed version sees each once.
    extender["ext"].stop()
    kube.request("DELETE", f"/api/v1/namespaces/{NS}/pods/a-1", query={"gracePeriodSeconds": "0"})
    extender["ext"] = start(kube, config_file)
    cluster.restart_scheduler(extender["ext"].server.url)
    client.base = extender["ext"].server.url
    s, b, _ = client.call("POST", f"/api/v1/namespaces/{NS}/allocations", alloc("a-3"))
    assert s == 201, b
    events = watch(
        client,
        f"/api/v1/namespaces/{NS}/allocations?watch=true&labelSelector=suite%3Dapi-alloc&resourceVersion={rv}&timeoutSeconds=5",
    )
    seen = [
        (e["type"], e["object"]["metadata"]["name"], e["object"]["metadata"]["resourceVersion"])
        for e in events
        if e["type"] != "BOOKMARK"
    ]
    assert ("DELETED", "a-1") in {(t, n) for t, n, _ in seen}, seen
    assert ("ADDED", "a-3") in {(t, n) for t, n, _ in seen}, seen
    assert not any(n in ("a-0", "a-2") for _, n, _ in seen), seen  # unchanged since the list: not repeated
    assert len({r for _, _, r in seen}) == len(seen)  # nothing twice

    # The same from this process's own history (one upstream watch for every watcher).
    listing = client.call("GET", f"/api/v1/namespaces/{NS}/allocations?labelSelector=suite%3Dapi-alloc")[1]
    rv2 = listing["metadata"]["resourceVersion"]
    s, b, _ = client.call("DELETE", f"/api/v1/namespaces/{NS}/allocations/a-2", {"gracePeriodSeconds": 0})
    assert s == 200 and b["status"]["phase"] == "Terminating", b
    wait(
        "a-2 gone",
        lambda: (
            not pods(kube, "metadata.name=a-2")
            and all(p["metadata"]["name"] != "a-2" for p in pods(kube, "suite=api-alloc"))
        ),
    )
    query = "watch=true&labelSelector=suite%3Dapi-alloc&timeoutSeconds=3"
    events = watch(client, f"/api/v1/namespaces/{NS}/allocations?{query}&resourceVersion={rv2}")
    changes = [(e["type"], e["object"]["metadata"]["name"]) for e in events if e["type"] != "BOOKMARK"]
    assert (
        changes and set(changes) <= {("MODIFIED", "a-2"), ("DELETED", "a-2")} and changes[-1] == ("DELETED", "a-2")
    ), changes
    events = watch(client, f"/api/v1/namespaces/{NS}/allocations?{query}")
    assert sorted(e["object"]["metadata"]["name"] for e in events if e["type"] == "ADDED") == ["a-0", "a-3"], events


def watch(client: Client, path: str) -> list[dict[str, Any]]:
    req = urllib.request.Request(client.base + path, headers={"Authorization": f"Bearer {client.token}"})
    events = []
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["Content-Type"] == "text/event-stream"
        for line in r:
            if line.startswith(b"data: "):
                events.append(json.loads(line[6:]))
    return events


def test_a_stale_quota_update_gets_409_and_quota_status_shows_usage(client: Client, kube: RestKube) -> None:
    quota = {"metadata": {"name": "api-team"}, "spec": {"hard": {"nvidia.com/gpu": "100", "cpu": "1000"}}}
    try:
        s, b, _ = client.call("POST", f"/api/v1/namespaces/{NS}/resourcequotas", quota)
        assert s == 201, b
        rv = b["metadata"]["resourceVersion"]
        s, b, _ = client.call(
            "PATCH",
            f"/api/v1/namespaces/{NS}/resourcequotas/api-team",
            {"metadata": {"resourceVersion": rv}, "spec": {"hard": {"nvidia.com/gpu": "150"}}},
        )
        assert s == 200 and b["spec"]["hard"]["nvidia.com/gpu"] == "150", b
        s, b, _ = client.call(
            "PATCH",
            f"/api/v1/namespaces/{NS}/resourcequotas/api-team",
            {"metadata": {"resourceVersion": rv}, "spec": {"hard": {"nvidia.com/gpu": "10"}}},
        )
        assert s == 409 and b["reason"] == "Conflict" and b["message"], b
        s, b, _ = client.call("GET", f"/api/v1/namespaces/{NS}/resourcequotas/api-team/status")
        assert s == 200 and b["status"]["hard"]["nvidia.com/gpu"] == "150", b
        s, b, _ = client.call(
            "POST",
            f"/api/v1/namespaces/{NS}/resourcequotas",
            {"metadata": {"name": "x"}, "spec": {"hard": {"pods": "5", "gpu": "x"}}},
        )
        assert s == 400 and {c["field"] for c in b["details"]["causes"]} >= {"spec.hard.gpu"}, b
    finally:
        kube.request("DELETE", f"{QUEUES}/api-team")
        kube.request(
            "PATCH",
            f"/api/v1/namespaces/{NS}",
            body={"metadata": {"labels": {"phalanx.io/queue": None}}},
            content_type="application/merge-patch+json",
        )


def test_a_burst_above_the_limit_gets_429_with_its_headers(client: Client, extender: dict[str, Any]) -> None:
    api = extender["ext"].api
    saved = api.limiter
    api.limiter = RateLimiter(per_minute=60, burst=5)
    try:
        codes = [client.call("GET", "/api/v1/namespaces/burst/allocations") for _ in range(12)]
    finally:
        api.limiter = saved
    refused = [c for c in codes if c[0] == 429]
    assert len(refused) >= 6, [c[0] for c in codes]
    _, body, headers = refused[0]
    assert body["reason"] == "TooManyRequests" and "burst" in body["message"]
    assert (
        headers["X-RateLimit-Limit"] == "60"
        and headers["X-RateLimit-Remaining"] == "0"
        and int(headers["Retry-After"]) >= 1
    )


def test_errors_are_statuses_naming_the_fields(client: Client) -> None:
    s, b, _ = client.call(
        "POST",
        f"/api/v1/namespaces/{NS}/allocations",
        {"metadata": {"name": "Bad_Name"}, "spec": {"resources": {"requests": {"cpu": "lots"}}, "extra": 1}},
    )
    assert s == 400 and b["kind"] == "Status"
    assert {c["field"] for c in b["details"]["causes"]} == {
        "metadata.name",
        "spec.resources.requests.cpu",
        "spec.extra",
    }, b
    s, b, _ = client.call("GET", f"/api/v1/namespaces/{NS}/allocations", token="")
    assert s == 401 and b["reason"] == "Unauthorized", b
    s, b, _ = client.call("GET", f"/api/v1/namespaces/{NS}/allocations/nope")
    assert s == 404 and b["reason"] == "NotFound", b
    s, b, _ = client.call("GET", "/openapi.json", token="")
    assert s == 200 and "/api/v1/namespaces/{namespace}/jobs" in b["paths"] and "Job" in b["components"]["schemas"]


def test_a_drain_of_a_node_holding_a_gang_member_evicts_the_whole_gang_and_requeues_it(
    client: Client, kube: RestKube, cleanup: list[str]
) -> None:
    cleanup.append("api-drain")
    s, b, _ = client.call("POST", f"/api/v1/namespaces/{NS}/jobs", job("drained", "api-drain", ["b1-r2"], n=2))
    assert s == 201, b
    bound = wait("bound", lambda: all_bound(kube, "api-drain", 2), 60)
    node = bound[0]["spec"]["nodeName"]
    first = {p["metadata"]["uid"] for p in bound}
    try:
        s, b, _ = client.call("POST", f"/api/v1/nodes/{node}/drain", {"reason": "maintenance", "gracePeriodSeconds": 0})
        assert s == 200 and b["gangPolicy"] == "EvictGang", b

        def requeued() -> Any:  # both members evicted, both made again, placed as a gang elsewhere
            ps = pods(kube, "suite=api-drain")
            fresh = [p for p in ps if p["metadata"]["uid"] not in first]
            return len(ps) == 2 and len(fresh) == 2 and all(p["spec"].get("nodeName") for p in fresh) and fresh

        again = wait("gang evicted and requeued", requeued, 90)
        assert node not in {p["spec"]["nodeName"] for p in again}
        assert len({rack_of(kube, p["spec"]["nodeName"]) for p in again}) == 1
        s, b, _ = client.call("GET", f"/api/v1/nodes/{node}/drain")
        assert s == 200 and b["progress"]["evicted"] == 2 and list(b["requeued"]) == [f"{NS}/drained"], b
        s, b, _ = client.call("GET", f"/api/v1/nodes/{node}/evictions")
        assert s == 200 and {i["allocation"] for i in b["items"]} >= {bound[0]["metadata"]["name"]}, b
        assert kube.request("GET", f"/api/v1/nodes/{node}").body["spec"].get("unschedulable") is True
        s, status, _ = client.call("GET", f"/api/v1/namespaces/{NS}/jobs/drained/status")
        assert s == 200 and status["status"]["phase"] == "Running", status
    finally:
        s, b, _ = client.call("PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": False}})
        assert s == 200, b


def test_fuzz_10000_requests_no_crash_no_5xx_every_4xx_explained(client: Client) -> None:
    rng = random.Random(7)
    paths = [
        "/api/v1/namespaces/{ns}/allocations",
        "/api/v1/namespaces/{ns}/allocations/{name}",
        "/api/v1/namespaces/{ns}/allocations/bulk-release",
        "/api/v1/namespaces/{ns}/jobs",
        "/api/v1/namespaces/{ns}/jobs/{name}/status",
        "/api/v1/namespaces/{ns}/jobs/{name}/boost",
        "/api/v1/namespaces/{ns}/jobs/{name}/cancel",
        "/api/v1/namespaces/{ns}/resourcequotas",
        "/api/v1/namespaces/{ns}/resourcequotas/{name}",
        "/api/v1/namespaces/{ns}/preemptions",
        "/api/v1/nodes/{name}",
        "/api/v1/nodes/{name}/drain",
        "/api/v1/nodes/{name}/evictions",
        "/api/v1/metrics/cluster/utilization",
        "/api/v1/metrics/tenants/{ns}/usage?period={name}",
        "/api/v1/metrics/queues",
    ]
    seeds = [
        job("fz", "fuzz", ["b0-r3"], n=2),
        {"metadata": {"name": "fz"}, "spec": {"resources": {"requests": {"cpu": "1"}}}},
        {"newPriority": 5},
        {"labelSelector": "suite=fuzz-none"},
        {"spec": {"unschedulable": "x"}},
        {"targetAllocation": "nope"},
    ]
    names = ["fz", "x", "", "..", "%00", "a" * 300, "UPPER", "nope", "ns-fuzz"]
    bad: list[Any] = []
    lock = threading.Lock()

    def mutate(doc: Any, depth: int = 0) -> Any:
        if isinstance(doc, dict) and doc and depth < 6:
            key = rng.choice(list(doc))
            choice = rng.random()
            out = dict(doc)
            if choice < 0.3:
                out[key] = mutate(doc[key], depth + 1)
            elif choice < 0.5:
                out[key] = rng.choice([None, -1, 10**12, "", "x" * 5000, [], {}, 1.5, True, "300x"])
            elif choice < 0.6:
                del out[key]
            else:
                out[rng.choice(["extra", key + "x", "$ref"])] = rng.choice([1, "a", {}])
            return out
        return rng.choice([doc, None, 0, "", [doc], {"a": doc}])

    def one(i: int) -> None:
        method = rng.choice(["GET", "POST", "PATCH", "DELETE", "PUT"])
        path = (
            rng.choice(paths)
            .replace("{ns}", rng.choice(["ns-fuzz", "Bad", "x" * 70]))
            .replace("{name}", rng.choice(names))
        )
        if rng.random() < 0.1:
            path += rng.choice(
                [
                    "?dryRun=All",
                    "?dryRun=x",
                    "?limit=-1",
                    "?continue=!!",
                    "?watch=true&timeoutSeconds=1&resourceVersion=1",
                    "?fieldSelector=foo%3Dbar",
                    "?labelSelector=%28",
                ]
            )
        r = rng.random()
        raw = None
        body: Any = None
        if r < 0.1:
            raw = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
        elif r < 0.8:
            body = mutate(rng.choice(seeds))
        s, b, _ = client.call(method, path, body, raw=raw, token=client.token if rng.random() > 0.05 else "bogus")
        ok = s < 500 or s == 503
        if 400 <= s < 500 and not (isinstance(b, dict) and b.get("message")):
            ok = False
        if not ok:
            with lock:
                bad.append((method, path, s, str(b)[:300]))

    count = 10_000
    started = time.monotonic()
    threads = [threading.Thread(target=lambda k=k: [one(k * 10_000 + j) for j in range(count // 8)]) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad, bad[:10]
    print(f"fuzz: {count} requests in {time.monotonic() - started:.1f} s")


def service_account_token(kube: RestKube, name: str, rules: list[dict[str, Any]]) -> str:
    """A real service account's token, with a namespaced Role of `rules`."""
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": NS}}
    assert kube.request("POST", f"/api/v1/namespaces/{NS}/serviceaccounts", body=sa).status in (201, 409)
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name}, "rules": rules}
    assert kube.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/roles", body=role).status in (
        201,
        409,
    )
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NS}],
    }
    r = kube.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings", body=binding)
    assert r.status in (201, 409)
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}}
    r = kube.request("POST", f"/api/v1/namespaces/{NS}/serviceaccounts/{name}/token", body=request)
    assert r.status == 201, r.body
    return str(r.body["status"]["token"])


def test_the_api_never_does_more_than_the_callers_rbac_allows(
    client: Client, kube: RestKube, cleanup: list[str]
) -> None:
    """A reader may list but not submit; a caller allowed Workloads but not pods gets the API
    server's refusal of the pods, and the half-made job is removed again."""
    cleanup.append("api-rbac")
    reader = service_account_token(
        kube, "api-reader", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    )
    s, b, _ = client.call("GET", f"/api/v1/namespaces/{NS}/allocations?limit=1", token=reader)
    assert s == 200, b
    s, b, _ = client.call(
        "POST", f"/api/v1/namespaces/{NS}/jobs", job("sneaky", "api-rbac", ["b0-r3"], n=1), token=reader
    )
    assert s == 403 and "api-reader" in b["message"], b
    half = service_account_token(
        kube,
        "api-half",
        [
            {"apiGroups": ["phalanx.io"], "resources": ["workloads"], "verbs": ["create", "get", "delete", "list"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "deletecollection"]},
        ],
    )
    s, b, _ = client.call("POST", f"/api/v1/namespaces/{NS}/jobs", job("half", "api-rbac", ["b0-r3"], n=1), token=half)
    assert s == 403 and "removed again" in b["message"], b
    assert not pods(kube, "suite=api-rbac")
    wait("half-made Workload removed", lambda: kube.request("GET", f"{WORKLOADS}/half").status == 404)


def test_a_request_over_its_quota_gets_403_naming_quota_resource_limit_and_usage(
    client: Client, kube: RestKube, cleanup: list[str]
) -> None:
    cleanup.append("api-quota")
    try:
        s, b, _ = client.call(
            "POST",
            f"/api/v1/namespaces/{NS}/resourcequotas",
            {"metadata": {"name": "api-small"}, "spec": {"hard": {"nvidia.com/gpu": "8"}}},
        )
        assert s == 201, b
        alloc = {
            "metadata": {"name": "q-0", "labels": {"suite": "api-quota"}},
            "spec": {
                "queue": "api-small",
                "resources": {"requests": {"nvidia.com/gpu": "8"}},
                "scheduling": {"nodeSelector": {RACK: "b0-r3"}},
            },
        }
        s, b, _ = client.call("POST", f"/api/v1/namespaces/{NS}/allocations", alloc)
        assert s == 201, b
        wait("bound", lambda: all_bound(kube, "api-quota", 1), 60)
        wait(
            "usage counted",
            lambda: (
                client.call("GET", f"/api/v1/namespaces/{NS}/resourcequotas/api-small/status")[1]["status"][
                    "utilization"
                ].get("nvidia.com/gpu")
                == "100%"
            ),
        )
        alloc["metadata"]["name"] = "q-1"
        alloc["spec"]["resources"]["requests"]["nvidia.com/gpu"] = "1"
        s, b, _ = client.call("POST", f"/api/v1/namespaces/{NS}/allocations", alloc)
        assert s == 403 and b["reason"] == "Forbidden", b
        assert "api-small" in b["message"] and "gpu" in b["message"] and "8" in b["message"], b
    finally:
        kube.request("DELETE", f"{QUEUES}/api-small")
        kube.request(
            "PATCH",
            f"/api/v1/namespaces/{NS}",
            body={"metadata": {"labels": {"phalanx.io/queue": None}}},
            content_type="application/merge-patch+json",
        )


def test_an_admin_preemption_evicts_the_whole_gang_and_the_node_stream_tells_it(
    client: Client, kube: RestKube, cleanup: list[str]
) -> None:
    cleanup.append("api-preempt")
    s, b, _ = client.call("POST", f"/api/v1/namespaces/{NS}/jobs", job("victim", "api-preempt", ["b0-r2"], n=3, gpus=2))
    assert s == 201, b
    bound = wait("bound", lambda: all_bound(kube, "api-preempt", 3), 60)
    node = bound[0]["spec"]["nodeName"]
    notices: list[dict[str, Any]] = []
    reader = threading.Thread(
        target=lambda: notices.extend(watch(client, f"/api/v1/nodes/{node}/evictions?watch=true&timeoutSeconds=20"))
    )
    reader.start()

    # A CI run once had this dry run answered 404 right after the pods showed bound (not
    # reproduced in 6 runs since, 2 of them on a loaded machine; the API answers from the
    # extender's watch cache, which may trail kube-apiserver): a dry run changes nothing, so it
    # is asked until it finds the gang, and a lasting 404 still fails here.
    def dry_run() -> tuple[int, Any] | None:
        s, b, _ = client.call(
            "POST", f"/api/v1/namespaces/{NS}/preemptions?dryRun=All", {"targetAllocation": "victim-1"}
        )
        return (s, b) if s != 404 else None

    s, b = wait("a dry-run preemption finds the gang", dry_run, 30)
    assert (
        s == 200 and b["status"] == "DryRun" and len(b["evicted"]) == 3 and len(pods(kube, "suite=api-preempt")) == 3
    ), b
    s, b, _ = client.call(
        "POST",
        f"/api/v1/namespaces/{NS}/preemptions",
        {"targetAllocation": "victim-1", "reason": "incident", "gracePeriodSeconds": 0},
    )
    assert s == 201 and b["status"] == "Initiated" and sorted(b["evicted"]) == ["victim-0", "victim-1", "victim-2"], b
    assert b["resourcesFreed"]["nvidia.com/gpu"] == "6", b
    wait("gang evicted", lambda: not pods(kube, "suite=api-preempt"), 60)
    reader.join(30)
    on_node = {p["metadata"]["name"] for p in bound if p["spec"]["nodeName"] == node}
    assert {n["allocation"] for n in notices if n["type"] == "EVICTION"} == on_node, notices


def test_a_drain_that_waits_for_gangs_leaves_them_and_says_so(
    client: Client, kube: RestKube, cleanup: list[str]
) -> None:
    cleanup.append("api-wait")
    s, b, _ = client.call("POST", f"/api/v1/namespaces/{NS}/jobs", job("kept", "api-wait", ["b1-r3"], n=2, gpus=2))
    assert s == 201, b
    bound = wait("bound", lambda: all_bound(kube, "api-wait", 2), 60)
    node = bound[0]["spec"]["nodeName"]
    try:
        s, b, _ = client.call("POST", f"/api/v1/nodes/{node}/drain?dryRun=All", {"gangPolicy": "EvictGang"})
        assert s == 200 and b["status"] == "DryRun" and b["allocationsToEvict"] >= 2, b
        assert not kube.request("GET", f"/api/v1/nodes/{node}").body["spec"].get("unschedulable")
        s, b, _ = client.call("POST", f"/api/v1/nodes/{node}/drain", {"gangPolicy": "Wait", "gracePeriodSeconds": 0})
        assert s == 200 and b["status"] == "WaitingForGangs" and b["waitingGangs"] == [f"wl:{NS}/kept/members"], b
        assert len(pods(kube, "suite=api-wait")) == 2
    finally:
        client.call("PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": False}})


def test_monitoring_reports_the_cluster_queues_and_a_tenants_usage(
    client: Client, kube: RestKube, cleanup: list[str]
) -> None:
    cleanup.append("api-mon")
    s, before, _ = client.call("GET", "/api/v1/metrics/cluster/utilization")
    assert s == 200 and before["cluster"]["nodes"]["total"] == 64, before
    s, b, _ = client.call("POST", f"/api/v1/namespaces/{NS}/jobs", job("mon", "api-mon", ["b1-r0"], n=2))
    assert s == 201, b
    wait("bound", lambda: all_bound(kube, "api-mon", 2))
    after = wait(  # reports are rebuilt at most once a second
        "utilisation counts the job",
        lambda: (
            (a := client.call("GET", "/api/v1/metrics/cluster/utilization")[1])["cluster"]["gpu"]["requested"]
            - before["cluster"]["gpu"]["requested"]
            >= 16 - 1e-6
            and a
        ),
    )
    assert after["scheduling"]["latencySamples"] >= 2
    s, usage, _ = client.call("GET", f"/api/v1/metrics/tenants/{NS}/usage?period=1h")
    assert s == 200 and float(usage["resources"]["nvidia.com/gpu"]["currentUsage"]) >= 16, usage
    s, q, _ = client.call("GET", "/api/v1/metrics/queues")
    assert s == 200 and any(x["name"] == "default" for x in q["queues"]), q
    s, b, _ = client.call("GET", f"/api/v1/metrics/tenants/{NS}/usage?period=1y")
    assert s == 400 and "period" in b["message"], b


def test_an_overloaded_api_answers_503_with_retry_after(client: Client, extender: dict[str, Any]) -> None:
    api = extender["ext"].api
    saved = api.in_flight
    api.in_flight = threading.BoundedSemaphore(1)
    api.in_flight.acquire()
    try:
        s, b, headers = client.call("GET", f"/api/v1/namespaces/{NS}/allocations")
    finally:
        api.in_flight = saved
    assert s == 503 and b["reason"] == "ServiceUnavailable" and headers["Retry-After"] == "1", b


def test_a_dry_run_that_needs_room_says_whom_it_would_preempt(
    client: Client, kube: RestKube, cleanup: list[str]
) -> None:
    cleanup.append("api-room")
    low = job("low", "api-room", ["b0-r1"], n=8)  # the whole rack, priority 100
    s, b, _ = client.call("POST", f"/api/v1/namespaces/{NS}/jobs", low)
    assert s == 201, b
    wait("rack full", lambda: all_bound(kube, "api-room", 8), 60)
    high = job("high", "api-room", ["b0-r1"], n=2)
    high["spec"]["priority"] = 1000
    s, b, _ = client.call("POST", f"/api/v1/namespaces/{NS}/jobs?dryRun=All", high)
    assert s == 200, b
    plan = b["status"]["dryRun"]
    assert plan["placeable"] is False and sorted(plan["wouldPreempt"]) == sorted(f"{NS}/low-{i}" for i in range(8)), (
        plan
    )
    assert len(plan["placementAfterPreemption"]) == 2 and "low" in plan["preemption"], plan
    assert len(pods(kube, "suite=api-room")) == 8 and all(
        p["metadata"].get("deletionTimestamp") is None for p in pods(kube, "suite=api-room")
    )
