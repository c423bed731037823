"""Node pools (`phalanx.io/node-pools`, extender/node_pools.py): the annotation read into a
pod's placement, the score formula, and the tier rule in gang plans and in filter/prioritize.

Twelve 8-GPU nodes, three racks; two pools by the pool label:

    rack b0-r0:  n0   n1   n2   n3      (no pool)
    rack b0-r1:  n4   n5   n6   n7      n4 n5 n6: pool "slow"
    rack b0-r2:  n8   n9   n10  n11     n8 n9:    pool "fast"
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import orjson
import pytest

from extender.binder import Binder
from extender.cache import Cache
from extender.config import PhalanxConfig, parse
from extender.gangs.manager import GangManager
from extender.gangs.sources import WORKLOAD, GangObjects
from extender.metrics import Metrics
from extender.node_pools import MAX_POOLS, NODE_POOLS_ANNOTATION, POOL_LABEL, preference, read, tier
from extender.objects import DEVICES_ANNOTATION, encode_devices, pod_info
from extender.verbs import Verbs
from solver import DeviceAssignment, NodeName, ScoreBand, SolverParams
from tests.extender.fakes import FakeKube, node, pod

JSON = dict[str, Any]
LEVELS = ("topology.phalanx.io/block", "topology.phalanx.io/rack", "kubernetes.io/hostname")
NAMES = [f"n{i}" for i in range(12)]
POOLS = {"n4": "slow", "n5": "slow", "n6": "slow", "n8": "fast", "n9": "fast"}
FAST, SLOW = ["n8", "n9"], ["n4", "n5", "n6"]
UNPOOLED = ["n0", "n1", "n2", "n3", "n7", "n10", "n11"]
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def nodes(**extra: dict[str, str]) -> list[JSON]:
    out = []
    for i, name in enumerate(NAMES):
        labels = {POOL_LABEL: POOLS[name]} if name in POOLS else {}
        out.append(node(name, rack=f"b0-r{i // 4}", labels={**labels, **extra.get(name, {})}))
    return out


def pooled(name: str, pools: Any, *, gpus: int = 8, gang: str = "", prefer: str = "") -> JSON:
    """A pending pod stating `pools` (JSON-encoded unless a string), in gang `gang` if named,
    preferring node `prefer` (preferred node affinity, weight 100) if named."""
    text = pools if isinstance(pools, str) else json.dumps(pools)
    p = pod(name, gpus=gpus, annotations={NODE_POOLS_ANNOTATION: text} if pools is not None else {})
    if gang:
        p["metadata"]["labels"] = {"phalanx.io/workload": gang}
    if prefer:
        term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [prefer]}]}
        p["spec"]["affinity"] = {"nodeAffinity": {PREFERRED: [{"weight": 100, "preference": term}]}}
    return p


def busy(node_name: str, gpus: int = 8) -> JSON:
    """A running pod holding `gpus` GPUs (the first ones) of `node_name`."""
    record = encode_devices(tuple(DeviceAssignment(i, 1000, 81920) for i in range(gpus)))
    return pod(
        f"busy-{node_name}", gpus=gpus, node_name=node_name, phase="Running", annotations={DEVICES_ANNOTATION: record}
    )


# ---------------------------------------------------------------------------- the annotation


@pytest.mark.parametrize(
    ("case", "text", "want"),
    [
        ("a bare word is a pool name", '["a100"]', [f"{POOL_LABEL}=a100"]),
        ("pool names, most preferred first", '["h100", "a100"]', [f"{POOL_LABEL}=h100", f"{POOL_LABEL}=a100"]),
        ("a selector", '["gpu.vendor in (nvidia)"]', ["gpu.vendor=nvidia"]),
        ("AND, a mismatch, an absence", '["a=b,c=d", "tier!=spot", "!spot"]', ["a=b,c=d", "tier!=spot", "!spot"]),
        ("a prefixed key alone is kubectl's Exists", '["example.com/spot"]', ["example.com/spot"]),
        ("no pools at all", "[]", []),
        ("sixteen pools", json.dumps([f"p{i}" for i in range(MAX_POOLS)]), [f"{POOL_LABEL}=p{i}" for i in range(16)]),
    ],
)
def test_the_annotation_reads_to_selectors(case: str, text: str, want: list[str]) -> None:
    reading = read(text)
    assert reading.error == "", case
    assert [str(s) for s in reading.pools] == want, case


@pytest.mark.parametrize(
    ("case", "text", "reason"),
    [
        ("not JSON", "a100", "not JSON"),
        ("an object", '{"pool": "a100"}', "JSON array of strings"),
        ("a number among the pools", '["a100", 7]', "JSON array of strings"),
        ("a nested list", '[["a100"]]', "JSON array of strings"),
        ("more than 16 pools", json.dumps([f"p{i}" for i in range(MAX_POOLS + 1)]), "17 pools; at most 16"),
        ("an empty entry", '["a100", ""]', "pool 2 (''): empty"),
        ("a selector that does not parse", '["a100", "gpu in (a"]', "pool 2"),
        ("deep nesting", "[" * 5000 + "]" * 5000, "JSON"),
        ("too long", json.dumps(["a" * 60] * 400), "under 16384 bytes"),
        ("not text at all", None, "JSON array"),
    ],
)
def test_a_malformed_annotation_is_no_preference_and_says_why(case: str, text: Any, reason: str) -> None:
    reading = read(text)
    assert reading.pools == (), case
    assert reading.error.startswith(f"{NODE_POOLS_ANNOTATION}: ") and reason in reading.error, case


def test_a_pod_carries_its_pools_in_its_placement_and_a_bad_annotation_as_its_error() -> None:
    """Pools spelt two ways give one placement (so one gang group); a pod without the
    annotation has none; a malformed one is reported, the pod kept without a preference."""
    bare, spelt = pod_info(pooled("a", ["fast"])), pod_info(pooled("b", [f"{POOL_LABEL} in (fast)"]))
    assert bare.placement == spelt.placement and '"nodePools":["phalanx.io/node-pool=fast"]' in bare.placement
    plain = pod_info(pooled("c", None))
    assert (plain.node_pools, plain.node_pools_error, plain.placement) == ((), "", "")
    bad = pod_info(pooled("d", "[fast]"))
    assert bad.node_pools == () and bad.placement == "" and "not JSON" in bad.node_pools_error
    assert bad.error == ""  # not an invalid request: the pod schedules as if it stated no pools


# ---------------------------------------------------------------------------- the score formula


def test_pools_dominate_affinity_orders_within_a_pool_and_unpooled_nodes_score_lowest() -> None:
    """Two pools: w = 100 // 3 = 33. Pool 0 spans 66..98, pool 1 33..65, no pool 0..32; the
    affinity of the best node (100) adds w - 1 = 32."""
    pools = read('["fast", "slow"]').pools
    labelled = [("f0", "fast"), ("f1", "fast"), ("s0", "slow"), ("u0", ""), ("u1", "")]
    found = preference(
        [(NodeName(n), {POOL_LABEL: p} if p else {}) for n, p in labelled],
        pools,
        {NodeName("f1"): 50, NodeName("s0"): 50, NodeName("u0"): 50},
    )
    assert dict(found.scores) == {"f0": 66, "f1": 98, "s0": 65, "u0": 32}  # u1 scores 0: absent, still allowed
    assert found.tiers == (
        ScoreBand(98, 98, rank=0),  # fast's best-affinity nodes
        ScoreBand(66, 98, rank=1),  # fast
        ScoreBand(33, 65, rank=2),  # slow: its one node, no better sub-tier (planned once)
        ScoreBand(33, 65, rank=3),  # slow
        ScoreBand(32, 32, rank=4),  # unpooled, best affinity
        ScoreBand(0, 32, rank=5),  # unpooled
    )


@pytest.mark.parametrize("count", range(1, MAX_POOLS + 1))
def test_every_pool_outscores_the_next_whatever_the_affinity(count: int) -> None:
    pools = read(json.dumps([f"p{i}" for i in range(count)])).pools
    members = [(NodeName(f"{p}-{a}"), {POOL_LABEL: p}) for p in [f"p{i}" for i in range(count)] for a in (0, 1)]
    members += [(NodeName("none-0"), {}), (NodeName("none-1"), {})]
    found = preference(members, pools, {n: 1 for n, _ in members if n.endswith("-1")})
    score = dict(found.scores)
    order = [[score.get(NodeName(f"{p}-{a}"), 0) for a in (0, 1)] for p in [*(f"p{i}" for i in range(count)), "none"]]
    for better, worse in itertools.pairwise(order):
        assert min(better) > max(worse)
        assert better[1] > better[0] and worse[1] > worse[0]  # affinity counts within each
    assert max(score.values()) <= 100


# ---------------------------------------------------------------------------- gangs


def workload(name: str, count: int) -> JSON:
    gang = {
        "name": "workers",
        "minCount": count,
        "rankedGroups": [{"name": "r", "eqGroups": [{"name": "w", "count": count}]}],
    }
    return {"metadata": {"name": name, "namespace": "default", "uid": f"wl-{name}"}, "spec": {"gangGroups": [gang]}}


def gang_nodes(
    count: int, pools: Any, *, full: tuple[str, ...] = (), prefer: str = "", prefers: tuple[str, ...] = ()
) -> list[str]:
    """Where the gang manager plans a `count`-member gang (8 GPUs each) stating `pools`, with
    the nodes `full` taken by running pods; member i prefers `prefers[i]` if given, else
    `prefer` (members that prefer differently are groups of their own)."""
    cache = Cache(LEVELS)
    cache.replace_nodes(nodes())
    for n in full:
        cache.pod_event("ADDED", busy(n))
    objects = GangObjects()
    objects.replace(WORKLOAD, [workload("job", count)])
    mgr = GangManager(cache, objects, SolverParams, lambda *a: None, lambda *a, **k: None, bind_wait_cap_s=5)
    members = [
        pooled(f"p{i}", pools, gang="job", prefer=prefers[i] if i < len(prefers) else prefer) for i in range(count)
    ]
    for p in members:
        cache.pod_event("ADDED", p)
    planned = []
    for p in members:
        answer = mgr.filter(pod_info(p), NAMES)
        assert answer is not None and len(answer.passed) == 1, answer
        planned.append(answer.passed[0])
    return sorted(planned, key=NAMES.index)


@pytest.mark.parametrize(
    ("case", "count", "full", "where"),
    [
        ("the first pool, though other racks hold it as compactly", 2, (), FAST),
        ("the second pool when the first is too small", 3, (), SLOW),
        ("the second pool when the first is taken", 2, ("n9",), SLOW),
        ("nodes in no pool when neither pool holds the gang", 2, ("n4", "n5", "n8"), UNPOOLED),
        ("nodes in no pool when the gang is larger than any pool", 4, (), UNPOOLED),
    ],
)
def test_a_gang_goes_to_the_first_pool_that_holds_it_whole(
    case: str, count: int, full: tuple[str, ...], where: list[str]
) -> None:
    placed = gang_nodes(count, ["fast", "slow"], full=full)
    assert len(placed) == count and set(placed) <= set(where), case


def test_pools_never_hide_capacity_a_gang_may_use() -> None:
    """Twelve members need every node: pools only order them."""
    assert gang_nodes(12, ["fast", "slow"]) == NAMES


@pytest.mark.parametrize("preferred", SLOW)
def test_preferred_affinity_orders_nodes_within_a_pool_never_across_pools(preferred: str) -> None:
    """Asked once for each node of the pool, so a plan that ignores affinity cannot pass."""
    assert gang_nodes(1, ["slow"], prefer=preferred) == [preferred]
    assert gang_nodes(1, ["fast", "slow"], prefer=preferred)[0] in FAST  # the pool order comes first


def test_groups_that_prefer_differently_still_go_whole_to_one_pool() -> None:
    """Two members prefer n4 (their best-affinity tier in the slow pool is n4 alone), the third
    has no preference: the slow pool holds all three, so all three go there, never two in
    the slow pool and one in the fast one because their groups' tiers differ in number."""
    placed = gang_nodes(3, ["slow", "fast"], prefers=("n4", "n4", ""))
    assert set(placed) <= set(SLOW) and "n4" in placed


