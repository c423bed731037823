"""``python -m deploy.local run`` (behind ``make run``): the whole system on the local cluster.

Steps: bring the cluster up (or reuse it), install the WorkloadPolicy CRD, start the Phalanx
extender (``python -m extender``) as a child process on a loopback port, with its policy
admission webhooks on another (registered by the extender itself at an https://127.0.0.1 URL),
point kube-scheduler at it (NodeResourcesFit ignoring
the HAMI-style resources no node advertises), apply the sample manifests
(``config/samples/*.yaml``), wait until each sample pod is bound or reported unschedulable, and
print where everything landed. Then it keeps serving until Ctrl-C (``--once`` stops right away);
on the way out it stops the extender and tears the cluster down unless ``--keep-cluster`` (then
it also removes the webhook configurations: they fail closed, and nothing would serve them).
"""

from __future__ import annotations

import contextlib
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
from deploy.local.cluster import LocalCluster
from deploy.local.components import LOOPBACK, free_port
from deploy.local.kubeapi import request_json
from deploy.local.nodes import RACK_LABEL
from deploy.local.paths import REPO_ROOT
from deploy.local.scheduler_config import HAMI_RESOURCES
from deploy.local.wait import FatalWaitError, WaitTimeout, http_ok, wait_for

DEFAULT_SAMPLES = REPO_ROOT / "config" / "samples"
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


POLICY_CRD = REPO_ROOT / "config" / "crds" / "phalanx.io_workloadpolicies.yaml"
WEBHOOK_CONFIGURATIONS = (
    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/phalanx-policies",
    "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/phalanx-policies",
)


def start_extender(cluster: LocalCluster, port: int, webhook_port: int | None = None) -> process.Launched:
    """Start ``python -m extender`` against the cluster and wait until it reports ready; with
    `webhook_port`, its policy webhooks too (README "Workload policies")."""
    argv = [sys.executable, "-m", "extender", "--kubeconfig", str(cluster.kubeconfig_path), "--port", str(port)]
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
    # Naive plural (kind + "s"): enough for Pod, PodGroup, Workload and ConfigMap samples.
    api_version, plural = obj["apiVersion"], obj["kind"].lower() + "s"
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{namespace}/{plural}"


def apply_manifests(api: client.ApiClient, files: Iterable[Path], namespace: str = "default") -> list[str]:
    """Create every object of ``files`` in ``namespace`` (existing ones are kept); return the pod names."""
    pods = []
    for path in files:
        for obj in yaml.safe_load_all(path.read_text()):
            if not obj:
                continue
            response = request_json(api, "POST", _collection_path(obj, namespace), body=obj)
            if response.status >= 300 and response.status != 409:
                raise RuntimeError(f"{path.name}: creating {obj['kind']} {obj['metadata']['name']}: {response.body}")
            if obj["kind"] == "Pod":
                pods.append(obj["metadata"]["name"])
    return pods


def _placement(api: client.ApiClient, namespace: str, name: str, rack_of: dict[str, str]) -> Placement | None:
    pod = request_json(api, "GET", f"/api/v1/namespaces/{namespace}/pods/{name}").body
    node = pod["spec"].get("nodeName")
    if node:
        annotations = pod["metadata"].get("annotations") or {}
        devices = {k: v for k, v in annotations.items() if k.startswith("phalanx.io/")}
        return Placement(name, node, rack_of.get(node), " ".join(f"{k}={v}" for k, v in devices.items()))
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition["status"] == "False" and condition.get("message"):
            return Placement(name, None, None, condition["message"])
    return None


def wait_placements(api: client.ApiClient, pods: Sequence[str], namespace: str = "default") -> list[Placement]:
    """Wait until each pod is bound or reported unschedulable; pods still undecided are listed as such."""
    rack_of = {
        n["metadata"]["name"]: n["metadata"]["labels"].get(RACK_LABEL, "")
        for n in request_json(api, "GET", "/api/v1/nodes").body["items"]
    }
    decided: dict[str, Placement] = {}
    started = time.monotonic()

    def settled() -> bool:
        for name in pods:
            if name not in decided or decided[name].node is None:
                found = _placement(api, namespace, name, rack_of)
                if found is not None:
                    decided[name] = found
        if len(decided) < len(pods):
            return False
        # An "unschedulable" verdict can be transient (a gang waiting for quorum): give the
        # scheduler's retries a few seconds before reporting it.
        all_bound = all(p.node for p in decided.values())
        return all_bound or time.monotonic() - started > SETTLE_SECONDS

    # Pods still undecided at the deadline are reported as pending, not raised.
    with contextlib.suppress(WaitTimeout):
        wait_for(settled, timeout=PLACEMENT_SECONDS, what="sample pods to be placed")
    return [decided.get(name, Placement(name, None, None, "still pending")) for name in pods]


def print_report(placements: Sequence[Placement]) -> None:
    """Print one line per sample pod."""
    print(f"{'pod':<28} {'node':<16} {'rack':<8} detail")
    for p in placements:
        print(f"{p.name:<28} {p.node or '-':<16} {p.rack or '-':<8} {p.detail}")


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
        request_json(
            api,
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            body=yaml.safe_load(POLICY_CRD.read_text()),
        )
    extender = start_extender(cluster, port, webhook_port=free_port())
    try:
        url = f"http://{LOOPBACK}:{port}"
        cluster.restart_scheduler(url, ignored_resources=HAMI_RESOURCES)
        with cluster.api_client() as api:
            pods = apply_manifests(api, _manifest_files(options.samples))
            print_report(wait_placements(api, pods))
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
