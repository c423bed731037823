"""The solver as a gRPC service (`rpc/solver.proto`): the model's codec, the server
(`python -m solverd`) and the extender's client, which falls back to the in-process solver when
the service is slow or down."""
