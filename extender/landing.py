"""Binds answered before their Binding lands, and the journal that keeps those answers.

kube-scheduler binds through the extender, each pod's bind in a goroutine of its own that holds
one connection to the extender until the reply. The reply waited for the Binding, which takes
kube-apiserver hundreds of milliseconds when it is busy, while Go keeps only two idle
connections per extender: at 300 pods/s most binds opened a new connection (0.7 per pod,
measured), dialled by kube-scheduler, accepted by the extender, closed after one call.

With a journal (`--bind-journal FILE`), a single pod's bind (not a gang member, whose gate needs
the real outcome; not a GPU pod whose node has an agent to admit its devices first) is answered
once every check has passed and its devices are counted: the extender writes the bind to the
journal, replies, and lands the Binding from a pool of its own threads. kube-scheduler has
assumed the pod on that node and never expires the assumption (1.37), so the extender owns the
outcome: it retries every failure (backing off up to `MAX_BACKOFF_S`) until the Binding lands or
the watch shows the pod bound or gone. A replica that stops leading sends nothing (the binder's
fence) and keeps retrying: its kube-scheduler restarts with a fresh cache, the new leader binds
the pod, and the watch ends the landing. A bind of a pod whose landing is under way is answered
at once for the same node and refused for another.

The journal keeps those answers across a restart of the extender beside a kube-scheduler that
keeps running (its container restarted, the pod's emptyDir kept): one JSON line per bind
answered early, one `{"ended": uid}` when it is settled; a new process lands every bind still
open in it, its devices counted again, once its caches are in. Lines are flushed, not synced: a
crash of the process keeps them; a crash of the node takes kube-scheduler, and its assumptions,
with it. A journal that cannot be written falls back to answering the bind when it lands.
"""

from __future__ import annotations

import heapq
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import orjson
import structlog

log = structlog.get_logger("phalanx.landing")

WORKERS = 64  # Bindings in flight at once: as many as the extender's client keeps connections
FIRST_BACKOFF_S = 0.2
MAX_BACKOFF_S = 10.0
#: Lines written before the journal is rewritten with only the open landings.
COMPACT_LINES = 20_000
#: Bytes of one journal line read back: a bind's record is small; more is not ours.
MAX_LINE = 64 * 2**10


@dataclass(frozen=True, slots=True)
class Landing:
    """A bind answered before its Binding landed."""

    uid: str
    namespace: str
    name: str
    node: str
    record: str = ""  # the device record the Binding carries (objects.encode_devices); "" for none

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _landing(line: bytes) -> Landing | str:
    """A journal line: an open landing, or the uid of an ended one. Raises ValueError."""
    obj = orjson.loads(line)
    if not isinstance(obj, dict):
        raise ValueError("not an object")
    if "ended" in obj:
        if not isinstance(obj["ended"], str):
            raise ValueError("ended: not a string")
        return obj["ended"]
    uid, namespace, name, node, record = (obj.get(k) for k in ("uid", "namespace", "name", "node", "record"))
    if not (isinstance(uid, str) and isinstance(namespace, str) and isinstance(name, str)):
        raise ValueError("uid, namespace and name must be strings")
    if not (isinstance(node, str) and isinstance(record, str) and uid and node):
        raise ValueError("node and record must be strings (uid and node not empty)")
    return Landing(uid, namespace, name, node, record)


