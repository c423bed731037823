"""List-then-watch of one resource, as client-go's reflector does it.

List (paged), hand the full set to the cache, mark "listed", then watch from the list's
resourceVersion with bookmarks. A 410 Gone (as an HTTP status or an ERROR event) means the
version expired: list again. Any other failure backs off and re-watches from the last version
seen. Readiness is reported only after the first list.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from extender.kube import JSON, ApiError, Expired, Kube, check

log = structlog.get_logger("phalanx.watch")

OnList = Callable[[list[JSON]], None]
OnEvent = Callable[[str, JSON], None]


class Reflector:
    def __init__(
        self,
        kube: Kube,
        path: str,
        *,
        on_list: OnList,
        on_event: OnEvent,
        name: str,
        timeout_s: int = 300,
        page: int = 500,
        selector: dict[str, str] | None = None,
        optional: bool = False,
    ) -> None:
        self.optional = optional  # an API that may not be served (yet): poll quietly for it
        self.kube = kube
        self.path = path
        self.selector = selector or {}
        self.on_list = on_list
        self.on_event = on_event
        self.name = name
        self.timeout_s = timeout_s
        self.page = page
        self.listed = threading.Event()
        self.stopped = threading.Event()
        self.resource_version = ""
        self._absent_logged = False

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name=f"watch-{self.name}", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        backoff = 0.5
        need_list = True
        while not self.stopped.is_set():
            try:
                if need_list:
                    self.list()
                    need_list = False
                self.watch()
                backoff = 0.5
            except Expired:
                log.info("watch expired; listing again", resource=self.name)
                need_list = True
            except ApiError as e:
                if self.optional and e.status == 404:
                    if not self._absent_logged:
                        log.info("API not served; polling for it", resource=self.name)
                        self._absent_logged = True
                    need_list = True
                    self.stopped.wait(10)
                    continue
                self._retry(e, backoff)
                backoff = min(backoff * 2, 10.0)
                need_list = need_list or e.status in (401, 403, 404)
            except Exception as e:
                self._retry(e, backoff)
                backoff = min(backoff * 2, 10.0)

    def _retry(self, error: Exception, backoff: float) -> None:
        log.warning("watch failed; retrying", resource=self.name, error=str(error), backoff_s=backoff)
        self.stopped.wait(backoff)

    def list(self) -> None:
        items: list[JSON] = []
        cont = ""
        while True:
            query = {"limit": str(self.page), **self.selector}
            if cont:
                query["continue"] = cont
            body: Any = check(self.kube.request("GET", self.path, query=query), f"list {self.name}")
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            cont = meta.get("continue") or ""
            if not cont:
                self.resource_version = meta.get("resourceVersion", "")
                break
        self.on_list(items)
        self.listed.set()
        log.info("listed", resource=self.name, count=len(items), resource_version=self.resource_version)

    def watch(self) -> None:
        query = {
            **self.selector,
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": self.resource_version,
            "timeoutSeconds": str(self.timeout_s),
        }
        started = time.monotonic()
        for event in self.kube.stream(self.path, query):
            if self.stopped.is_set():
                return
            kind, obj = event.get("type", ""), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Expired(self.path)
                raise ApiError(int(obj.get("code") or 500), obj, f"watch {self.name}")
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if rv:
                self.resource_version = rv
            if kind != "BOOKMARK":
                self.on_event(kind, obj)
        if time.monotonic() - started < 1:
            self.stopped.wait(0.5)  # a server closing at once must not become a hot loop
