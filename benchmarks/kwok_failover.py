"""Failover: kill the leading replica while a 32-pod gang is being placed; count partial gangs
and double-booked devices.

Two replicas of the shipped Deployment run as local processes (`deploy/local/replicas.py`: the
containers' own commands, the shipped RBAC, tokens minted as kubelet would), kube-scheduler
electing its leader on a lease of 6 s (renew deadline 4 s, retry 1 s) and each extender
following its own kube-scheduler (`--follow-scheduler-lease`). Each trial submits a 32-member
gang (one GPU each, required within one rack) and SIGKILLs both containers of the leading pod at
one of three moments, in turn: as the members are created (before any plan), once the gang is
planned and its members wait at the gate (nothing bound yet), and once the first member is
bound (see `Failover.trial`). The killed pod is started again at once (kubelet's restart) and
becomes the standby. A trial ends when the gang is whole on the new leader, or after 120 s.

Figures: partial gangs (some but not all members bound at the end), double-booked devices (two
pods whose `phalanx.io/gpu-devices` records claim more than one GPU between them, on any node),
time from the kill to the gang whole (p50, max).

    python -m benchmarks.kwok_failover [--kills 20] [--quick] [--no-record]
"""

from __future__ import annotations

import json
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import finish, machine, median, parser, percentile
from deploy.local import replicas
from deploy.local.cluster import LocalCluster
from deploy.local.components import ControlPlaneOptions
from extender.kube import RestKube
from extender.objects import DEVICES_ANNOTATION, DeviceRecordError, decode_devices

NS = "failover"
MEMBERS = 32
LEASE = (6.0, 4.0, 1.0)  # kube-scheduler's leaseDuration, renewDeadline, retryPeriod
MOMENTS = ("before quorum", "planned, 31 members waiting at the gate", "16 of 32 bound (minCount 16)")
RACK = "topology.phalanx.io/rack"
WHOLE_S = 120.0


