"""The Phalanx node agent: a DaemonSet process per GPU node that makes the node honour what the
scheduler decided (which GPU, which share, how much memory, which MIG slice).

It shares only the device contract (the pod annotation `phalanx.io/gpu-devices`, read by
`agent.contract`) and the gRPC protos (rpc/) with the extender; it never imports `extender`.

- `inventory`: the node's GPUs as the agent sees them, and the `Backend` protocol;
- `backends`: NVML (`nvidia-ml-py`) where a driver exists, a fake driven by node labels on KWOK;
- `ledger`: what the node holds, checked against the inventory (a device the node does not know,
  an unhealthy one or an oversubscribed one is refused, never silently swapped);
- `deviceplugin`: the kubelet device-plugin API (v1beta1) and the container edits (CDI);
- `service`: the seed's `NodeAgent` gRPC service;
- `node`: the Kubernetes side (pods on this node, the inventory annotation, evictions).
"""
