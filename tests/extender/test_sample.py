"""Filter's sample: the passing nodes cut to what kube-scheduler would score by default, the
ones Phalanx ranks best kept (extender/verbs.py `_sample`, extender/scoring.py)."""

from __future__ import annotations

from typing import Any

import pytest

from extender.app import Extender
from extender.config import parse
from extender.objects import DEVICES_ANNOTATION, encode_devices, scored_preferences
from extender.scoring import best, sample_size
from solver.model import DeviceAssignment
from tests.extender.fakes import extender_on, leader, node, pod, scores

JSON = dict[str, Any]
NODES = [f"n{i:03d}" for i in range(300)]
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


@pytest.mark.parametrize(
    ("nodes", "want"),
    [(0, 0), (99, 99), (100, 100), (200, 100), (1000, 420), (5000, 500), (10_000, 500), (20_000, 1000)],
)
def test_sample_size_is_kube_schedulers_default(nodes: int, want: int) -> None:
    """numFeasibleNodesToFind with percentageOfNodesToScore unset (kube-scheduler v1.37)."""
    assert sample_size(nodes) == want


def test_best_keeps_the_highest_and_the_first_of_equals_in_order() -> None:
    names = ["a", "b", "c", "d", "e"]
    assert best(names, {"d": 3, "b": 1, "e": 1}, 2) == ["b", "d"]  # d, then the first of b and e
    assert best(names, {"e": 2}, 3) == ["a", "b", "e"]  # unscored count as 0
    assert best(names, {}, 9) == names


@pytest.mark.parametrize(
    ("case", "spec", "want"),
    [
        ("nothing stated", {}, False),
        ("required node affinity is a filter, not a score", {"affinity": {"nodeAffinity": {"x": 1}}}, False),
        ("preferred node affinity", {"affinity": {"nodeAffinity": {PREFERRED: [{"weight": 1}]}}}, True),
        ("preferred pod anti-affinity", {"affinity": {"podAntiAffinity": {PREFERRED: [{"weight": 1}]}}}, True),
        ("spread that may be broken", {"topologySpreadConstraints": [{"whenUnsatisfiable": "ScheduleAnyway"}]}, True),
        ("hard spread is a filter", {"topologySpreadConstraints": [{"whenUnsatisfiable": "DoNotSchedule"}]}, False),
        ("malformed fields state nothing", {"affinity": "x", "topologySpreadConstraints": 5}, False),
    ],
)
def test_scored_preferences(case: str, spec: JSON, want: bool) -> None:
    assert scored_preferences(spec) is want, case


@pytest.fixture
def ext() -> Extender:
    """300 idle 2-GPU nodes but n250, whose GPU 1 is half used; a workload of half GPUs."""
    used = encode_devices((DeviceAssignment(1, 500, 0),))
    running = pod("run", annotations={"gpu-fraction": "0.5", DEVICES_ANNOTATION: used}, node_name="n250")
    running["status"]["phase"] = "Running"
    pending = [pod(f"q{i}", annotations={"gpu-fraction": "0.5"}) for i in range(4)]
    extender: Extender = extender_on([node(n, gpus=2) for n in NODES], [running, *pending])
    extender.apply(parse("filter: {sampleNodes: 10}", source="test"))
    return extender


def half(name: str) -> JSON:
    return pod(name, annotations={"gpu-fraction": "0.5"})


def passed(ext: Extender, obj: JSON, names: list[str] = NODES) -> list[str]:
    reply = ext.verbs.filter({"Pod": obj, "NodeNames": names})
    assert not reply["FailedNodes"] and not reply["FailedAndUnresolvableNodes"]
    names_out: list[str] = reply["NodeNames"]
    return names_out


