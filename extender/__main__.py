"""`python -m extender`: run the Phalanx scheduler extender."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from extender.app import Extender, Options
from extender.kube import RestKube


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m extender", description=__doc__)
    ap.add_argument("--kubeconfig", help="kubeconfig file; in-cluster service account when omitted")
    ap.add_argument("--host", default="127.0.0.1", help="listen address (a sidecar listens on loopback)")
    ap.add_argument("--port", type=int, default=8888)
    ap.add_argument("--config-namespace", default="phalanx-system", help="namespace of the phalanx-config ConfigMap")
    ap.add_argument("--config-file", type=Path, help="initial configuration file (the ConfigMap overrides it)")
    args = ap.parse_args()
    kube = RestKube.from_kubeconfig(args.kubeconfig)
    extender = Extender(kube, Options(args.host, args.port, args.config_namespace, args.config_file))
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    extender.start()
    done.wait()
    extender.stop()


if __name__ == "__main__":
    main()
