"""One pod against one node: fit, the reason it does not fit, and a fragmentation-aware score.

This is the extender's per-node hot path (filter and prioritize call it once per candidate
node, and memoise on the node's version), so it works from the immutable `Node` directly.
Fit is the fit model's (fit.py); the reasons name the first check of that model that fails,
each with its stable prefix below and the numbers that matter.
"""

from __future__ import annotations

from solver.capacity import DeviceState, NodeCapacity
from solver.device import FULL_SHARE
from solver.fit import allowed, allowed_devices, scalar_shortfall
from solver.model import GpuKind, Node, PodShape
from solver.params import PlacementMode

MAX_SCORE = 10
# The GPU fill ratio scores 0..8 of the 10: 0.8 was its weight beside a per-node preference
# (0.2) that nothing ever set; the scale stays as the benchmarks measured it.
FILL_WEIGHT = 0.8

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


def reason(node: Node, shape: PodShape) -> str:
    """Why one pod of `shape` does not fit on `node`, with the numbers that matter."""
    if node.unschedulable:
        return NODE_CORDONED
    if not allowed(node, shape):
        return NODE_INELIGIBLE
    short = scalar_shortfall(shape.requests, node.free)
    if short is None:
        return _gpu_reason(node, shape)
    if short.resource == "cpu":
        return f"{INSUFFICIENT_CPU}: {short.free}m free, pod needs {short.need}m"
    if short.resource == "memory":
        return f"{INSUFFICIENT_MEMORY}: {short.free}Mi free, pod needs {short.need}Mi"
    if short.resource == "pods":
        return INSUFFICIENT_PODS
    return f"{INSUFFICIENT} {short.resource}: {short.free} free, pod needs {short.need}"


def _gpu_reason(node: Node, shape: PodShape) -> str:
    gpu = shape.gpu
    if not node.gpus:
        return NO_GPU
    devices = allowed_devices(node.gpus, shape.gpu_models)
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
    """0..8: how good placing one pod here is for GPU fragmentation.

    CompactFirst: the fuller the node's GPUs after placing the pod, the higher (fills partly
    used GPUs and nodes, keeps idle ones whole). LowLoadFirst: the reverse. Pods without GPU
    demand, nodes without GPUs and MIG-only nodes (slices are not a fill ratio) score 0.
    """
    if shape.gpu.kind is GpuKind.NONE or not node.gpus:
        return 0
    state = NodeCapacity(node)
    taken = state.take_preferring(shape, spread=mode is PlacementMode.LOW_LOAD_FIRST)
    plain = [d for d in state.devices if not d.is_mig]
    if taken is None or not plain:
        return 0
    used = sum(_load(d) for d in plain) / len(plain)
    fill = used if mode is PlacementMode.COMPACT_FIRST else 1 - used
    return min(MAX_SCORE, round(MAX_SCORE * fill * FILL_WEIGHT))


def _load(d: DeviceState) -> float:
    """How used one device is: its most used dimension (share, memory or TFLOPs)."""
    load = 1 - d.free_milli / FULL_SHARE
    if d.memory_mib:
        load = max(load, 1 - d.free_memory_mib / d.memory_mib)
    if d.tflops:
        load = max(load, 1 - d.free_tflops / d.tflops)
    return load
