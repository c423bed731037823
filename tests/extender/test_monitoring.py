"""The shipped dashboard and alerts: written from deploy/monitoring.py, and every metric they
query is one the extender exports."""

from __future__ import annotations

import re

from prometheus_client import generate_latest

from deploy import monitoring
from extender.app import Extender, Options
from tests.extender.fakes import FakeKube


def test_the_shipped_files_are_what_deploy_monitoring_writes() -> None:
    for path, text in monitoring.files().items():
        assert path.read_text() == text, f"{path} is stale: run python -m deploy.monitoring"


def test_every_queried_metric_is_exported() -> None:
    ext = Extender(FakeKube(), Options(port=0))
    try:
        text = generate_latest(ext.metrics.registry).decode()
    finally:
        ext.server.server_close()
    exported = set(re.findall(r"^# TYPE (\S+)", text, re.MULTILINE))
    exported |= {name + suffix for name in exported for suffix in ("_total", "_bucket", "_count", "_sum")}
    queries = [s.promql() for p in monitoring.PANELS for s in p.series] + [a.expr for a in monitoring.ALERTS]
    missing = {n for q in queries for n in monitoring.metric_names(q) if n not in exported}
    assert not missing, missing
    assert len(monitoring.dashboard()["panels"]) == len(monitoring.PANELS) >= 10
