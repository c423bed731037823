"""Node pools: an ordered placement preference a pod states in `phalanx.io/node-pools`.

Contract: the annotation is a JSON array of at most 16 strings, the most preferred pool
first. Each is a node label selector in kubectl's syntax (extender/selectors.py: `pool=a100`,
`gpu.vendor in (nvidia)`, `tier!=spot`, `a=b,c=d` for AND, `!spot`, `example.com/spot`),
except a bare word that could be a label value (`a100`: letters, digits, `-_.`, no operator,
no `/`), which names a pool by the label administrators put on its nodes:
`phalanx.io/node-pool=a100`. A node is in the first pool whose selector matches it; nodes in
none are the last tier. A workload-policy webhook writes the annotation, or users do.

Pools are a preference, never a filter: capacity the pod may use is never hidden, only
ordered. Gangs: pools and preferred node affinity become the solver's node scores and tiers
(`preference`), so the solver plans a gang on the first pool that holds it whole (the nodes
in no pool are the last pool), and only then on every node it may use. Single pods: filter
keeps, of the nodes that pass, those of the first pool any of them is in (`TierMemo.first`);
prioritize agrees.

A malformed annotation (not JSON, not a list of strings, a selector that does not parse, too
many pools) never blocks scheduling: the pod has no pool preference and `PodInfo` carries the
problem for the Event that reports it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

import orjson

from extender.selectors import Op, Requirement, Selector, SelectorError, is_value, parse
from solver import NodeName, ScoreBand

NODE_POOLS_ANNOTATION = "phalanx.io/node-pools"
POOL_LABEL = "phalanx.io/node-pool"  # the label a bare pool name stands for
MAX_POOLS = 16
MAX_ANNOTATION = 16 * 1024  # characters: about 16 selectors of 1,024
MAX_CACHED = 1024  # annotations at most this long are parsed once (many pods share one)
MAX_LISTS = 32  # node-pool lists whose node tiers filter keeps (each up to one entry per node)

NodePools = tuple[Selector, ...]


@dataclass(frozen=True, slots=True)
class Reading:
    """The annotation read: its pools, or () and why it cannot be used."""

    pools: NodePools = ()
    error: str = ""


def read(text: object) -> Reading:
    """The pod's node pools from the annotation's text (never raises)."""
    if isinstance(text, str) and len(text) <= MAX_CACHED:
        return _read_cached(text)
    return _read(text)


@lru_cache(maxsize=512)
def _read_cached(text: str) -> Reading:
    return _read(text)


def _read(text: object) -> Reading:
    try:
        return Reading(_pools(text))
    except SelectorError as e:
        return Reading((), f"{NODE_POOLS_ANNOTATION}: {e}")


def _pools(text: object) -> NodePools:
    if not isinstance(text, str) or len(text) > MAX_ANNOTATION:
        raise SelectorError(f"must be a JSON array of at most {MAX_POOLS} strings, under {MAX_ANNOTATION} bytes")
    try:
        entries = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise SelectorError(f"not JSON: {str(e)[:128]}") from None
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise SelectorError("must be a JSON array of strings (selectors or pool names)")
    if len(entries) > MAX_POOLS:
        raise SelectorError(f"{len(entries)} pools; at most {MAX_POOLS}")
    out = []
    for i, entry in enumerate(entries):
        try:
            out.append(pool_selector(entry))
        except SelectorError as e:
            raise SelectorError(f"pool {i + 1} ({entry[:64]!r}): {e}") from None
    return tuple(out)


def pool_selector(entry: str) -> Selector:
    """One entry: a bare pool name, or a selector in kubectl's syntax."""
    if is_value(entry) and entry:
        return Selector((Requirement(POOL_LABEL, Op.IN, (entry,)),))
    return parse(entry)


def tier(labels: Mapping[str, str], pools: NodePools) -> int:
    """The index of the first pool whose selector the labels match; len(pools) for none."""
    for i, selector in enumerate(pools):
        if selector.matches(labels):
            return i
    return len(pools)


# ------------------------------------------------------------------ gangs


