"""The kubelet device-plugin API (v1beta1): how the kubelet counts Phalanx's GPUs, and how a
container gets exactly the devices Phalanx's record names.

One plugin per advertised resource, each a gRPC server on its own socket
`<plugin dir>/phalanx-<resource>.sock`, registered with the kubelet's `Registration` service on
`<plugin dir>/kubelet.sock` (version v1beta1, the socket's file name as endpoint, PreStartContainer
required, GetPreferredAllocation offered):
- `nvidia.com/gpu`: whole GPUs, `slots_per_gpu` slots per GPU not in MIG mode;
- `nvidia.com/mig-<profile>`: the slices of each profile on static-MIG GPUs ("1g.10gb+me" is
  spelled `nvidia.com/mig-1g.10gb.me`); a node that cuts slices per pod (dynamic MIG) advertises
  every profile of its GPUs' MIG tables, as many as each GPU could hold;
- `phalanx.io/gpu-share`: 10 slots per GPU not in MIG mode; a pod asking a fractional share by
  annotation requests one, only so that the kubelet calls this plugin for it.

Device ids are opaque slot tokens ("gpu-slot-0", "mig-1g.10gb-slot-3", "share-slot-12"), not
devices: the kubelet only counts with them. The slots of unhealthy GPUs are reported Unhealthy
(the highest-numbered ones, which GetPreferredAllocation hands out last), so the kubelet lowers
allocatable; `DevicePlugins.update` pushes a new ListAndWatch answer whenever the slots change.

Which devices a container gets is Phalanx's record, resolved at container start, because the
kubelet tells a plugin nothing about the pod:
1. Allocate answers each container with the CDI device `phalanx.io/gpu=<claim>` (the claim hashes
   the resource and the slot ids; `agent.cdi`), the annotation `phalanx.io/claim` and the env
   `PHALANX_CLAIM`;
2. PreStartContainer gets the same slot ids, finds the container holding them through the
   kubelet's pod-resources List (slot ids are exclusive to a pod; an init container holds a
   subset of what its app containers do, so a superset names the pod too), asks the resolver for
   the pod's container edits (the ledger admits the record or refuses it) and writes the claim's
   CDI spec. A refusal fails the call with FAILED_PRECONDITION, so the kubelet does not start the
   container;
3. the runtime resolves the CDI name when it creates the container, after PreStartContainer.

A restarted kubelet deletes the plugin sockets and makes a new kubelet.sock; a thread polls both
every second and serves and registers again. Kubelet faults are logged and retried, never raised.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import structlog

from agent.cdi import DEFAULT_CDI_DIR, claim_id, device_name, remove_stale, write_spec
from agent.inventory import Inventory
from agent.ledger import ContainerEdits
from rpc import deviceplugin_pb2, deviceplugin_pb2_grpc, podresources_pb2, podresources_pb2_grpc
from solver.mig import load_tables

log = structlog.get_logger("phalanx.deviceplugin")

Message = Any  # a protobuf message (generated code, unchecked: no grpcio or protobuf stubs)
Resolver = Callable[[str, str], ContainerEdits]  # (namespace, pod name) -> edits; raises if refused

API_VERSION = "v1beta1"
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
KUBELET_SOCKET = "kubelet.sock"  # the Registration service, in the plugin directory

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
SHARE_RESOURCE = "phalanx.io/gpu-share"
SHARE_SLOTS_PER_GPU = 10  # fractional pods one GPU may carry; the record, not this, bounds the shares
CLAIM_ANNOTATION = "phalanx.io/claim"
CLAIM_ENV = "PHALANX_CLAIM"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

# PreStartContainer refusals (the kubelet puts them in the pod's events); stable wording
NO_HOLDER = "no container on this node holds"

RPC_TIMEOUT_S = 5.0  # Register and List: the kubelet answers both from memory
LIST_RETRY_S = 0.25
CLOCK_SLACK_S = 1.0  # file times come from the kernel's coarse clock, which may lag time.time()
SERVER_WORKERS = 8  # ListAndWatch holds one; PreStartContainer may wait for pod-resources


class PreStartRefused(Exception):
    """The container must not start; the message says why and names the pod when known."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# -- slots ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Slot:
    id: str
    healthy: bool = True


