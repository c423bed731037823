"""What one GPU can still give: idle, how many shares, how many MIG slices. Written once.

The snapshot's `GpuDevice` (immutable, model.py) and the solve's `DeviceState` (consumed step
by step, capacity.py) both inherit `DeviceFit`, so the placers, the single-pod filter and the
explanations ask a device the same questions and get the same answers.

A device is statically partitioned (`mig`: free slices per profile, from the node's MIG
resources), or whole, shared, or -- when Phalanx may partition it on demand (`partition`) --
cut into the dynamic slices of `mig_layout`. The extender's device discovery never gives one
device both a static partition and a dynamic one, so a device's MIG slices are its static ones
plus what its dynamic partition can still cut.
"""

from __future__ import annotations

from collections.abc import Sized

from solver import mig
from solver.mig import MigSlot, MigTable

FULL_SHARE = 1000  # milli-GPU in one device
UNLIMITED = 1 << 30  # "no limit" in pod counts: a dimension the pod does not ask for


class DeviceFit:
    """The device rule over a device's free fields (the subclasses are dataclasses)."""

    __slots__ = ()

    index: int
    model: str
    memory_mib: int
    free_milli: int
    free_memory_mib: int
    tflops: int
    free_tflops: int
    mig: Sized  # the static partition: empty when there is none
    partition: MigTable | None
    mig_layout: tuple[MigSlot, ...]

    def static_free(self, profile: str) -> int:
        """Free slices of `profile` in the static partition (0 without one)."""
        raise NotImplementedError

    @property
    def is_mig(self) -> bool:
        """In MIG mode: statically partitioned, or holding dynamic slices."""
        return bool(self.mig) or bool(self.mig_layout)

    @property
    def is_idle(self) -> bool:
        """No share, memory or TFLOPs taken and not in MIG mode: a whole-GPU pod can take it."""
        return (
            not self.mig
            and not self.mig_layout
            and self.free_milli == FULL_SHARE
            and self.free_memory_mib == self.memory_mib
            and self.free_tflops == self.tflops
        )

    def share_fits(self, milli: int, memory_mib: int, tflops: int = 0) -> int:
        """How many (milli, memory, TFLOPs) shares still fit on this device (none in MIG mode)."""
        if self.mig or self.mig_layout or not (milli or memory_mib or tflops):
            return 0
        by_share = self.free_milli // milli if milli else UNLIMITED
        by_memory = self.free_memory_mib // memory_mib if memory_mib else UNLIMITED
        by_tflops = self.free_tflops // tflops if tflops else UNLIMITED
        return max(0, min(by_share, by_memory, by_tflops))

    def cuttable(self) -> MigTable | None:
        """The dynamic partition's profile table while it may cut more slices (the device is
        partitionable and idle, or already cut); None otherwise."""
        if self.partition is not None and (self.mig_layout or self.is_idle):
            return self.partition
        return None

    def mig_free(self, profile: str) -> int:
        """Slices of `profile` this device can still give: free static slices plus how many more
        a dynamic partition can cut (exact for one profile)."""
        static = self.static_free(profile)
        table = self.cuttable()
        return static if table is None else static + mig.capacity(table, self.mig_layout, profile)