@dataclass(frozen=True, slots=True)
class Preference:
    """Node scores and the tiers a gang is planned on (`solver.EqGroup`)."""

    scores: tuple[tuple[NodeName, int], ...]
    tiers: tuple[ScoreBand, ...]


def preference(
    nodes: Iterable[tuple[NodeName, Mapping[str, str]]], pools: NodePools, affinity: Mapping[NodeName, int]
) -> Preference:
    """Pool order and preferred node affinity as one score per node, pools dominating.

    With P pools each gets a band of width w = 100 // (P + 1). A node in pool k (0 = most
    preferred; k = P for a node in no pool) with affinity a (its preferred-affinity weight
    normalised as kube-scheduler does: the best node 100) scores

        (P - k) * w  +  (w - 1) * a // 100

    so every node of pool k outscores every node of pool k + 1 (the bands [(P-k)w, (P-k)w +
    w - 1] do not overlap), affinity orders nodes within a pool, and nodes in no pool score
    below every pool (0 without affinity: absent from the scores, still allowed). 16 pools
    leave w = 5: five affinity levels per pool.

    Tiers, for the pools that have nodes, in order: the pool's best-affinity nodes (rank 2k;
    the whole pool when its nodes do not differ in affinity), then the whole pool, its nodes
    alone (rank 2k + 1); then the same for the nodes in no pool. Ranks are the same for every
    group of a gang, so the solver plans the whole gang inside one pool at a time (a group
    with no node in a pool keeps to no node there). It ends with every node the gang may use,
    so a gang goes to the first pool that holds it whole, and spans pools only when none does."""
    count = len(pools)
    width = 100 // (count + 1)
    best = max(affinity.values(), default=0)
    scores: list[tuple[NodeName, int]] = []
    spans: dict[int, tuple[int, int]] = {}  # pool index -> (lowest, highest) score of its nodes
    for name, labels in nodes:
        k = tier(labels, pools)
        a = 100 * affinity.get(name, 0) // best if best > 0 else 0
        score = (count - k) * width + (width - 1) * a // 100
        if score > 0:
            scores.append((name, score))
        low, high = spans.get(k, (score, score))
        spans[k] = (min(low, score), max(high, score))
    tiers: list[ScoreBand] = []
    for k in sorted(spans):  # ranks 2k (best affinity) and 2k + 1 (whole pool), alike per gang
        low, high = spans[k]
        floor = (count - k) * width
        top = floor + width - 1
        tiers.append(ScoreBand(high if high > low else floor, top, rank=2 * k))
        tiers.append(ScoreBand(floor, top, rank=2 * k + 1))
    return Preference(tuple(sorted(scores)), tuple(tiers))


# ------------------------------------------------------------------ single pods


class TierMemo:
    """Each node's tier per node-pool list, for filter and prioritize: kept until a node
    object changes (`version`, the cache's nodes_version), so a stream of pods with one list
    costs a dictionary lookup per node. Nodes the cache lacks are in no pool, never kept."""

    def __init__(
        self, labels_of: Callable[[list[str]], list[Mapping[str, str] | None]], version: Callable[[], int]
    ) -> None:
        self._labels_of = labels_of
        self._version = version
        self._seen = -1
        self._tiers: dict[NodePools, dict[str, int]] = {}
        self._lock = threading.Lock()

    def first(self, pools: NodePools, names: list[str]) -> list[str]:
        """Of `names`, those in the first pool any of them is in, in their order."""
        tiers = self.tiers(pools, names)
        top = min(tiers, default=0)
        if top == max(tiers, default=0):
            return names
        return [n for n, t in zip(names, tiers, strict=True) if t == top]

    def tiers(self, pools: NodePools, names: list[str]) -> list[int]:
        version = self._version()
        with self._lock:
            if version != self._seen or (pools not in self._tiers and len(self._tiers) >= MAX_LISTS):
                self._tiers = {}
                self._seen = version
            known = self._tiers.setdefault(pools, {})
            missing = [n for n in names if n not in known]
        if missing:
            found = zip(missing, self._labels_of(missing), strict=True)
            fresh = {n: tier(labels, pools) for n, labels in found if labels is not None}
            with self._lock:
                known.update(fresh)
        none = len(pools)
        return [known.get(n, none) for n in names]