def wait(what: str, probe: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")


class Failover:
    """Two replicas on a running cluster; `trial` kills the leader once."""

    def __init__(self, cluster: LocalCluster, folder: Path) -> None:
        self.kube = RestKube.from_kubeconfig(str(cluster.kubeconfig_path))
        docs = replicas.install(self.kube)
        wait("Workloads served", lambda: self.kube.request("GET", "/apis/phalanx.io/v1alpha1/workloads").status == 200)
        admin = cluster.kubeconfig_path
        sched = replicas.account_kubeconfig(self.kube, admin, "phalanx-scheduler", folder)
        ext = replicas.account_kubeconfig(self.kube, admin, "phalanx-extender", folder)
        self.pair = [replicas.Replica(name, folder / name, sched, ext, docs, lease_timing=LEASE) for name in ("a", "b")]
        r = self.kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
        if r.status not in (201, 409):
            raise RuntimeError(f"namespace {NS}: {r.status} {r.body}")
        for replica in self.pair:
            replica.start()
        for replica in self.pair:
            wait(f"replica {replica.name} ready", replica.ready, 120)

    def stop(self) -> None:
        for replica in self.pair:
            replica.stop()

    def leader(self) -> replicas.Replica:
        return wait("one replica leading", lambda: next((r for r in self.pair if r.leading()), None), 90)

    def _pods(self, gang: str) -> list[dict[str, Any]]:
        query = {"labelSelector": f"phalanx.io/workload={gang}"}
        return list(self.kube.request("GET", f"/api/v1/namespaces/{NS}/pods", query=query).body["items"])

    def _bound(self, gang: str) -> int:
        return sum(1 for p in self._pods(gang) if p["spec"].get("nodeName"))

    def _planned(self, replica: replicas.Replica, gang: str) -> bool:
        request = urllib.request.Request(f"{replica.url}/api/v1/gangs/{NS}/{gang}", headers=self._token())
        try:
            with urllib.request.urlopen(request, timeout=5) as r:
                return any(g["plan"] for g in json.loads(r.read())["gangs"])
        except OSError:
            return False

    def _token(self) -> dict[str, str]:
        return {k: v for k, v in self.kube.headers.items() if k == "Authorization"}

    def trial(self, index: int) -> dict[str, Any]:
        """One kill at MOMENTS[index % 3]:
        0. half the members exist (no quorum yet); the rest are created after the kill;
        1. 31 members and a blocker that never reaches bind (schedulerName "nobody"): the gang is
           planned and its 31 members wait at the gate; after the kill the blocker is replaced
           by the 32nd member;
        2. minCount 16: the first 16 are bound; the other 16 are created after the kill and must
           land next to them (same rack) on the new leader."""
        moment = index % len(MOMENTS)
        leader = self.leader()
        gang = f"fo-{index}"
        minimum = MEMBERS // 2 if moment == 2 else MEMBERS
        group = {
            "name": "workers",
            "minCount": minimum,
            "topologyRequest": {"required": RACK},
            "rankedGroups": [{"name": "all", "eqGroups": [{"name": "w", "count": MEMBERS}]}],
        }
        body = {
            "apiVersion": "phalanx.io/v1alpha1",
            "kind": "Workload",
            "metadata": {"name": gang, "namespace": NS},
            "spec": {"gangGroups": [group]},
        }
        r = self.kube.request("POST", f"/apis/phalanx.io/v1alpha1/namespaces/{NS}/workloads", body=body)
        if r.status != 201:
            raise RuntimeError(f"workload {gang}: {r.status} {r.body}")
        first = {0: MEMBERS // 2, 1: MEMBERS - 1, 2: MEMBERS // 2}[moment]
        for i in range(first):
            self._member(gang, i)
        if moment == 1:
            self._member(gang, MEMBERS - 1, name=f"{gang}-blocker", scheduler="nobody")
            wait("the gang planned, its members at the gate", lambda: self._planned(leader, gang), 60)
        elif moment == 2:
            wait("the first 16 bound", lambda: self._bound(gang) == first, 60)
        bound_at_kill = self._bound(gang)
        leader.kill()
        killed = time.monotonic()
        leader.start()  # kubelet restarts the pod: it comes back as the standby
        if moment == 1:
            self.kube.request(
                "DELETE", f"/api/v1/namespaces/{NS}/pods/{gang}-blocker", query={"gracePeriodSeconds": "0"}
            )
            wait("the blocker gone", lambda: len(self._pods(gang)) == MEMBERS - 1, 60)
        for i in range(first, MEMBERS):  # arriving while the leader is gone
            self._member(gang, i)
        try:
            wait("the gang whole", lambda: self._bound(gang) == MEMBERS, WHOLE_S)
            whole_s: float | None = time.monotonic() - killed
        except TimeoutError:
            whole_s = None
        pods = self._pods(gang)
        bound = sum(1 for p in pods if p["spec"].get("nodeName"))
        racks = {self._rack(p["spec"]["nodeName"]) for p in pods if p["spec"].get("nodeName")}
        double = double_booked(self.kube)
        self._clean(gang)
        return {
            "moment": MOMENTS[moment],
            "bound_at_kill": bound_at_kill,
            "bound": bound,
            "partial": 0 < bound < MEMBERS,
            "racks": len(racks),
            "whole_s": whole_s,
            "double_booked": double,
        }

    def _rack(self, node: str) -> str:
        return str(self.kube.request("GET", f"/api/v1/nodes/{node}").body["metadata"]["labels"].get(RACK, ""))

    def _member(self, gang: str, i: int, *, name: str = "", scheduler: str = "phalanx") -> None:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name or f"{gang}-{i}", "labels": {"phalanx.io/workload": gang}},
            "spec": {
                "schedulerName": scheduler,
                "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            },
        }
        r = self.kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=pod)
        if r.status != 201:
            raise RuntimeError(f"pod {gang}-{i}: {r.status} {r.body}")

    def _clean(self, gang: str) -> None:
        self.kube.request("DELETE", f"/apis/phalanx.io/v1alpha1/namespaces/{NS}/workloads/{gang}")
        query = {"labelSelector": f"phalanx.io/workload={gang}", "gracePeriodSeconds": "0"}
        self.kube.request("DELETE", f"/api/v1/namespaces/{NS}/pods", query=query)
        wait(f"gang {gang} gone", lambda: not self._pods(gang), 60)