def mig_resource(profile: str) -> str:
    """The resource name of a MIG profile ("+" is not allowed in resource names)."""
    return MIG_RESOURCE_PREFIX + re.sub(r"[^A-Za-z0-9.-]", ".", profile)


def socket_name(resource: str) -> str:
    return "phalanx-" + re.sub(r"[^A-Za-z0-9._-]", "-", resource) + ".sock"


def is_ours(resource: str) -> bool:
    return resource in (GPU_RESOURCE, SHARE_RESOURCE) or resource.startswith(MIG_RESOURCE_PREFIX)


def _slots(prefix: str, total: int, unhealthy: int) -> tuple[Slot, ...]:
    return tuple(Slot(f"{prefix}-slot-{i}", i < total - unhealthy) for i in range(total))


def advertised(inventory: Inventory, *, slots_per_gpu: int = 1) -> dict[str, tuple[Slot, ...]]:
    """The resources this node advertises and their slots."""
    out: dict[str, tuple[Slot, ...]] = {}
    # On a dynamic-MIG node every GPU may be taken whole, shared or cut, whatever it holds now.
    plain = [g for g in inventory.gpus if not g.mig_enabled or inventory.dynamic_mig]
    sick = sum(1 for g in plain if not g.healthy)
    if plain:
        out[GPU_RESOURCE] = _slots("gpu", len(plain) * slots_per_gpu, sick * slots_per_gpu)
        out[SHARE_RESOURCE] = _slots("share", len(plain) * SHARE_SLOTS_PER_GPU, sick * SHARE_SLOTS_PER_GPU)
    if inventory.dynamic_mig:
        return out | _dynamic_mig(inventory)
    counts: dict[str, list[int]] = {}  # resource -> [slices, slices on unhealthy GPUs]
    for gpu in inventory.gpus:
        for mig in gpu.migs if gpu.mig_enabled else ():
            count = counts.setdefault(mig_resource(mig.profile), [0, 0])
            count[0] += 1
            count[1] += int(not gpu.healthy)
    for resource, (total, bad) in sorted(counts.items()):
        out[resource] = _slots("mig-" + resource.removeprefix(MIG_RESOURCE_PREFIX), total, bad)
    return out


def _dynamic_mig(inventory: Inventory) -> dict[str, tuple[Slot, ...]]:
    """Every profile of each GPU's MIG table, as many slots as the GPU could hold of it: the
    kubelet only counts; the scheduler decides which cuts fit (config/mig-profiles.yaml)."""
    tables = load_tables()
    counts: dict[str, list[int]] = {}
    for gpu in inventory.gpus:
        table = tables.table_for(gpu.model)
        for profile in table.profiles if table is not None else ():
            count = counts.setdefault(mig_resource(profile.name), [0, 0])
            count[0] += profile.max_count
            count[1] += profile.max_count * int(not gpu.healthy)
    return {
        resource: _slots("mig-" + resource.removeprefix(MIG_RESOURCE_PREFIX), total, bad)
        for resource, (total, bad) in sorted(counts.items())
    }


def _slot_number(slot_id: str) -> tuple[int, str]:
    tail = slot_id.rsplit("-", 1)[-1]
    return (int(tail), slot_id) if tail.isdigit() else (-1, slot_id)


def preferred(available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
    """GetPreferredAllocation's choice: the required slots, then the lowest-numbered ones."""
    must = list(dict.fromkeys(must_include))
    rest = sorted(set(available) - set(must), key=_slot_number)
    return [*must, *rest][: max(size, 0)]


# -- pod resources ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerRef:
    namespace: str
    pod: str
    container: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.pod}"


def _held(container: Message) -> dict[str, set[str]]:
    """resource -> device ids of one container (the kubelet lists one entry per device and NUMA
    node, so the entries of a resource are merged)."""
    held: dict[str, set[str]] = {}
    for d in container.devices:
        held.setdefault(d.resource_name, set()).update(d.device_ids)
    return held


