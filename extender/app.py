"""The extender process: watch cache, configuration, HTTP server, wired together.

Start-up: load the configuration (ConfigMap, else a file, else defaults), list and watch
nodes and pods, serve HTTP at once (readiness stays 503 until both lists are in), and keep
watching the ConfigMap: a valid update applies live, an invalid one is logged, recorded as an
Event on the ConfigMap and ignored.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import structlog
from prometheus_client import start_http_server

from extender import logs
from extender.agents import ENDPOINT_ANNOTATION, Agents
from extender.api.context import Context
from extender.api.core import ApiError as Refused
from extender.api.service import AllocationApi
from extender.auth import KubeAuthorizer
from extender.binder import Binder
from extender.cache import Cache
from extender.collectors import StateCollector
from extender.config import (
    CONFIGMAP_KEY,
    CONFIGMAP_NAME,
    ConfigError,
    PhalanxConfig,
    parse,
    unmatched_levels,
    unmatched_levels_message,
)
from extender.dynamic_watch import DynamicWatches
from extender.gangs.manager import GangManager
from extender.gangs.notify import Notifier
from extender.gangs.ri_source import RISource
from extender.gangs.sources import (
    COSCHEDULING_POD_GROUP,
    KAI_POD_GROUP,
    NATIVE_POD_GROUP,
    VOLCANO_POD_GROUP,
    WORKLOAD,
    GangObjects,
    definition_spec,
    same_definition,
)
from extender.kube import ApiError, Kube
from extender.landing import Journal, Landings
from extender.leader import LeaderOptions, Leadership
from extender.metrics import Metrics
from extender.objects import PodInfo, pod_info
from extender.policy.api import PolicyApi
from extender.policy.priorities import PriorityClasses
from extender.policy.service import PolicyService, WebhookOptions, plural_kinds
from extender.policy.store import POLICIES_PATH, PolicyStore
from extender.policy.webhook import Admission
from extender.pools import Hardware
from extender.preemption import Preemptor
from extender.queue_status import QUEUES_PATH, QueueStatusWriter
from extender.queues import QueueBook
from extender.read_api import ReadApi
from extender.ri.model import GVK
from extender.ri.registry import Registry
from extender.server import Api, Read, Reply, Route, Server
from extender.sharing import Sharing
from extender.tls import ServerTLS, TLSFiles
from extender.verbs import Verbs
from extender.watch import Reflector
from extender.workload_types import WorkloadTypes
from solver import SolverParams
from solverd.client import RemoteSolver

# Gang definition kinds also served at an older version by older Kubernetes releases.
OLDER_VERSIONS = {"/apis/scheduling.k8s.io/v1beta1/podgroups": ("/apis/scheduling.k8s.io/v1alpha2/podgroups",)}

log = structlog.get_logger("phalanx.app")
CATCH_UP_GATHER_S = 0.005  # a burst of pod changes gathered before the memos catch up
CATCH_UP_QUIET_S = 0.02  # no verb call for this long: kube-scheduler is not streaming pods
# Young objects collected every 50,000 allocations (not 700): start-up and the verbs make many.
GC_THRESHOLDS = (50_000, 20, 100)


@dataclass(frozen=True)
class Options:
    host: str = "127.0.0.1"
    port: int = 8888
    config_namespace: str = "phalanx-system"
    config_file: Path | None = None
    tls: TLSFiles | None = None  # serve HTTPS (verbs only for clients the client CA signed)
    leader: LeaderOptions | None = None  # HA: bind only while the kube-scheduler beside it leads
    metrics_address: tuple[str, int] | None = None  # also serve /metrics here (for Prometheus)
    webhook: WebhookOptions | None = None  # serve the workload-policy admission webhooks
    solver: RemoteSolverOptions | None = None  # solve through the solver service (solverd), in process if down
    api: ApiListenOptions | None = None  # also serve the REST APIs (only) here, for tenants
    # Answer single pods' binds before their Binding lands, journalled here (extender/landing.py).
    bind_journal: Path | None = None


@dataclass(frozen=True)
class ApiListenOptions:
    address: tuple[str, int]  # host, port (port 0: any free one)
    tls: TLSFiles | None = None  # required off loopback (enforced by the command line)


@dataclass(frozen=True)
class RemoteSolverOptions:
    address: str  # host:port of `python -m solverd`
    deadline_s: float | None = None  # None: the solver time limit + 2 s


class Extender:
    def __init__(self, kube: Kube, options: Options = Options()) -> None:
        self.kube = kube
        self.options = options
        self.config = self._initial_config()
        self.metrics = Metrics()
        self.cache = Cache(self.config.topology.levels, Hardware(self.config.gpu))
        self.leadership: Leadership | None = None
        agents = Agents(
            lambda node: self.cache.node_annotation(node, ENDPOINT_ANNOTATION),
            lambda: getattr(kube, "headers", {}).get("Authorization"),
        )
        self.binder = Binder(kube, fence=self._fence if options.leader else None, agents=agents)
        self.gang_objects = GangObjects()
        self.notifier = notifier = Notifier(self.binder, lambda how: self.metrics.gang_wakeups.labels(how).inc())
        self.cache.on_pod_change(self._report_pod)
        self._synced = False  # see `synced`
        self._sync_lock = threading.Lock()
        self._pods_moved = threading.Event()  # wakes the memos' catch-up (extender/memo.py)
        self.cache.on_pod_change(lambda old, new: self._pods_moved.set())
        self.cache.on_invalid_node(self._report_node)
        self.registry = Registry()
        # A trip fires on the thread that ran the jq (maybe a filter): report through the queue.
        self.registry.on_budget_trip(lambda _name, message: self._report_config("ResourceInterfaceOverBudget", message))
        self.ri = RISource(self.registry, self.cache.pod)
        self.queues = QueueBook(self.cache, self.config.queues, gang_of=lambda pod: self.gangs.gang_of(pod))
        self.queues.waits = lambda queue, seconds: self.metrics.queue_wait.labels(queue).observe(seconds)
        self.remote_solver: RemoteSolver | None = None
        if options.solver is not None:
            self.remote_solver = RemoteSolver(
                options.solver.address,
                deadline_s=options.solver.deadline_s,
                on_solve=lambda where: self.metrics.solves.labels(where).inc(),
            )
        self.gangs = GangManager(
            self.cache,
            self.gang_objects,
            self._solver_params,
            notifier,
            notifier.nudge,
            ri=self.ri,
            stats=self.metrics,
            admission=self.queues,
            planner=self.remote_solver.plan if self.remote_solver else None,
        )
        self.preemptor = Preemptor(
            self.cache,
            self.binder,
            self.queues,
            gang_of=self.gangs.gang_of,
            config=lambda: self.config.queues,
            report=notifier.report,
            counted=lambda queue, kind, n: self.metrics.queue_evictions.labels(queue, kind).inc(n),
        )
        self.gangs.preemptor = self.preemptor
        self.queues.changed = self.gangs.retry_waiting
        self.gangs.ours = self.queues.ours
        self.gangs.queue_config = lambda: self.config.queues
        self.dynamic = DynamicWatches(kube, on_list=self.ri.replace, on_event=self._ri_event)
        if options.leader is not None:
            self.metrics.leading.set(0)
            self.leadership = Leadership(
                kube, options.leader, on_lost=self.gangs.release_all, gauge=self.metrics.leading.set
            )
        self.workload_types = WorkloadTypes(
            kube,
            self.registry,
            namespace=options.config_namespace,
            configmap=CONFIGMAP_NAME,
            on_change=lambda: self.dynamic.sync(self.ri.watched_kinds()),
            warn=self._warn_workload_type,
        )
        self.dynamic.sync(self.ri.watched_kinds())
        self.sharing = Sharing(self.cache, enabled=self.config.gpu.fragmentation_scoring)
        self.verbs = Verbs(
            self.cache,
            self.binder,
            self.config,
            self.metrics,
            self.gangs,
            sharing=self.sharing,
            synced=self.synced,
            queues=self.queues,
        )
        self.landings: Landings | None = None
        if options.bind_journal is not None:
            self.landings = Landings(
                Journal(options.bind_journal),
                self.verbs.land,
                self.verbs.resume,
                counted=lambda outcome: self.metrics.outcomes.labels("bind-landing", outcome).inc(),
            )
            self.verbs.landings = self.landings
        self.read_api = ReadApi(self.cache, self.gangs, self.queues)
        self.policies = PolicyStore(report=notifier.report)
        self.admission = Admission(
            self.policies,
            self.registry,
            queue_of=self.queues.queue_for,
            priorities=PriorityClasses(kube),
            ready=lambda: self.policy_reflector.listed.is_set() or self.policy_reflector.absent,
        )
        self.policy_service = (
            PolicyService(
                kube,
                self.admission,
                options=options.webhook,
                namespace=options.config_namespace,
                metrics=self.metrics,
                kinds=lambda: plural_kinds(self.dynamic.resources(), self.registry),
                namespaces=self.policies.namespaces,
            )
            if options.webhook is not None
            else None
        )
        self.queue_status = QueueStatusWriter(
            kube,
            self.queues,
            leading=lambda: self.leadership is None or self.leadership.leading,
            counts=self.preemptor.counts_of,
        )
        self.reflectors = [
            Reflector(
                kube, "/api/v1/nodes", on_list=self.cache.replace_nodes, on_event=self.cache.node_event, name="nodes"
            ),
            Reflector(
                kube,
                "/api/v1/pods",
                on_list=self._pods_listed,
                on_event=self._pod_event,
                name="pods",
                prepare=pod_info,
            ),
        ]
        self.queue_reflectors = [
            Reflector(
                kube,
                QUEUES_PATH,
                name="queues.phalanx.io",
                optional=True,
                on_list=self.queues.replace_queues,
                on_event=self.queues.queue_event,
            ),
            Reflector(
                kube,
                "/api/v1/namespaces",
                name="namespaces",
                on_list=self.queues.replace_namespaces,
                on_event=self.queues.namespace_event,
            ),
        ]
        self.definition_reflectors = [
            self._definitions(path, kind, name)
            for path, kind, name in (
                ("/apis/phalanx.io/v1alpha1/workloads", WORKLOAD, "workloads.phalanx.io"),
                # v1beta1 on Kubernetes 1.37, v1alpha2 on 1.36: whichever is served.
                ("/apis/scheduling.k8s.io/v1beta1/podgroups", NATIVE_POD_GROUP, "podgroups.scheduling.k8s.io"),
                (
                    "/apis/scheduling.x-k8s.io/v1alpha1/podgroups",
                    COSCHEDULING_POD_GROUP,
                    "podgroups.scheduling.x-k8s.io",
                ),
                ("/apis/scheduling.volcano.sh/v1beta1/podgroups", VOLCANO_POD_GROUP, "podgroups.scheduling.volcano.sh"),
                ("/apis/scheduling.run.ai/v2alpha2/podgroups", KAI_POD_GROUP, "podgroups.scheduling.run.ai"),
            )
        ]
        self.policy_reflector = Reflector(
            kube,
            POLICIES_PATH,
            name="workloadpolicies.phalanx.io",
            optional=True,
            on_list=self.policies.replace,
            on_event=self.policies.event,
        )
        self.config_reflector = Reflector(
            kube,
            f"/api/v1/namespaces/{options.config_namespace}/configmaps",
            on_list=self._config_list,
            on_event=self._config_event,
            name="configmap",
            selector={"fieldSelector": f"metadata.name={CONFIGMAP_NAME}"},
        )
        authorizer = KubeAuthorizer(kube)
        self.api = AllocationApi(
            Context(
                self.cache,
                self.gangs,
                self.queues,
                kube,
                caller=_caller_of(kube),
                authorizer=authorizer,
                config=lambda: self.config.api,
                pods_rv=lambda: self.reflectors[1].resource_version,
            ),
            node_view=self.read_api.nodes,
        )
        self.cache.on_pod_change(self.api.pod_changed)
        self.binder.on_evict = self._evicted
        self.metrics.registry.register(StateCollector(self.cache, self.gangs, self._reflectors, self.queues))
        self._metrics_server: Any = None
        reads: dict[str, Read] = {
            "/api/v1/gangs": self.read_api.gangs_,
            "/api/v1/nodes": self.read_api.nodes,
            "/api/v1/pools": self.read_api.pools,
            "/api/v1/queues": self.read_api.queues_,
        }
        apis: dict[str, Api] = {"/api/v1/workload-types": self.workload_types.api}
        self.server = Server(
            (options.host, options.port),
            verbs={
                "filter": self.verbs.filter_then,
                "prioritize": self.verbs.prioritize,
                "bind": self.verbs.bind,
                "preempt": self.verbs.preempt,
            },
            metrics=self.metrics,
            ready=self.ready,
            reads=reads,
            apis=apis,
            authorizer=authorizer,
            tls=ServerTLS(options.tls) if options.tls else None,
            routes=PolicyApi(self.admission).routes(),
            first_routes=self.api.routes(),
        )
        # The REST APIs alone (no verbs, no stats reset) where tenants can reach them: over TLS
        # on any address, the bearer token and RBAC deciding every call.
        self.api_server: Server | None = None
        if options.api is not None:
            self.api_server = Server(
                options.api.address,
                verbs={},
                metrics=self.metrics,
                ready=self.ready,
                reads=reads,
                apis=apis,
                authorizer=authorizer,
                tls=ServerTLS(options.api.tls) if options.api.tls else None,
                routes=[_HEALTHZ, *PolicyApi(self.admission).routes()],
                first_routes=self.api.routes(),
                admin=False,
            )
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._gc_tuned = False
        self._listed: dict[tuple[str, str], dict[str, str]] = {}  # kind -> ns/name -> resourceVersion

    def _definitions(self, path: str, kind: tuple[str, str], name: str) -> Reflector:
        """A watch of gang definitions of one kind; the API may not be served (CRD absent),
        and a kind that moved between versions is watched at the one served."""
        return Reflector(
            self.kube,
            path,
            name=name,
            optional=True,
            alternatives=OLDER_VERSIONS.get(path, ()),
            on_list=lambda items: self._definitions_listed(kind, items),
            on_event=lambda event, obj: self._definition_event(kind, event, obj),
        )

    def _solver_params(self) -> SolverParams:
        """The configured parameters, with the cluster's current workload for fragmentation."""
        return replace(self.config.solver_params(), workload=self.sharing.workload())

    def _ri_event(self, gvk: GVK, event: str, obj: dict[str, Any]) -> None:
        self.ri.event(gvk, event, obj)
        if self.registry.lookup(gvk.group, gvk.version, gvk.kind) is not None:
            meta = obj.get("metadata") or {}
            self.gangs.definition_changed(meta.get("namespace", ""), meta.get("name", ""))

    def _reflectors(self) -> list[Reflector]:
        return [
            *self.reflectors,
            *self.definition_reflectors,
            *self.queue_reflectors,
            self.config_reflector,
            self.policy_reflector,
            *self.dynamic.running.values(),
        ]

    def _warn_workload_type(self, message: str) -> None:
        self.metrics.config_rejections.labels("workload-type").inc()
        log.error("workload type rejected; keeping the last good one", error=message)
        ref = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIGMAP_NAME, "namespace": self.options.config_namespace},
        }
        try:
            self.binder.event(ref, reason="InvalidWorkloadType", message=message[:1024], kind="Warning")
        except (ApiError, OSError) as e:
            log.warning("could not record the event", error=str(e))

    def _definitions_listed(self, kind: tuple[str, str], items: list[dict[str, Any]]) -> None:
        """A (re-)list of definitions, e.g. once a CRD installed after start-up is served: the
        members parked waiting for new or changed definitions are woken, as for a single event
        (a re-list after 410 Gone wakes nobody whose definition did not change)."""
        versions = {_ns_name(obj): str((obj.get("metadata") or {}).get("resourceVersion", "")) for obj in items}
        before = self._listed.get(kind, {})
        self._listed[kind] = versions
        self.gang_objects.replace(kind, items)
        changed = {name for name, rv in versions.items() if before.get(name) != rv}
        if changed:
            self.gangs.definitions_changed(changed)
        for obj in items:
            if _ns_name(obj) not in before:
                self._seen(kind, obj)

    def _report_pod(self, old: PodInfo | None, new: PodInfo | None) -> None:
        """A pod with a request, device record or node-pool annotation Phalanx cannot use gets a
        Warning Event naming the field (a cache listener: it only queues)."""
        if new is None:
            return
        for reason, problem, before in (
            ("InvalidGPURequest", new.error, old.error if old else ""),
            ("UntrustedDeviceRecord", new.device_error, old.device_error if old else ""),
            ("InvalidNodePools", new.node_pools_error, old.node_pools_error if old else ""),
        ):
            if problem and problem != before:
                ref = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": new.name, "namespace": new.namespace, "uid": new.uid},
                }
                self.notifier.report(ref, reason, f"pod {new.key}: {problem}")

    def _report_node(self, obj: dict[str, Any], problem: str) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))[:253]
        ref = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": str(meta.get("uid", ""))[:64]}}
        self.notifier.report(ref, "InvalidNode", f"node {name} skipped by Phalanx: {problem}")

    def _definition_event(self, kind: tuple[str, str], event: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        before = self.gang_objects.get(kind, namespace, name) if event == "MODIFIED" else None
        self.gang_objects.event(kind, event, obj)
        if before is not None and same_definition(kind, before, obj):
            return  # only its status changed (Phalanx's own WaitingForQuorum writes among them)
        self.gangs.definition_changed(namespace, name)
        if event == "ADDED":
            self._seen(kind, obj)

    def _fence(self) -> str:
        """ "" when this replica may bind now (HA: its kube-scheduler leads, confirmed lately)."""
        return self.leadership.check() if self.leadership is not None else ""

    def _seen(self, kind: tuple[str, str], obj: dict[str, Any]) -> None:
        """A new Workload or PodGroup without a status: say what it waits for from the start
        (the leader only: a standby writes nothing)."""
        if self.leadership is not None and not self.leadership.leading:
            return
        if (obj.get("status") or {}).get("conditions") or (obj.get("status") or {}).get("phase"):
            return
        spec = definition_spec(self.gang_objects, kind, obj)
        if spec is not None and spec.enabled:
            self.gangs.seen(spec)

    def _sweep(self) -> None:
        ticks = 0
        woken = False
        while not self._stopping.wait(1.0):
            ticks += 1
            try:
                if not woken and self.synced():
                    self.gangs.wake_all()
                    woken = True
                    # The solver's view of every node, built once now (150 ms at 5,000 nodes)
                    # rather than inside the first gang's plan; later plans rebuild only the
                    # nodes that changed.
                    self.cache.snapshot()
                self.gangs.sweep()
                self.verbs.expire_choices()
                self.api.tick(leading=self.leadership is None or self.leadership.leading)
                if ticks % 5 == 0:
                    self.dynamic.retry()  # CRDs installed after start-up
                if ticks % 10 == 1:
                    self.verbs.refresh_workload()  # the fragmentation measure's target workload
                    self._check_levels()
            except Exception:
                log.exception("periodic sweep failed")

    def _catch_up(self) -> None:
        """Pods moved: check the nodes they moved on again for every pod shape, before the
        next filter has to (a burst is gathered for a few milliseconds first). Only between
        calls: while kube-scheduler streams pods (a call in the last CATCH_UP_QUIET_S) each call
        re-checks the few nodes that moved since the one before, and eager checking would do
        work for nodes kube-scheduler's sample may never offer again."""
        while not self._stopping.is_set():
            if not self._pods_moved.wait(1.0):
                continue
            self._pods_moved.clear()
            self._stopping.wait(CATCH_UP_GATHER_S)
            if time.monotonic() - self.verbs.last_call < CATCH_UP_QUIET_S:
                # kube-scheduler is streaming pods: the calls keep up lazily. Look again once a
                # quiet spell may have begun (not every few ms: each look costs the GIL twice).
                self._pods_moved.set()
                self._stopping.wait(CATCH_UP_QUIET_S)
                continue
            try:
                if self.synced():
                    self.verbs.catch_up()
            except Exception:
                log.exception("memo catch-up failed")

    def _report_config(self, reason: str, message: str) -> None:
        """A Warning Event on the Phalanx ConfigMap, queued (never an API call on this thread)."""
        meta = {"name": CONFIGMAP_NAME, "namespace": self.options.config_namespace}
        self.notifier.report({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}, reason, message[:1024])

    def _check_levels(self) -> None:
        """A Warning Event on the ConfigMap while configured topology levels match no node
        (valid configuration, but such a level constrains nothing). Reported once per text."""
        missing = unmatched_levels(self.config, self.cache.node_labels()) if self.synced() else []
        if missing:
            self._report_config("TopologyLevelsUnmatched", unmatched_levels_message(missing))

    def _initial_config(self) -> PhalanxConfig:
        if self.options.config_file is not None:
            return parse(self.options.config_file.read_text(), source=str(self.options.config_file))
        return PhalanxConfig()

    def start(self) -> None:
        # Filter and prioritize must not queue behind watch decoding for a whole 5 ms GIL slice.
        sys.setswitchinterval(0.001)
        # The lists build a large heap fast (50,000 pods parsed page by page). At the collector's
        # default thresholds it walks the growing heap again and again: 3 of the 5 s it takes
        # to decode and read 50,000 pods in process. What the imports made lives as long as the
        # process: out of its way too.
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        logs.configure(self.config.server.log_level)
        for r in [*self.reflectors, *self.definition_reflectors, *self.queue_reflectors, *self._config_reflectors()]:
            self._threads.append(r.start())
        if self.policy_service is not None:
            self.policy_service.start()
        self.dynamic.start()
        if self.leadership is not None:
            self.leadership.start()
        if self.landings is not None:
            self._threads.extend(self.landings.start())
        sweeper = threading.Thread(target=self._sweep, name="gang-sweep", daemon=True)
        sweeper.start()
        self._threads.append(sweeper)
        catcher = threading.Thread(target=self._catch_up, name="memo-catch-up", daemon=True)
        catcher.start()
        self._threads.append(catcher)
        status = threading.Thread(
            target=self.queue_status.run,
            args=(lambda: self.config.queues.status_seconds,),
            name="queue-status",
            daemon=True,
        )
        status.start()
        self._threads.append(status)
        thread = threading.Thread(target=self.server.serve_forever, name="http", daemon=True)
        thread.start()
        self._threads.append(thread)
        if self.api_server is not None:
            api_thread = threading.Thread(target=self.api_server.serve_forever, name="http-api", daemon=True)
            api_thread.start()
            self._threads.append(api_thread)
        if self.options.metrics_address is not None:
            # /metrics alone, where Prometheus can reach it (the verbs stay on loopback).
            host, port = self.options.metrics_address
            self._metrics_server, metrics_thread = start_http_server(port, host, registry=self.metrics.registry)
            self._threads.append(metrics_thread)
        log.info("extender started", url=self.server.url, levels=self.config.topology.levels)

    def stop(self) -> None:
        self._stopping.set()
        if self.leadership is not None:
            self.leadership.stop()
        self.gangs.shutdown()
        if self.landings is not None:
            self.landings.stop()
        self.api.stop()
        self.queue_status.stop()
        for r in [*self.reflectors, *self.definition_reflectors, *self.queue_reflectors, *self._config_reflectors()]:
            r.stop()
        if self.policy_service is not None:
            self.policy_service.stop()
        self.dynamic.stop()
        for server in (self.server, self.api_server):
            if server is not None:
                server.shutdown()
                server.server_close()
                server.close_connections()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        if self.remote_solver is not None:
            self.remote_solver.close()

    def _evicted(self, namespace: str, name: str, node: str) -> None:
        self.api.evictions.add(namespace, name, node, "Preempted by Phalanx: a higher-priority gang needs the room")

    def _config_reflectors(self) -> list[Reflector]:
        return [self.config_reflector, self.policy_reflector]

    def synced(self) -> bool:
        """Both the node and the pod lists are in: until then no verb may answer (a pass from
        a half-loaded cache would double-book devices). A reflector's `listed` is never
        cleared (a relist replaces the cache's objects in one step), so once true it stays:
        every verb call and the catch-up ask."""
        if not self._synced and self._all_listed():
            with self._sync_lock:  # one caller resumes; the others wait for it, then answer
                if not self._synced:
                    if self.landings is not None:  # the binds a previous process answered, counted first
                        self.landings.resume_all()
                    self._synced = True
        return self._synced

    def _all_listed(self) -> bool:
        return all(r.listed.is_set() for r in self.reflectors)

    def ready(self) -> bool:
        dead = self.notifier.dead_threads() + [t.name for t in self._threads if not t.is_alive()]
        self.metrics.dead_threads.set(len(dead))
        if dead:
            log.error("writer threads died", threads=dead)
        nodes, pods = self.cache.counts()
        self.metrics.cache_objects.labels("nodes").set(nodes)
        self.metrics.cache_objects.labels("pods").set(pods)
        synced = self._all_listed()  # as the reflectors say now (readiness is not on a hot path)
        if synced and not self._gc_tuned:
            # The cache is a large, long-lived heap: move it out of the collector's way (young
            # objects are collected less often since `start`), so no filter call pays for a
            # full collection.
            gc.freeze()
            self._gc_tuned = True
        return synced and not dead

    # ------------------------------------------------------------------ configuration

    def _config_list(self, items: list[dict[str, Any]]) -> None:
        for obj in items:
            self._config_event("ADDED", obj)

    def _pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.gangs.renominate(kind, obj)  # a planned member's nomination, cleared by a failed cycle
        with self.api.applying(str((obj.get("metadata") or {}).get("resourceVersion", ""))):
            self.cache.pod_event(kind, obj)

    def _pods_listed(self, items: list[Any]) -> None:
        with self.api.applying(""):
            self.cache.replace_pod_infos(items)
            self.api.relisted(self.reflectors[1].resource_version)

    def _config_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            log.warning("configuration ConfigMap deleted; keeping the last good configuration")
            return
        meta = obj.get("metadata") or {}
        self.workload_types.sync(obj.get("data") or {})
        source = f"ConfigMap {meta.get('namespace')}/{meta.get('name')} key {CONFIGMAP_KEY}"
        try:
            config = parse((obj.get("data") or {}).get(CONFIGMAP_KEY, ""), source=source)
        except ConfigError as e:
            self.metrics.config_rejections.labels("configmap").inc()
            log.error("configuration rejected; keeping the last good one", error=str(e))
            self.binder.event({**obj, "kind": "ConfigMap"}, reason="InvalidConfig", message=str(e), kind="Warning")
            return
        self.apply(config)
        log.info("configuration applied", source=source, resource_version=meta.get("resourceVersion"))

    def apply(self, config: PhalanxConfig) -> None:
        self.config = config
        self.verbs.config = config
        self.queues.configure(config.queues)
        self.cache.configure(config.topology.levels, Hardware(config.gpu))
        logs.configure(config.server.log_level)


def _ns_name(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


_HEALTHZ = Route(frozenset({"GET"}), "/healthz", lambda m, p, b: Reply(200, b"ok", "text/plain"))


def _caller_of(kube: Kube) -> Callable[[str], Kube]:
    """The API server with a caller's credentials (`RestKube.as_caller`); a client that cannot
    act for callers refuses every write rather than making it with Phalanx's own rights."""
    as_caller = getattr(kube, "as_caller", None)
    if as_caller is not None:
        return cast(Callable[[str], Kube], as_caller)

    def refuse(authorization: str) -> Kube:
        raise Refused(503, "this extender's API server client cannot make calls with a caller's credentials")

    return refuse
