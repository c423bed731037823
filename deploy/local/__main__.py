"""Command line: ``python -m deploy.local up|down|status|run|restart-scheduler|build|gomod``.

``up`` builds the binaries on first use (several minutes; cached afterwards), starts the
control plane, creates the nodes of ``config/cluster.yaml`` and prints the kubeconfig path.
The state folder is ``~/.cache/phalanx/cluster/<name>`` unless ``--state-dir`` or
``$PHALANX_STATE_DIR`` says otherwise.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from deploy.local import controllers
from deploy.local.build import ensure_binaries, ensure_helm
from deploy.local.cluster import ClusterStatus, LocalCluster
from deploy.local.components import ControlPlaneOptions
from deploy.local.paths import DEFAULT_CLUSTER_CONFIG, DEFAULT_CLUSTER_NAME
from deploy.local.run import DEFAULT_SAMPLES, RUN_CONTROLLERS, RunOptions, run
from deploy.local.scheduler_config import DEFAULT_SCHEDULER_NAME, ManagedResource


def _progress(message: str) -> None:
    print(message, flush=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.local",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--name", default=DEFAULT_CLUSTER_NAME, help="cluster name")
    parser.add_argument("--state-dir", help="state folder (default: $PHALANX_STATE_DIR or the cache)")
    commands = parser.add_subparsers(dest="command", required=True)

    up = commands.add_parser("up", help="start (or reuse) the cluster and create its nodes")
    up.add_argument("--config", default=str(DEFAULT_CLUSTER_CONFIG), help="cluster description")
    up.add_argument("--no-nodes", action="store_true", help="do not create the fake nodes")
    up.add_argument(
        "--controllers",
        default="",
        help="workload controllers to build and run beside kube-controller-manager, comma-separated, from: "
        + ", ".join(controllers.CONTROLLERS),
    )
    restart = commands.add_parser("restart-scheduler", help="restart kube-scheduler")
    for sub in (up, restart):
        sub.add_argument("--extender-url", help="call this Phalanx extender (else vanilla)")
        sub.add_argument(
            "--scheduler-name",
            action="append",
            dest="scheduler_names",
            help="scheduler profile name (repeatable; default: default-scheduler)",
        )
        sub.add_argument(
            "--managed-resource",
            action="append",
            default=[],
            metavar="NAME[:ignored]",
            help="extender managedResources entry (repeatable; default: all pods)",
        )
        sub.add_argument(
            "--ignored-resource",
            action="append",
            default=[],
            metavar="NAME",
            help="resource NodeResourcesFit ignores (repeatable; e.g. nvidia.com/gpumem)",
        )

    down = commands.add_parser("down", help="stop the cluster")
    down.add_argument("--keep", action="store_true", help="keep etcd data for the next up")
    commands.add_parser("status", help="show components, pids, ports, kubeconfig, nodes")
    run = commands.add_parser("run", help="cluster + extender + samples, then serve until Ctrl-C (make run)")
    run.add_argument("--port", type=int, help="extender port (default: a free one)")
    run.add_argument("--samples", default=str(DEFAULT_SAMPLES), help="manifest file or folder to apply")
    run.add_argument("--once", action="store_true", help="exit after the placement report")
    run.add_argument("--keep-cluster", action="store_true", help="leave the cluster running on exit")
    run.add_argument(
        "--controllers",
        default=",".join(RUN_CONTROLLERS),
        help="workload controllers to run (default: what the samples need)",
    )
    commands.add_parser(
        "build", help="build the control-plane binaries, helm and the workload controllers (cached); print their paths"
    )
    commands.add_parser("gomod", help="regenerate the kube wrapper go.mod from kubernetes' own")
    return parser


def _managed(values: Sequence[str]) -> list[ManagedResource]:
    return [ManagedResource(name=v.split(":")[0], ignored_by_scheduler=v.endswith(":ignored")) for v in values]


def print_status(status: ClusterStatus) -> None:
    """Print a human-readable status table."""
    print(f"state dir:  {status.state_dir}")
    print(f"kubeconfig: {status.kubeconfig}")
    if not status.components:
        print("not running")
        return
    for c in status.components:
        state = "running" if c.running else "DEAD"
        print(f"  {c.name:<15} pid {c.pid:<8} port {c.port:<6} {state:<8} log {c.log}")
    print(f"scheduler:  {'extender ' + status.extender_url if status.extender_url else 'vanilla'}")
    if status.nodes_total is not None:
        print(f"nodes:      {status.nodes_ready}/{status.nodes_total} Ready")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return the exit code."""
    args = _parser().parse_args(argv)
    if args.command == "build":
        print(ensure_binaries(_progress))
        print(f"helm: {ensure_helm(_progress)}")  # for tests/e2e/test_chart.py (charts/phalanx)
        for spec in controllers.CONTROLLERS.values():  # for tests/e2e/test_controllers.py
            binary, _ = controllers.ensure(spec, _progress)
            print(f"{spec.name}: {binary}")
        return 0
    if args.command == "gomod":
        from deploy.local.gomod import regenerate

        print(f"wrote {regenerate()}")
        return 0
    wanted = tuple(n.strip() for n in getattr(args, "controllers", "").split(",") if n.strip())
    cluster = LocalCluster(
        args.name,
        state_dir_path=args.state_dir,
        progress=_progress,
        spec_path=getattr(args, "config", DEFAULT_CLUSTER_CONFIG),
        options=ControlPlaneOptions(controllers=wanted),
    )
    if args.command in ("up", "restart-scheduler"):
        names: list[str] = args.scheduler_names or [DEFAULT_SCHEDULER_NAME]
        managed = _managed(args.managed_resource)
        ignored: list[str] = args.ignored_resource
        if args.command == "up":
            cluster.up(
                extender_url=args.extender_url,
                nodes=not args.no_nodes,
                managed_resources=managed,
                scheduler_names=names,
                ignored_resources=ignored,
            )
        else:
            cluster.restart_scheduler(
                args.extender_url, managed_resources=managed, scheduler_names=names, ignored_resources=ignored
            )
        print_status(cluster.status())
        print(f"export KUBECONFIG={cluster.kubeconfig_path}")
    elif args.command == "run":
        options = RunOptions(port=args.port, samples=Path(args.samples), once=args.once, keep_cluster=args.keep_cluster)
        return run(cluster, options)
    elif args.command == "down":
        cluster.down(keep_data=args.keep)
    else:
        status = cluster.status()
        print_status(status)
        return 0 if status.running else 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
