"""``python -m deploy.local run`` (behind ``make run``): the whole system on the local cluster.

Steps: bring the cluster up (or reuse it) with kube-controller-manager and the JobSet
controller, install Phalanx's CRDs (``config/crds``), start the Phalanx extender
(``python -m extender``) as a child process on a loopback port, with its policy admission
webhooks on another (registered by the extender itself at an https://127.0.0.1 URL), point
kube-scheduler at it (NodeResourcesFit ignoring the HAMI-style resources no node advertises),
apply the sample manifests (``config/samples/*.yaml``: single GPU pods, a JobSet of 8-GPU
workers, a Deployment of half-GPU replicas, a JobSet too big for a rack), wait until every
sample pod (label ``app=phalanx-sample``; the controllers make most of them) is bound or
reported unschedulable, and print where each landed and each gang's placement, solve time and,
for one that waits, its reason. Then it keeps serving until Ctrl-C (``--once`` stops right
away); on the way out it stops the extender and tears the cluster down unless
``--keep-cluster`` (then it also removes the webhook configurations: they fail closed, and
nothing would serve them).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from deploy.local import process
from deploy.local.cluster import LocalCluster, apply_object
from deploy.local.components import LOOPBACK, free_port
from deploy.local.kubeapi import request_json
from deploy.local.nodes import RACK_LABEL
from deploy.local.paths import REPO_ROOT
from deploy.local.scheduler_config import HAMI_RESOURCES
from deploy.local.wait import FatalWaitError, WaitTimeout, http_ok, wait_for
from extender.kube import RestKube
from extender.kubectl import Client
from extender.objects import DEVICES_ANNOTATION

DEFAULT_SAMPLES = REPO_ROOT / "config" / "samples"
SAMPLE_SELECTOR = "app=phalanx-sample"
RUN_CONTROLLERS = ("jobset",)  # what the samples need beside kube-controller-manager
GANG_KINDS = ("JobSet",)  # sample kinds that are gangs (their Resource Interface's)
EXTENDER_READY_SECONDS = 120.0
PLACEMENT_SECONDS = 120.0
SETTLE_SECONDS = 10.0


@dataclass(frozen=True)
class RunOptions:
    """What ``run`` does beyond bringing the cluster up."""

    port: int | None = None
    """Extender port on 127.0.0.1; None picks a free one."""
    samples: Path = DEFAULT_SAMPLES
    """A manifest file or a folder of ``*.yaml`` files applied once the extender serves."""
    once: bool = False
    """Exit after the placement report instead of serving until Ctrl-C."""
    keep_cluster: bool = False
    """Leave the cluster running on exit (the extender always stops)."""


@dataclass(frozen=True)
class Placement:
    """Where one sample pod ended up."""

    name: str
    node: str | None
    rack: str | None
    detail: str


CRDS = REPO_ROOT / "config" / "crds"
WEBHOOK_CONFIGURATIONS = (
    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/phalanx-policies",
    "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/phalanx-policies",
)


def start_extender(cluster: LocalCluster, port: int, webhook_port: int | None = None) -> process.Launched:
    """Start ``python -m extender`` against the cluster and wait until it reports ready; with
    `webhook_port`, its policy webhooks too (README "Workload policies")."""
    argv = [sys.executable, "-m", "extender", "--kubeconfig", str(cluster.kubeconfig_path), "--port", str(port)]
    argv += ["--bind-journal", str(cluster.layout.root / "extender.binds")]  # as the chart: extender/landing.py
    if webhook_port is not None:
        argv += [
            f"--webhook-port={webhook_port}",
            f"--webhook-host={LOOPBACK}",
            f"--webhook-url=https://{LOOPBACK}:{webhook_port}",
            f"--webhook-cert-dir={cluster.layout.root / 'webhook'}",
        ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    log = cluster.layout.log("extender")
    launched = process.start(argv, log_path=log, env=env)

    def ready() -> bool:
        if not process.is_running(launched.pid, Path(sys.executable)):
            raise FatalWaitError(f"the extender exited; last log lines:\n{process.log_tail(log)}")
        return http_ok(f"http://{LOOPBACK}:{port}/readyz")

    wait_for(ready, timeout=EXTENDER_READY_SECONDS, what="the extender to become ready")
    return launched


def _manifest_files(samples: Path) -> list[Path]:
    return sorted(samples.glob("*.yaml")) if samples.is_dir() else [samples]


def _collection_path(obj: dict[str, Any], namespace: str) -> str:
    # Naive plural (kind + "s"): enough for the samples' kinds (Pod, Deployment, JobSet, Workload, ...).
    api_version, plural = obj["apiVersion"], obj["kind"].lower() + "s"
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{namespace}/{plural}"


def expected_pods(obj: dict[str, Any]) -> int:
    """How many pods ``obj`` makes: 1 for a Pod, its replicas for a Deployment, replicas x
    parallelism summed over a JobSet's replicated Jobs; 0 for anything else."""
    spec = obj.get("spec") or {}
    if obj["kind"] == "Pod":
        return 1
    if obj["kind"] == "Deployment":
        return int(spec.get("replicas", 1))
    if obj["kind"] == "JobSet":
        return sum(
            int(r.get("replicas", 1)) * int(r["template"]["spec"].get("parallelism", 1))
            for r in spec.get("replicatedJobs") or []
        )
    return 0