def test_the_node_phalanx_ranks_best_survives_the_cut(ext: Extender) -> None:
    """Without the cut prioritize's leader is n250 (it fills the half-used GPU), 250 names
    into kube-scheduler's list; the sample of 10 keeps it, in the list's order, and
    prioritize over the sample names the same leader."""
    assert leader(scores(ext, half("q0"), NODES)) == "n250"
    sample = passed(ext, half("q0"))
    assert len(sample) == 10 and "n250" in sample
    assert sample == sorted(sample, key=NODES.index)
    assert leader(scores(ext, half("q0"), sample)) == "n250"


def test_pods_phalanx_has_no_opinion_on_get_the_first_in_kube_schedulers_order(ext: Extender) -> None:
    """A small CPU pod changes nothing for the GPU workload: the first nodes as kube-scheduler
    listed them, every time, 100 of them (the fewest kube-scheduler itself scores; its own
    default is 48 % of 300; the fixture's setting of 10 is for GPU pods), for its scores to
    choose among."""
    names = NODES[150:] + NODES[:150]
    assert passed(ext, pod("cpu"), names) == passed(ext, pod("cpu"), names) == names[:100]


def test_below_kube_schedulers_count_the_setting_cuts_gpu_pods_only(ext: Extender) -> None:
    """sampleNodes 1: a GPU pod gets Phalanx's one best node (kube-scheduler then skips
    scoring); a pod without GPUs still gets the 100 nodes auto gives it, for kube-scheduler's
    scores to choose among."""
    ext.apply(parse("filter: {sampleNodes: 1}", source="test"))
    assert passed(ext, half("q0")) == ["n250"]
    assert passed(ext, pod("cpu")) == NODES[:100]


def test_a_pod_with_scored_preferences_keeps_every_node(ext: Extender) -> None:
    obj = half("q0")
    term = {"weight": 10, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}
    obj["spec"]["affinity"] = {"nodeAffinity": {PREFERRED: [term]}}
    assert passed(ext, obj) == NODES


@pytest.mark.parametrize(
    ("setting", "gpu", "cpu"),
    [("all", 300, 300), ("auto", 1, 100), ("1", 1, 100), ("150", 150, 150), ("1000", 300, 300)],
)
def test_the_setting(ext: Extender, setting: str, gpu: int, cpu: int) -> None:
    """auto: a GPU pod gets Phalanx's pick; a pod without GPUs 100 nodes, the fewest
    kube-scheduler scores (its own default is 48 % of 300 nodes). A number N: at most N for a
    GPU pod; a pod without GPUs as auto cuts it, or N when more."""
    ext.apply(parse(f"filter: {{sampleNodes: {setting}}}", source="test"))
    assert len(passed(ext, half("q0"))) == gpu
    assert len(passed(ext, pod("cpu"))) == cpu


def test_by_default_phalanx_picks_a_gpu_pods_node() -> None:
    """No setting: the GPU pod gets the node Phalanx ranks best (n250 fills a half-used GPU)."""
    used = encode_devices((DeviceAssignment(1, 500, 0),))
    running = pod("run", annotations={"gpu-fraction": "0.5", DEVICES_ANNOTATION: used}, node_name="n250")
    running["status"]["phase"] = "Running"
    extender: Extender = extender_on([node(n, gpus=2) for n in NODES], [running, half("q0")])
    assert passed(extender, half("q0")) == ["n250"]


def test_a_pod_that_fits_nowhere_still_hears_why_from_every_node(ext: Extender) -> None:
    reply = ext.verbs.filter({"Pod": pod("big", gpus=4), "NodeNames": NODES})
    assert reply["NodeNames"] == []
    assert set(reply["FailedNodes"]) == set(NODES)


def test_an_invalid_setting_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"filter\.sampleNodes"):
        parse("filter: {sampleNodes: 0}", source="test")