def test_a_malformed_annotation_leaves_a_gang_without_preference() -> None:
    assert gang_nodes(2, "[fast") == gang_nodes(2, None)


# ---------------------------------------------------------------------------- single pods


def verbs_on(*running: JSON, sample: str = "all", **labels: dict[str, str]) -> Verbs:
    """The verbs over the drawn cluster (no app: filter and prioritize need only the cache)."""
    cache = Cache(LEVELS)
    cache.replace_nodes(nodes(**labels))
    cache.replace_pods(list(running))
    config = parse(f"filter: {{sampleNodes: {sample}}}", source="test") if sample else PhalanxConfig()
    return Verbs(cache, Binder(FakeKube()), config, Metrics())


def offered(verbs: Verbs, obj: JSON, names: list[str] = NAMES) -> list[str]:
    reply = verbs.filter({"Pod": obj, "NodeNames": names})
    assert not reply["FailedAndUnresolvableNodes"]
    out: list[str] = reply["NodeNames"]
    return out


@pytest.mark.parametrize(
    ("case", "full", "want"),
    [
        ("the first pool while it has room", (), FAST),
        ("the second pool once the first is full", ("n8", "n9"), SLOW),
        ("the first pool's node that still has room", ("n8",), ["n9"]),
        ("nodes in no pool once both pools are full", ("n4", "n5", "n6", "n8", "n9"), UNPOOLED),
    ],
)
def test_filter_offers_the_first_pool_with_a_passing_node(case: str, full: tuple[str, ...], want: list[str]) -> None:
    verbs = verbs_on(*(busy(n) for n in full))
    assert offered(verbs, pooled("q", ["fast", "slow"])) == want, case


