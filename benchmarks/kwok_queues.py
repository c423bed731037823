"""Randomized queue trials on KWOK: queues, priorities and gangs through kube-scheduler + Phalanx.

One local control plane with 64 fake 8-GPU nodes (config/cluster.yaml's layout: 8 nodes per
rack, 4 racks per block; rack b1-r3 is MIG and is left out), the Workload and Queue CRDs, three
PriorityClasses and the extender as a subprocess. Each trial owns one rack (64 GPUs) and its own
queues: a parent with a random GPU limit (32..96; above 64 the rack binds) and two or three
children with random deserved quotas (0..32) and weights (1..3). Two batches of random gangs
(1..4 members of 8 or 4 GPUs, random priority and child queue) are submitted, the second once
the first has settled, so later gangs meet a busy rack: fair share, limits, priority preemption
and reclaim all act.

Checked on every poll (every 0.25 s) of a trial's pods and events:
- partial gangs: a gang with some but not all members bound for longer than PARTIAL_GRACE_S
  (members of a gang bind one by one within a second; longer means a broken gang);
- limit violations: any queue (children rolled up into the parent) holding more GPUs than its
  limit, terminating pods included (they hold their devices until gone);
- wasted evictions: a gang Phalanx preempted for (a `GangPreempting` Event on its Workload) that
  was never fully bound by the time its wave settled (a later, higher-priority gang may evict it
  again: that is not waste), and evictions with no such Event at all.
A trial settles when nothing bound, terminating or newly evicted changed for SETTLE_S, or at
TRIAL_DEADLINE_S. Trials run in waves, one per rack (7 at once), everything deleted between
waves.

    python -m benchmarks.kwok_queues [--quick] [--trials N] [--seed N] [--no-record]

Full: 203 trials (29 waves of 7). Quick: 14 trials. The last line is one JSON object: trials,
partial_gangs, limit_violations, wasted_evictions, evictions, preemptions, gangs, gangs_bound.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import yaml

from benchmarks.common import finish, parser
from benchmarks.kwok import NS, ROOT, KwokSession, http_json, kwok_session
from extender.kube import RestKube

QUEUES = "/apis/phalanx.io/v1alpha1/queues"
WORKLOADS = f"/apis/phalanx.io/v1alpha1/namespaces/{NS}/workloads"
PODS = f"/api/v1/namespaces/{NS}/pods"
RACKS = [f"b{b}-r{r}" for b in range(2) for r in range(4) if (b, r) != (1, 3)]  # b1-r3 is MIG
PRIORITIES = {"q-low": 10, "q-mid": 100, "q-high": 1000}
LABEL = "bench"
PARTIAL_GRACE_S = 5.0
SETTLE_S = 4.0
TRIAL_DEADLINE_S = 90.0


@dataclass
class Trial:
    index: int
    rack: str
    limits: dict[str, int]  # queue -> GPU limit (the parent's)
    parent: str
    children: dict[str, int] = field(default_factory=dict)  # child -> deserved GPUs
    gangs: dict[str, tuple[str, int, int, str]] = field(default_factory=dict)  # name -> (queue, members, gpus, class)


@dataclass
class Tally:
    partial: set[str] = field(default_factory=set)
    limit: list[str] = field(default_factory=list)
    wasted: set[str] = field(default_factory=set)
    evicted: set[str] = field(default_factory=set)
    preempted_for: dict[str, float] = field(default_factory=dict)  # gang -> first Preempting event seen
    ever_bound: set[str] = field(default_factory=set)  # gangs seen fully bound at some poll
    gangs_bound: int = 0


def setup(kube: RestKube) -> None:
    for crd in ("phalanx.io_workloads.yaml", "phalanx.io_queues.yaml"):
        body = yaml.safe_load((ROOT / "config/crds" / crd).read_text())
        assert kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=body).status in (
            201,
            409,
        )
    for path in (QUEUES, WORKLOADS):
        _until(lambda path=path: kube.request("GET", path).status == 200, 60)
    for name, value in PRIORITIES.items():
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        kube.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body=body)


def _until(probe: Any, seconds: float) -> None:
    end = time.monotonic() + seconds
    while not probe():
        if time.monotonic() > end:
            raise TimeoutError("condition not reached")
        time.sleep(0.2)


def make_trial(rng: random.Random, index: int, rack: str) -> Trial:
    parent = f"t{index}"
    # A limit above the rack's 64 GPUs leaves capacity as the bound: preemption and reclaim act.
    trial = Trial(index, rack, {parent: rng.choice([32, 48, 64, 96, 96])}, parent)
    for child in ("a", "b", "c")[: rng.choice([2, 3])]:
        trial.children[f"{parent}-{child}"] = rng.choice([0, 8, 16, 24, 32])
    return trial


def create_queues(kube: RestKube, trial: Trial, rng: random.Random) -> None:
    def queue(name: str, spec: dict[str, Any]) -> None:
        body = {
            "apiVersion": "phalanx.io/v1alpha1",
            "kind": "Queue",
            "metadata": {"name": name, "labels": {LABEL: "q"}},
        }
        assert kube.request("POST", QUEUES, body={**body, "spec": spec}).status == 201

    queue(trial.parent, {"limit": {"gpu": trial.limits[trial.parent]}})
    for child, deserved in trial.children.items():
        queue(child, {"parent": trial.parent, "deserved": {"gpu": deserved}, "weight": rng.randint(1, 3)})


def submit(kube: RestKube, trial: Trial, rng: random.Random, batch: int) -> None:
    for g in range(rng.randint(3, 6)):
        name = f"t{trial.index}-g{batch}{g}"
        queue, members = rng.choice(sorted(trial.children)), rng.randint(1, 4)
        gpus, klass = rng.choice([8, 8, 4]), rng.choice(sorted(PRIORITIES))
        trial.gangs[name] = (queue, members, gpus, klass)
        group = {"name": "w", "minCount": members, "scheduleTimeoutSeconds": 60}
        group["rankedGroups"] = [{"name": "r", "eqGroups": [{"name": "w", "count": members}]}]
        body = {
            "apiVersion": "phalanx.io/v1alpha1",
            "kind": "Workload",
            "metadata": {"name": name, "labels": {LABEL: "q"}},
        }
        assert kube.request("POST", WORKLOADS, body={**body, "spec": {"gangGroups": [group]}}).status == 201
        for i in range(members):
            labels = {LABEL: "q", "phalanx.io/workload": name, "phalanx.io/queue": queue, "gang": name}
            container = {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            spec = {"priorityClassName": klass, "nodeSelector": {"topology.phalanx.io/rack": trial.rack}}
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-{i}", "labels": labels}}
            assert kube.request("POST", PODS, body={**pod, "spec": {**spec, "containers": [container]}}).status == 201


def observe(kube: RestKube, trials: list[Trial], tally: Tally, deadline_s: float) -> None:
    """Poll until the wave settles, checking the invariants on every poll."""
    by_gang = {g: t for t in trials for g in t.gangs}
    alive: set[str] = set()
    partial_since: dict[str, float] = {}
    last_change, last_state = time.monotonic(), None
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        pods = kube.request("GET", PODS, query={"labelSelector": f"{LABEL}=q"}).body["items"]
        now = time.monotonic()
        names = {p["metadata"]["name"] for p in pods}
        tally.evicted |= {n for n in alive - names if n.rsplit("-", 1)[0] in by_gang}
        alive = names
        bound = Counter(p["metadata"]["labels"]["gang"] for p in pods if p["spec"].get("nodeName"))
        tally.ever_bound |= {g for g, t in by_gang.items() if bound[g] == t.gangs[g][1]}
        _check_partial(by_gang, bound, partial_since, now, tally)
        _check_limits(trials, pods, tally)
        _note_preemptions(kube, tally, now)
        state = (frozenset(bound.items()), sum(1 for p in pods if p["metadata"].get("deletionTimestamp")))
        if state != last_state:
            last_change, last_state = now, state
        elif now - last_change >= SETTLE_S and not state[1]:
            break
        time.sleep(0.25)


def _fully_bound(kube: RestKube, by_gang: dict[str, Trial]) -> set[str]:
    pods = kube.request("GET", PODS, query={"labelSelector": f"{LABEL}=q"}).body["items"]
    bound = Counter(p["metadata"]["labels"]["gang"] for p in pods if p["spec"].get("nodeName"))
    return {g for g, t in by_gang.items() if bound[g] == t.gangs[g][1]}


def _check_partial(
    by_gang: dict[str, Trial], bound: Counter[str], since: dict[str, float], now: float, tally: Tally
) -> None:
    for gang, trial in by_gang.items():
        members = trial.gangs[gang][1]
        if 0 < bound[gang] < members:
            since.setdefault(gang, now)
            if now - since[gang] > PARTIAL_GRACE_S:
                tally.partial.add(gang)
        else:
            since.pop(gang, None)


def _check_limits(trials: list[Trial], pods: list[dict[str, Any]], tally: Tally) -> None:
    held: Counter[str] = Counter()
    for p in pods:
        if p["spec"].get("nodeName"):
            gpus = int(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
            held[p["metadata"]["labels"]["phalanx.io/queue"]] += gpus
    for t in trials:
        total = sum(held[c] for c in t.children)
        if total > t.limits[t.parent]:
            tally.limit.append(f"{t.parent}: {total} GPUs held, limit {t.limits[t.parent]}")


def _note_preemptions(kube: RestKube, tally: Tally, now: float) -> None:
    events = kube.request("GET", f"/api/v1/namespaces/{NS}/events", query={"fieldSelector": "reason=GangPreempting"})
    for e in events.body.get("items", []):
        tally.preempted_for.setdefault(e["involvedObject"]["name"], now)


def clean(kube: RestKube) -> None:
    kube.request("DELETE", WORKLOADS, query={"labelSelector": f"{LABEL}=q"})
    kube.request("DELETE", PODS, query={"labelSelector": f"{LABEL}=q", "gracePeriodSeconds": "0"})
    _until(lambda: not kube.request("GET", PODS, query={"labelSelector": f"{LABEL}=q"}).body["items"], 120)
    kube.request("DELETE", QUEUES, query={"labelSelector": f"{LABEL}=q"})
    for reason in ("GangPreempting", "Scheduled"):
        kube.request("DELETE", f"/api/v1/namespaces/{NS}/events", query={"fieldSelector": f"reason={reason}"})


def run_wave(session: KwokSession, rng: random.Random, first: int, count: int, tally: Tally) -> list[Trial]:
    kube = session.kube
    trials = [make_trial(rng, first + i, RACKS[i]) for i in range(count)]
    for t in trials:
        create_queues(kube, t, rng)
    # Administrators create queues before teams submit: wait until the extender has seen them.
    wanted = {q for t in trials for q in (t.parent, *t.children)}
    _until(
        lambda: wanted <= {q["name"] for q in http_json("GET", f"{session.ext_url}/api/v1/queues", kube)["queues"]}, 60
    )
    for batch in range(2):
        for t in trials:
            submit(kube, t, rng, batch)
        observe(kube, trials, tally, TRIAL_DEADLINE_S)
    bound = _fully_bound(kube, {g: t for t in trials for g in t.gangs})
    tally.gangs_bound += len(bound)
    # A gang bound between two polls and evicted again at once (a higher-priority gang came)
    # did bind: kube-scheduler's Scheduled events say so for every member.
    events = kube.request("GET", f"/api/v1/namespaces/{NS}/events", query={"fieldSelector": "reason=Scheduled"})
    scheduled = {e["involvedObject"]["name"] for e in events.body.get("items", [])}
    for t in trials:
        for gang, (_, members, _, _) in t.gangs.items():
            if all(f"{gang}-{i}" in scheduled for i in range(members)):
                tally.ever_bound.add(gang)
    for gang in list(tally.preempted_for):  # judged at the end of its wave: it must have bound
        if gang in {g for t in trials for g in t.gangs} and gang not in bound | tally.ever_bound:
            tally.wasted.add(gang)
    clean(kube)
    return trials


def main() -> None:
    ap = parser(__doc__, quick="14 trials (2 waves) instead of 203")
    ap.add_argument("--trials", type=int, default=0, help="trials to run (rounded up to whole waves of 7)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    trials = args.trials or (14 if args.quick else 203)
    rng = random.Random(args.seed)
    tally = Tally()
    gangs = 0
    started = time.monotonic()
    with kwok_session("queues", 64, before_extender=setup) as session:
        session.cluster.restart_scheduler(session.ext_url)
        print(f"  extender log: {session.state / 'extender.log'}", flush=True)
        done = 0
        while done < trials:
            count = min(len(RACKS), trials - done)
            wave = run_wave(session, rng, done, count, tally)
            gangs += sum(len(t.gangs) for t in wave)
            done += count
            print(f"  {done}/{trials} trials, {gangs} gangs, {len(tally.evicted)} evicted, "
                  f"{len(tally.partial)} partial, {len(tally.limit)} over limit", flush=True)  # fmt: skip
    unexplained = len(tally.evicted) and not tally.preempted_for
    lines = [
        f"{trials} trials on 64 KWOK nodes ({len(RACKS)} racks of 8 x 8 GPUs), seed {args.seed}, "
        f"{time.monotonic() - started:.0f} s",
        f"gangs submitted {gangs}, fully bound at settle {tally.gangs_bound}",
        f"pods evicted {len(tally.evicted)}, gangs preempted for {len(tally.preempted_for)}",
        f"partial gangs {len(tally.partial)}, limit violations {len(tally.limit)}, "
        f"wasted evictions {len(tally.wasted) + (1 if unexplained else 0)}",
        *(f"  over limit: {v}" for v in tally.limit[:5]),
        *(f"  partial: {g}" for g in sorted(tally.partial)[:5]),
        *(f"  preempted for, not bound: {g}" for g in sorted(tally.wasted)[:5]),
    ]
    finish(
        "kwok_queues",
        args,
        lines,
        {
            "trials": trials,
            "gangs": gangs,
            "gangs_bound": tally.gangs_bound,
            "evictions": len(tally.evicted),
            "preemptions": len(tally.preempted_for),
            "partial_gangs": len(tally.partial),
            "limit_violations": len(tally.limit),
            "wasted_evictions": len(tally.wasted) + (1 if unexplained else 0),
        },
    )


if __name__ == "__main__":
    main()
