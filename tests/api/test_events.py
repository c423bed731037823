"""The watch history: events after a list's version, in order, to any number of readers."""

from __future__ import annotations

import threading
import time

from extender.api.events import Events
from extender.objects import PodInfo, pod_info


def pod(name: str) -> PodInfo:
    return pod_info({"metadata": {"name": name, "namespace": "ns", "uid": name}, "spec": {"containers": []}})


def drain(events: Events, rv: int, seconds: float = 0.2) -> list[tuple[list[str], int]]:
    stop = threading.Event()
    out = []
    for batch, at in events.follow(rv, stop, time.monotonic() + seconds, idle_s=0.05):
        out.append(([e.pod.name for e in batch], at))
        if not batch:
            break
    return out


def test_a_reader_gets_the_events_after_its_version_then_a_bookmark_where_it_is() -> None:
    events = Events()
    events.reset("100")
    for i, rv in enumerate(("101", "105", "109")):
        events.add("ADDED", pod(f"p{i}"), rv)
    assert events.covers(100) and events.covers(109) and not events.covers(99) and not events.covers(110)
    assert drain(events, 105) == [(["p2"], 109), ([], 109)]
    assert drain(events, 100) == [(["p0", "p1", "p2"], 109), ([], 109)]


def test_a_waiting_reader_wakes_for_a_new_event() -> None:
    events = Events()
    events.reset("1")
    got: list[list[str]] = []
    stop = threading.Event()

    def read() -> None:
        for batch, _ in events.follow(1, stop, time.monotonic() + 5, idle_s=5):
            got.append([e.pod.name for e in batch])
            return

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.1)
    events.add("MODIFIED", pod("late"), "2")
    reader.join(5)
    assert got == [["late"]]


def test_history_that_no_longer_covers_a_reader_ends_its_stream() -> None:
    events = Events(most=2)
    events.reset("10")
    for rv in (11, 12, 13):
        events.add("ADDED", pod(f"p{rv}"), str(rv))
    assert not events.covers(10) and events.covers(11)  # the event at 11 was dropped: after it is held
    assert drain(events, 10) == []
    events.reset("50")  # a relist: earlier versions are no longer in order here
    assert not events.covers(13) and drain(events, 13) == []


def test_an_opaque_version_turns_the_history_off() -> None:
    events = Events()
    events.reset("abc")
    events.add("ADDED", pod("p"), "7")
    assert not events.covers(7)


def test_an_opaque_version_ends_the_readers_it_cannot_serve() -> None:
    events = Events()
    events.reset("1")
    events.add("ADDED", pod("a"), "2")
    ended = threading.Event()

    def read() -> None:
        for _ in events.follow(2, threading.Event(), time.monotonic() + 5, idle_s=5):
            pass
        ended.set()

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.1)
    events.add("MODIFIED", pod("a"), "not-a-number")
    reader.join(5)
    assert ended.is_set()
