"""HA: the extender binds only while the kube-scheduler beside it leads (its /metrics says so)
and the Lease was renewed within its duration; losing the lead releases every reservation."""

from __future__ import annotations

import datetime as dt
import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from extender import leader
from extender.app import Extender, Options
from extender.kube import Response
from extender.leader import LeaderOptions, Leadership
from tests.extender.fakes import FakeKube, node, pod, serving

LEASE = "/apis/coordination.k8s.io/v1/namespaces/phalanx-system/leases/phalanx-scheduler"


class Sibling(http.server.ThreadingHTTPServer):
    leads = 1.0
    failing = False  # answer 500 (a busy or restarting kube-scheduler)


class Metrics(http.server.BaseHTTPRequestHandler):
    server: Sibling

    def do_GET(self) -> None:
        if self.server.failing:
            self.send_error(500)
            return
        body = (
            "# TYPE leader_election_master_status gauge\n"
            f'leader_election_master_status{{name="kube-scheduler"}} {self.server.leads}\n'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def sibling() -> Iterator[Sibling]:
    server = Sibling(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


class LeaseKube(FakeKube):
    renewed_ago_s: float = 0.5
    duration_s: int = 15
    holder: str = "pod-a_1234"

    def request(self, method: str, path: str, **kwargs: Any) -> Response:
        if method == "GET" and path == LEASE:
            renewed = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=self.renewed_ago_s)
            spec = {
                "holderIdentity": self.holder,
                "leaseDurationSeconds": self.duration_s,
                "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "leaseTransitions": 3,
            }
            return Response(200, {"spec": spec})
        return super().request(method, path, **kwargs)


def options(sibling: Sibling) -> LeaderOptions:
    return LeaderOptions("phalanx-system", "phalanx-scheduler", f"http://127.0.0.1:{sibling.server_port}/metrics")


def until(probe: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_leads_while_the_sibling_leads_and_the_lease_is_fresh(
    sibling: Sibling, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(leader, "POLL_S", 0.05)
    kube = LeaseKube()
    lost: list[str] = []
    lead = Leadership(kube, options(sibling), on_lost=lost.append)
    assert "not the leader" in lead.check()  # nothing confirmed yet
    lead.start()
    until(lambda: lead.leading)
    sibling.leads = 0.0  # kube-scheduler lost its lease (it exits soon after)
    until(lambda: bool(lost))
    assert "does not lead" in lead.check() and "'pod-a_1234' holds the lease" in lead.check()
    assert "no longer leads phalanx-system/phalanx-scheduler" in lost[0]
    lead.stop()


def test_a_lease_not_renewed_within_its_duration_refuses_binds(
    sibling: Sibling, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(leader, "POLL_S", 0.05)
    kube = LeaseKube()
    kube.renewed_ago_s = 14.0  # of 15: less than MARGIN_S left
    lead = Leadership(kube, options(sibling), on_lost=lambda why: None)
    lead.start()
    until(lambda: "not confirmed" in lead.check())
    kube.renewed_ago_s = 1.0
    until(lambda: lead.leading)
    lead.stop()


def test_a_silent_sibling_is_not_a_leader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leader, "POLL_S", 0.05)
    unreachable = LeaderOptions("phalanx-system", "phalanx-scheduler", "http://127.0.0.1:9/metrics")
    lead = Leadership(LeaseKube(), unreachable, on_lost=lambda why: None)
    lead.start()
    until(lambda: "cannot confirm leadership" in lead.check())
    lead.stop()


def test_a_standby_refuses_binds_and_sends_nothing(sibling: Sibling, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leader, "POLL_S", 0.05)
    sibling.leads = 0.0
    kube = LeaseKube()
    kube.pods["default/p"] = pod("p", uid="uid-p", gpus=1)
    ext = Extender(kube, Options(port=0, leader=options(sibling)))
    ext.cache.replace_nodes([node("n0", gpus=2)])
    ext.cache.replace_pods([kube.pods["default/p"]])
    assert ext.leadership is not None
    ext.leadership.start()
    try:
        with serving(ext):
            reply = ext.verbs.bind({"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n0"})
            assert "not the leader" in reply["Error"]
            assert not [c for c in kube.calls if c[1].endswith("/binding")]
            sibling.leads = 1.0
            until(lambda: ext.leadership is not None and ext.leadership.leading)
            reply = ext.verbs.bind({"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n0"})
            assert reply == {"Error": ""}
    finally:
        ext.leadership.stop()


def test_a_failed_poll_refuses_binds_but_keeps_the_reservations_until_a_lease_duration_passed(
    sibling: Sibling, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(leader, "POLL_S", 0.05)
    monkeypatch.setattr(leader, "MARGIN_S", 0.2)
    kube = LeaseKube()
    kube.duration_s, kube.renewed_ago_s = 2, 0.1
    lost: list[str] = []
    lead = Leadership(kube, options(sibling), on_lost=lost.append)
    lead.start()
    until(lambda: lead.leading)
    sibling.failing = True
    until(lambda: "cannot confirm leadership" in lead.check())
    time.sleep(0.5)
    assert lost == []  # a blip: binds wait, reservations stay
    sibling.failing = False
    until(lambda: lead.leading)
    sibling.failing = True
    until(lambda: bool(lost), timeout=10)  # nothing confirmed for a lease duration: given up
    assert "cannot confirm leadership" in lost[0]
    lead.stop()


def test_a_lease_that_moved_is_a_lost_lead_whatever_the_sibling_says(
    sibling: Sibling, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(leader, "POLL_S", 0.05)
    kube = LeaseKube()
    lost: list[str] = []
    lead = Leadership(kube, options(sibling), on_lost=lost.append)
    lead.start()
    until(lambda: lead.leading)
    kube.holder = "pod-b_5678"  # a stale "1" on the sibling's /metrics must not keep the lead
    until(lambda: bool(lost))
    assert "moved to 'pod-b_5678'" in lost[0]
    lead.stop()
