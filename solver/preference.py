"""Which devices a pod should take on one node, when there is a reason to prefer some.

Two reasons, in order: a packing plan's lead (solver.packing: devices that await this share
size, chosen by the caller) and the target workload's fragmentation (solver.frag: the devices
where the measure grows least). Without either, `NodeCapacity`'s default choice applies (best
fit, or the freest when spreading). This layer sits above both capacity.py and frag.py, so the
capacity accounting knows nothing of workloads.
"""

from __future__ import annotations

from collections.abc import Sequence

from solver.capacity import NodeCapacity
from solver.frag import WorkloadClass, placement_delta
from solver.model import DeviceAssignment, GpuKind, Node, PodShape


class NodeState(NodeCapacity):
    """Free capacity of one node that a solve (or the extender) consumes pod by pod."""

    __slots__ = ()

    def take(
        self,
        shape: PodShape,
        *,
        spread: bool = False,
        workload: Sequence[WorkloadClass] = (),
        lead: Sequence[int] = (),
    ) -> tuple[DeviceAssignment, ...] | None:
        """Consume one pod of `shape`; returns its devices, or None (nothing changed) if it
        does not fit. Shares go best-fit (fullest device that fits) unless `spread`; with a
        target `workload` (and not spreading), whole and share pods take the devices where its
        fragmentation grows least (`preferred_devices`). Devices in `lead` (a packing plan's
        choice, solver.packing) are tried before all others, in order."""
        if self.capacity(shape) < 1:
            return None
        prefer = preferred_devices(self.as_node(), shape, workload) if workload and not spread else ()
        if lead:
            prefer = (*lead, *(i for i in prefer if i not in lead))
        return self._consume(shape, spread=spread, prefer=prefer)


def preferred_devices(node: Node, shape: PodShape, classes: Sequence[WorkloadClass]) -> tuple[int, ...]:
    """The devices a whole or share pod should take on `node` so the target workload fragments
    least (the fullest device among equal scores); () when the measure has no say."""
    if not classes or shape.gpu.kind not in (GpuKind.SHARE, GpuKind.WHOLE):
        return ()
    verdict = placement_delta(node, shape, classes, fullest_on_ties=True)
    return verdict.devices if verdict.fits else ()
