"""`python -m agent`: the node agent of one node (a DaemonSet pod, or a process per KWOK node in
the local cluster and its tests)."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import structlog

from agent.auth import Reviewer
from agent.inventory import Backend, BackendError
from agent.kube import Kube
from agent.ledger import Ledger
from agent.mps import MpsControl
from agent.node import NodeLoop
from agent.service import NodeAgentService
from rpc import nodeagent_pb2_grpc as pb_grpc

log = structlog.get_logger("phalanx.agent")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m agent", description=__doc__)
    ap.add_argument("--node", default=os.environ.get("NODE_NAME", ""), help="this node's name (env NODE_NAME)")
    ap.add_argument("--kubeconfig", help="kubeconfig file; in-cluster service account when omitted")
    ap.add_argument(
        "--backend",
        choices=("auto", "nvml", "fake"),
        default="auto",
        help="nvml: the GPUs through NVML; fake: GPUs from the Node's labels (KWOK); auto: nvml when a driver loads",
    )
    ap.add_argument("--listen", default="0.0.0.0:9444", help="host:port of the NodeAgent gRPC service")
    ap.add_argument(
        "--advertise",
        default="",
        help="host:port the scheduler dials, written to the Node's phalanx.io/agent-endpoint "
        "(default: $POD_IP and the --listen port)",
    )
    ap.add_argument(
        "--device-plugins",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="serve the kubelet device-plugin API (off on KWOK nodes, which have no kubelet)",
    )
    ap.add_argument("--plugin-dir", default="/var/lib/kubelet/device-plugins/")
    ap.add_argument("--pod-resources-socket", default="/var/lib/kubelet/pod-resources/kubelet.sock")
    ap.add_argument("--cdi-dir", default="/var/run/cdi")
    ap.add_argument(
        "--state-file",
        default="/var/lib/phalanx/agent-pins.json",
        help="which static MIG slice each pod holds, kept across agent restarts (a host path)",
    )
    ap.add_argument("--gpu-slots", type=int, default=1, help="nvidia.com/gpu slots advertised per whole GPU")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between inventory and health polls")
    ap.add_argument(
        "--pending-grace",
        type=float,
        default=60.0,
        help="seconds a BindAllocation waits for its pod's Binding before it is released",
    )
    ap.add_argument(
        "--evict-unhealthy",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="evict the pods holding a GPU that turns unhealthy",
    )
    ap.add_argument(
        "--mps",
        choices=("auto", "on", "off"),
        default="auto",
        help="run the MPS control daemon share containers need (auto: with the NVML backend)",
    )
    ap.add_argument("--mps-control", default="nvidia-cuda-mps-control", help="the MPS control binary")
    ap.add_argument(
        "--dynamic-mig-label",
        default="phalanx.io/mig-mode=dynamic",
        help="node label key=value of dynamic-MIG nodes (the extender's dynamicMigLabel)",
    )
    args = ap.parse_args(argv)
    if not args.node:
        ap.error("--node (or env NODE_NAME) is required")
    return args


def backend_for(args: argparse.Namespace, kube: Kube) -> tuple[Backend, Any]:
    """The backend, and for the fake one the callable that follows the Node object."""
    from agent.backends import FakeBackend, NvmlBackend

    if args.backend in ("auto", "nvml"):
        key, _, value = args.dynamic_mig_label.partition("=")
        labels = (kube.node(args.node).get("metadata") or {}).get("labels") or {}
        try:
            return NvmlBackend(dynamic_mig=labels.get(key) == value), None
        except BackendError as e:
            if args.backend == "nvml":
                raise SystemExit(f"phalanx-agent: {e}") from None
            log.info("no NVML driver: GPUs from the node's labels (fake backend)", error=str(e))
    fake = FakeBackend.from_node(kube.node(args.node), dynamic_mig_label=args.dynamic_mig_label)
    return fake, fake.update


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    kube = Kube.from_kubeconfig(args.kubeconfig)
    backend, follow = backend_for(args, kube)
    state = Path(args.state_file)
    state.parent.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(backend, state=state)
    port = args.listen.rsplit(":", 1)[1]
    pod_ip = os.environ.get("POD_IP", "")
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip  # an IPv6 address is bracketed in host:port
    endpoint = args.advertise or (f"{host}:{port}" if pod_ip else "")
    plugins = None
    loop = NodeLoop(
        kube,
        args.node,
        ledger,
        endpoint=endpoint,
        interval_s=args.interval,
        pending_grace_s=args.pending_grace,
        evict_unhealthy=args.evict_unhealthy,
        follow_node=follow,
        mps=MpsControl(binary=args.mps_control)
        if args.mps == "on" or (args.mps == "auto" and follow is None)
        else None,
    )
    if args.device_plugins:
        from agent.deviceplugin import DevicePlugins

        plugins = DevicePlugins(
            loop.resolve,
            plugin_dir=Path(args.plugin_dir),
            pod_resources_socket=Path(args.pod_resources_socket),
            cdi_dir=Path(args.cdi_dir),
            slots_per_gpu=args.gpu_slots,
        )
        loop.on_inventory = plugins.update
        loop.housekeeping = plugins.collect_garbage
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="nodeagent"))
    pb_grpc.add_NodeAgentServicer_to_server(
        NodeAgentService(args.node, ledger, loop, Reviewer(kube, args.node)), server
    )
    if server.add_insecure_port(args.listen) == 0:
        raise SystemExit(f"phalanx-agent: cannot listen on {args.listen}")
    server.start()
    loop.start()
    if plugins is not None:
        plugins.start()
    log.info("agent serving", node=args.node, listen=args.listen, endpoint=endpoint, backend=backend.name)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    loop.stop()
    if plugins is not None:
        plugins.stop()
    server.stop(grace=5).wait()
    if loop.mps is not None:
        loop.mps.stop()
    backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
