"""KubeSchedulerConfiguration (``kubescheduler.config.k8s.io/v1``) for the local kube-scheduler.

Without an extender this is the stock scheduler. With one, every profile calls the Phalanx
extender for filter, bind and preempt, and for prioritize where a pod requests GPU resources
(`extender_config`). ``percentageOfNodesToScore`` is left to
kube-scheduler's default (a share of the feasible nodes from 100 nodes up, 42 % of 1,000, 10 %
of 5,000): a planned gang member carries its planned node as ``status.nominatedNodeName``,
which kube-scheduler checks alone before any sample, so no plan needs every node offered.
``httpTimeout`` is 30 s rather than the 5 s default because the
extender holds gang members in bind until the whole gang has arrived.

``managedResources`` of the filter, preempt and bind entries is empty by default on purpose:
kube-scheduler only consults an extender for pods requesting a managed resource when the list
is non-empty, and gang members need not request GPUs. Pass resources (with
``ignored_by_scheduler=True`` for ones no node advertises, such as a GPU-share resource) to
narrow that down.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

API_VERSION = "kubescheduler.config.k8s.io/v1"
DEFAULT_SCHEDULER_NAME = "default-scheduler"
CLIENT_QPS = 5000.0
CLIENT_BURST = 5000
HAMI_RESOURCES = ("nvidia.com/gpumem", "nvidia.com/gpucores")
"""Per-device GPU memory / core shares that Phalanx understands and no node advertises."""


def scored_resources() -> tuple[str, ...]:
    """The resources of the pods kube-scheduler asks the extender to prioritize: whole GPUs, the
    node agent's share slots (README "The node agent"), HAMi-style shares, and every MIG profile
    of config/mig-profiles.yaml. Pods without them are not scored by the extender: its filter
    already kept only the nodes it ranks first for them (extender/verbs.py `_sample`), so a
    prioritize would score them all alike. Imported here: the solver and the extender are the
    only heavy imports of this package (0.36 s), and most of its uses never need the list."""
    from extender.gpu import GPU, mig_resource
    from extender.policy.gpushare import SHARE_RESOURCE
    from solver import load_tables

    profiles = {p.name for table in load_tables().tables for p in table.profiles}
    return (GPU, SHARE_RESOURCE, *HAMI_RESOURCES, *sorted(mig_resource(p) for p in profiles))


@dataclass(frozen=True)
class ManagedResource:
    """An extended resource the extender manages; ignored ones skip the scheduler's fit check."""

    name: str
    ignored_by_scheduler: bool = False


@dataclass(frozen=True)
class ExtenderTLS:
    """kube-scheduler's side of an HTTPS extender: its client certificate and key, and the CA
    that signed the extender's serving certificate."""

    cert_file: str
    key_file: str
    ca_file: str


def extender_config(
    url: str,
    *,
    managed_resources: Sequence[ManagedResource] = (),
    http_timeout: str = "30s",
    weight: int = 1,
    ignorable: bool = False,
    tls: ExtenderTLS | None = None,
) -> list[dict[str, Any]]:
    """Return the ``extenders`` entries for the Phalanx extender at ``url`` (its URL prefix);
    with ``tls``, kube-scheduler verifies the extender's certificate and presents its own.

    Without managed resources (every pod is the extender's) the verbs are three entries at the
    same URL: filter and preempt for every pod; prioritize only for pods that request GPU
    resources (`scored_resources`: the only pods whose filter may keep nodes Phalanx ranks
    apart, when they state preferences kube-scheduler scores), so a pod without GPUs costs one
    call on kube-scheduler's serial cycle, not two; and bind for every pod (the gang gate).
    kube-scheduler gives each entry its own HTTP client, and Go's client keeps two idle
    connections: in one entry, the binds in flight (they run beside the next pods' scheduling
    cycles) hold those two, and the next filter or prioritize, on kube-scheduler's serial path,
    opens a new connection. Apart, filter, prioritize and preempt, called one at a time by the
    scheduling cycle, always find theirs. kube-scheduler refuses a managed resource named in two
    entries, so with managed resources every verb stays in one entry.
    """
    entry: dict[str, Any] = {
        "urlPrefix": url.rstrip("/"),
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "bindVerb": "bind",
        "preemptVerb": "preempt",
        "weight": weight,
        "enableHTTPS": url.startswith("https://"),
        "nodeCacheCapable": True,
        "ignorable": ignorable,
        "httpTimeout": http_timeout,
        "managedResources": [{"name": r.name, "ignoredByScheduler": r.ignored_by_scheduler} for r in managed_resources],
    }
    if tls is not None:
        entry["tlsConfig"] = {"certFile": tls.cert_file, "keyFile": tls.key_file, "caFile": tls.ca_file}
    if managed_resources:
        return [entry]
    cycle = {k: v for k, v in entry.items() if k not in ("prioritizeVerb", "bindVerb", "weight")}
    scorer = {k: v for k, v in entry.items() if k not in ("filterVerb", "bindVerb", "preemptVerb")}
    scorer["managedResources"] = [{"name": name, "ignoredByScheduler": False} for name in scored_resources()]
    binder = {k: v for k, v in entry.items() if k not in ("filterVerb", "prioritizeVerb", "preemptVerb", "weight")}
    return [cycle, scorer, binder]