def apply_manifests(api: client.ApiClient, files: Iterable[Path], namespace: str = "default") -> list[dict[str, Any]]:
    """Create every object of ``files`` in ``namespace`` (existing ones are kept); return them
    as written in the files."""
    objects = []
    for path in files:
        for obj in yaml.safe_load_all(path.read_text()):
            if not obj:
                continue
            response = request_json(api, "POST", _collection_path(obj, namespace), body=obj)
            if response.status >= 300 and response.status != 409:
                raise RuntimeError(f"{path.name}: creating {obj['kind']} {obj['metadata']['name']}: {response.body}")
            objects.append(obj)
    return objects


def devices_summary(record: str) -> str:
    """A pod's ``phalanx.io/gpu-devices`` record in a few words: "GPUs 0-7", "GPU 3: 0.5",
    "GPU 0: 10240 MiB", "GPU 4: MIG 1g.10gb"."""
    try:
        return _summary(json.loads(record))
    except (ValueError, TypeError, KeyError, AttributeError):  # not a record Phalanx wrote: as it is
        return record


def _summary(devices: list[dict[str, Any]]) -> str:
    whole = [d["index"] for d in devices if d.get("milli") == 1000 and not d.get("mig")]
    parts = []
    if whole:
        span = f"{whole[0]}-{whole[-1]}" if whole == list(range(whole[0], whole[-1] + 1)) and len(whole) > 1 else ""
        parts.append(f"GPUs {span or ','.join(map(str, whole))}" if len(whole) > 1 else f"GPU {whole[0]}")
    for d in devices:
        if d.get("mig"):
            parts.append(f"GPU {d['index']}: MIG {d['mig']}")
        elif d.get("milli") != 1000:
            share = [
                f"{d['milli'] / 1000:g}" if d.get("milli") else "",
                f"{d['memoryMiB']} MiB" if d.get("memoryMiB") else "",
            ]
            parts.append(f"GPU {d['index']}: {' + '.join(x for x in share if x)}")
    return "; ".join(parts)


def _placement(pod: dict[str, Any], rack_of: dict[str, str]) -> Placement | None:
    name = pod["metadata"]["name"]
    node = pod["spec"].get("nodeName")
    if node:
        record = (pod["metadata"].get("annotations") or {}).get(DEVICES_ANNOTATION, "")
        return Placement(name, node, rack_of.get(node), devices_summary(record) if record else "")
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition["status"] == "False" and condition.get("message"):
            return Placement(name, None, None, _first_reason(condition["message"]))
    return None


def racks(api: client.ApiClient) -> dict[str, str]:
    """Each node's rack."""
    return {
        n["metadata"]["name"]: n["metadata"]["labels"].get(RACK_LABEL, "")
        for n in request_json(api, "GET", "/api/v1/nodes").body["items"]
    }


def wait_placements(api: client.ApiClient, expected: int, namespace: str = "default") -> list[Placement]:
    """Wait until the ``expected`` sample pods exist and each is bound or reported
    unschedulable; pods still undecided at the deadline are listed as such."""
    rack_of = racks(api)
    found: dict[str, Placement | None] = {}
    started = time.monotonic()

    def settled() -> bool:
        path = f"/api/v1/namespaces/{namespace}/pods"
        for pod in request_json(api, "GET", path, query={"labelSelector": SAMPLE_SELECTOR}).body["items"]:
            found[pod["metadata"]["name"]] = _placement(pod, rack_of)
        decided = [p for p in found.values() if p is not None]
        if len(found) < expected or len(decided) < len(found):
            return False
        # An "unschedulable" verdict can be transient (a gang waiting for quorum): give the
        # scheduler's retries a few seconds before reporting it.
        return all(p.node for p in decided) or time.monotonic() - started > SETTLE_SECONDS

    # Pods still undecided at the deadline are reported as pending, not raised.
    with contextlib.suppress(WaitTimeout):
        wait_for(settled, timeout=PLACEMENT_SECONDS, what="sample pods to be placed")
    return [p or Placement(name, None, None, "still pending") for name, p in sorted(found.items())]


def _first_reason(message: str) -> str:
    """kube-scheduler's "0/64 nodes are available: 56 <Phalanx's reason>, 8 <another>. preemption:
    ..." cut to its first reason."""
    head = message.split(". preemption:", 1)[0]
    return head.split(": ", 1)[-1].split(", ", 1)[0] if ": " in head else head


