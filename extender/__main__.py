"""`python -m extender`: run the Phalanx scheduler extender."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ipaddress
import signal
import threading
from pathlib import Path

from extender.app import ApiListenOptions, Extender, Options, RemoteSolverOptions
from extender.kube import RestKube
from extender.leader import LeaderOptions
from extender.policy.service import webhook_options
from extender.tls import TLSFiles

M_ARENA_MAX = -8  # glibc mallopt parameter
ARENAS = 2


def _few_malloc_arenas() -> None:
    """At most two glibc malloc arenas (as MALLOC_ARENA_MAX=2 would, but wherever the process
    runs). glibc gives each thread that allocates concurrently an arena of its own and never
    hands their peaks back: after a burst of hostile requests on a few hundred threads the
    extender stayed 120-150 MiB larger; with two arenas, 24 MiB. Set before any thread starts.
    A no-op off glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(M_ARENA_MAX, ARENAS)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def main() -> None:
    _few_malloc_arenas()
    ap = argparse.ArgumentParser(prog="python -m extender", description=__doc__)
    ap.add_argument("--kubeconfig", help="kubeconfig file; in-cluster service account when omitted")
    ap.add_argument("--host", default="127.0.0.1", help="listen address (a sidecar listens on loopback)")
    ap.add_argument(
        "--insecure-expose-verbs",
        action="store_true",
        help="allow a non-loopback --host without TLS client certificates: anyone who reaches the port "
        "can bind pods; only behind a network policy that admits kube-scheduler alone",
    )
    ap.add_argument("--port", type=int, default=8888)
    ap.add_argument("--config-namespace", default="phalanx-system", help="namespace of the phalanx-config ConfigMap")
    ap.add_argument("--config-file", type=Path, help="initial configuration file (the ConfigMap overrides it)")
    ap.add_argument("--tls-cert-file", type=Path, help="serve HTTPS with this certificate (PEM, re-read on change)")
    ap.add_argument("--tls-private-key-file", type=Path, help="the certificate's private key (PEM)")
    ap.add_argument(
        "--client-ca-file",
        type=Path,
        help="CA of the clients allowed to call the verbs (kube-scheduler's tlsConfig.certFile); "
        "a verb call without a certificate it signed gets 401",
    )
    ap.add_argument(
        "--follow-scheduler-lease",
        metavar="NAMESPACE/NAME",
        help="HA: bind only while the kube-scheduler beside this extender holds this lease (its "
        "leaderElection resourceNamespace/resourceName); every other replica refuses binds",
    )
    ap.add_argument(
        "--scheduler-metrics-url",
        default="https://127.0.0.1:10259/metrics",
        help="where the kube-scheduler beside it serves /metrics (its leader_election_master_status)",
    )
    ap.add_argument(
        "--metrics-address",
        metavar="HOST:PORT",
        help="also serve /metrics (only) here, e.g. 0.0.0.0:9090 for Prometheus; the verbs stay on --host",
    )
    ap.add_argument(
        "--api-address",
        metavar="HOST:PORT",
        help="also serve the REST APIs (allocations, jobs, quotas, nodes, metrics, reads; never the verbs) "
        "here, e.g. 0.0.0.0:8443 behind the phalanx-api Service; off loopback it needs --api-tls-cert-file",
    )
    ap.add_argument("--api-tls-cert-file", type=Path, help="the REST API port's certificate (PEM, re-read on change)")
    ap.add_argument("--api-tls-private-key-file", type=Path, help="its private key (PEM)")
    ap.add_argument(
        "--webhook-port",
        type=int,
        default=0,
        help="serve the workload-policy admission webhooks (TLS) on this port; 0: off",
    )
    ap.add_argument("--webhook-host", default="0.0.0.0", help="the webhooks' listen address")
    ap.add_argument(
        "--webhook-service",
        metavar="NAMESPACE/NAME[:PORT]",
        help="the Service the API server calls the webhooks through (in-cluster)",
    )
    ap.add_argument(
        "--webhook-url",
        metavar="https://HOST:PORT",
        help="the base URL the API server calls the webhooks at (a control plane outside the cluster)",
    )
    ap.add_argument(
        "--webhook-cert-dir",
        type=Path,
        default=Path("/tmp/phalanx-webhook"),
        help="where the webhook's serving certificate is written (shared through a Secret, rotated)",
    )
    ap.add_argument(
        "--gpu-share-resource",
        action="store_true",
        help="with the node agent: give pods that ask a GPU share by annotation a phalanx.io/gpu-share "
        "slot (a mutating webhook; needs --webhook-port), so the kubelet calls the agent for them",
    )
    ap.add_argument(
        "--solver-address",
        metavar="HOST:PORT",
        help="solve gangs through the solver service (`python -m solverd`) here; in process when it is "
        "down or slower than the deadline",
    )
    ap.add_argument(
        "--solver-deadline",
        type=float,
        metavar="SECONDS",
        help="how long a remote solve may take before the in-process solver answers (default: the "
        "solver time limit + 2 s)",
    )
    ap.add_argument(
        "--bind-journal",
        type=Path,
        metavar="FILE",
        help="answer a single pod's bind once it is checked and its devices counted, and land the Binding "
        "in the background, journalled in FILE (on the pod's own volume: a restarted extender lands what "
        "it answered); without it a bind is answered when its Binding has landed",
    )
    args = ap.parse_args()
    if args.solver_deadline is not None and (not args.solver_address or args.solver_deadline <= 0):
        ap.error("--solver-deadline needs --solver-address and a positive number of seconds")
    remote = RemoteSolverOptions(args.solver_address, args.solver_deadline) if args.solver_address else None
    webhook = None
    if args.gpu_share_resource and not args.webhook_port:
        ap.error("--gpu-share-resource needs the webhooks (--webhook-port)")
    if args.webhook_port:
        try:
            webhook = webhook_options(
                args.webhook_host,
                args.webhook_port,
                args.webhook_service,
                args.webhook_url,
                args.webhook_cert_dir,
                gpu_share=args.gpu_share_resource,
            )
        except ValueError as e:
            ap.error(str(e))
    metrics_address = None
    if args.metrics_address:
        host, _, port = args.metrics_address.rpartition(":")
        if not host or not port.isdigit():
            ap.error(f"--metrics-address {args.metrics_address!r}: expected HOST:PORT")
        metrics_address = (host.strip("[]"), int(port))
    leader = None
    if args.follow_scheduler_lease:
        namespace, _, name = args.follow_scheduler_lease.partition("/")
        if not namespace or not name:
            ap.error(f"--follow-scheduler-lease {args.follow_scheduler_lease!r}: expected NAMESPACE/NAME")
        leader = LeaderOptions(namespace, name, args.scheduler_metrics_url)
    if bool(args.tls_cert_file) != bool(args.tls_private_key_file):
        ap.error("--tls-cert-file and --tls-private-key-file go together")
    if args.client_ca_file and not args.tls_cert_file:
        ap.error("--client-ca-file needs --tls-cert-file and --tls-private-key-file (client certificates need TLS)")
    secured = bool(args.tls_cert_file and args.client_ca_file)
    if not _loopback(args.host) and not secured and not args.insecure_expose_verbs:
        ap.error(
            f"--host {args.host}: the verbs listen on loopback only (run the extender as kube-scheduler's "
            "sidecar) unless they are secured: --tls-cert-file, --tls-private-key-file and --client-ca-file "
            "(or, behind a network policy, --insecure-expose-verbs)"
        )
    tls = TLSFiles(args.tls_cert_file, args.tls_private_key_file, args.client_ca_file) if args.tls_cert_file else None
    api = None
    if bool(args.api_tls_cert_file) != bool(args.api_tls_private_key_file):
        ap.error("--api-tls-cert-file and --api-tls-private-key-file go together")
    if args.api_tls_cert_file and not args.api_address:
        ap.error("--api-tls-cert-file needs --api-address")
    if args.api_address:
        host, _, port = args.api_address.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")  # [::]:8443
        if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            ap.error(f"--api-address {args.api_address!r}: expected HOST:PORT")
        if not _loopback(host) and not args.api_tls_cert_file:
            ap.error(f"--api-address {args.api_address}: off loopback the API needs TLS (--api-tls-cert-file)")
        api_tls = TLSFiles(args.api_tls_cert_file, args.api_tls_private_key_file) if args.api_tls_cert_file else None
        api = ApiListenOptions((host, int(port)), api_tls)
    kube = RestKube.from_kubeconfig(args.kubeconfig)
    options = Options(
        args.host,
        args.port,
        args.config_namespace,
        args.config_file,
        tls,
        leader,
        metrics_address,
        webhook,
        remote,
        api,
        args.bind_journal,
    )
    extender = Extender(kube, options)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    extender.start()
    done.wait()
    extender.stop()


if __name__ == "__main__":
    main()
