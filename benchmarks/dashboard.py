"""The Grafana dashboard's panels, rendered to a PNG from a real run (no Grafana needed).

A KWOK cluster of 64 GPU nodes (config/cluster.yaml) with kube-scheduler calling the extender
goes through a scripted hour in miniature: 16-member gangs bound within one rack, GPU-share
pods, a gang too big for any rack (pending, RequiredTopology), a gang short of members
(WaitingForQuorum), gangs deleted and new share pods filling the holes they leave, an invalid
ConfigMap update (rejected). The extender's /metrics is scraped every second; each panel of
`deploy/monitoring.py` is evaluated on the scrapes as its PromQL would be (sums by label;
rate and histogram_quantile over a 15 s window instead of the dashboard's 5 m, the run being
short) and drawn with matplotlib into benchmarks/dashboard.png, the picture in the README.

    python -m benchmarks.dashboard [--quick] [--no-record] [--out PATH]
"""

from __future__ import annotations

import math
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common import finish, machine, parser
from benchmarks.kwok import kwok_session
from deploy.monitoring import PANELS, Panel, Series
from extender.kube import RestKube

ROOT = Path(__file__).resolve().parent.parent
CRDS = ROOT / "config" / "crds" / "phalanx.io_workloads.yaml"
NS = "default"
WINDOW_S = 15.0
Sample = tuple[dict[str, str], float]
Scrape = tuple[float, dict[str, list[Sample]]]


class Scraper:
    def __init__(self, url: str) -> None:
        self.url = url
        self.scrapes: list[Scrape] = []
        self._stop = threading.Event()
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                continue
            samples: dict[str, list[Sample]] = defaultdict(list)
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    samples[s.name].append((dict(s.labels), float(s.value)))
            self.scrapes.append((time.monotonic() - self.started, dict(samples)))

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)


# ------------------------------------------------------------------ PromQL, evaluated locally


def _groups(samples: list[Sample], series: Series, name_by: tuple[str, ...]) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = defaultdict(float)
    for labels, value in samples:
        if all(_matches(labels.get(k, ""), v) for k, v in series.match):
            out[tuple(labels.get(k, "") for k in name_by)] += value
    return out


def _matches(value: str, pattern: str) -> bool:
    return value in pattern.split("|")


def _before(scrapes: list[Scrape], index: int) -> Scrape | None:
    t = scrapes[index][0]
    for j in range(index - 1, -1, -1):
        if t - scrapes[j][0] >= WINDOW_S:
            return scrapes[j]
    return None


def evaluate(series: Series, scrapes: list[Scrape]) -> dict[tuple[str, ...], list[tuple[float, float]]]:
    """The series over time, one line per group of `series.by`."""
    lines: dict[tuple[str, ...], list[tuple[float, float]]] = defaultdict(list)
    for i, (t, samples) in enumerate(scrapes):
        if series.kind == "gauge":
            for key, value in _groups(samples.get(series.metric, []), series, series.by).items():
                lines[key].append((t, value))
            continue
        then = _before(scrapes, i)
        if then is None:
            continue
        dt = t - then[0]
        if series.kind == "rate":
            now_g = _groups(samples.get(series.metric, []), series, series.by)
            then_g = _groups(then[1].get(series.metric, []), series, series.by)
            for key, value in now_g.items():
                lines[key].append((t, max(0.0, value - then_g.get(key, 0.0)) / dt))
            continue
        name = series.metric + "_bucket"
        by = (*series.by, "le")
        now_g = _groups(samples.get(name, []), series, by)
        then_g = _groups(then[1].get(name, []), series, by)
        per_group: dict[tuple[str, ...], list[tuple[float, float]]] = defaultdict(list)
        for key, value in now_g.items():
            per_group[key[:-1]].append((float(key[-1]), value - then_g.get(key, 0.0)))
        for key, buckets in per_group.items():
            q = _quantile(series.q, sorted(buckets))
            if not math.isnan(q):
                lines[key].append((t, q))
    return lines


def _quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """histogram_quantile: cumulative (le, count) pairs, linear inside the bucket."""
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower
            return lower + (le - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = le, count
    return lower


def _legend(series: Series, key: tuple[str, ...]) -> str:
    text = series.legend
    for name, value in zip(series.by, key, strict=False):
        text = text.replace("{{" + name + "}}", value)
    return text


def render(scrapes: list[Scrape], out: Path, title: str) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = math.ceil(len(PANELS) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 5.2, rows * 3.0), squeeze=False)
    drawn = 0
    for ax, panel in zip(axes.flat, PANELS, strict=False):
        drawn += _panel(ax, panel, scrapes)
    for ax in list(axes.flat)[len(PANELS) :]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return drawn


def _panel(ax: Any, panel: Panel, scrapes: list[Scrape]) -> int:
    """Draw a panel's lines; ones that stay 0 are left out (a panel of error rates would list
    every resource at 0), and a panel whose every line is 0 says so. 1 if it had samples."""
    lines = samples = 0
    for series in panel.series:
        for key, points in sorted(evaluate(series, scrapes).items()):
            samples += len(points)
            if not points or not any(y for _, y in points):
                continue
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, label=_legend(series, key)[:40], linewidth=1.2)
            lines += 1
    if samples and not lines:
        ax.plot([scrapes[0][0], scrapes[-1][0]], [0, 0], label="every series 0 in this run", color="grey")
    if not samples:
        ax.text(
            0.5, 0.5, "none in this run", ha="center", va="center", fontsize=8, color="grey", transform=ax.transAxes
        )
    ax.set_title(panel.title, fontsize=9)
    ax.set_xlabel("s", fontsize=7)
    ax.set_ylabel(panel.unit, fontsize=7)
    ax.tick_params(labelsize=7)
    if samples:
        ax.legend(fontsize=6, loc="upper left")
    return 1 if samples else 0