class PodResources:
    """A client of the kubelet's pod-resources API (v1): which container holds which device ids.
    A channel per call: calls are rare, and a fresh one never waits out a reconnect backoff."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket

    def list(self) -> Message:
        with grpc.insecure_channel(f"unix://{self.socket}") as channel:
            stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
            return stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=RPC_TIMEOUT_S)

    def holder(self, resource: str, device_ids: Collection[str]) -> ContainerRef | None:
        """The container holding exactly `device_ids`, else one holding them all."""
        want = set(device_ids)
        found = None
        for pod in self.list().pod_resources:
            for container in pod.containers:
                held = _held(container).get(resource, set())
                if want and want <= held:
                    ref = ContainerRef(pod.namespace, pod.name, container.name)
                    if held == want:
                        return ref
                    found = found or ref
        return found

    def await_holder(self, resource: str, device_ids: Collection[str], *, timeout_s: float) -> ContainerRef:
        """`holder`, asking again until `timeout_s` passed (the kubelet lists a container a moment
        after it allocated it); raises `PreStartRefused`."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ref, detail = self.holder(resource, device_ids), "not listed"
            except grpc.RpcError as e:
                ref, detail = None, f"List failed: {_rpc_error(e)}"
            if ref is not None:
                return ref
            if time.monotonic() >= deadline:
                ids = ", ".join(sorted(device_ids))
                raise PreStartRefused(f"{NO_HOLDER} {resource} [{ids}] after {timeout_s:g}s ({detail})")
            time.sleep(LIST_RETRY_S)

    def claims(self) -> set[str]:
        """The claims of every container holding Phalanx resources now."""
        return {
            claim_id(resource, ids)
            for pod in self.list().pod_resources
            for container in pod.containers
            for resource, ids in _held(container).items()
            if is_ours(resource) and ids
        }


def _rpc_error(e: grpc.RpcError) -> str:
    code, details = getattr(e, "code", None), getattr(e, "details", None)
    return f"{code().name}: {details()}" if callable(code) and callable(details) else str(e)


# -- one resource -----------------------------------------------------------------------------


def _options() -> Message:
    return deviceplugin_pb2.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)


class _Servicer:
    """The DevicePlugin service of one resource (the methods carry the gRPC names)."""

    def __init__(
        self,
        resource: str,
        slots: tuple[Slot, ...],
        *,
        pods: PodResources,
        resolve: Resolver,
        cdi_dir: Path,
        lookup_timeout_s: float,
    ) -> None:
        self.resource = resource
        self._pods = pods
        self._resolve = resolve
        self._cdi_dir = cdi_dir
        self._lookup_timeout_s = lookup_timeout_s
        self._changed = threading.Condition()
        self._slots = slots
        self._version = 0

    def publish(self, slots: tuple[Slot, ...]) -> bool:
        """Set the slots; True (and every ListAndWatch stream answers again) when they changed."""
        with self._changed:
            if slots == self._slots:
                return False
            self._slots, self._version = slots, self._version + 1
            self._changed.notify_all()
        return True

    def GetDevicePluginOptions(self, request: Message, context: grpc.ServicerContext) -> Message:
        return _options()

    def ListAndWatch(self, request: Message, context: grpc.ServicerContext) -> Iterator[Message]:
        context.add_callback(self._wake)
        seen = -1
        while context.is_active():
            with self._changed:
                if self._version == seen:
                    self._changed.wait(timeout=1.0)  # the callback wakes it on cancel; this is a backstop
                    continue
                seen, slots = self._version, self._slots
            devices = [deviceplugin_pb2.Device(ID=s.id, health=HEALTHY if s.healthy else UNHEALTHY) for s in slots]
            yield deviceplugin_pb2.ListAndWatchResponse(devices=devices)

    def GetPreferredAllocation(self, request: Message, context: grpc.ServicerContext) -> Message:
        answers = [
            deviceplugin_pb2.ContainerPreferredAllocationResponse(
                deviceIDs=preferred(r.available_deviceIDs, r.must_include_deviceIDs, r.allocation_size)
            )
            for r in request.container_requests
        ]
        return deviceplugin_pb2.PreferredAllocationResponse(container_responses=answers)

    def Allocate(self, request: Message, context: grpc.ServicerContext) -> Message:
        answers = [self._allocate(list(r.devices_ids)) for r in request.container_requests]
        return deviceplugin_pb2.AllocateResponse(container_responses=answers)

    def PreStartContainer(self, request: Message, context: grpc.ServicerContext) -> Message:
        try:
            self._prestart(list(request.devices_ids))
        except PreStartRefused as e:
            log.warning("container start refused", resource=self.resource, reason=e.message)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, e.message)
        except OSError as e:
            log.error("cannot write the CDI spec", resource=self.resource, error=str(e))
            context.abort(grpc.StatusCode.INTERNAL, f"writing the CDI spec: {e}")
        return deviceplugin_pb2.PreStartContainerResponse()

    def _wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _allocate(self, ids: list[str]) -> Message:
        claim = claim_id(self.resource, ids)
        return deviceplugin_pb2.ContainerAllocateResponse(
            envs={CLAIM_ENV: claim},
            annotations={CLAIM_ANNOTATION: claim},
            cdi_devices=[deviceplugin_pb2.CDIDevice(name=device_name(claim))],
        )

    def _prestart(self, ids: list[str]) -> None:
        ref = self._pods.await_holder(self.resource, ids, timeout_s=self._lookup_timeout_s)
        try:
            edits = self._resolve(ref.namespace, ref.pod)
        except Exception as e:  # the resolver's refusal, whatever its type: the container must not start
            text = str(e) or type(e).__name__
            raise PreStartRefused(text if ref.key in text else f"pod {ref.key}: {text}") from e
        claim = claim_id(self.resource, ids)
        write_spec(self._cdi_dir, claim, edits)
        log.info(
            "container devices written",
            pod=ref.key,
            container=ref.container,
            resource=self.resource,
            claim=claim,
            devices=edits.env.get("NVIDIA_VISIBLE_DEVICES", ""),
        )


