"""`python -m solverd [--address 127.0.0.1:50551]`: serve the Solver gRPC service until SIGTERM.
`python -m solverd --probe HOST:PORT` asks a running one for its Health (exit 0 when serving:
the container's exec probe, as it listens on the pod's loopback)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from solverd.server import serve


def probe(address: str) -> int:
    from solverd.client import RemoteSolver

    remote = RemoteSolver(address)
    try:
        return 0 if remote.health(timeout_s=5.0).serving else 1
    except Exception as e:  # unreachable, deadline: not serving
        print(f"solverd at {address}: {e}", file=sys.stderr)
        return 1
    finally:
        remote.close()


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m solverd", description=__doc__)
    ap.add_argument("--address", default="127.0.0.1:50551", help="host:port to listen on (default loopback)")
    ap.add_argument("--threads", type=int, default=4, help="calls served at once")
    ap.add_argument("--probe", metavar="HOST:PORT", help="check a running service's health and exit")
    args = ap.parse_args()
    if args.probe:
        sys.exit(probe(args.probe))
    server, _ = serve(args.address, threads=args.threads)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    server.stop(grace=5).wait()


if __name__ == "__main__":
    main()
