"""The extender's HTTP surface in-process: exact wire format, errors, and bind behaviour."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from extender.app import Extender, Options
from extender.metrics import Metrics
from extender.objects import DEVICES_ANNOTATION
from extender.outcomes import Then
from extender.server import Server
from tests.extender.fakes import ADMIN, FakeKube, node, pod, serving


@pytest.fixture
def ext() -> Iterator[tuple[Extender, FakeKube]]:
    kube = FakeKube()
    extender = Extender(kube, Options(port=0))
    extender.cache.replace_nodes([node("n0", gpus=2), node("n1", gpus=8)])
    extender.cache.replace_pods([])
    with serving(extender):
        yield extender, kube


def call(extender: Extender, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    # The REST API takes an operator's token (FakeKube reviews it); the verbs ignore it.
    req = urllib.request.Request(
        extender.server.url + path, data=data, method="POST" if data is not None else "GET", headers=ADMIN
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            payload = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        payload, status = e.read(), e.code
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, payload.decode()


def test_filter_passes_gpu_nodes_that_fit_and_says_why_others_fail(ext: tuple[Extender, FakeKube]) -> None:
    extender, _ = ext
    status, body = call(extender, "/filter", {"Pod": pod("p", gpus=4), "NodeNames": ["n0", "n1", "ghost"]})
    assert status == 200
    assert body == {
        "Nodes": None,
        "NodeNames": ["n1"],
        "FailedNodes": {"n0": "not enough idle GPUs: 2 idle, pod needs 4", "ghost": "node unknown to phalanx"},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


def test_filter_counts_a_single_pods_devices_once_its_reply_is_sent(ext: tuple[Extender, FakeKube]) -> None:
    """Offered one node, the pod's devices are chosen by the connection's thread right after the
    reply (extender/verbs.py `filter_then`); its bind then keeps them."""
    extender, kube = ext
    p = pod("one", gpus=1)
    kube.pods["default/one"] = p
    extender.cache.pod_event("ADDED", p)
    status, body = call(extender, "/filter", {"Pod": p, "NodeNames": ["n0"]})
    assert status == 200 and body["NodeNames"] == ["n0"]
    deadline = time.monotonic() + 10
    while extender.cache.assumed("uid-one") is None and time.monotonic() < deadline:
        time.sleep(0.01)
    chosen = extender.cache.assumed("uid-one")
    assert chosen is not None and chosen.node == "n0"
    status, body = call(
        extender, "/bind", {"PodName": "one", "PodNamespace": "default", "PodUID": "uid-one", "Node": "n0"}
    )
    assert status == 200 and body == {"Error": ""}
    record = json.loads(kube.pods["default/one"]["metadata"]["annotations"][DEVICES_ANNOTATION])
    assert [e["index"] for e in record] == [d.index for d in chosen.devices]


def test_work_after_a_reply_that_fails_is_counted_and_the_connection_goes_on() -> None:
    """A verb's `Then.after` that raises: the reply was already sent, the error is counted, and
    the same connection serves its next request."""
    ran: list[int] = []

    def verb(args: dict[str, Any]) -> Then:
        def after() -> None:
            ran.append(1)
            raise RuntimeError("after failed")

        return Then({"Error": ""}, after)

    metrics = Metrics()
    server = Server(("127.0.0.1", 0), verbs={"filter": verb}, metrics=metrics, ready=lambda: True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        for _ in range(2):
            conn.request("POST", "/filter", body=b"{}", headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            assert response.status == 200 and json.loads(response.read()) == {"Error": ""}
        conn.close()
        # The first call's work ran before the connection read the second request; the second's
        # runs once its reply is written, maybe after the client has read it.
        deadline = time.monotonic() + 10
        while metrics.errors.labels("filter", "internal")._value.get() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ran == [1, 1]
        assert metrics.errors.labels("filter", "internal")._value.get() == 2
    finally:
        server.shutdown()
        server.server_close()


def _schedstat_kept() -> bool:
    """The kernel accounts this thread's time on and off a core (/proc/thread-self/schedstat)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[0]) > 0
    except (OSError, IndexError, ValueError):
        return False