class Journal:
    """The binds answered early and not yet settled, one JSON line each, in a file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._open: dict[str, Landing] = {}
        self._file: IO[bytes] | None = None
        self._lines = 0

    def load(self) -> list[Landing]:
        """The landings the file holds open (a previous process's), the file rewritten with
        them alone and kept open for appending. A line that does not read (a crash cut it, or
        someone edited the file) is skipped and logged."""
        with self._lock:
            self._open.clear()
            try:
                with self.path.open("rb") as f:
                    for number, line in enumerate(f, 1):
                        if not line.strip():
                            continue
                        try:
                            if len(line) > MAX_LINE:
                                raise ValueError(f"longer than {MAX_LINE} bytes")
                            entry = _landing(line)
                        except ValueError as e:  # orjson.JSONDecodeError is one
                            log.warning("bind journal line skipped", path=str(self.path), line=number, error=str(e))
                            continue
                        if isinstance(entry, str):
                            self._open.pop(entry, None)
                        else:
                            self._open[entry.uid] = entry
            except FileNotFoundError:
                pass
            except OSError as e:  # unreadable: what it held cannot be resumed; say so loudly
                log.error("bind journal unreadable; binds it holds are not resumed", path=str(self.path), error=str(e))
            try:
                self._rewrite()
            except OSError as e:  # `opened` then refuses: binds are answered when they land
                log.error(
                    "bind journal not writable; binds are answered when they land", path=str(self.path), error=str(e)
                )
            return list(self._open.values())

    def opened(self, landing: Landing) -> None:
        """Record a bind about to be answered; raises OSError when the file cannot take it."""
        with self._lock:
            self._write(orjson.dumps(landing))  # the dataclass's fields in order, in C (asdict: 4 µs more)
            self._open[landing.uid] = landing

    def ended(self, uid: str) -> None:
        with self._lock:
            if self._open.pop(uid, None) is None:
                return
            try:
                self._write(orjson.dumps({"ended": uid}))
                if self._lines >= COMPACT_LINES:
                    self._rewrite()
            except OSError as e:  # it replays as open: landed or bound, it ends again at once
                log.warning("bind journal not written", path=str(self.path), error=str(e))

    def open_count(self) -> int:
        return len(self._open)

    def node_of(self, uid: str) -> str:
        """The node an open landing of this pod goes to ("" when none is open)."""
        landing = self._open.get(uid)  # one dict read: no lock needed
        return landing.node if landing is not None else ""

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _write(self, line: bytes) -> None:
        if self._file is None:
            raise OSError(f"bind journal {self.path} is not open")
        self._file.write(line + b"\n")
        self._file.flush()
        self._lines += 1

    def _rewrite(self) -> None:
        """The open landings alone, written beside the file and moved over it."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".new")
        with partial.open("wb") as f:
            f.writelines(orjson.dumps(landing) + b"\n" for landing in self._open.values())
        os.replace(partial, self.path)
        self._file = self.path.open("ab")
        self._lines = len(self._open)


class Landings:
    """The binds answered early, landed by a pool of threads and retried until settled.

    `land(landing)` makes one try and says whether the landing is settled (landed, or the pod
    is bound or gone); `resume(landing)` counts a previous process's landing again and says
    whether it is still to land."""

    def __init__(
        self,
        journal: Journal,
        land: Callable[[Landing], bool],
        resume: Callable[[Landing], bool],
        *,
        workers: int = WORKERS,
        counted: Callable[[str], None] = lambda outcome: None,
    ) -> None:
        self.journal = journal
        self._land = land
        self._resume = resume
        self._counted = counted
        self._lock = threading.Lock()  # `_pending` taken once
        self._queue: queue.SimpleQueue[tuple[Landing, int] | None] = queue.SimpleQueue()
        self._retries: list[tuple[float, int, Landing, int]] = []  # (due, tiebreak, landing, attempt)
        self._retry_cv = threading.Condition()
        self._tiebreak = itertools.count()
        self._workers = workers
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._pending = journal.load()  # resumed once the caches are in (`resume_all`)

    def start(self) -> list[threading.Thread]:
        for i in range(self._workers):
            self._threads.append(threading.Thread(target=self._work, name=f"bind-landing-{i}", daemon=True))
        self._threads.append(threading.Thread(target=self._retry_loop, name="bind-landing-retry", daemon=True))
        for t in self._threads:
            t.start()
        return list(self._threads)

    def stop(self) -> None:
        self._stopping.set()
        for _ in range(self._workers):
            self._queue.put(None)
        with self._retry_cv:
            self._retry_cv.notify_all()
        self.journal.close()

    def node_of(self, uid: str) -> str:
        """The node a landing of this pod is under way to ("" when none is): the journal's
        open landings are the ones under way (and, until `resume_all`, a previous process's)."""
        return self.journal.node_of(uid)

    def begin(self, landing: Landing) -> bool:
        """Journal `landing` and set it landing; False (nothing recorded) when the journal
        cannot take it: the caller answers the bind when it lands instead."""
        try:
            self.journal.opened(landing)
        except OSError as e:
            log.warning("bind journal not written; answering when the Binding lands", error=str(e))
            self._counted("journal-failed")
            return False
        self._queue.put((landing, 0))
        return True

    def resume_all(self) -> int:
        """Set landing what the journal held open when this process started (once the caches
        are in: each pod is checked, and its devices counted, against the cache); how many."""
        with self._lock:
            pending, self._pending = self._pending, []
        resumed = 0
        for landing in pending:
            try:
                still = self._resume(landing)
            except Exception as e:  # a record that no longer decodes: nothing to land
                log.warning("journalled bind not resumed", pod=landing.key, node=landing.node, error=str(e))
                still = False
            if not still:
                self.journal.ended(landing.uid)
                continue
            self._queue.put((landing, 0))
            resumed += 1
        if resumed:
            log.info("journalled binds resumed", count=resumed)
        return resumed

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None or self._stopping.is_set():
                return
            landing, attempt = item
            try:
                settled = self._land(landing)
            except Exception as e:  # never lose a landing to a bug in one try
                log.exception("bind landing try failed", pod=landing.key, error=str(e))
                settled = False
            if settled:
                self.journal.ended(landing.uid)
                self._counted("landed" if attempt == 0 else "landed-after-retry")
            else:
                self._counted("retried")
                self._retry(landing, attempt + 1)

    def _retry(self, landing: Landing, attempt: int) -> None:
        delay = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** min(attempt - 1, 16))
        with self._retry_cv:
            heapq.heappush(self._retries, (time.monotonic() + delay, next(self._tiebreak), landing, attempt))
            self._retry_cv.notify()

    def _retry_loop(self) -> None:
        with self._retry_cv:
            while not self._stopping.is_set():
                now = time.monotonic()
                while self._retries and self._retries[0][0] <= now:
                    _, _, landing, attempt = heapq.heappop(self._retries)
                    self._queue.put((landing, attempt))
                wait = self._retries[0][0] - now if self._retries else None
                self._retry_cv.wait(wait)