def double_booked(kube: RestKube) -> list[str]:
    """Devices two or more pods claim beyond one whole GPU between them, across the cluster."""
    shares: dict[tuple[str, int], list[tuple[str, int]]] = defaultdict(list)
    for p in kube.request("GET", "/api/v1/pods").body["items"]:
        node = p["spec"].get("nodeName")
        text = (p["metadata"].get("annotations") or {}).get(DEVICES_ANNOTATION)
        if not node or not text:
            continue
        try:
            devices = decode_devices(text) or ()
        except DeviceRecordError:
            continue
        for d in devices:
            if not d.mig_profile:
                shares[(node, d.index)].append((f"{p['metadata']['namespace']}/{p['metadata']['name']}", d.milli))
    return [
        f"{node} GPU {index}: {', '.join(f'{pod} {milli}' for pod, milli in held)}"
        for (node, index), held in sorted(shares.items())
        if sum(milli for _, milli in held) > 1000
    ]


def run(cluster: LocalCluster, folder: Path, kills: int) -> dict[str, Any]:
    """`kills` trials on a running cluster; the figures as a dict (the e2e test reads it too)."""
    failover = Failover(cluster, folder)
    trials = []
    try:
        for i in range(kills):
            trials.append(failover.trial(i))
    finally:
        failover.stop()
    whole = [t["whole_s"] for t in trials if t["whole_s"] is not None]
    return {
        "kills": len(trials),
        "partial_gangs": sum(1 for t in trials if t["partial"]),
        "gangs_split_across_racks": sum(1 for t in trials if t["racks"] > 1),
        "unplaced_gangs": sum(1 for t in trials if t["bound"] == 0),
        "double_booked_devices": sum(len(t["double_booked"]) for t in trials),
        "failover_whole_s_p50": round(median(whole), 2) if whole else None,
        "failover_whole_s_max": round(percentile(whole, 100), 2) if whole else None,
        "trials": trials,
    }


def main() -> None:
    ap = parser(__doc__, quick="3 kills instead of --kills")
    ap.add_argument("--kills", type=int, default=20)
    args = ap.parse_args()
    kills = 3 if args.quick else args.kills
    state = Path(tempfile.mkdtemp(prefix="phalanx-failover-"))
    cluster = LocalCluster(
        "failover", state_dir_path=state, options=ControlPlaneOptions(die_with_parent=True, controller_manager=False)
    )
    try:
        cluster.up()
        result = run(cluster, state / "replicas", kills)
    finally:
        cluster.down()
    lines = [
        f"machine: {machine()}",
        f"{result['kills']} kills of the leading replica, {MEMBERS}-member gangs, lease {LEASE[0]:g} s",
        *(
            f"  trial {i}: killed {t['moment']} ({t['bound_at_kill']} bound); "
            f"{t['bound']}/{MEMBERS} bound at the end"
            + (f", whole {t['whole_s']:.1f} s after the kill" if t["whole_s"] is not None else "")
            + (f"; DOUBLE-BOOKED {t['double_booked']}" if t["double_booked"] else "")
            for i, t in enumerate(result["trials"])
        ),
        f"partial gangs: {result['partial_gangs']}, gangs never placed: {result['unplaced_gangs']}, "
        f"double-booked devices: {result['double_booked_devices']}",
        f"kill to gang whole: p50 {result['failover_whole_s_p50']} s, max {result['failover_whole_s_max']} s",
    ]
    headline = {k: v for k, v in result.items() if k != "trials"}
    finish("kwok_failover", args, lines, headline)


if __name__ == "__main__":
    main()