def _half_gpu_shape_memoised() -> tuple[Extender, Any, JSON]:
    """An extender whose half-GPU shape has every node memoised by fragmentation (a half pod
    runs on n250, another is pending): it, that shape's memo, and the running pod."""
    used = encode_devices((DeviceAssignment(1, 500, 0),))
    running = pod("run", annotations={"gpu-fraction": "0.5", DEVICES_ANNOTATION: used}, node_name="n250")
    running["status"]["phase"] = "Running"
    ext: Extender = extender_on([node(n, gpus=2) for n in NODES], [running, half("q0")])
    assert passed(ext, half("q0")) == ["n250"]
    return ext, next(m for m in ext.verbs._memo.values() if m.deltas), running


def _workload_moves_to_whole_gpus() -> tuple[Extender, Any, int]:
    """`_half_gpu_shape_memoised`, then 30 whole-GPU pods running (the target workload moves
    past the drift): the extender, that shape's memo, and the workload's generation before."""
    ext, memo, _ = _half_gpu_shape_memoised()
    before = ext.sharing.workload_generation
    for i in range(30):
        whole = pod(f"w{i}", gpus=1, node_name=NODES[i])
        whole["status"]["phase"] = "Running"
        ext.cache.pod_event("ADDED", whole)
    return ext, memo, before


def test_a_new_target_workload_is_measured_by_the_sweep_not_by_the_next_filter() -> None:
    """The sweep's refresh re-measures every memoised fragmentation delta when the target
    workload moves, off the verbs' path: the next filter finds them measured (and equal to
    what it would have measured itself), instead of measuring its whole node list."""
    ext, memo, before = _workload_moves_to_whole_gpus()
    ext.verbs.refresh_workload()
    generation = ext.sharing.workload_generation
    assert generation != before and memo.workload_generation == generation
    measured = dict(memo.deltas)
    assert len(measured) > 250  # every node it had, but those that moved since
    memo.deltas.clear()
    memo.workload_generation = -1
    ext.verbs._fragmentation_scores(memo, NODES, memo.shape, ext.sharing.workload())  # type: ignore[arg-type]
    assert {n: memo.deltas[n] for n in measured} == measured


def test_a_node_that_moves_while_the_sweep_measures_is_not_installed_stale() -> None:
    """The sweep measures without the memo's lock; a node touched after the measurement, even
    right before the install's own sync, must not keep the delta measured before it moved."""
    ext, memo, _ = _workload_moves_to_whole_gpus()
    original = type(memo).sync
    calls = []

    def touch_then_sync(self: Any, cache: Any) -> None:
        calls.append(1)
        if len(calls) == 2:  # the install: n200 moves just before the memo syncs
            late = pod("late", gpus=2, node_name="n200")
            late["status"]["phase"] = "Running"
            cache.pod_event("ADDED", late)
        original(self, cache)

    memo.sync = touch_then_sync.__get__(memo)  # type: ignore[method-assign]
    ext.verbs.refresh_workload()
    assert len(calls) == 2 and memo.workload_generation == ext.sharing.workload_generation
    del memo.sync
    memo.sync(ext.cache)
    assert "n200" not in memo.deltas  # dropped, to be measured again against the node as it is


def test_the_sweeps_measure_gives_the_gil_up_between_batches_and_drops_what_moved_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The re-measure is a pure-Python pass over every memoised node (20-45 ms at 5,000 nodes):
    between batches it sleeps, so a call waiting for the GIL runs at once instead of after the
    pass. A pod a call binds during a pause moves its node: measured before (an earlier batch)
    or after (a later one), that delta is not installed; every other node's is."""
    import extender.verbs as verbs_module

    ext, memo, _ = _workload_moves_to_whole_gpus()  # the sweep re-measures
    memo.sync(ext.cache)  # as the pass does first: the nodes that moved are dropped
    names = sorted(memo.deltas)
    early, late = names[10], names[-10]  # measured before the first pause, and after it
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 1:  # a call comes in the first pause and binds onto both nodes
            for n, where in enumerate((early, late)):
                moved = pod(f"m{n}", gpus=1, node_name=where)
                moved["status"]["phase"] = "Running"
                ext.cache.pod_event("ADDED", moved)

    monkeypatch.setattr(verbs_module, "REMEASURE_BATCH", 50)
    monkeypatch.setattr(verbs_module.time, "sleep", pause)
    ext.verbs.refresh_workload()
    assert memo.workload_generation == ext.sharing.workload_generation
    assert len(pauses) >= len(names) // 50 - 1 and set(pauses) == {verbs_module.REMEASURE_PAUSE_S}
    assert early not in memo.deltas and late not in memo.deltas  # to be measured as they are now
    assert set(names) - set(memo.deltas) == {early, late}  # every other node measured anew


