"""The seed's NodeAgent service over real gRPC, driven by the extender's client
(extender/agents.py): binds admitted or refused with the node's reason, dynamic MIG cut at bind,
the snapshot, heartbeat directives and the token check."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from agent.auth import Reviewer
from agent.backends import FakeBackend
from agent.ledger import Ledger
from agent.node import NodeLoop
from agent.service import NodeAgentService
from extender.agents import AgentRefused, Agents
from rpc import nodeagent_pb2 as pb
from rpc import nodeagent_pb2_grpc as pb_grpc

NODE = "n1"


def node(
    *, gpus: int = 2, labels: dict[str, str] | None = None, health: dict[str, str] | None = None
) -> dict[str, Any]:
    annotations = {"phalanx.io/fake-gpu-health": json.dumps(health)} if health else {}
    return {
        "metadata": {
            "name": NODE,
            "labels": {
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.memory": "81920",
                **(labels or {}),
            },
            "annotations": annotations,
        },
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}},
    }


class Api:
    """The two review endpoints of an API server, answering from a table of tokens."""

    def __init__(self, users: dict[str, tuple[str, bool]]) -> None:
        self.users = users  # token -> (user, allowed)

    def ok(self, method: str, path: str, *, body: Any = None, **_: Any) -> Any:
        if path.endswith("/tokenreviews"):
            user = self.users.get(body["spec"]["token"])
            return {"status": {"authenticated": user is not None, "user": {"username": user[0] if user else ""}}}
        allowed = any(u == body["spec"]["user"] and ok for u, ok in self.users.values())
        return {"status": {"allowed": allowed}}


Served = tuple[Ledger, Any, str]


def serve(backend: FakeBackend, reviewer: Reviewer | None = None) -> Iterator[Served]:
    ledger = Ledger(backend)
    loop = NodeLoop(None, NODE, ledger)  # type: ignore[arg-type]  # not started: no API calls
    loop._listed.set()  # as after its first pod list
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_NodeAgentServicer_to_server(NodeAgentService(NODE, ledger, loop, reviewer), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield ledger, pb_grpc.NodeAgentStub(channel), f"127.0.0.1:{port}"
    finally:
        channel.close()
        server.stop(0)


@pytest.fixture
def agent() -> Iterator[Served]:
    yield from serve(FakeBackend.from_node(node(gpus=2, health={"1": "XID 79"})))


@pytest.fixture
def dynamic() -> Iterator[Served]:
    yield from serve(FakeBackend.from_node(node(gpus=1, labels={"phalanx.io/mig-mode": "dynamic"})))


def client(endpoint: str, token: str | None = None) -> Agents:
    return Agents(lambda n: endpoint if n == NODE else "", lambda: f"Bearer {token}" if token else None)


def bind(agents: Agents, name: str, record: list[dict[str, Any]]) -> None:
    agents.bind(namespace="ns", name=name, uid=f"uid-{name}", node=NODE, record=json.dumps(record))


def test_a_whole_gpu_is_admitted_once_and_a_second_claim_is_refused(agent: Served) -> None:
    ledger, _, endpoint = agent
    agents = client(endpoint)
    bind(agents, "a", [{"index": 0, "milli": 1000, "memoryMiB": 81920}])
    bind(agents, "a", [{"index": 0, "milli": 1000, "memoryMiB": 81920}])  # a retry: the same answer
    with pytest.raises(AgentRefused, match=r"Oversubscribed.*held by ns/a"):
        bind(agents, "b", [{"index": 0, "milli": 500, "memoryMiB": 1024}])
    assert [a.key for a in ledger.allocations()] == ["ns/a"]


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ([{"index": 7, "milli": 1000}], "UnknownDevice"),
        ([{"index": 1, "milli": 1000}], "DeviceUnhealthy"),
        ([{"index": 0, "milli": 600, "memoryMiB": 90000}], "Oversubscribed"),
        ([{"index": 0, "mig": "1g.10gb"}], "InvalidRecord"),
        ([{"index": 0, "milli": 2000}], "InvalidRecord"),
    ],
    ids=[
        "a GPU the node does not have",
        "an unhealthy GPU",
        "more memory than the GPU",
        "a slice of a GPU not in MIG mode",
        "a malformed record",
    ],
)
def test_a_record_the_node_cannot_honour_is_refused_with_its_reason(
    agent: Served, record: list[dict[str, Any]], reason: str
) -> None:
    with pytest.raises(AgentRefused, match=reason):
        bind(client(agent[2]), "p", record)
    assert not agent[0].allocations()


def test_two_shares_fit_one_gpu_and_a_third_past_it_is_refused(agent: Served) -> None:
    agents = client(agent[2])
    bind(agents, "s1", [{"index": 0, "milli": 500, "memoryMiB": 40960}])
    bind(agents, "s2", [{"index": 0, "milli": 250, "memoryMiB": 20480}])
    with pytest.raises(AgentRefused, match="250/1000 free, asked 500"):
        bind(agents, "s3", [{"index": 0, "milli": 500, "memoryMiB": 1024}])
    edits = [agent[0].edits(a) for a in agent[0].allocations()]
    assert [e.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for e in edits] == ["50", "25"]
    assert [e.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] for e in edits] == ["0=40960M", "0=20480M"]


def test_a_dynamic_mig_slice_is_cut_at_bind_and_removed_at_release(dynamic: Served) -> None:
    ledger, stub, endpoint = dynamic
    bind(client(endpoint), "m", [{"index": 0, "mig": "3g.40gb", "start": 4}])
    snap = stub.GetResourceSnapshot(pb.SnapshotRequest(node_id=NODE))
    (gpu,) = snap.gpus
    assert [(m.profile, m.start, m.allocation_id) for m in gpu.mig_devices] == [("3g.40gb", 4, "ns/m")]
    assert snap.allocations[0].grants[0].uuid == gpu.mig_devices[0].uuid
    with pytest.raises(AgentRefused, match="MigFailed"):  # overlaps the slice just cut
        bind(client(endpoint), "n", [{"index": 0, "mig": "7g.80gb", "start": 0}])
    ledger.release("ns/m")
    assert not stub.GetResourceSnapshot(pb.SnapshotRequest(node_id=NODE)).gpus[0].mig_devices


def test_the_snapshot_reports_health_and_usage(agent: Served) -> None:
    bind(client(agent[2]), "a", [{"index": 0, "milli": 1000, "memoryMiB": 81920}])
    snap = agent[1].GetResourceSnapshot(pb.SnapshotRequest(node_id=NODE))
    assert [(g.index, g.healthy, g.health_reason) for g in snap.gpus] == [(0, True, ""), (1, False, "XID 79")]
    assert (snap.usage.gpus, snap.usage.gpus_healthy, snap.usage.gpu_milli_allocated, snap.usage.allocations) == (
        2,
        1,
        1000,
        1,
    )
    assert snap.conditions[0].type == "GPUHealthy" and snap.conditions[0].status == "False"


def test_heartbeat_directives_compare_the_scheduler_view_with_the_node(agent: Served) -> None:
    bind(client(agent[2]), "a", [{"index": 0, "milli": 1000, "memoryMiB": 81920}])
    request = pb.HeartbeatRequest(node_id=NODE, pod_statuses=[pb.PodStatus(allocation_id="ns/ghost")])
    (reply,) = list(agent[1].Heartbeat(iter([request])))
    assert reply.lease_duration_seconds > 0
    assert [(d.type, d.allocation_id) for d in reply.directives] == [
        ("UnknownAllocation", "ns/a"),
        ("MissingAllocation", "ns/ghost"),
    ]


def test_a_bind_for_another_node_is_refused(agent: Served) -> None:
    reply = agent[1].BindAllocation(pb.BindRequest(allocation_id="ns/p", node_id="other"))
    assert (reply.success, reply.failure_reason) == (False, "WrongNode")


def test_callers_need_a_token_rbac_allows() -> None:
    api = Api({"good": ("system:serviceaccount:phalanx-system:phalanx-extender", True), "weak": ("bob", False)})
    reviewer = Reviewer(api, NODE)  # type: ignore[arg-type]
    for _, _, endpoint in serve(FakeBackend.from_node(node()), reviewer):
        record = [{"index": 0, "milli": 1000, "memoryMiB": 81920}]
        with pytest.raises(AgentRefused, match="UNAUTHENTICATED"):
            bind(client(endpoint), "p", record)
        with pytest.raises(AgentRefused, match="bob may not create nodeagents"):
            bind(client(endpoint, "weak"), "p", record)
        bind(client(endpoint, "good"), "p", record)


def test_binds_wait_until_the_agent_knows_its_pods() -> None:
    """After a restart, before the first pod list, a bind cannot be judged: UNAVAILABLE (the
    extender binds without the agent then; the agent re-checks the record when the pod comes)."""
    ledger = Ledger(FakeBackend.from_node(node()))
    loop = NodeLoop(None, NODE, ledger)  # type: ignore[arg-type]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_NodeAgentServicer_to_server(NodeAgentService(NODE, ledger, loop, None), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            record = json.dumps([{"index": 0, "milli": 1000}])
            request = pb.BindRequest(allocation_id="ns/p", node_id=NODE, annotations={"phalanx.io/gpu-devices": record})
            with pytest.raises(grpc.RpcError) as refused:
                pb_grpc.NodeAgentStub(channel).BindAllocation(request, timeout=5)
            assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(0)
    assert not ledger.allocations()


class Evictions:
    """The API server's Eviction endpoint, as the agent calls it (agent/kube.py)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, int | None, str]] = []

    def evict(self, namespace: str, name: str, *, grace_s: int | None, uid: str = "") -> Any:
        from agent.kube import Response

        self.sent.append((namespace, name, grace_s, uid))
        return Response(201, {})


def test_the_extender_evicts_through_the_agent_of_the_pods_node() -> None:
    """Preemption on a node with an agent: EvictAllocation, an Eviction with the pod's own grace
    period and its UID as precondition; a pod the agent has not seen falls back (None)."""
    ledger = Ledger(FakeBackend.from_node(node()))
    api = Evictions()
    loop = NodeLoop(api, NODE, ledger)  # type: ignore[arg-type]
    loop._listed.set()
    loop._pods["ns/victim"] = {"metadata": {"name": "victim", "namespace": "ns", "uid": "u-v"}, "spec": {}}
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_NodeAgentServicer_to_server(NodeAgentService(NODE, ledger, loop, None), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        agents = client(f"127.0.0.1:{port}")
        assert agents.evict(namespace="ns", name="victim", node=NODE, reason="preempted") == ""
        assert api.sent == [("ns", "victim", None, "u-v")]
        assert agents.evict(namespace="ns", name="stranger", node=NODE, reason="preempted") is None
        assert agents.evict(namespace="ns", name="victim", node="no-agent", reason="preempted") is None
    finally:
        server.stop(0)
