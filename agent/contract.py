"""The device contract the agent shares with the extender: the pod annotation
`phalanx.io/gpu-devices`, written by the extender's Binding (format: extender/objects.py).

One entry per device the pod uses:
- `{"index": 3, "milli": 1000, "memoryMiB": 81920}`: a whole (milli 1000) or shared GPU, with
  the GPU memory granted on it (and `"tflops"` when compute was asked in TFLOPs);
- `{"index": 5, "mig": "1g.10gb"}`: a slice of a static MIG partition;
- `{"index": 2, "mig": "3g.40gb", "start": 4}`: a dynamic MIG slice the agent cuts at that
  placement start before the pod's containers start.

The agent parses it itself (it does not import the extender) with the same bounds; a unit test
holds the two parsers to the same answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DEVICES_ANNOTATION = "phalanx.io/gpu-devices"
INVENTORY_ANNOTATION = "phalanx.io/gpu-inventory"
ENDPOINT_ANNOTATION = "phalanx.io/agent-endpoint"
POD_UID_ANNOTATION = "phalanx.io/pod-uid"
FULL_SHARE = 1000
MAX_RECORD = 16 * 1024
MAX_INDEX = 64
MAX_MEMORY_MIB = 2**20
MAX_TFLOPS = 100_000


class RecordError(ValueError):
    """A device record the agent must not act on; the message names the problem."""


@dataclass(frozen=True, slots=True)
class Grant:
    """One entry of the record."""

    index: int
    milli: int = 0  # thousandths of the device (1000: whole); 0 for MIG
    memory_mib: int = 0  # 0: no memory figure (a whole GPU written before memory was recorded)
    mig: str = ""  # MIG profile
    start: int = -1  # dynamic MIG placement start; -1: a static slice
    tflops: float = 0.0

    @property
    def whole(self) -> bool:
        return not self.mig and self.milli >= FULL_SHARE

    @property
    def dynamic(self) -> bool:
        return bool(self.mig) and self.start >= 0


def _int(e: dict[str, Any], key: str, low: int, high: int, default: int | None = None) -> int:
    value = e.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RecordError(f"{key} must be an integer in [{low}, {high}], not {value!r}")
    return value


def _grant(e: Any) -> Grant:
    if not isinstance(e, dict):
        raise RecordError(f"each entry must be an object, not {type(e).__name__}")
    index = _int(e, "index", 0, MAX_INDEX - 1)
    if "mig" in e:
        if not isinstance(e["mig"], str) or not e["mig"] or len(e["mig"]) > 32:
            raise RecordError(f"mig must be a profile name, not {e['mig']!r}")
        return Grant(index, mig=e["mig"], start=_int(e, "start", -1, 63, -1))
    tflops = e.get("tflops", 0)
    if isinstance(tflops, bool) or not isinstance(tflops, int | float) or not 0 <= tflops <= MAX_TFLOPS:
        raise RecordError(f"tflops must be a number in [0, {MAX_TFLOPS}], not {tflops!r}")
    return Grant(
        index,
        milli=_int(e, "milli", 0, FULL_SHARE, 0),
        memory_mib=_int(e, "memoryMiB", 0, MAX_MEMORY_MIB, 0),
        tflops=float(tflops),
    )


def decode(text: str | None) -> tuple[Grant, ...] | None:
    """The record; None when absent. Raises `RecordError` for a malformed one, one out of
    range, or one naming a GPU twice outside MIG slices."""
    if not text:
        return None
    if len(text) > MAX_RECORD:
        raise RecordError(f"longer than {MAX_RECORD} bytes")
    try:
        entries = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise RecordError(f"not JSON: {e}") from None
    if not isinstance(entries, list) or len(entries) > MAX_INDEX * 8:
        raise RecordError("must be a JSON list of at most 512 entries")
    grants = tuple(_grant(e) for e in entries)
    whole = [g.index for g in grants if not g.mig]
    if len(set(whole)) != len(whole):
        raise RecordError("names a device twice")
    return grants