# ------------------------------------------------------------------ the scripted run


def workload(kube: RestKube, name: str, count: int, *, required: str = "topology.phalanx.io/rack") -> None:
    group = {
        "name": "g",
        "minCount": count,
        "topologyRequest": {"required": required},
        "rankedGroups": [{"name": "all", "eqGroups": [{"name": "w", "count": count}]}],
    }
    body = {"apiVersion": "phalanx.io/v1alpha1", "kind": "Workload", "metadata": {"name": name, "namespace": NS}}
    body["spec"] = {"gangGroups": [group]}
    kube.request("POST", f"/apis/phalanx.io/v1alpha1/namespaces/{NS}/workloads", body=body)


def pod(kube: RestKube, name: str, labels: dict[str, str], *, gpus: int = 0, fraction: str = "") -> None:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    meta: dict[str, Any] = {"name": name, "labels": {"bench": "dashboard", **labels}}
    if fraction:
        meta["annotations"] = {"gpu-fraction": fraction}
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": meta}
    body["spec"] = {"containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]}
    kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=body)


def delete(kube: RestKube, selector: str) -> None:
    kube.request(
        "DELETE", f"/api/v1/namespaces/{NS}/pods", query={"labelSelector": selector, "gracePeriodSeconds": "0"}
    )


def script(kube: RestKube, scale: float) -> list[str]:
    """The run: (seconds after start, what happens). Returns what happened, for the report."""
    done = []

    def at(t: float, what: str) -> None:
        time.sleep(max(0.0, t * scale - (time.monotonic() - started)))
        done.append(f"{time.monotonic() - started:5.1f} s  {what}")

    started = time.monotonic()
    at(2, "4 gangs of 16 x 1 GPU, each within one rack")
    for g in range(4):
        workload(kube, f"train-{g}", 16)
        for i in range(16):
            pod(kube, f"train-{g}-{i}", {"phalanx.io/workload": f"train-{g}"}, gpus=1)
    at(10, "60 share pods (half and quarter GPUs)")
    for i in range(60):
        pod(kube, f"share-{i}", {"kind": "share"}, fraction="0.5" if i % 2 else "0.25")
    at(18, "a gang of 10 x 8 GPUs within one rack (80 > 64: cannot fit)")
    workload(kube, "toobig", 10)
    for i in range(10):
        pod(kube, f"toobig-{i}", {"phalanx.io/workload": "toobig"}, gpus=8)
    at(24, "a gang of 8 with 5 members (waiting for quorum)")
    workload(kube, "short", 8)
    for i in range(5):
        pod(kube, f"short-{i}", {"phalanx.io/workload": "short"}, gpus=1)
    at(32, "an invalid ConfigMap update (rejected, the last good configuration stays)")
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "phalanx-config", "namespace": "phalanx-system"},
    }
    cm["data"] = {"config.yaml": yaml.safe_dump({"solver": {"timeLimitSeconds": -5}})}
    kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": "phalanx-system"}})
    kube.request("POST", "/api/v1/namespaces/phalanx-system/configmaps", body=cm)
    at(40, "2 training gangs finish (deleted)")
    delete(kube, "phalanx.io/workload in (train-0,train-1)")
    at(48, "80 more share pods fill the holes")
    for i in range(60, 140):
        pod(kube, f"share-{i}", {"kind": "share"}, fraction="0.25" if i % 3 else "0.5")
    at(58, "the short gang's last 3 members arrive; 2 more 16-member gangs")
    for i in range(5, 8):
        pod(kube, f"short-{i}", {"phalanx.io/workload": "short"}, gpus=1)
    for g in range(4, 6):
        workload(kube, f"train-{g}", 16)
        for i in range(16):
            pod(kube, f"train-{g}-{i}", {"phalanx.io/workload": f"train-{g}"}, gpus=1)
    at(75, "half the share pods end")
    delete(kube, "kind=share")
    at(90, "end")
    return done


def main() -> None:
    ap = parser(__doc__, quick="the same script at half the pace (45 s)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "dashboard.png")
    args = ap.parse_args()

    def install(kube: RestKube) -> None:
        kube.request(
            "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=yaml.safe_load(CRDS.read_text())
        )
        deadline = time.monotonic() + 60
        while kube.request("GET", "/apis/phalanx.io/v1alpha1/workloads").status != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the Workload API is not served")
            time.sleep(0.2)

    with kwok_session("dashboard", 64, before_extender=install) as session:
        session.cluster.restart_scheduler(session.ext_url)
        scraper = Scraper(session.ext_url)
        try:
            happened = script(session.kube, 0.5 if args.quick else 1.0)
        finally:
            scraper.stop()
    title = "Phalanx dashboard (deploy/kubernetes/monitoring) rendered by benchmarks/dashboard.py from a KWOK run"
    drawn = render(scraper.scrapes, args.out, title)
    lines = [
        f"machine: {machine()}",
        f"scrapes: {len(scraper.scrapes)} (1 s apart); panels with data: {drawn}/{len(PANELS)}",
        "the run:",
        *[f"  {h}" for h in happened],
        f"picture: {args.out}",
    ]
    finish(
        "dashboard", args, lines, {"panels": len(PANELS), "panels_with_data": drawn, "scrapes": len(scraper.scrapes)}
    )


if __name__ == "__main__":
    main()
