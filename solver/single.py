"""One pod against one node: fit, the reason it does not fit, and a fragmentation-aware score.

This is the extender's per-node hot path (filter and prioritize call it once per candidate
node, and memoise on the node's version), so it works from the immutable `Node` directly.
"""

from __future__ import annotations

from solver.capacity import DeviceState, NodeState, eligible
from solver.model import FULL_SHARE, GpuKind, Node, PodShape
from solver.params import PlacementMode
from solver.problem import node_capacity

MAX_SCORE = 10

NODE_CORDONED = "node is cordoned"
NODE_INELIGIBLE = "node is not eligible for this pod"
INSUFFICIENT_CPU = "insufficient cpu"
INSUFFICIENT_MEMORY = "insufficient memory"
INSUFFICIENT_PODS = "too many pods"
INSUFFICIENT = "insufficient"
NO_GPU = "node has no GPU"
WRONG_MODEL = "no GPU of the requested model"
WHOLE_GPUS = "not enough idle GPUs"
SHARE_GPUS = "no GPU has the requested share free"
MIG_SLICES = "not enough free MIG slices"
NO_TFLOPS = "pod requests TFLOPs; this node's GPU model has no TFLOPs rating (see gpu.models)"


def fits(node: Node, shape: PodShape) -> bool:
    return eligible(node, shape) and node_capacity(node, shape) > 0


def reason(node: Node, shape: PodShape) -> str:
    """Why one pod of `shape` does not fit on `node`, with the numbers that matter."""
    if node.unschedulable:
        return NODE_CORDONED
    if shape.allowed_nodes is not None and node.name not in shape.allowed_nodes:
        return NODE_INELIGIBLE
    free, req = node.free, shape.requests
    if req.cpu_milli > free.cpu_milli:
        return f"{INSUFFICIENT_CPU}: {free.cpu_milli}m free, pod needs {req.cpu_milli}m"
    if req.memory_mib > free.memory_mib:
        return f"{INSUFFICIENT_MEMORY}: {free.memory_mib}Mi free, pod needs {req.memory_mib}Mi"
    if req.pods > free.pods:
        return INSUFFICIENT_PODS
    for key, value in req.extended:
        if value > free.get(key):
            return f"{INSUFFICIENT} {key}: {free.get(key)} free, pod needs {value}"
    return _gpu_reason(node, shape)


def _gpu_reason(node: Node, shape: PodShape) -> str:
    gpu = shape.gpu
    if not node.gpus:
        return NO_GPU
    devices = [d for d in node.gpus if shape.gpu_models is None or d.model in shape.gpu_models]
    if not devices:
        return f"{WRONG_MODEL} ({', '.join(sorted(shape.gpu_models or ()))})"
    if gpu.kind is GpuKind.WHOLE:
        idle = sum(1 for d in devices if d.is_idle)
        return f"{WHOLE_GPUS}: {idle} idle, pod needs {gpu.count}"
    if gpu.kind is GpuKind.MIG:
        free = sum(d.mig_free(gpu.mig_profile) for d in devices)
        return f"{MIG_SLICES}: {free} free {gpu.mig_profile}, pod needs {gpu.count}"
    if gpu.tflops and not any(d.tflops for d in devices):
        return NO_TFLOPS
    best = max(((d.free_milli, d.free_memory_mib, d.free_tflops) for d in devices if not d.is_mig), default=(0, 0, 0))
    need = f"{gpu.milli}m share and {gpu.memory_mib}Mi"
    have = f"{best[0]}m and {best[1]}Mi"
    if gpu.tflops:
        need += f" and {gpu.tflops / 1000:g} TFLOPs"
        have += f" and {best[2] / 1000:g} TFLOPs"
    return f"{SHARE_GPUS}: pod needs {need} on {gpu.count} device(s); the freest device has {have}"


def score(node: Node, shape: PodShape, mode: PlacementMode) -> int:
    """0..10: how good placing one pod here is for GPU fragmentation.

    CompactFirst: the fuller the node's GPUs after placing the pod, the higher (fills partly
    used GPUs and nodes, keeps idle ones whole). LowLoadFirst: the reverse. Pods without GPU
    demand score by the node's preference only.
    """
    preference = shape.node_scores.get(node.name, 0)
    if shape.gpu.kind is GpuKind.NONE or not node.gpus:
        return min(MAX_SCORE, preference)
    state = NodeState(node)
    taken = state.take(shape, spread=mode is PlacementMode.LOW_LOAD_FIRST)
    plain = [d for d in state.devices if not d.mig and not d.layout]
    if taken is None or not plain:
        return min(MAX_SCORE, preference)  # MIG-only nodes: slices are not a fill ratio
    used = sum(_load(d) for d in plain) / len(plain)
    fill = used if mode is PlacementMode.COMPACT_FIRST else 1 - used
    return min(MAX_SCORE, round(MAX_SCORE * fill * 0.8 + preference * 0.2))


def _load(d: DeviceState) -> float:
    """How used one device is: its most used dimension (share, memory or TFLOPs)."""
    load = 1 - d.free_milli / FULL_SHARE
    if d.memory_mib:
        load = max(load, 1 - d.free_memory_mib / d.memory_mib)
    if d.tflops:
        load = max(load, 1 - d.free_tflops / d.tflops)
    return load