def _every_pod_leaves() -> tuple[Extender, Any]:
    """`_half_gpu_shape_memoised`, then every pod gone (a job's pods all deleted): the
    extender and that shape's memo."""
    ext, memo, running = _half_gpu_shape_memoised()
    assert not memo.scores  # ranked by deltas so far: no scores kept
    for gone in (running, half("q0")):
        ext.cache.pod_event("DELETED", gone)
    return ext, memo


def test_with_no_workload_left_the_sweep_scores_the_nodes_not_the_next_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pod gone, the target workload is empty and a GPU shape is ranked by how full it
    leaves a node (`node_score`), not by deltas. The sweep's refresh scores the nodes the shape
    knows, off the verbs' path: without it the next filters scored their whole lists, 8-9 ms
    each for ten filters in a row at 5,000 nodes (the paced round's filter p99 of 8.1-8.9 ms in
    a third of kwok_throughput's runs). The scores are what the filter would have computed, and
    a filter that comes while they are measured ranks by the deltas, as before."""
    import extender.verbs as verbs_module
    from extender.memo import ShapeMemo
    from solver import node_score

    ext, memo = _every_pod_leaves()
    scored: list[str] = []
    original = ShapeMemo.score
    monkeypatch.setattr(ShapeMemo, "score", lambda self, node: scored.append(node.name) or original(self, node))
    during: list[list[str]] = []

    def pause(seconds: float) -> None:  # a filter comes while the sweep scores the nodes
        if not during:
            before = len(scored)
            during.append(passed(ext, half("q1")))
            during.append(scored[before:])

    monkeypatch.setattr(verbs_module, "REMEASURE_BATCH", 50)
    monkeypatch.setattr(verbs_module.time, "sleep", pause)
    ext.verbs.refresh_workload()
    assert len(during[0]) == 1 and during[1] == []  # meanwhile ranked by its deltas, as before
    assert ext.sharing.workload() == ()
    assert memo.shape is not None and not memo.by_fragmentation(())
    assert set(memo.scores) == set(NODES) - {"n250"}  # all but the node the pod left
    models = {n: ext.cache.node_model(n) for n in memo.scores}
    assert memo.scores == {n: node_score(m, memo.shape, memo.mode) for n, m in models.items() if m is not None}
    scored.clear()
    assert len(passed(ext, half("q1"))) == 1
    assert scored == ["n250"]  # the filter scored no other node itself


def test_with_no_workload_left_the_catch_up_scores_the_nodes_pods_move_on() -> None:
    """While GPU shapes are ranked by scores, the catch-up keeps them: a node a pod moved on is
    scored again off the verbs' path, as it is now."""
    ext, memo = _every_pod_leaves()
    ext.verbs.refresh_workload()
    ext.verbs.catch_up()
    moved = pod("w", annotations={"gpu-fraction": "0.5"}, node_name=NODES[7])  # not counted in the workload yet
    moved["status"]["phase"] = "Running"
    ext.cache.pod_event("ADDED", moved)
    assert NODES[7] in memo.scores and ext.verbs.catch_up() == 1
    node = ext.cache.node_model(NODES[7])
    assert node is not None and memo.scores[NODES[7]] == memo.score(node) != memo.score(ext.cache.node_model(NODES[8]))