@pytest.mark.skipif(not _schedstat_kept(), reason="the kernel keeps no run delay")
def test_a_verbs_own_cpu_and_its_wait_for_a_core_are_timed_apart() -> None:
    """A verb that runs 30 ms of its own CPU on a core a busy process shares: the call's `cpu`
    phase holds those 30 ms, its `queued` phase the time the thread waited for the core (the
    busy process takes its turns: about as long again, at least a few ms)."""
    core = min(os.sched_getaffinity(0))
    busy = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"])

    def verb(args: dict[str, Any]) -> dict[str, Any]:
        os.sched_setaffinity(0, {core})  # this thread only: it shares the busy process's core
        began = time.thread_time()
        while time.thread_time() - began < 0.030:
            pass
        return {"Error": ""}

    metrics = Metrics()
    server = Server(("127.0.0.1", 0), verbs={"filter": verb}, metrics=metrics, ready=lambda: True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not _on_core(busy.pid, core):
            time.sleep(0.01)
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
        conn.request("POST", "/filter", body=b"{}", headers={"Content-Type": "application/json"})
        assert conn.getresponse().status == 200
        conn.close()
        # The phases are counted once the reply is written: maybe after the client has read it.
        deadline = time.monotonic() + 10
        while "filter.queued" not in metrics.percentiles() and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = metrics.percentiles()
        cpu, queued = stats["filter.cpu"]["p50_ms"], stats["filter.queued"]["p50_ms"]
        assert 30 <= cpu <= stats["filter.server"]["p50_ms"] + 1
        assert queued >= 5, f"waited {queued:.1f} ms for a core it shared with a busy process"
    finally:
        busy.kill()
        busy.wait()
        server.shutdown()
        server.server_close()


def _on_core(pid: int, core: int) -> bool:
    """The process runs pinned to `core` (its affinity is set once it has started)."""
    try:
        return os.sched_getaffinity(pid) == {core}
    except OSError:
        return False


def test_filter_passes_pods_without_gpu_demand_through(ext: tuple[Extender, FakeKube]) -> None:
    extender, _ = ext
    _, body = call(extender, "/filter", {"Pod": pod("p"), "NodeNames": ["n0", "x"]})
    assert body["NodeNames"] == ["n0", "x"] and body["FailedNodes"] == {}


def test_invalid_gpu_request_is_unresolvable_on_every_node(ext: tuple[Extender, FakeKube]) -> None:
    extender, _ = ext
    bad = pod("p", annotations={"gpu-fraction": "2"})
    _, body = call(extender, "/filter", {"Pod": bad, "NodeNames": ["n0"]})
    assert body["NodeNames"] == []
    assert body["FailedAndUnresolvableNodes"]["n0"].startswith("invalid GPU request: annotation gpu-fraction")


def test_prioritize_prefers_the_fuller_node_in_compact_first_mode(ext: tuple[Extender, FakeKube]) -> None:
    extender, _ = ext
    extender.cache.pod_event("ADDED", pod("busy", gpus=1, node_name="n0", phase="Running"))
    status, body = call(extender, "/prioritize", {"Pod": pod("p", gpus=1), "NodeNames": ["n0", "n1"]})
    assert status == 200
    scores = {h["Host"]: h["Score"] for h in body}
    assert body and all(set(h) == {"Host", "Score"} for h in body)
    assert scores.get("n0", 0) > scores.get("n1", 0)


def test_bind_sets_devices_and_node_in_one_call_and_accounts_at_once(ext: tuple[Extender, FakeKube]) -> None:
    extender, kube = ext
    p = pod("p", gpus=2, uid="u1")
    kube.pods["default/p"] = p
    extender.cache.pod_event("ADDED", p)
    status, body = call(extender, "/bind", {"PodName": "p", "PodNamespace": "default", "PodUID": "u1", "Node": "n0"})
    assert (status, body) == (200, {"Error": ""})
    methods = [(m, path.rsplit("/", 1)[-1]) for m, path, _ in kube.calls]
    assert methods == [("POST", "binding")]  # devices ride on the Binding: one call
    assert json.loads(p["metadata"]["annotations"][DEVICES_ANNOTATION]) == [
        {"index": 0, "milli": 1000, "memoryMiB": 81920},
        {"index": 1, "milli": 1000, "memoryMiB": 81920},
    ]
    _, after = call(extender, "/filter", {"Pod": pod("q", gpus=1), "NodeNames": ["n0"]})
    assert after["NodeNames"] == []  # the assumed pod holds both devices before any watch event


def test_bind_failure_releases_the_assumed_devices(ext: tuple[Extender, FakeKube]) -> None:
    extender, kube = ext
    kube.fail_bind = True
    p = pod("p", gpus=2, uid="u1")
    kube.pods["default/p"] = p
    extender.cache.pod_event("ADDED", p)
    _, body = call(extender, "/bind", {"PodName": "p", "PodNamespace": "default", "PodUID": "u1", "Node": "n0"})
    assert "etcd on fire" in body["Error"]
    assert extender.cache.node_model("n0").idle_gpus == 2  # type: ignore[union-attr]


def test_bind_of_an_already_bound_pod_is_idempotent(ext: tuple[Extender, FakeKube]) -> None:
    extender, _ = ext
    extender.cache.pod_event("ADDED", pod("p", uid="u1", node_name="n1", phase="Running"))
    args = {"PodName": "p", "PodNamespace": "default", "PodUID": "u1"}
    assert call(extender, "/bind", {**args, "Node": "n1"})[1] == {"Error": ""}
    assert "already bound" in call(extender, "/bind", {**args, "Node": "n0"})[1]["Error"]


def test_preempt_keeps_only_nodes_where_victims_free_enough_devices(ext: tuple[Extender, FakeKube]) -> None:
    extender, _ = ext
    for i in range(2):
        extender.cache.pod_event("ADDED", pod(f"v{i}", uid=f"v{i}", gpus=1, node_name="n0", phase="Running"))
    victims = {"n0": {"Pods": [{"UID": "v0"}], "NumPDBViolations": 0}, "n1": {"Pods": [], "NumPDBViolations": 0}}
    _, body = call(extender, "/preempt", {"Pod": pod("p", gpus=2), "NodeNameToMetaVictims": victims})
    assert set(body["NodeNameToMetaVictims"]) == {"n1"}
    victims["n0"]["Pods"].append({"UID": "v1"})  # type: ignore[attr-defined]
    _, body = call(extender, "/preempt", {"Pod": pod("p", gpus=2), "NodeNameToMetaVictims": victims})
    assert set(body["NodeNameToMetaVictims"]) == {"n0", "n1"}


@pytest.mark.parametrize(
    ("case", "path", "raw", "status", "fragment"),
    [
        ("not JSON", "/filter", b"{nope", 400, "not JSON"),
        ("not an object", "/filter", b"[1]", 400, "JSON object"),
        ("no Pod", "/filter", b'{"NodeNames": []}', 400, "field Pod"),
        ("no NodeNames", "/filter", b'{"Pod": {"metadata": {}}}', 400, "NodeNames"),
        ("bind without Node", "/bind", b'{"PodName": "p", "PodNamespace": "d", "PodUID": "u"}', 400, "Node"),
        ("unknown verb", "/explode", b"{}", 404, "unknown verb"),
    ],
)
def test_malformed_requests_get_a_clear_error_and_the_server_lives_on(
    ext: tuple[Extender, FakeKube], case: str, path: str, raw: bytes, status: int, fragment: str
) -> None:
    extender, _ = ext
    got, body = call(extender, path, raw=raw)
    assert got == status and fragment in body["Error"]
    assert call(extender, "/healthz")[0] == 200


def test_health_readiness_and_metrics(ext: tuple[Extender, FakeKube]) -> None:
    extender, _ = ext
    assert call(extender, "/readyz")[0] == 200
    call(extender, "/filter", {"Pod": pod("p", gpus=1), "NodeNames": ["n0"]})
    status, text = call(extender, "/metrics")
    assert status == 200 and 'phalanx_extender_request_seconds_count{verb="filter"}' in text
    extender.reflectors[0].listed.clear()
    assert call(extender, "/readyz")[0] == 503


def test_node_read_api_shows_what_the_solver_sees(ext: tuple[Extender, FakeKube]) -> None:
    extender, _ = ext
    extender.cache.pod_event("ADDED", pod("busy", gpus=1, node_name="n0", phase="Running"))
    status, body = call(extender, "/api/v1/nodes/n0")
    assert status == 200
    assert [g["freeMilli"] for g in body["gpus"]] == [0, 1000]
    assert body["pods"] == [{"pod": "default/busy", "uid": "uid-busy", "assumed": False}]
    assert call(extender, "/api/v1/nodes/ghost")[0] == 404


def test_call_histograms_expose_what_prometheus_clients_histogram_would() -> None:
    """`CallHistogram` (one lock per call) renders the same buckets, counts and sums as
    prometheus_client's `Histogram` for the same observations, bounds included (a value on a
    bound counts in that bound's bucket)."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from extender.metrics import LATENCY_BUCKETS, CallHistogram

    values = [0.0001, 0.0005, 0.0007, 0.001, 0.003, 0.2, 1.0, 29.0, 31.0, 0.0005]
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast = CallHistogram("x_seconds", "doc", ["verb", "phase"], LATENCY_BUCKETS, ours)
    slow = Histogram("x_seconds", "doc", ["verb", "phase"], buckets=LATENCY_BUCKETS, registry=theirs)
    for i, v in enumerate(values):
        labels = ("filter", "read") if i % 3 else ("bind", "work")
        fast.observe([(labels, v)])
        slow.labels(*labels).observe(v)

    def series(registry: CollectorRegistry) -> list[str]:
        text = generate_latest(registry).decode()
        return sorted(
            line for line in text.splitlines() if line and not line.startswith("#") and "_created" not in line
        )

    assert series(ours) == series(theirs)
