"""The solver's model through rpc/solver.proto and back is the same model: snapshots,
requests, parameters and plans, over inputs that use every field."""

from __future__ import annotations

import pytest

import solver
from rpc import solver_pb2 as pb
from solverd import codec
from tests.solverd.corpus import scenarios

SCENARIOS = scenarios()


@pytest.mark.parametrize(("name", "snapshot", "requests", "params"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_a_round_trip_through_the_wire_changes_nothing(
    name: str, snapshot: solver.ClusterSnapshot, requests: list[solver.GangRequest], params: solver.SolverParams
) -> None:
    wire = pb.SolveRequest.FromString(codec.solve_request(snapshot, requests, params).SerializeToString())
    back = codec.from_snapshot(wire.snapshot)
    assert back == snapshot
    assert [codec.from_request(r) for r in wire.requests] == requests
    assert codec.from_params(wire.params) == params
    result = solver.plan(snapshot, requests, params=params)
    assert codec.from_plan(pb.PlanResult.FromString(codec.plan(result).SerializeToString())) == result


def test_a_mig_table_is_sent_once_and_shared_by_its_devices() -> None:
    (_, snapshot, _, _) = next(s for s in SCENARIOS if s[0].startswith("MIG"))
    wire = codec.snapshot(snapshot)
    assert len(wire.mig_tables) == 1
    back = codec.from_snapshot(wire)
    tables = {id(d.partition) for n in back.nodes for d in n.gpus if d.partition is not None}
    assert len(tables) == 1  # one table object, as the extender builds them (its memos are per table)


def test_absent_and_empty_restrictions_stay_distinct() -> None:
    """allowed_nodes None (anywhere) and frozenset() (nowhere) must not both become 'anywhere'."""
    for allowed in (None, frozenset()):
        shape = solver.PodShape(allowed_nodes=allowed, gpu_models=allowed)
        request = solver.GangRequest.single("p", shape)
        assert codec.from_request(pb.GangRequest.FromString(codec.request(request).SerializeToString())) == request
