"""The time budget of one jq evaluation, and the per-definition circuit breaker that enforces it.

libjq cannot be interrupted, so the budget is kept in three places: `jqlint` rejects what could
loop or explode, `probe` times every definition on pod-sized documents at registration, and the
`Breaker` here watches every run afterwards. A definition whose evaluations overrun their budget
`OVERRUNS_TO_TRIP` times within `WINDOW` runs, or once by `HARD_FACTOR`, is tripped: its keys
stop being evaluated (its pods get `REASON_BUDGET`), and `on_trip` is told once, with a message
naming the definition (the app logs it and raises a Warning event). Registering the definition
again gives a fresh breaker.

Budget of one run, in CPU seconds on the evaluating thread (wall time would count waiting for
the GIL - its switch interval alone is 5 ms - and for a core on a busy node, and trip good
definitions under load): `BASE_S` plus `PER_BYTE_S` for each byte of JSON the run reads. libjq parses
JSON at ~100 ns a byte (measured: a 1 MB pod takes ~100 ms to parse); a shipped definition keys
a realistic pod (~1.5 KB after projection) in ~50-100 µs all in. 5 ms is 50x that, and far
below anything a person notices in a verb; 0.5 µs a byte leaves 5x libjq's own parsing for
legitimately large pods. A single run past 20x its budget (100 ms on a small pod) trips at once:
nothing legitimate gets there.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

BASE_S = 0.005
PER_BYTE_S = 0.5e-6
HARD_FACTOR = 20
OVERRUNS_TO_TRIP = 3
WINDOW = 100

REASON_BUDGET = "the resource interface's jq exceeded its time budget; its keys are no longer evaluated"

TripHandler = Callable[[str, str], None]  # (definition, message)


def budget_s(size: int) -> float:
    """Seconds one jq run over `size` bytes of JSON may take."""
    return BASE_S + PER_BYTE_S * size


class Breaker:
    """Per-definition overrun counter; thread-safe, cheap enough to call on every jq run."""

    def __init__(self, name: str, on_trip: TripHandler | None = None) -> None:
        self.name = name
        self.on_trip = on_trip
        self.runs = 0
        self.overruns = 0
        self.seconds = 0.0
        self.tripped_because = ""
        self._recent: deque[int] = deque(maxlen=OVERRUNS_TO_TRIP)  # run numbers of the last overruns
        self._lock = threading.Lock()

    @property
    def tripped(self) -> bool:
        return bool(self.tripped_because)

    def record(self, seconds: float, size: int) -> None:
        allowed = budget_s(size)
        with self._lock:
            self.runs += 1
            self.seconds += seconds
            if seconds <= allowed or self.tripped:
                return
            self.overruns += 1
            self._recent.append(self.runs)
            why = self._why(seconds, allowed, size)
            if not why:
                return
            self.tripped_because = why
        self._report(why)

    def _why(self, seconds: float, allowed: float, size: int) -> str:
        took = f"a jq evaluation took {seconds * 1000:.1f} ms over {size} bytes (budget {allowed * 1000:.1f} ms)"
        if seconds > HARD_FACTOR * allowed:
            return f"{took}, more than {HARD_FACTOR}x its budget"
        if len(self._recent) == OVERRUNS_TO_TRIP and self.runs - self._recent[0] < WINDOW:
            return f"{took}; {OVERRUNS_TO_TRIP} evaluations over budget within {WINDOW}"
        return ""

    def _report(self, why: str) -> None:
        message = f"resource interface {self.name}: {why}; its pods are no longer keyed until it is registered again"
        if self.on_trip is not None:
            self.on_trip(self.name, message)
