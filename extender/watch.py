"""List-then-watch of one resource, as client-go's reflector does it.

List (paged), hand the full set to the cache, mark "listed", then watch from the list's
resourceVersion with bookmarks. A 410 Gone (as an HTTP status or an ERROR event) means the
version expired: list again. Any other failure backs off (exponential, 0.5 s to 5 s, with
jitter so a dozen reflectors do not reconnect in step) and re-watches from the last version seen.
A watch that ran healthily for a while before failing starts the backoff afresh: one outage
must not leave every later reconnect at the cap (after a kube-apiserver restart, each second
of backoff is a second of stale cache). Readiness is reported only after the first list.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

from extender.kube import JSON, ApiError, Expired, Kube, check

log = structlog.get_logger("phalanx.watch")

OnList = Callable[[list[Any]], None]  # the listed items, or what `prepare` made of them
OnEvent = Callable[[str, JSON], None]

BACKOFF_S = 0.5  # first retry after a failure
MAX_BACKOFF_S = 5.0  # cheap to poll a refused connection; long waits only delay recovery
HEALTHY_S = 10.0  # a list-and-watch that lasted this long was healthy: reset the backoff
# How often an optional API that is not served (a CRD not installed yet) is asked for again: a
# 404 costs the API server nothing, and the gap is added to the time a gang created with its
# CRD waits (10 s here made 4 creation orders bind in 7-9 s instead of under 1 s).
ABSENT_POLL_S = 2.0


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
        alternatives: tuple[str, ...] = (),
        prepare: Callable[[JSON], Any] | None = None,
    ) -> None:
        self.optional = optional  # an API that may not be served (yet): poll quietly for it
        # For /metrics (extender/collectors.py): full lists done, watches that failed and were retried.
        self.lists = 0
        self.restarts = 0
        self.kube = kube
        # The same resource at other API versions, tried in turn while the current one is not
        # served (404): a kind that moved from v1alpha2 to v1beta1 is watched at whichever the
        # API server serves, the first that answers wins until it stops being served.
        self.paths = (path, *alternatives)
        self._current = 0
        self.selector = selector or {}
        # Applied to each listed item as its page arrives (on_list then gets what it returns):
        # the pods' reflector parses them there, so 50,000 raw pods are never held at once.
        self.prepare = prepare
        self.on_list = on_list
        self.on_event = on_event
        self.name = name
        self.timeout_s = timeout_s
        self.page = page
        self.listed = threading.Event()
        self.absent = False  # optional and not served (404) when last asked
        self.stopped = threading.Event()
        self.resource_version = ""
        self._absent_logged = False

    @property
    def path(self) -> str:
        return self.paths[self._current]

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name=f"watch-{self.name}", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        backoff = BACKOFF_S
        need_list = True
        while not self.stopped.is_set():
            started = time.monotonic()
            try:
                if need_list:
                    self.list()
                    need_list = False
                self.watch()
                backoff = BACKOFF_S
            except Expired:
                log.info("watch expired; listing again", resource=self.name)
                need_list = True
            except ApiError as e:
                if self.optional and e.status == 404:
                    self.absent = True
                    need_list = True
                    self._current = (self._current + 1) % len(self.paths)
                    if self._current == 0:  # every version asked once: wait before the next round
                        if not self._absent_logged:
                            log.info("API not served; polling for it", resource=self.name, paths=self.paths)
                            self._absent_logged = True
                        self.stopped.wait(ABSENT_POLL_S)
                    continue
                backoff = self._retry(e, backoff, started)
                need_list = need_list or e.status in (401, 403, 404)
            except Exception as e:  # urllib3's errors (MaxRetryError, ProtocolError) are not OSError
                backoff = self._retry(e, backoff, started)

    def _retry(self, error: Exception, backoff: float, started: float) -> float:
        """Wait before the next attempt; returns the backoff for the one after."""
        self.restarts += 1
        if time.monotonic() - started >= HEALTHY_S:
            backoff = BACKOFF_S
        wait = backoff * random.uniform(0.8, 1.2)
        log.warning("watch failed; retrying", resource=self.name, error=str(error), backoff_s=round(wait, 2))
        self.stopped.wait(wait)
        return min(backoff * 2, MAX_BACKOFF_S)

    def list(self) -> None:
        """List page by page. The next page is asked for as soon as this one's continue token
        is read, and fetched while this one is prepared: kube-apiserver encodes it while the
        extender parses, instead of each waiting for the other (two pages held at most)."""
        items: list[Any] = []
        pages = 0
        with ThreadPoolExecutor(1, thread_name_prefix=f"list-{self.name}") as fetcher:
            pending = fetcher.submit(self._page, "")
            while True:
                body = pending.result()
                pages += 1
                meta = body.get("metadata") or {}
                cont = meta.get("continue") or ""
                if cont:
                    pending = fetcher.submit(self._page, cont)
                page_items = body.get("items") or []
                # List items of built-in kinds carry no apiVersion/kind (watch events do): stamp
                # the list's own, so a consumer knows which version of a moved kind it holds.
                api_version, kind = body.get("apiVersion"), str(body.get("kind") or "").removesuffix("List")
                for item in page_items:
                    if isinstance(item, dict) and api_version and "apiVersion" not in item:
                        item["apiVersion"] = api_version
                        item.setdefault("kind", kind)
                items.extend(page_items if self.prepare is None else map(self.prepare, page_items))
                del body, page_items  # this page's raw objects can go before the next is read
                if not cont:
                    self.resource_version = meta.get("resourceVersion", "")
                    break
        self.on_list(items)
        self.lists += 1
        self.absent = False
        self.listed.set()
        log.info("listed", resource=self.name, count=len(items), pages=pages, resource_version=self.resource_version)

    def _page(self, cont: str) -> Any:
        query = {"limit": str(self.page), **self.selector}
        if cont:
            query["continue"] = cont
        return check(self.kube.request("GET", self.path, query=query), f"list {self.name}")

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
