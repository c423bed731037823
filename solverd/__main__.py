"""`python -m solverd [--address 127.0.0.1:50551]`: serve the Solver gRPC service until SIGTERM."""

from __future__ import annotations

import argparse
import signal
import threading

from solverd.server import serve


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m solverd", description=__doc__)
    ap.add_argument("--address", default="127.0.0.1:50551", help="host:port to listen on (default loopback)")
    ap.add_argument("--threads", type=int, default=4, help="calls served at once")
    args = ap.parse_args()
    server, _ = serve(args.address, threads=args.threads)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    server.stop(grace=5).wait()


if __name__ == "__main__":
    main()
