"""Watches of kinds known only at run time (the kinds registered Resource Interfaces name).

`sync(kinds)` makes the running set of reflectors match: a new kind is resolved to its resource
path through API discovery (`/apis/<group>/<version>`, `/api/v1` for the core group) and gets a
list-then-watch reflector; a kind no longer wanted has its reflector stopped. A kind whose API
is not served yet (CRD not installed) stays pending and is retried by `retry()`, called from the
extender's periodic sweep, so installing a CRD later needs no restart.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import structlog

from extender.kube import JSON, Kube
from extender.ri.model import GVK
from extender.watch import Reflector

log = structlog.get_logger("phalanx.dynamic-watch")

OnList = Callable[[GVK, list[JSON]], None]
OnEvent = Callable[[GVK, str, JSON], None]


class DynamicWatches:
    def __init__(self, kube: Kube, *, on_list: OnList, on_event: OnEvent) -> None:
        self.kube = kube
        self.on_list = on_list
        self.on_event = on_event
        self.lock = threading.Lock()
        self.running: dict[GVK, Reflector] = {}
        self.pending: set[GVK] = set()
        self.started = False

    def sync(self, kinds: frozenset[GVK]) -> None:
        with self.lock:
            for gvk in [k for k in self.running if k not in kinds]:
                self.running.pop(gvk).stop()
                log.info("stopped watching", kind=str(gvk))
            self.pending = {k for k in kinds if k not in self.running}
        self.retry()

    def retry(self) -> None:
        """Resolve and start pending kinds whose API is served now."""
        with self.lock:
            if not self.started:
                return
            pending = sorted(self.pending, key=str)
        for gvk in pending:
            path = self._path(gvk)
            if path is None:
                continue
            reflector = Reflector(
                self.kube,
                path,
                name=f"{gvk.kind}.{gvk.group or 'core'}/{gvk.version}",
                optional=True,
                on_list=functools.partial(self.on_list, gvk),
                on_event=functools.partial(self.on_event, gvk),
            )
            with self.lock:
                if gvk not in self.pending or not self.started:
                    continue
                self.pending.discard(gvk)
                self.running[gvk] = reflector
            reflector.start()
            log.info("watching", kind=str(gvk), path=path)

    def resources(self) -> dict[GVK, str]:
        """Each watched kind's resource path (its plural is the last segment)."""
        with self.lock:
            return {gvk: r.path for gvk, r in self.running.items()}

    def start(self) -> None:
        with self.lock:
            self.started = True
        self.retry()

    def stop(self) -> None:
        with self.lock:
            self.started = False
            for r in self.running.values():
                r.stop()
            self.pending |= set(self.running)
            self.running.clear()

    def _path(self, gvk: GVK) -> str | None:
        base = f"/apis/{gvk.group}/{gvk.version}" if gvk.group else f"/api/{gvk.version}"
        try:
            r = self.kube.request("GET", base)
        except Exception as e:  # urllib3's MaxRetryError while the API server is down is no OSError
            log.warning("discovery failed", kind=str(gvk), error=str(e))
            return None
        if r.status != 200 or not isinstance(r.body, dict):
            return None
        for resource in r.body.get("resources") or []:
            if resource.get("kind") == gvk.kind and "/" not in str(resource.get("name", "")):
                return f"{base}/{resource['name']}"
        return None
