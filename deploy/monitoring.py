"""The Grafana dashboard and the Prometheus alerts, from one list of panels and rules.

`python -m deploy.monitoring` writes deploy/kubernetes/monitoring/ (grafana-dashboard.json,
prometheus-rule.yaml) and the Helm chart's copies (charts/phalanx/files/). A test fails when
the files differ from what this module writes, and when a query names a metric the extender
does not export. `benchmarks/dashboard.py` renders the same panels to a PNG from a real run,
evaluating each panel's series on scraped samples.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

OUT = Path(__file__).resolve().parent / "kubernetes" / "monitoring"
CHART_FILES = Path(__file__).resolve().parents[1] / "charts" / "phalanx" / "files"  # the chart's copies
WINDOW = "5m"  # the rate and quantile window of the dashboard's queries


@dataclass(frozen=True)
class Series:
    """One line of a panel: a metric summed by `by`, as is (gauge), per second (rate) or as a
    quantile of a histogram."""

    metric: str
    kind: Literal["gauge", "rate", "quantile"] = "gauge"
    by: tuple[str, ...] = ()
    q: float = 0.0
    match: tuple[tuple[str, str], ...] = ()  # label = value (value may be a regex alternation)
    legend: str = ""

    def selector(self, name: str) -> str:
        inner = ",".join(f'{k}=~"{v}"' if "|" in v else f'{k}="{v}"' for k, v in self.match)
        return f"{name}{{{inner}}}" if inner else name

    def promql(self) -> str:
        by = f" by ({', '.join(self.by)})" if self.by else ""
        if self.kind == "gauge":
            return f"sum{by} ({self.selector(self.metric)})"
        if self.kind == "rate":
            return f"sum{by} (rate({self.selector(self.metric)}[{WINDOW}]))"
        groups = ", ".join(("le", *self.by))
        buckets = self.selector(self.metric + "_bucket")
        return f"histogram_quantile({self.q}, sum by ({groups}) (rate({buckets}[{WINDOW}])))"


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str  # Grafana unit: short, s, percentunit, bytes, reqps
    series: tuple[Series, ...]
    description: str = ""


PANELS = (
    Panel(
        "Gangs pending, by reason",
        "short",
        (Series("phalanx_gangs_pending", by=("reason",), legend="{{reason}}"),),
        "Gangs with members waiting and no reservation; the reason class comes from the solver's explanation.",
    ),
    Panel(
        "Reservations held and gang timeouts",
        "short",
        (
            Series("phalanx_gang_reservations", legend="members holding a reservation"),
            Series("phalanx_gang_timeouts_total", "rate", legend="timeouts / s"),
        ),
    ),
    Panel(
        "Quorum to bound",
        "s",
        (
            Series("phalanx_gang_quorum_to_bound_seconds", "quantile", q=0.5, legend="p50"),
            Series("phalanx_gang_quorum_to_bound_seconds", "quantile", q=0.99, legend="p99"),
        ),
    ),
    Panel(
        "Gang plans / s",
        "reqps",
        (Series("phalanx_gang_plans_total", "rate", by=("kind",), legend="{{kind}}"),),
        "first: a gang's first reservation; replan: after a release, a timeout or an outdated plan.",
    ),
    Panel(
        "GPUs allocated, by pool and model",
        "short",
        (
            Series("phalanx_gpu_allocated", by=("pool", "model"), legend="{{pool}} {{model}} allocated"),
            Series("phalanx_gpu_devices", by=("pool", "model"), legend="{{pool}} {{model}} total"),
        ),
    ),
    Panel(
        "GPU fragmentation",
        "percentunit",
        (
            Series("phalanx_gpu_fragmentation_ratio", by=("pool", "model"), legend="{{pool}} {{model}} stranded"),
            Series("phalanx_gpu_memory_allocated_ratio", by=("pool", "model"), legend="{{pool}} {{model}} memory"),
        ),
        "Free share stranded on partly used GPUs / all free share; GPU memory allocated / total.",
    ),
    Panel(
        "Extender verbs p99",
        "s",
        (Series("phalanx_extender_request_seconds", "quantile", by=("verb",), q=0.99, legend="{{verb}}"),),
    ),
    Panel(
        "Extender errors / s",
        "reqps",
        (Series("phalanx_extender_errors_total", "rate", by=("verb", "reason"), legend="{{verb}} {{reason}}"),),
    ),
    Panel(
        "Bind refusals / s",
        "reqps",
        (
            Series(
                "phalanx_extender_outcomes_total",
                "rate",
                by=("outcome",),
                match=(("verb", "bind"),),
                legend="{{outcome}}",
            ),
        ),
    ),
    Panel(
        "Watch cache: relists and restarts / s",
        "reqps",
        (
            Series("phalanx_watch_lists_total", "rate", by=("resource",), legend="list {{resource}}"),
            Series("phalanx_watch_restarts_total", "rate", by=("resource",), legend="restart {{resource}}"),
        ),
    ),
    Panel(
        "Leading replicas and config rejections",
        "short",
        (
            Series("phalanx_leading", legend="replicas that may bind"),
            Series("phalanx_config_rejections_total", "rate", by=("source",), legend="rejected {{source}} / s"),
        ),
    ),
    Panel(
        "Extender memory",
        "bytes",
        (Series("process_resident_memory_bytes", legend="resident"),),
    ),
)


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    labels: dict[str, str] = field(default_factory=dict)


ALERTS = (
    Alert(
        "PhalanxGangStuck",
        'sum by (reason) (phalanx_gangs_pending{reason!~"WaitingForQuorum|WaitingForDefinition"}) > 0',
        "15m",
        "warning",
        "{{ $value }} gang(s) with quorum cannot be placed ({{ $labels.reason }}) for 15 minutes; "
        "`kubectl phalanx explain` names the binding constraint.",
    ),
    Alert(
        "PhalanxGangTimeouts",
        "increase(phalanx_gang_timeouts_total[15m]) > 0",
        "0m",
        "warning",
        "Gang reservations timed out at bind in the last 15 minutes: members planned but never reached bind.",
    ),
    Alert(
        "PhalanxExtenderErrors",
        'sum by (verb) (rate(phalanx_extender_errors_total{reason="internal"}[5m])) > 0',
        "5m",
        "critical",
        "The extender answers {{ $labels.verb }} with internal errors.",
    ),
    Alert(
        "PhalanxBindFailures",
        'sum(rate(phalanx_extender_outcomes_total{verb="bind",outcome=~"refused|no-longer-fits|gang-wait-failed"}[10m]))'
        ' + sum(rate(phalanx_extender_errors_total{verb="bind"}[10m])) > 0.1',
        "10m",
        "warning",
        "Binds are refused or failing ({{ $value }} / s) for 10 minutes.",
    ),
    Alert(
        "PhalanxBindsNotLanding",
        # A bind answered before its Binding landed (extender/landing.py) is retried every 10 s
        # until it lands; kube-scheduler holds the pod as assumed meanwhile and never asks again.
        # Retries that go on for 15 minutes mean kube-apiserver refuses them or cannot be reached.
        'sum(rate(phalanx_extender_outcomes_total{verb="bind-landing",outcome="retried"}[10m])) > 0',
        "15m",
        "warning",
        "Binds answered to kube-scheduler have not landed for 15 minutes: their Bindings are retried "
        "({{ $value }} / s); the extender's log names each pod and kube-apiserver's answer.",
    ),
    Alert(
        "PhalanxFragmentationHigh",
        "max by (pool, model) (phalanx_gpu_fragmentation_ratio) > 0.5",
        "30m",
        "info",
        "Over half the free GPU share of {{ $labels.pool }} {{ $labels.model }} is stranded on partly used GPUs.",
    ),
    Alert(
        "PhalanxExtenderStarved",
        # kube-scheduler waits on filter and prioritize: time the extender's threads spend waiting
        # for a core there lengthens every pod's scheduling cycle.
        'sum(rate(phalanx_extender_request_phase_seconds_sum{verb=~"filter|prioritize",phase="queued"}[10m]))'
        ' > 2 * sum(rate(phalanx_extender_request_phase_seconds_sum{verb=~"filter|prioritize",phase="cpu"}[10m]))'
        ' and sum(rate(phalanx_extender_request_phase_seconds_count{verb="filter",phase="cpu"}[10m])) > 1',
        "15m",
        "warning",
        "Filter and prioritize wait for a core more than twice as long as they run, for 15 minutes: the "
        "extender lacks CPU, and every pod's scheduling cycle waits with it. Raise its CPU request.",
    ),
    Alert(
        "PhalanxNoLeader",
        "sum(phalanx_leading) < 1",
        "2m",
        "critical",
        "No Phalanx replica may bind: no kube-scheduler leads, or leadership cannot be confirmed.",
    ),
)


def dashboard() -> dict[str, Any]:
    panels = []
    for i, p in enumerate(PANELS):
        panels.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": p.title,
                "description": p.description,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 8, "x": (i % 3) * 8, "y": (i // 3) * 8},
                "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
                "targets": [
                    {"refId": chr(ord("A") + j), "expr": s.promql(), "legendFormat": s.legend}
                    for j, s in enumerate(p.series)
                ],
            }
        )
    return {
        "title": "Phalanx",
        "uid": "phalanx",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "tags": ["phalanx", "scheduling", "gpu"],
        "templating": {
            "list": [{"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"}]
        },
        "panels": panels,
    }


def prometheus_rule() -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "phalanx", "namespace": "phalanx-system", "labels": {"app": "phalanx-scheduler"}},
        "spec": {
            "groups": [
                {
                    "name": "phalanx",
                    "rules": [
                        {
                            "alert": a.name,
                            "expr": a.expr,
                            "for": a.for_,
                            "labels": {"severity": a.severity, **a.labels},
                            "annotations": {"summary": a.summary},
                        }
                        for a in ALERTS
                    ],
                }
            ]
        },
    }


def metric_names(expr: str) -> set[str]:
    """The metric names a query reads (what the exporter must serve)."""
    names = set(re.findall(r"\b((?:phalanx|process)_[a-z_]+)\b", expr))
    return {re.sub(r"_bucket$", "", n) for n in names}


def files() -> dict[Path, str]:
    dashboard_json = json.dumps(dashboard(), indent=2) + "\n"
    rule = "# Written by `python -m deploy.monitoring`; edit deploy/monitoring.py.\n" + yaml.safe_dump(
        prometheus_rule(), sort_keys=False, width=200
    )
    out = {}
    for folder in (OUT, CHART_FILES):
        out[folder / "grafana-dashboard.json"] = dashboard_json
        out[folder / "prometheus-rule.yaml"] = rule
    return out


def main() -> None:
    for path, text in files().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
