"""The reflector under scripted streams: list, events, bookmarks, 410 and recovery."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from extender.kube import Expired
from extender.watch import Reflector
from tests.extender.fakes import FakeKube


def run_until(reflector: Reflector, done: threading.Event) -> None:
    thread = reflector.start()
    assert done.wait(10), "reflector did not reach the expected state"
    reflector.stop()
    thread.join(5)


def test_list_then_events_in_order_with_bookmarks_skipped_and_410_relisting() -> None:
    kube = FakeKube()
    path = "/api/v1/things"
    kube.lists[path] = [
        [{"metadata": {"name": "a", "resourceVersion": "1"}}],
        [{"metadata": {"name": "b", "resourceVersion": "5"}}],
    ]
    kube.streams[path] = [
        [
            {"type": "ADDED", "object": {"metadata": {"name": "x", "resourceVersion": "11"}}},
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}},
            {"type": "ERROR", "object": {"code": 410, "message": "too old"}},
        ],
        Expired,
        [{"type": "DELETED", "object": {"metadata": {"name": "b", "resourceVersion": "20"}}}],
    ]
    seen: list[str] = []
    lists: list[list[str]] = []
    done = threading.Event()

    def on_event(kind: str, obj: dict) -> None:  # type: ignore[type-arg]
        seen.append(f"{kind}:{obj['metadata']['name']}")
        if kind == "DELETED":
            done.set()

    reflector = Reflector(
        kube,
        path,
        on_list=lambda items: lists.append([i["metadata"]["name"] for i in items]),
        on_event=on_event,
        name="things",
    )
    run_until(reflector, done)
    assert lists[:3] == [["a"], ["b"], ["b"]]  # first list, re-list after ERROR 410, re-list after Expired
    assert seen == ["ADDED:x", "DELETED:b"]
    assert reflector.listed.is_set()
    watches = [q for m, p, q in kube.calls if m == "GET"]
    assert watches  # lists went through request()


def test_resource_version_advances_with_events_and_bookmarks() -> None:
    kube = FakeKube()
    path = "/api/v1/things"
    kube.lists[path] = [[]]
    kube.streams[path] = [[{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "42"}}}]]
    done = threading.Event()
    reflector = Reflector(kube, path, on_list=lambda items: None, on_event=lambda k, o: None, name="things")
    original = kube.stream

    def stream(p: str, query: dict) -> object:  # type: ignore[type-arg]
        if query["resourceVersion"] == "42":
            done.set()
        return original(p, query)

    kube.stream = stream  # type: ignore[method-assign,assignment]
    run_until(reflector, done)


def test_a_watch_that_ran_healthily_starts_the_next_backoff_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """After one API server outage the reconnect backoff once stayed at its cap for good."""
    from extender import watch

    clock = [0.0]
    monkeypatch.setattr(watch.time, "monotonic", lambda: clock[0])
    waits: list[float] = []
    reflector = Reflector(
        FakeKube(), "/api/v1/things", on_list=lambda items: None, on_event=lambda k, o: None, name="t"
    )
    monkeypatch.setattr(reflector.stopped, "wait", lambda s: waits.append(s) or False)
    backoff = watch.BACKOFF_S
    for _ in range(6):  # failures in a row: the backoff climbs to the cap
        backoff = reflector._retry(OSError("refused"), backoff, started=clock[0])
    assert backoff == watch.MAX_BACKOFF_S
    clock[0] = 1000.0  # the next list-and-watch began long ago: it was healthy
    reflector._retry(OSError("EOF"), backoff, started=clock[0] - watch.HEALTHY_S)
    assert waits[-1] <= watch.BACKOFF_S * 1.2
    assert max(waits) <= watch.MAX_BACKOFF_S * 1.2


def test_listed_items_are_prepared_page_by_page() -> None:
    """A reflector with `prepare` hands on_list what it made of each item (the pods' reflector
    parses pods as their page arrives, so no raw list is held whole)."""
    kube = FakeKube()
    path = "/api/v1/things"
    kube.lists[path] = [[{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]]
    kube.streams[path] = [[]]
    lists: list[list[str]] = []
    done = threading.Event()

    def on_list(items: list[str]) -> None:
        lists.append(items)
        done.set()

    reflector = Reflector(
        kube,
        path,
        on_list=on_list,
        on_event=lambda k, o: None,
        name="things",
        prepare=lambda obj: obj["metadata"]["name"].upper(),
    )
    run_until(reflector, done)
    assert lists[0] == ["A", "B"]


class PagedKube:
    """Serves a list in pages of one item, with continue tokens; notes each page asked for."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.asked: list[str] = []
        self.second_page_asked = threading.Event()

    def request(self, method: str, path: str, *, query: dict[str, str] | None = None, body: object = None) -> Any:
        from extender.kube import Response

        cont = (query or {}).get("continue", "")
        self.asked.append(cont)
        if cont == "1":
            self.second_page_asked.set()
        i = int(cont or 0)
        meta = {"resourceVersion": "7", **({"continue": str(i + 1)} if i + 1 < len(self.names) else {})}
        return Response(200, {"items": [{"metadata": {"name": self.names[i]}}], "metadata": meta})


def test_the_next_page_is_fetched_while_this_one_is_prepared() -> None:
    """Preparing page one waits until page two has been asked for: a list that fetched pages
    one after the other would never get there (the wait would time out)."""
    kube = PagedKube(["a", "b", "c"])
    overlapped: list[bool] = []

    def prepare(item: dict[str, Any]) -> str:
        name: str = item["metadata"]["name"]
        if name == "a":
            overlapped.append(kube.second_page_asked.wait(5))
        return name

    lists: list[list[str]] = []
    reflector = Reflector(
        kube,  # type: ignore[arg-type]
        "/api/v1/pods",
        on_list=lists.append,
        on_event=lambda kind, obj: None,
        name="pods",
        prepare=prepare,
    )
    reflector.list()
    assert overlapped == [True]
    assert lists == [["a", "b", "c"]] and kube.asked == ["", "1", "2"]
    assert reflector.resource_version == "7"
