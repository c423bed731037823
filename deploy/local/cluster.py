"""``LocalCluster``: start the local control plane, inspect it, swap its scheduler, stop it.

Start order is etcd → kube-apiserver → (kube-controller-manager, kube-scheduler, kwok) → fake
nodes (the controller manager unless ``ControlPlaneOptions.controller_manager`` is off), and each step waits
on an observable condition (a health endpoint, the ``default`` namespace, Ready nodes) with a
deadline; a component that exits while we wait fails the wait at once with its log tail. Ports
are chosen free at every start and kubeconfigs are rewritten to match. ``up`` on a healthy
cluster reuses it (restarting only kube-scheduler when the requested extender differs); on a
partly running one it stops the leftovers and starts afresh on the same etcd data.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml
from kubernetes import client

from deploy.local import controllers, credentials, process, stages
from deploy.local.build import Binaries, ensure_binaries, locate_binaries
from deploy.local.components import (
    LOOPBACK,
    ApiserverFiles,
    ControlPlaneOptions,
    Ports,
    apiserver_argv,
    audit_policy,
    controller_manager_argv,
    etcd_argv,
    kwok_argv,
    pick_ports,
    scheduler_argv,
)
from deploy.local.kubeapi import new_api_client, request_json
from deploy.local.nodes import (
    CreatedNodes,
    create_node_objects,
    is_ready,
    list_nodes,
    node_manifests,
    ready_node_names,
)
from deploy.local.paths import DEFAULT_CLUSTER_CONFIG, DEFAULT_CLUSTER_NAME, state_dir
from deploy.local.replicas import collection
from deploy.local.scheduler_config import (
    DEFAULT_SCHEDULER_NAME,
    ExtenderTLS,
    ManagedResource,
    SchedulerSettings,
)
from deploy.local.state import (
    COMPONENTS,
    CONTROLLER_MANAGER,
    ClusterRecord,
    ComponentRecord,
    StateLayout,
    load_record,
    locked,
    save_record,
)
from deploy.local.strays import find_strays
from deploy.local.topology import ClusterSpec, load_cluster_spec
from deploy.local.wait import FatalWaitError, http_ok, tls_context, wait_for

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Timeouts:
    """Deadlines in seconds; generous because a busy two-core machine starts things slowly."""

    etcd: float = 60.0
    apiserver: float = 180.0
    scheduler: float = 90.0
    kwok: float = 90.0
    nodes: float = 180.0


@dataclass(frozen=True)
class ComponentStatus:
    """One component as seen by :meth:`LocalCluster.status`."""

    name: str
    pid: int
    port: int
    running: bool
    log: str


@dataclass(frozen=True)
class ClusterStatus:
    """A snapshot of the cluster for ``status`` and tests."""

    state_dir: Path
    kubeconfig: Path
    components: tuple[ComponentStatus, ...]
    extender_url: str | None
    nodes_total: int | None
    nodes_ready: int | None

    @property
    def running(self) -> bool:
        return bool(self.components) and all(c.running for c in self.components)


class LocalCluster:
    """A local etcd + kube-apiserver + kube-scheduler + KWOK cluster with fake GPU nodes.

    ``up()`` is idempotent and ``down()`` leaves no process behind. Everything lives in
    ``state_dir`` (default ``~/.cache/phalanx/cluster/<name>`` or ``$PHALANX_STATE_DIR``).
    """

    def __init__(
        self,
        name: str = DEFAULT_CLUSTER_NAME,
        *,
        state_dir_path: Path | str | None = None,
        spec: ClusterSpec | None = None,
        spec_path: Path | str = DEFAULT_CLUSTER_CONFIG,
        options: ControlPlaneOptions | None = None,
        timeouts: Timeouts | None = None,
        progress: Progress = print,
    ) -> None:
        self.name = name
        self.layout = StateLayout(state_dir(name, state_dir_path))
        self._spec = spec
        self._spec_path = Path(spec_path)
        self.options = options or ControlPlaneOptions()
        self.timeouts = timeouts or Timeouts()
        self._progress = progress
        self._handles: dict[str, process.Launched] = {}

    # -- public API ---------------------------------------------------------------------------

    @property
    def state_dir(self) -> Path:
        return self.layout.root

    @property
    def kubeconfig_path(self) -> Path:
        """The admin kubeconfig (token auth, verifies TLS with the API server's CA)."""
        return self.layout.kubeconfig

    @property
    def spec(self) -> ClusterSpec:
        """The fake-node description (``config/cluster.yaml`` unless given)."""
        if self._spec is None:
            self._spec = load_cluster_spec(self._spec_path)
        return self._spec

    def up(
        self,
        *,
        extender_url: str | None = None,
        nodes: bool = True,
        managed_resources: Sequence[ManagedResource] = (),
        scheduler_names: Sequence[str] = (DEFAULT_SCHEDULER_NAME,),
        ignored_resources: Sequence[str] = (),
    ) -> Self:
        """Start the cluster (or reuse a healthy one) and create the spec's nodes.

        The scheduler arguments mean what they mean for :meth:`restart_scheduler`; a reused
        cluster's kube-scheduler is restarted only if its configuration would change.
        """
        settings = _settings(extender_url, managed_resources, scheduler_names, ignored_resources)
        controllers.with_requirements(self.options.controllers)  # an unknown name fails before anything starts
        with locked(self.layout):
            record = load_record(self.layout)
            if record is not None and self._healthy(record):
                self._progress(f"cluster {self.name!r} already running; reusing it")
                if self._scheduler_config_differs(settings):
                    self._restart_scheduler(record, settings)
            else:
                self._stop_all(record)
                self._start(settings)
        if nodes:
            self.create_nodes()
        self._progress(f"cluster {self.name!r} is up; kubeconfig: {self.kubeconfig_path}")
        return self

    def down(self, *, keep_data: bool = False) -> None:
        """Stop every component (SIGTERM, then SIGKILL) and drop etcd data unless ``keep_data``."""
        with locked(self.layout):
            self._stop_all(load_record(self.layout))
            self.layout.record.unlink(missing_ok=True)
            if not keep_data:
                shutil.rmtree(self.layout.etcd_data, ignore_errors=True)
        self._progress(f"cluster {self.name!r} is down")

    def restart_scheduler(
        self,
        extender_url: str | None = None,
        *,
        managed_resources: Sequence[ManagedResource] = (),
        scheduler_names: Sequence[str] = (DEFAULT_SCHEDULER_NAME,),
        ignored_resources: Sequence[str] = (),
        extender_tls: ExtenderTLS | None = None,
        percentage_of_nodes_to_score: int | None = None,
    ) -> None:
        """Restart kube-scheduler, stock (``extender_url=None``) or calling the extender
        (over HTTPS with ``extender_tls``: kube-scheduler's client certificate and the CA of
        the extender's).

        ``managed_resources`` narrows which pods the extender sees (default: all);
        ``ignored_resources`` are skipped by NodeResourcesFit (e.g. :data:`HAMI_RESOURCES`);
        ``scheduler_names`` gives one profile per name; ``percentage_of_nodes_to_score``
        overrides kube-scheduler's adaptive default (for A/B runs).
        """
        settings = _settings(extender_url, managed_resources, scheduler_names, ignored_resources)
        settings = replace(
            settings, extender_tls=extender_tls, percentage_of_nodes_to_score=percentage_of_nodes_to_score
        )
        with locked(self.layout):
            self._restart_scheduler(self._require_record(), settings)

    def restart_apiserver(self, *, crash: bool = True, down_s: float = 0.0) -> None:
        """Stop kube-apiserver (SIGKILL when ``crash``, as a crash would; else SIGTERM), keep it
        down ``down_s`` seconds (an outage its clients must ride out), and start it again on the
        same port with the same certificates and etcd, so every kubeconfig stays valid (fault
        tests: benchmarks/chaos.py)."""
        with locked(self.layout):
            record = load_record(self.layout)  # no health probe first: a crash strikes at once
            if record is None or "kube-apiserver" not in record.components:
                raise RuntimeError(f"cluster {self.name!r} is not running (state: {self.state_dir})")
            old = record.components["kube-apiserver"]
            if crash:
                launched = self._handles.pop("kube-apiserver", None)
                handle = launched.handle if launched and launched.pid == old.pid else None
                process.kill(old.pid, Path(old.binary), handle=handle)
                self._progress(f"killed kube-apiserver (pid {old.pid})")
            else:
                self._stop_component("kube-apiserver", old)
            time.sleep(down_s)  # the outage itself, not a synchronisation
            etcd, scheduler, kwok = (record.components[n].port for n in ("etcd", "kube-scheduler", "kwok"))
            ports = Ports(etcd_client=etcd, etcd_peer=0, apiserver=old.port, scheduler=scheduler, kwok=kwok)
            tokens = credentials.ensure_tokens(self.layout.token_file)
            self._start_apiserver(record, Path(old.binary), ports, tokens)

    def status(self) -> ClusterStatus:
        """Return pids, ports and liveness of each component and the node counts."""
        record = load_record(self.layout)
        components: tuple[ComponentStatus, ...] = ()
        total = ready = None
        if record is not None:
            components = tuple(
                ComponentStatus(name, c.pid, c.port, process.is_running(c.pid, Path(c.binary)), c.log)
                for name, c in record.components.items()
            )
            if self._healthy(record):
                with self.api_client() as api:
                    listed = list_nodes(api)
                total, ready = len(listed), sum(1 for node in listed if is_ready(node))
        return ClusterStatus(
            state_dir=self.state_dir,
            kubeconfig=self.kubeconfig_path,
            components=components,
            extender_url=record.extender_url if record else None,
            nodes_total=total,
            nodes_ready=ready,
        )

    def api_client(self) -> client.ApiClient:
        """Return a new Kubernetes API client for the admin kubeconfig (close it when done)."""
        return new_api_client(str(self.kubeconfig_path))

    def create_nodes(
        self,
        count: int | None = None,
        *,
        spec: ClusterSpec | None = None,
        wait_ready: bool = True,
        workers: int = 8,
    ) -> CreatedNodes:
        """Create ``count`` fake GPU nodes (default: the spec's); wait until they are Ready."""
        bodies = node_manifests(spec or self.spec, count)
        with self.api_client() as api:
            created = create_node_objects(api, bodies, workers=workers)
            if wait_ready:
                self.wait_nodes_ready(created.names, api=api)
        self._progress(f"nodes: {len(created.created)} created, {len(created.existing)} existed")
        return created

    def wait_nodes_ready(
        self,
        names: Sequence[str],
        *,
        api: client.ApiClient | None = None,
        timeout: float | None = None,
    ) -> None:
        """Wait until every node in ``names`` reports Ready."""
        wanted = set(names)

        def all_ready(api_client: client.ApiClient) -> bool:
            return wanted <= ready_node_names(api_client, label_selector="")

        deadline = self.timeouts.nodes if timeout is None else timeout
        if api is not None:
            wait_for(lambda: all_ready(api), timeout=deadline, what=f"{len(wanted)} nodes Ready")
            return
        with self.api_client() as own:
            wait_for(lambda: all_ready(own), timeout=deadline, what=f"{len(wanted)} nodes Ready")

    def __enter__(self) -> Self:
        return self.up()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.down()

    # -- starting -----------------------------------------------------------------------------

    def _start(self, settings: SchedulerSettings) -> None:
        binaries = ensure_binaries(self._progress)
        ports = pick_ports()
        record = ClusterRecord(
            name=self.name,
            extender_url=settings.extender_url,
            scheduler_names=settings.scheduler_names,
            apiserver_url=f"https://{LOOPBACK}:{ports.apiserver}",
        )
        try:
            tokens = self._prepare_files(record.apiserver_url)
            self._start_etcd(record, binaries, ports)
            self._start_apiserver(record, binaries.kube_apiserver, ports, tokens)
            if self.options.controller_manager:
                argv = controller_manager_argv(
                    binaries.kube_controller_manager, port=ports.controller_manager, kubeconfig=self.layout.kubeconfig
                )
                self._launch(
                    record, CONTROLLER_MANAGER, binaries.kube_controller_manager, ports.controller_manager, argv
                )
            self.layout.scheduler_config.write_text(settings.render(self.layout.scheduler_kubeconfig))
            self._launch_scheduler(record, binaries.kube_scheduler, ports.scheduler)
            kwok = kwok_argv(
                binaries.kwok,
                port=ports.kwok,
                kubeconfig=self.layout.kwok_kubeconfig,
                stage_config=self.layout.kwok_stages,
                options=self.options,
            )
            self._launch(record, "kwok", binaries.kwok, ports.kwok, kwok)
            self._wait_healthy(record, "kube-scheduler", self.timeouts.scheduler)
            self._wait_healthy(record, "kwok", self.timeouts.kwok)
            if self.options.controller_manager:
                self._wait_healthy(record, CONTROLLER_MANAGER, self.timeouts.scheduler)
            for name in controllers.with_requirements(self.options.controllers):
                self._start_controller(record, name)
        except BaseException:
            self._progress(f"start failed; stopping what was started (logs in {self.state_dir / 'logs'})")
            self._stop_all(record)
            raise

    def _start_controller(self, record: ClusterRecord, name: str) -> None:
        """Build (cached) and start a workload controller with its CRDs and webhooks."""
        spec = controllers.CONTROLLERS[name]
        binary, source = controllers.ensure(spec, self._progress)
        with self.api_client() as api:

            def apply(doc: dict[str, Any]) -> None:
                apply_object(api, doc)

            prepared = controllers.prepare(
                spec,
                binary,
                source,
                state=self.state_dir,
                kubeconfig=self.layout.kubeconfig,
                apply=apply,
                environ=os.environ,
            )
            self._launch(record, name, binary, prepared.health_port, prepared.argv, env=prepared.env)
            self._wait_healthy(record, name, self.timeouts.scheduler)
            for doc in controllers.documents(source, spec.manifests):
                apply(doc)

    def start_controller(self, name: str) -> None:
        """Start a workload controller (and those it needs) in the running cluster, installing its
        CRDs and webhooks then; one already running is left alone."""
        with locked(self.layout):
            record = self._require_record()
            for needed in controllers.with_requirements((name,)):
                if needed not in record.components:
                    self._start_controller(record, needed)

    def restart_controller(self, name: str) -> None:
        """Stop a workload controller (SIGTERM, then SIGKILL) and start it again, as a restarted
        controller pod would: its informers relist and it reconciles from what the API server
        holds."""
        with locked(self.layout):
            record = self._require_record()
            self._stop_component(name, record.components[name])
            self._start_controller(record, name)

    def _prepare_files(self, server: str) -> credentials.Tokens:
        layout = self.layout
        credentials.ensure_service_account_key(layout.service_account_key)
        tokens = credentials.ensure_tokens(layout.token_file)
        for path, identity in (
            (layout.kubeconfig, tokens.admin),
            (layout.scheduler_kubeconfig, tokens.scheduler),
            (layout.kwok_kubeconfig, tokens.kwok),
        ):
            credentials.write_kubeconfig(
                path,
                credentials.kubeconfig(server, layout.ca_file, identity, cluster_name=self.name),
            )
        stages.write_stage_config(layout.kwok_stages)
        return tokens

    def _start_etcd(self, record: ClusterRecord, binaries: Binaries, ports: Ports) -> None:
        self.layout.etcd_data.mkdir(parents=True, exist_ok=True)
        self.layout.etcd_data.chmod(0o700)
        self._launch(
            record,
            "etcd",
            binaries.etcd,
            ports.etcd_client,
            etcd_argv(binaries.etcd, data_dir=self.layout.etcd_data, ports=ports),
        )
        self._wait_healthy(record, "etcd", self.timeouts.etcd)

    def _start_apiserver(self, record: ClusterRecord, binary: Path, ports: Ports, tokens: credentials.Tokens) -> None:
        files = ApiserverFiles(
            cert_dir=self.layout.pki,
            service_account_key=self.layout.service_account_key,
            token_file=self.layout.token_file,
        )
        if self.options.audit_users:
            self.layout.audit_policy.write_text(yaml.safe_dump(audit_policy(self.options.audit_users)))
            files = replace(files, audit_policy=self.layout.audit_policy, audit_log=self.layout.audit_log)
        self._launch(
            record,
            "kube-apiserver",
            binary,
            ports.apiserver,
            apiserver_argv(binary, ports=ports, files=files, options=self.options),
        )
        self._wait_healthy(record, "kube-apiserver", self.timeouts.apiserver)
        # /readyz can pass before the system-namespaces controller has made "default".
        url = f"{record.apiserver_url}/api/v1/namespaces/default"
        context = tls_context(str(self.layout.ca_file))
        wait_for(
            lambda: http_ok(url, context=context, token=tokens.admin.token),
            timeout=self.timeouts.apiserver,
            what="namespace default",
        )

    def _launch(
        self,
        record: ClusterRecord,
        name: str,
        binary: Path,
        port: int,
        argv: list[str],
        env: dict[str, str] | None = None,
    ) -> None:
        log = self.layout.log(name)
        launched = process.start(argv, log_path=log, env=env, die_with_parent=self.options.die_with_parent)
        self._handles[name] = launched
        record.components[name] = ComponentRecord(pid=launched.pid, binary=str(binary), port=port, log=str(log))
        save_record(self.layout, record)
        self._progress(f"started {name} (pid {launched.pid}, port {port})")

    # -- health -------------------------------------------------------------------------------

    def _probe(self, record: ClusterRecord, name: str) -> bool:
        port = record.components[name].port
        if name == "etcd":
            return http_ok(f"http://{LOOPBACK}:{port}/health")
        if name == "kube-apiserver":
            if not self.layout.ca_file.is_file():
                return False
            context = tls_context(str(self.layout.ca_file))
            return http_ok(f"{record.apiserver_url}/readyz", context=context)
        if name == "kube-scheduler":
            return http_ok(f"https://{LOOPBACK}:{port}/readyz", context=tls_context(None))
        if name == CONTROLLER_MANAGER:
            return http_ok(f"https://{LOOPBACK}:{port}/healthz", context=tls_context(None))
        if name in controllers.CONTROLLERS:
            return http_ok(f"http://{LOOPBACK}:{port}{controllers.CONTROLLERS[name].health_path}")
        return http_ok(f"http://{LOOPBACK}:{port}/healthz")

    def _wait_healthy(self, record: ClusterRecord, name: str, timeout: float) -> None:
        component = record.components[name]

        def healthy() -> bool:
            if not process.is_running(component.pid, Path(component.binary)):
                tail = process.log_tail(Path(component.log))
                raise FatalWaitError(f"{name} exited; last log lines:\n{tail}")
            return self._probe(record, name)

        wait_for(healthy, timeout=timeout, what=f"{name} to become healthy")

    def _healthy(self, record: ClusterRecord) -> bool:
        wanted = set(COMPONENTS) - (set() if self.options.controller_manager else {CONTROLLER_MANAGER})
        # the record may hold more workload controllers than asked (an `up --controllers` before)
        present = wanted | set(controllers.with_requirements(self.options.controllers)) <= set(record.components)
        return present and all(
            process.is_running(c.pid, Path(c.binary)) and self._probe(record, name)
            for name, c in record.components.items()
        )

    # -- scheduler ----------------------------------------------------------------------------

    def _scheduler_config_differs(self, settings: SchedulerSettings) -> bool:
        path = self.layout.scheduler_config
        return not path.is_file() or path.read_text() != settings.render(self.layout.scheduler_kubeconfig)

    def _launch_scheduler(self, record: ClusterRecord, binary: Path, port: int) -> None:
        argv = scheduler_argv(
            binary,
            port=port,
            config=self.layout.scheduler_config,
            kubeconfig=self.layout.scheduler_kubeconfig,
            options=self.options,
        )
        self._launch(record, "kube-scheduler", binary, port, argv)

    def _restart_scheduler(self, record: ClusterRecord, settings: SchedulerSettings) -> None:
        old = record.components["kube-scheduler"]
        self._stop_component("kube-scheduler", old)
        self.layout.scheduler_config.write_text(settings.render(self.layout.scheduler_kubeconfig))
        record.extender_url, record.scheduler_names = settings.extender_url, settings.scheduler_names
        self._launch_scheduler(record, Path(old.binary), old.port)
        self._wait_healthy(record, "kube-scheduler", self.timeouts.scheduler)
        self._progress(f"kube-scheduler restarted ({settings.describe()})")

    # -- stopping -----------------------------------------------------------------------------

    def _stop_component(self, name: str, component: ComponentRecord) -> None:
        launched = self._handles.pop(name, None)
        handle = launched.handle if launched and launched.pid == component.pid else None
        if process.stop(component.pid, Path(component.binary), handle=handle):
            self._progress(f"stopped {name} (pid {component.pid})")

    def _stop_all(self, record: ClusterRecord | None) -> None:
        if record is not None:
            extra = [n for n in record.components if n not in COMPONENTS]  # workload controllers first
            for name in [*extra, *reversed(COMPONENTS)]:
                if name in record.components:
                    self._stop_component(name, record.components[name])
        # Safety net: anything still running from our binaries with this state folder in argv.
        binaries = locate_binaries()
        for stray in find_strays(self.state_dir, binaries, controllers.binaries()):
            self._progress(f"stopping stray {stray.binary.name} (pid {stray.pid})")
            process.stop(stray.pid, stray.binary)

    def _require_record(self) -> ClusterRecord:
        record = load_record(self.layout)
        if record is None or not self._healthy(record):
            raise RuntimeError(f"cluster {self.name!r} is not running (state: {self.state_dir})")
        return record


def apply_object(api: client.ApiClient, doc: dict[str, Any]) -> None:
    """Server-side apply of an object of replicas.PATHS (a CRD, a webhook configuration, a
    controller's namespace and ConfigMap), as replicas.apply does; a CRD is waited on until it is
    Established."""
    path = f"{collection(doc)}/{doc['metadata']['name']}"
    query = {"fieldManager": "phalanx-local", "force": "true"}
    applied = request_json(api, "PATCH", path, body=doc, query=query, content_type="application/apply-patch+yaml")
    if applied.status not in (200, 201):
        raise RuntimeError(f"applying {doc['kind']} {doc['metadata']['name']}: HTTP {applied.status}: {applied.body}")
    if doc["kind"] == "CustomResourceDefinition":

        def established() -> bool:
            status = request_json(api, "GET", path).body.get("status") or {}
            return any(c["type"] == "Established" and c["status"] == "True" for c in status.get("conditions") or [])

        wait_for(established, timeout=60, what=f"CRD {doc['metadata']['name']} established")


def _settings(
    extender_url: str | None,
    managed_resources: Sequence[ManagedResource],
    scheduler_names: Sequence[str],
    ignored_resources: Sequence[str],
) -> SchedulerSettings:
    return SchedulerSettings(
        extender_url=extender_url,
        managed_resources=tuple(managed_resources),
        scheduler_names=tuple(scheduler_names),
        ignored_resources=tuple(ignored_resources),
    )
