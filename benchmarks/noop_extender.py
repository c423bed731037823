"""The extender protocol's floor: what any extender on Phalanx's HTTP server costs kube-scheduler.

A stand-in for the Phalanx extender in `kwok_throughput --floor`: the same HTTP server
(extender/server.py, its verbs' timing phases included) and the same Binding POST
(extender/binder.py, through the same client; with `--bind-journal`, answered at once and landed
in the background as Phalanx's single pods' binds are, extender/landing.py), with no work of
its own: filter passes a pod requesting `nvidia.com/gpu` the first node it is offered (as
Phalanx's `filter.sampleNodes: auto` does, so kube-scheduler skips prioritize for it) and any
other pod the first 100 it is offered (as that setting cuts them; kube-scheduler's
configuration sends those to prioritize only if they request a GPU resource, as for Phalanx:
deploy/local/scheduler_config.py), prioritize scores
nothing, preempt changes nothing. No cache, no watch, no devices, no gangs: the ratio it reaches
is the most an extender on this server and this protocol could, on the same machine, and
Phalanx's distance from it is what its own work costs.

    python -m benchmarks.noop_extender --kubeconfig FILE --port N   (started by kwok_throughput)

The REST API serves only `/api/v1/stats` (what the benchmark reads and resets), to a caller
presenting the token of the kubeconfig it was started with (the benchmark's own).
"""

from __future__ import annotations

import argparse
import hmac
import logging
from pathlib import Path
from typing import Any

import structlog

from extender import wire
from extender.auth import Access, Denied
from extender.binder import Binder
from extender.kube import ApiError, RestKube
from extender.landing import Journal, Landing, Landings
from extender.metrics import Metrics
from extender.scoring import MIN_SAMPLE
from extender.server import Server

GPU = "nvidia.com/gpu"


def wants_gpu(pod: dict[str, Any]) -> bool:
    """The pod requests (or limits) `nvidia.com/gpu` in a container."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        if GPU in (resources.get("limits") or {}) or GPU in (resources.get("requests") or {}):
            return True
    return False


def filter_verb(args: dict[str, Any]) -> dict[str, Any]:
    names = wire.node_names(args)  # malformed requests get Phalanx's 400s, not an internal error
    # As `filter.sampleNodes: auto` cuts them (the names offered never outnumber the nodes).
    passed = names[:1] if wants_gpu(wire.check_pod(args.get("Pod"))) else names[:MIN_SAMPLE]
    return {"NodeNames": passed, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}


class StatsOnly:
    """Reads and resets of /api/v1/stats by the holder of `authorization` (the header its
    kubeconfig's credentials make; None: a kubeconfig without a token, every caller refused)."""

    def __init__(self, authorization: str | None) -> None:
        self.authorization = authorization

    def check(self, authorization: str | None, access: Access) -> Denied | None:
        if access.resource != "stats":
            return Denied(403, f"{access}: the floor extender serves stats only")
        if not (self.authorization and authorization and hmac.compare_digest(authorization, self.authorization)):
            return Denied(401, "the floor extender's stats need the token it was started with")
        return None


def server(kube: RestKube, port: int, journal: Path | None = None) -> Server:
    binder = Binder(kube)

    def land(landing: Landing) -> bool:
        """One try; settled when it landed or the API server refuses it for good (a 4xx)."""
        try:
            binder.bind(landing.namespace, landing.name, landing.uid, landing.node, ())
        except ApiError as e:
            return 400 <= e.status < 500 and e.status != 429
        except OSError:
            return False
        return True

    # With a journal, binds are answered at once and landed in the background, as Phalanx's
    # single pods' are (extender/landing.py): the floor keeps the same protocol costs.
    landings = Landings(Journal(journal), land, lambda landing: True) if journal is not None else None
    if landings is not None:
        landings.start()
        landings.resume_all()

    def bind(args: dict[str, Any]) -> dict[str, Any]:
        checked = wire.bind_args(args)  # the names go into an API path: Kubernetes' grammar, or a 400
        if landings is not None and landings.begin(Landing(checked.uid, checked.namespace, checked.name, checked.node)):
            return {"Error": ""}
        try:
            binder.bind(checked.namespace, checked.name, checked.uid, checked.node, ())
        except Exception as e:  # kube-scheduler reads the error and retries the pod
            return {"Error": str(e)}
        return {"Error": ""}

    verbs = {
        "filter": filter_verb,
        "prioritize": lambda args: [],
        "bind": bind,
        "preempt": lambda args: {"NodeNameToMetaVictims": {}},
    }
    stats = StatsOnly(kube.headers.get("Authorization"))
    return Server(("127.0.0.1", port), verbs=verbs, metrics=Metrics(), ready=lambda: True, authorizer=stats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--config-file", help="ignored (kwok_throughput passes what it passes the extender)")
    ap.add_argument("--bind-journal", type=Path, help="answer binds at once and land them in the background")
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    server(RestKube.from_kubeconfig(args.kubeconfig), args.port, args.bind_journal).serve_forever()


if __name__ == "__main__":
    main()