@dataclass(frozen=True)
class GangLine:
    """Where one gang landed (or why it waits) and how long its plan took."""

    owner: str  # Kind/name of the object the gang is
    racks: str
    state: str


def gang_lines(
    api: client.ApiClient,
    live: Sequence[dict[str, Any]],
    owners: Sequence[dict[str, Any]],
    placements: Sequence[Placement],
    namespace: str = "default",
) -> list[GangLine]:
    """Each sample gang: a waiting one as the extender reports it (with its reason), a bound
    one from the GangScheduled Event on its owner ("bound 8 of 8 pending members on 1 block,
    1 rack, 8 hosts (OPTIMAL, 12 ms)"; the extender forgets a gang whose pods completed), with
    the racks its pods hold."""
    racks_of = {p.name: p.rack for p in placements if p.rack}
    lines = []
    for obj in owners:
        kind, name = obj["kind"], obj["metadata"]["name"]
        holding = sorted({rack for pod, rack in racks_of.items() if pod.startswith(f"{name}-")})
        waiting = [g for g in live if g["key"].split("/")[1:2] == [name] and g["bound"] < g["members"]]
        if waiting:
            g = waiting[0]
            state = f"waiting ({g['bound']}/{g['members']} bound, {g.get('solveMs', 0):.0f} ms): {g['pendingReason']}"
            lines.append(GangLine(f"{kind}/{name}", "-", state))
            continue
        selector = f"involvedObject.kind={kind},involvedObject.name={name},reason=GangScheduled"
        events = request_json(api, "GET", f"/api/v1/namespaces/{namespace}/events", query={"fieldSelector": selector})
        messages = [e["message"] for e in events.body.get("items") or []]
        if messages:
            lines.append(GangLine(f"{kind}/{name}", ",".join(holding) or "-", messages[-1]))
    return lines


def wait_gangs(
    api: client.ApiClient, extender: Client, owners: Sequence[dict[str, Any]], placements: Sequence[Placement]
) -> list[GangLine]:
    """The gang lines once every owner has one (Events are written off the hot path)."""
    found: list[GangLine] = []

    def complete() -> bool:
        nonlocal found
        found = gang_lines(api, extender.phalanx("/api/v1/gangs")["gangs"], owners, placements)
        return len(found) == len(owners)

    with contextlib.suppress(WaitTimeout):
        wait_for(complete, timeout=SETTLE_SECONDS * 2, what="gang events")
    return found


def print_gangs(lines: Sequence[GangLine]) -> None:
    print(f"{'gang':<32} {'racks':<8} placement")
    for g in lines:
        print(f"{g.owner:<32} {g.racks:<8} {g.state}")


def print_report(placements: Sequence[Placement]) -> None:
    """Print one line per sample pod."""
    print(f"{'pod':<36} {'node':<16} {'rack':<8} detail")
    for p in placements:
        print(f"{p.name:<36} {p.node or '-':<16} {p.rack or '-':<8} {p.detail}")


def _wait_for_interrupt() -> None:
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()


def run(cluster: LocalCluster, options: RunOptions) -> int:
    """Run the whole system; return the exit code."""
    cluster.up()
    port = options.port or free_port()
    with cluster.api_client() as api:
        for name in ("phalanx-system",):  # the webhook certificate's Secret lives there
            request_json(api, "POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
        for path in sorted(CRDS.glob("*.yaml")):
            apply_object(api, yaml.safe_load(path.read_text()))
    extender = start_extender(cluster, port, webhook_port=free_port())
    try:
        url = f"http://{LOOPBACK}:{port}"
        cluster.restart_scheduler(url, ignored_resources=HAMI_RESOURCES)
        with cluster.api_client() as api:
            objects = apply_manifests(api, _manifest_files(options.samples))
            placements = wait_placements(api, sum(map(expected_pods, objects)))
            print_report(placements)
            extender_api = Client(RestKube.from_kubeconfig(str(cluster.kubeconfig_path)), url)
            print()
            print_gangs(wait_gangs(api, extender_api, [o for o in objects if o["kind"] in GANG_KINDS], placements))
        print(f"\nextender {url} (log: {cluster.layout.log('extender')})")
        print(f"export KUBECONFIG={cluster.kubeconfig_path}")
        if not options.once:
            print("serving; Ctrl-C to stop")
            _wait_for_interrupt()
    finally:
        process.stop(extender.pid, Path(sys.executable), handle=extender.handle)
        if options.keep_cluster:
            cluster.restart_scheduler(None)
            with cluster.api_client() as api:
                for path in WEBHOOK_CONFIGURATIONS:
                    request_json(api, "DELETE", path)
        else:
            cluster.down()
    return 0