def scheduler_config(
    kubeconfig: Path,
    *,
    extenders: Sequence[dict[str, Any]] = (),
    scheduler_names: Sequence[str] = (DEFAULT_SCHEDULER_NAME,),
    ignored_resources: Sequence[str] = (),
    percentage_of_nodes_to_score: int | None = None,
    qps: float = CLIENT_QPS,
    burst: int = CLIENT_BURST,
) -> dict[str, Any]:
    """Return a KubeSchedulerConfiguration; ``extenders`` come from :func:`extender_config`.

    One profile per name in ``scheduler_names``, all with the default plugins; with
    ``ignored_resources`` their NodeResourcesFit skips those resources (no node advertises
    HAMi-style ``nvidia.com/gpumem``, so otherwise such pods fit nowhere before the extender is
    asked). Leader election is off: there is one scheduler, and a restart must not wait out an
    old lease. The client's rate limiter is lifted (QPS and burst 5,000, as kube-scheduler's
    own scheduler_perf runs): at the default 50/100, or even 100/200, kube-scheduler binds no
    faster than its limiter allows, while the extender binds through its own client, which has
    none; a throughput comparison would measure the limiter.
    """
    profile_extras: dict[str, Any] = {}
    if ignored_resources:
        fit_args = {"ignoredResources": list(ignored_resources)}
        profile_extras["pluginConfig"] = [{"name": "NodeResourcesFit", "args": fit_args}]
    config: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": qps, "burst": burst},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": name, **profile_extras} for name in scheduler_names],
    }
    if extenders:
        config["extenders"] = list(extenders)
    if percentage_of_nodes_to_score is not None:
        config["percentageOfNodesToScore"] = percentage_of_nodes_to_score
    return config


@dataclass(frozen=True)
class SchedulerSettings:
    """Everything that decides kube-scheduler's configuration file; None URL = stock scheduler."""

    extender_url: str | None = None
    managed_resources: tuple[ManagedResource, ...] = ()
    scheduler_names: tuple[str, ...] = (DEFAULT_SCHEDULER_NAME,)
    ignored_resources: tuple[str, ...] = ()
    extender_tls: ExtenderTLS | None = None
    percentage_of_nodes_to_score: int | None = None  # None: kube-scheduler's adaptive default

    def render(self, kubeconfig: Path) -> str:
        """Return the configuration file's text (stable, so two renders compare equal)."""
        extenders: list[dict[str, Any]] = []
        if self.extender_url:
            extenders = extender_config(
                self.extender_url, managed_resources=self.managed_resources, tls=self.extender_tls
            )
        config = scheduler_config(
            kubeconfig,
            extenders=extenders,
            scheduler_names=self.scheduler_names,
            ignored_resources=self.ignored_resources,
            percentage_of_nodes_to_score=self.percentage_of_nodes_to_score,
        )
        return yaml.safe_dump(config, sort_keys=False)

    def describe(self) -> str:
        """One-line summary for logs."""
        return f"extender {self.extender_url}" if self.extender_url else "vanilla"
