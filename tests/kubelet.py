"""A test kubelet speaking the kubelet's real protocols over unix sockets: the device-plugin
Registration service on kubelet.sock, calls to the plugins' DevicePlugin service, and the
PodResourcesLister (rpc/deviceplugin.proto, rpc/podresources.proto). The agent's unit tests and
the node-agent e2e test play the kubelet with it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from agent.deviceplugin import socket_name
from rpc import deviceplugin_pb2 as dp
from rpc import deviceplugin_pb2_grpc as dp_grpc
from rpc import podresources_pb2 as pr
from rpc import podresources_pb2_grpc as pr_grpc


def pod_resources(namespace: str, name: str, containers: dict[str, dict[str, list[str]]]) -> Any:
    """A pod as the kubelet lists it: one ContainerDevices per device, as recent kubelets do."""
    return pr.PodResources(
        namespace=namespace,
        name=name,
        containers=[
            pr.ContainerResources(
                name=container,
                devices=[pr.ContainerDevices(resource_name=r, device_ids=[i]) for r, ids in held.items() for i in ids],
            )
            for container, held in containers.items()
        ],
    )


class _Registration(dp_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, kubelet: Kubelet) -> None:
        self.kubelet = kubelet

    def Register(self, request: Any, context: Any) -> Any:
        with self.kubelet.lock:
            self.kubelet.registrations.append(request)
        return dp.Empty()


class _Lister(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, kubelet: Kubelet) -> None:
        self.kubelet = kubelet

    def List(self, request: Any, context: Any) -> Any:
        with self.kubelet.lock:
            return pr.ListPodResourcesResponse(pod_resources=list(self.kubelet.pods))


def _serve(path: Path, add: Callable[[Any], None]) -> Any:
    server = grpc.server(ThreadPoolExecutor(4))
    add(server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    return server


@dataclass
class Kubelet:
    """Plays the kubelet: collects registrations, lists pods, calls the plugins."""

    plugin_dir: Path
    pod_resources_socket: Path
    lock: threading.Lock = field(default_factory=threading.Lock)
    registrations: list[Any] = field(default_factory=list)
    pods: list[Any] = field(default_factory=list)
    servers: dict[str, Any] = field(default_factory=dict)

    def start(self) -> None:
        self.start_registration()
        self.servers["pods"] = _serve(
            self.pod_resources_socket, lambda s: pr_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), s)
        )

    def start_registration(self) -> None:
        self.servers["registration"] = _serve(
            self.plugin_dir / "kubelet.sock",
            lambda s: dp_grpc.add_RegistrationServicer_to_server(_Registration(self), s),
        )

    def restart(self, *, delete_plugin_sockets: bool) -> None:
        self.servers.pop("registration").stop(None).wait()
        (self.plugin_dir / "kubelet.sock").unlink(missing_ok=True)
        if delete_plugin_sockets:
            for sock in self.plugin_dir.glob("phalanx-*.sock"):
                sock.unlink()
        with self.lock:
            self.registrations.clear()
        self.start_registration()

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop(None).wait()

    def registered(self) -> set[str]:
        with self.lock:
            return {r.resource_name for r in self.registrations}

    def list_pods(self, *pods: Any) -> None:
        with self.lock:
            self.pods = list(pods)

    @contextmanager
    def plugin(self, resource: str) -> Iterator[Any]:
        with grpc.insecure_channel(f"unix://{self.plugin_dir / socket_name(resource)}") as channel:
            yield dp_grpc.DevicePluginStub(channel)

    def allocate(self, resource: str, ids: list[str]) -> Any:
        with self.plugin(resource) as stub:
            return stub.Allocate(
                dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]), timeout=10
            )

    def prestart(self, resource: str, ids: list[str]) -> Any:
        with self.plugin(resource) as stub:
            return stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=ids), timeout=10)
