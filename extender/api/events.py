"""The allocation watch's event history: the pod events the extender's own pod watch delivers,
kept in order with their resourceVersions, so that any number of watchers are served from one
upstream watch (each event decoded once, its answer encoded once), as kube-apiserver's watch
cache serves its clients.

The history covers every event after the version of the last full list of pods (`covered_from`)
while it holds them (`most` events); a watch from a version it covers is served here, one from
an older version (before this process started, or dropped) is not, and the caller falls back to
the API server's own watch, which still misses and repeats nothing.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from extender.objects import PodInfo

MOST = 50_000


@dataclass(slots=True)
class Event:
    seq: int
    rv: int
    kind: str  # ADDED, MODIFIED, DELETED
    pod: PodInfo
    encoded: bytes = field(default=b"", compare=False)  # the SSE frame, made by its first reader


def version(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 20 else None


class Events:
    def __init__(self, most: int = MOST) -> None:
        self._events: deque[Event] = deque(maxlen=most)
        self.lock = threading.Condition()
        self.covered_from: int | None = None  # every event after this version is held
        self.latest = 0  # the newest version seen (a list's or an event's)
        self._seq = 0
        self.epoch = 0  # a relist starts a new one

    def reset(self, resource_version: str) -> None:
        """A full list at `resource_version`: what came before is no longer known in order."""
        with self.lock:
            self._events.clear()
            self.epoch += 1
            rv = version(resource_version)
            self.covered_from = rv
            self.latest = rv or 0
            self.lock.notify_all()

    def add(self, kind: str, pod: PodInfo, resource_version: str) -> None:
        rv = version(resource_version)
        with self.lock:
            if rv is None or self.covered_from is None:
                if self.covered_from is not None:  # an opaque version: this history cannot order it
                    self.covered_from = None
                    self.epoch += 1  # its readers end (their clients resume from the API server)
                    self.lock.notify_all()
                return
            if len(self._events) == self._events.maxlen:
                self.covered_from = self._events[0].rv  # the oldest goes: after it is still held
            self._seq += 1
            self._events.append(Event(self._seq, rv, kind, pod))
            self.latest = max(self.latest, rv)
            self.lock.notify_all()

    def covers(self, rv: int) -> bool:
        with self.lock:
            return self.covered_from is not None and self.covered_from <= rv <= self.latest

    def snapshot(self, take: Callable[[], list[PodInfo]]) -> tuple[int, list[PodInfo]]:
        """`take()` (the cache's pods) and the version they are at, consistently: events are
        added under this lock, after the cache applied them."""
        with self.lock:
            return self.latest, take()

    def follow(
        self, rv: int, stop: threading.Event, until: float, idle_s: float = 10.0
    ) -> Iterator[tuple[list[Event], int]]:
        """Batches of the events after version `rv` as they come, each with the version the
        reader is at once it has them, until `until` (monotonic) or `stop`; an empty batch
        after `idle_s` without one (time for a bookmark at that version). Ends early
        when the history can no longer serve the reader in order (a relist, or events it had
        not read yet were dropped): its client resumes from the last version it got."""
        with self.lock:
            if self.covered_from is None or rv < self.covered_from:
                return
            epoch = self.epoch
            seq = max((e.seq for e in self._events if e.rv <= rv), default=0)
            if not seq:
                seq = self._events[0].seq - 1 if self._events else self._seq
        while not stop.is_set() and time.monotonic() < until:
            with self.lock:
                if self.epoch != epoch or (self._events and self._events[0].seq > seq + 1):
                    return
                if not self._events or self._events[-1].seq <= seq:
                    self.lock.wait(min(idle_s, max(0.0, until - time.monotonic())))
                    if self.epoch != epoch or (self._events and self._events[0].seq > seq + 1):
                        return  # a relist, or events not read yet were dropped while waiting
                fresh = []
                for event in reversed(self._events):  # the newest few: never a walk of the whole history
                    if event.seq <= seq:
                        break
                    fresh.append(event)
                fresh.reverse()
            if fresh:
                seq, rv = fresh[-1].seq, fresh[-1].rv
            yield fresh, rv