def test_a_pod_without_gpus_is_cut_to_its_pool_too() -> None:
    assert offered(verbs_on(), pooled("cpu", ["slow"], gpus=0)) == SLOW


def test_sampling_picks_the_best_node_within_the_first_pool() -> None:
    """Half-used n4 (slow) and n9 (fast): without pools Phalanx's pick for a 4-GPU pod is the
    first of them, n4; with pools it is n9, the best node of the first pool."""
    verbs = verbs_on(busy("n4", 4), busy("n9", 4), sample="")
    assert offered(verbs, pooled("plain", None, gpus=4)) == ["n4"]
    assert offered(verbs, pooled("q", ["fast", "slow"], gpus=4)) == ["n9"]


def test_prioritize_agrees_with_filter() -> None:
    """Over every node, the first pool's nodes outscore all others, its best (the half-used
    n9 for a 4-GPU pod) highest."""
    verbs = verbs_on(busy("n4", 4), busy("n9", 4))
    obj = pooled("q", ["fast", "slow"], gpus=4)
    reply = {
        e["Host"]: e["Score"] for e in orjson.loads(orjson.dumps(verbs.prioritize({"Pod": obj, "NodeNames": NAMES})))
    }
    assert set(reply) == set(FAST) and reply["n9"] > reply["n8"] > 0