_FileId = tuple[int, int, int]


def _identity(path: Path) -> _FileId | None:
    """What tells a recreated file from the old one (an inode number alone may be reused)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


class _Plugin:
    """One resource's gRPC server and its registration. `ensure` serves again when the socket is
    gone and registers again when kubelet.sock is a new file (a restarted kubelet)."""

    def __init__(self, servicer: _Servicer, *, plugin_dir: Path) -> None:
        self.resource = servicer.resource
        self.servicer = servicer
        self.socket = plugin_dir / socket_name(self.resource)
        self._kubelet = plugin_dir / KUBELET_SOCKET
        self._lock = threading.Lock()
        self._server: Any = None  # grpc.Server
        self._executor: ThreadPoolExecutor | None = None
        self._served: _FileId | None = None
        self._registered: _FileId | None = None  # the kubelet.sock registered with
        self._stopped = False

    def ensure(self) -> None:
        """Serve and register where needed; raises what the kubelet or the socket raised."""
        with self._lock:
            if self._stopped:
                return
            if self._server is None or _identity(self.socket) != self._served:
                self._serve()
            kubelet = _identity(self._kubelet)
            if kubelet is not None and kubelet != self._registered:
                self._register()
                self._registered = kubelet

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._shutdown()

    def _serve(self) -> None:
        if self._server is not None:
            log.info("plugin socket gone; serving again", resource=self.resource, socket=str(self.socket))
        self._shutdown()
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        self._executor = ThreadPoolExecutor(SERVER_WORKERS, thread_name_prefix=f"plugin-{self.resource}")
        server = grpc.server(self._executor)
        deviceplugin_pb2_grpc.add_DevicePluginServicer_to_server(self.servicer, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server, self._served, self._registered = server, _identity(self.socket), None

    def _register(self) -> None:
        request = deviceplugin_pb2.RegisterRequest(
            version=API_VERSION, endpoint=self.socket.name, resource_name=self.resource, options=_options()
        )
        with grpc.insecure_channel(f"unix://{self._kubelet}") as channel:
            deviceplugin_pb2_grpc.RegistrationStub(channel).Register(request, timeout=RPC_TIMEOUT_S)
        log.info("registered with the kubelet", resource=self.resource, endpoint=self.socket.name)

    def _shutdown(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait(RPC_TIMEOUT_S)
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        if self._served is not None and _identity(self.socket) == self._served:
            self.socket.unlink(missing_ok=True)  # ours only: a newer file at the path is not
        self._server, self._executor, self._served = None, None, None


# -- all resources ----------------------------------------------------------------------------


class DevicePlugins:
    """Every resource's plugin: `update` after each inventory poll, `collect_garbage` now and
    then, `start` and `stop` once."""

    def __init__(
        self,
        resolve: Resolver,
        *,
        plugin_dir: Path = DEFAULT_PLUGIN_DIR,
        pod_resources_socket: Path = DEFAULT_POD_RESOURCES_SOCKET,
        cdi_dir: Path = DEFAULT_CDI_DIR,
        slots_per_gpu: int = 1,
        poll_s: float = 1.0,
        lookup_timeout_s: float = 5.0,
    ) -> None:
        if slots_per_gpu < 1:
            raise ValueError(f"slots_per_gpu must be at least 1, not {slots_per_gpu}")
        self._resolve = resolve
        self._plugin_dir = plugin_dir
        self._pods = PodResources(pod_resources_socket)
        self._cdi_dir = cdi_dir
        self._slots_per_gpu = slots_per_gpu
        self._poll_s = poll_s
        self._lookup_timeout_s = lookup_timeout_s
        self._lock = threading.Lock()
        self._plugins: dict[str, _Plugin] = {}
        self._errors: dict[str, str] = {}  # resource -> the failure last logged (each is logged once)
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    def resources(self) -> list[str]:
        with self._lock:
            return sorted(self._plugins)

    def start(self) -> None:
        """Serve and register every resource, and watch the kubelet in a thread."""
        if self._thread is None:
            self._halt.clear()
            self._thread = threading.Thread(target=self._watch, name="deviceplugin-watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            plugins, self._plugins = list(self._plugins.values()), {}
        for plugin in plugins:
            plugin.stop()

    def update(self, inventory: Inventory) -> None:
        """Start and stop plugins as resources appear and go, and push changed slots."""
        wanted = advertised(inventory, slots_per_gpu=self._slots_per_gpu)
        with self._lock:
            gone = [self._plugins.pop(r) for r in sorted(self._plugins) if r not in wanted]
            for resource, slots in wanted.items():
                plugin = self._plugins.get(resource)
                if plugin is None:
                    self._plugins[resource] = self._plugin(resource, slots)
                elif plugin.servicer.publish(slots):
                    healthy = sum(s.healthy for s in slots)
                    log.info("slots changed", resource=resource, healthy=healthy, total=len(slots))
        for plugin in gone:
            plugin.stop()
            log.info("resource withdrawn", resource=plugin.resource)
        if self._thread is not None:
            self._ensure_all()

    def collect_garbage(self) -> list[str]:
        """Delete the CDI specs of claims no container holds; returns them. A kubelet fault is
        logged and removes nothing."""
        started = time.time()
        try:
            live = self._pods.claims()
        except grpc.RpcError as e:
            log.warning("cannot list pod resources; CDI specs kept", error=_rpc_error(e))
            return []
        removed = remove_stale(self._cdi_dir, live, before=started - CLOCK_SLACK_S)
        if removed:
            log.info("stale CDI specs removed", claims=removed)
        return removed

    def _plugin(self, resource: str, slots: tuple[Slot, ...]) -> _Plugin:
        servicer = _Servicer(
            resource,
            slots,
            pods=self._pods,
            resolve=self._resolve,
            cdi_dir=self._cdi_dir,
            lookup_timeout_s=self._lookup_timeout_s,
        )
        return _Plugin(servicer, plugin_dir=self._plugin_dir)

    def _watch(self) -> None:
        while not self._halt.is_set():
            self._ensure_all()
            self._halt.wait(self._poll_s)

    def _ensure_all(self) -> None:
        with self._lock:
            plugins = list(self._plugins.values())
        for plugin in plugins:
            try:
                plugin.ensure()
            except Exception as e:  # a kubelet fault must not end the watch: log it once, retry next poll
                self._failed(plugin.resource, _rpc_error(e) if isinstance(e, grpc.RpcError) else repr(e))
            else:
                self._recovered(plugin.resource)

    def _failed(self, resource: str, error: str) -> None:
        with self._lock:
            new = self._errors.get(resource) != error
            self._errors[resource] = error
        if new:
            log.warning("device plugin not registered; retrying", resource=resource, error=error)

    def _recovered(self, resource: str) -> None:
        with self._lock:
            was = self._errors.pop(resource, None)
        if was is not None:
            log.info("device plugin registered again", resource=resource)
