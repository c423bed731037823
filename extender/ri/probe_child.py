"""The registration probe's child process: times jq programs on the probe documents it is sent.

Run as a script (`python probe_child.py`), never imported by the extender: it needs only libjq,
so it starts in ~50 ms, and the parent (`probe`) can kill it when a program overruns - libjq
itself cannot be interrupted. Protocol, one JSON document per line: first the probe documents
(a list), then requests {"programs": [...], "limits": [seconds per document], "repeat": n}; for
each program, in order, one reply {"seconds": [best of n runs per document, CPU time]} or {"error": "..."}
when it does not compile. A run past its document's limit is not repeated (it is over already).
"""

import contextlib
import json
import sys
import time

import jq  # type: ignore[import-not-found, unused-ignore]


def _time(program: object, text: str, limit: float, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        if limit < best < float("inf"):
            break
        start = time.thread_time()
        with contextlib.suppress(ValueError):  # a run-time error still cost what it cost
            program.input_text(text).all()  # type: ignore[attr-defined]
        best = min(best, time.thread_time() - start)
    return best


def main() -> None:
    docs = [json.dumps(doc) for doc in json.loads(sys.stdin.readline())]
    for line in sys.stdin:
        request = json.loads(line)
        for text in request["programs"]:
            try:
                program = jq.compile(text)
            except ValueError as error:
                reply: dict[str, object] = {"error": str(error).splitlines()[0]}
            else:
                limits, repeat = request["limits"], request["repeat"]
                reply = {
                    "seconds": [_time(program, doc, limit, repeat) for doc, limit in zip(docs, limits, strict=True)]
                }
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