def test_a_node_labelled_into_a_pool_is_offered_at_once() -> None:
    verbs = verbs_on()
    assert offered(verbs, pooled("q", ["fast"])) == FAST
    relabelled = next(n for n in nodes() if n["metadata"]["name"] == "n0")
    relabelled["metadata"]["labels"][POOL_LABEL] = "fast"
    verbs.cache.node_event("MODIFIED", relabelled)
    assert offered(verbs, pooled("q", ["fast"])) == ["n0", *FAST]


def test_a_malformed_annotation_or_none_leaves_every_node() -> None:
    verbs = verbs_on()
    assert offered(verbs, pooled("q", None)) == NAMES
    assert verbs._pool_tiers._tiers == {}  # a pod without pools never looks at them
    assert offered(verbs, pooled("bad", '["fast", 3]')) == NAMES


def test_the_tier_of_a_node_is_its_first_matching_pool() -> None:
    pools = read('["tier=gold", "gpu=a100", "gpu in (a100, h100)", "gpu"]').pools  # "gpu": a pool name
    assert tier({"gpu": "a100", "tier": "gold"}, pools) == 0
    assert tier({"gpu": "a100"}, pools) == 1
    assert tier({"gpu": "h100"}, pools) == 2
    assert tier({POOL_LABEL: "gpu"}, pools) == 3
    assert tier({"gpu": "b200"}, pools) == 4
