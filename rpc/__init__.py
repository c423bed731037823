"""The gRPC protocols Phalanx speaks, as .proto files; their Python code is generated, never
committed: `make deps` (and the image build) run `python -m rpc.build`.

- `nodeagent.proto`: the seed's scheduler-to-node service (package `scheduler.v1`), served by
  the node agent (agent/) and called by the extender.
- `deviceplugin.proto`, `podresources.proto`: the kubelet's device-plugin API (v1beta1) and
  pod-resources API (v1), copied verbatim from k8s.io/kubelet; the agent serves the first and
  calls the second, the tests play the kubelet with both.
"""
