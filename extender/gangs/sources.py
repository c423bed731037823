"""Where gangs come from: every supported definition, normalized to one `GangSpec`.

A pod joins a gang through one of:
1. Phalanx Workload (`phalanx.io/v1alpha1`): label `phalanx.io/workload=<name>`, optional
   `phalanx.io/gang-group=<group>` (default: the first group) and, with
   `replicaMode: ReplicatedGangs`, `phalanx.io/gang-replica=<i>` (each replica its own gang).
2. Kubernetes `scheduling.k8s.io` PodGroup, `v1beta1` (Kubernetes 1.37) or `v1alpha2` (1.36),
   whichever the API server serves: pod `spec.schedulingGroup.podGroupName`; gang `minCount`
   from `spec.schedulingPolicy.gang` (mutable in v1beta1: a change re-plans the gang), the
   required topology key from `spec.schedulingConstraints.topology[0].key`, and
   `spec.disruptionMode` (`all`: never preempted in part).
3. scheduler-plugins PodGroup (`scheduling.x-k8s.io/v1alpha1`): label
   `scheduling.x-k8s.io/pod-group=<name>`; `spec.minMember`, `spec.scheduleTimeoutSeconds`.
4. Volcano PodGroup (`scheduling.volcano.sh/v1beta1`): pod annotation
   `scheduling.k8s.io/group-name=<name>` (as Volcano's job controller writes it); `spec.minMember`.
5. KAI-Scheduler PodGroup (`scheduling.run.ai/v2alpha2`): pod annotation `pod-group-name=<name>`
   (as KAI's pod grouper writes it); `spec.minMember`, `spec.topologyConstraint`'s
   `requiredTopologyLevel` / `preferredTopologyLevel`.
So users of those schedulers switch without rewriting their workloads. `minResources` and
`queue` are not read (queues are their own issue).
KAI-style pod annotations `kai.scheduler/topology-required-placement` and
`kai.scheduler/topology-preferred-placement` add topology to a gang that has none of its own.

The definitions are kept by `GangObjects` (fed by watches); `resolve()` answers, for a pod,
which gang it belongs to and that gang's spec, or why the definition is not usable yet.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from solver import Slice, TopologyRequest

if TYPE_CHECKING:
    from extender.objects import PodInfo

JSON = dict[str, Any]

WORKLOAD_LABEL = "phalanx.io/workload"
GROUP_LABEL = "phalanx.io/gang-group"
REPLICA_LABEL = "phalanx.io/gang-replica"
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"
KAI_ANNOTATION = "pod-group-name"
KAI_REQUIRED = "kai.scheduler/topology-required-placement"
KAI_PREFERRED = "kai.scheduler/topology-preferred-placement"
INITIALLY_SCHEDULED = "PodGroupInitiallyScheduled"  # scheduling.k8s.io/v1beta1's condition
RANKED_GROUP_LABEL = "phalanx.io/ranked-group"  # a Workload member's ranked group (sub-group)
KAI_SUBGROUP_LABEL = "kai.scheduler/subgroup-name"  # a KAI PodGroup member's leaf sub-group

WORKLOAD = ("phalanx.io", "Workload")
NATIVE_POD_GROUP = ("scheduling.k8s.io", "PodGroup")
COSCHEDULING_POD_GROUP = ("scheduling.x-k8s.io", "PodGroup")
VOLCANO_POD_GROUP = ("scheduling.volcano.sh", "PodGroup")
KAI_POD_GROUP = ("scheduling.run.ai", "PodGroup")
#: Key prefixes of gangs whose definition is one object named like the gang ("<prefix>:ns/name").
DEFINITION_PREFIXES = ("wl", "pg", "cs", "vc", "kai", "ri")

DEFAULT_TIMEOUT_S = 60


@dataclass(frozen=True, slots=True)
class SubGroupSpec:
    """A part of a gang with its own minimum and topology: a Workload's ranked group, a KAI
    PodGroup's leaf sub-group. Placed whole (at least `min_count`) or not at all."""

    name: str
    min_count: int  # 0: all its members
    topology: TopologyRequest


@dataclass(frozen=True, slots=True)
class GangSpec:
    """A gang as Phalanx plans it, whatever defined it."""

    key: str  # from `gang_key`: "wl:<ns>/<workload>/<group>/<replica>", "pg:<ns>/<name>", "cs:<ns>/<name>"
    namespace: str
    source: tuple[str, str]  # (API group, kind) of the defining object
    owner: JSON  # the defining object's reference, for Events and status
    min_count: int
    count: int  # members expected; 0 when the definition does not say (members seen count)
    timeout_s: int
    topology: TopologyRequest
    priority: int = 0
    enabled: bool = True  # gangMode Off: members are scheduled as single pods
    declared: int = 0  # members the definition declares (0: it does not say)
    # scheduling.k8s.io PodGroup `disruptionMode: {all: {}}`: its members are disrupted together
    # or not at all, so preemption never takes some of them.
    disrupt_together: bool = False
    # v1beta1's `PodGroupInitiallyScheduled` is already True: terminal, never written False.
    initially_scheduled: bool = False
    subgroups: tuple[SubGroupSpec, ...] = ()
    min_subgroups: int = 0  # sub-groups that must be placed; 0: all of them
    subgroup_label: str = ""  # the pod label naming a member's sub-group
    default_subgroup: str = ""  # the sub-group of a member without that label ("" for none)

    def subgroup_of(self, labels: Mapping[str, str]) -> str:
        """The sub-group a member with these labels belongs to ("" for none)."""
        if not self.subgroups:
            return ""
        return labels.get(self.subgroup_label, "") or self.default_subgroup


@dataclass(frozen=True, slots=True)
class Resolution:
    """A pod's gang: its key, and the spec or the reason it is not usable yet."""

    key: str
    spec: GangSpec | None
    reason: str = ""


@dataclass
class GangObjects:
    """The defining objects, by (group, kind) and namespace/name."""

    objects: dict[tuple[str, str], dict[str, JSON]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def replace(self, kind: tuple[str, str], items: list[JSON]) -> None:
        with self.lock:
            self.objects[kind] = {_ns_name(o): o for o in items}

    def event(self, kind: tuple[str, str], event: str, obj: JSON) -> None:
        with self.lock:
            bucket = self.objects.setdefault(kind, {})
            if event == "DELETED":
                bucket.pop(_ns_name(obj), None)
            else:
                bucket[_ns_name(obj)] = obj

    def get(self, kind: tuple[str, str], namespace: str, name: str) -> JSON | None:
        with self.lock:
            return self.objects.get(kind, {}).get(f"{namespace}/{name}")


def definition_spec(objects: GangObjects, kind: tuple[str, str], obj: JSON) -> GangSpec | None:
    """The gang a Workload (its first gang group) or a scheduling.k8s.io PodGroup defines, as a
    member would resolve it; None for other kinds or an invalid object."""
    meta = obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    if kind == WORKLOAD:
        return _workload(objects, namespace, {WORKLOAD_LABEL: name}).spec
    if kind == NATIVE_POD_GROUP:
        return _native(objects, namespace, name).spec
    return None


def _ns_name(obj: JSON) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def resolve(
    objects: GangObjects, namespace: str, labels: dict[str, str], annotations: dict[str, str], scheduling_group: str
) -> Resolution | None:
    """The gang of a pod, or None when the pod belongs to no gang. A definition with a field
    that cannot be read (a count that is no integer, a list where an object belongs) is the
    gang's reason to wait, naming the object and the error; never an exception."""
    try:
        if WORKLOAD_LABEL in labels:
            res = _workload(objects, namespace, labels)
        elif scheduling_group:
            res = _native(objects, namespace, scheduling_group)
        elif COSCHEDULING_LABEL in labels:
            res = _min_member(objects, _COSCHEDULING, namespace, labels[COSCHEDULING_LABEL])
        elif annotations.get(VOLCANO_ANNOTATION):
            res = _min_member(objects, _VOLCANO, namespace, annotations[VOLCANO_ANNOTATION])
        elif annotations.get(KAI_ANNOTATION):
            res = _min_member(objects, _KAI, namespace, annotations[KAI_ANNOTATION])
        else:
            return None
    except (ValueError, TypeError, AttributeError, OverflowError) as e:
        key = gang_key(namespace, labels, scheduling_group, annotations)
        return Resolution(key, None, f"invalid gang definition for {key}: {type(e).__name__}: {e}"[:512])
    if res.spec is not None and not res.spec.topology.any:
        kai = kai_topology(annotations)
        if kai.any:
            res = Resolution(res.key, replace(res.spec, topology=kai), res.reason)
    return res


def kai_topology(annotations: dict[str, str]) -> TopologyRequest:
    """Topology from KAI-style pod annotations (for gangs whose definition names none)."""
    return TopologyRequest(required=annotations.get(KAI_REQUIRED, ""), preferred=annotations.get(KAI_PREFERRED, ""))


def stated_topology(members: Iterable[PodInfo]) -> TopologyRequest:
    """A gang's topology from KAI-style annotations: those of the first member (by key) that
    states one, whichever member is being resolved. A CPU-only MPI launcher or Ray head often
    states none while its workers do, and may be seen first: the gang is still one rack."""
    stating = [m for m in members if KAI_REQUIRED in m.annotations or KAI_PREFERRED in m.annotations]
    if not stating:
        return TopologyRequest()
    return kai_topology(min(stating, key=lambda m: m.key).annotations)


def _owner(obj: JSON, api_version: str, kind: str) -> JSON:
    """The reference Events and status writes use; the object's own apiVersion when it says
    (a scheduling.k8s.io PodGroup is v1beta1 on 1.37, v1alpha2 on 1.36)."""
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": str(obj.get("apiVersion") or api_version),
        "kind": kind,
        "metadata": {"name": meta.get("name", ""), "namespace": meta.get("namespace", ""), "uid": meta.get("uid", "")},
    }


def gang_key(
    namespace: str, labels: Mapping[str, str], scheduling_group: str, annotations: Mapping[str, str] | None = None
) -> str:
    """The gang a pod belongs to, from its own fields alone ("" for none): what the manager
    indexes members by before any definition is read."""
    if WORKLOAD_LABEL in labels:
        parts = (namespace, labels[WORKLOAD_LABEL], labels.get(GROUP_LABEL, ""), labels.get(REPLICA_LABEL, ""))
        return "wl:" + "/".join(parts).rstrip("/")
    if scheduling_group:
        return f"pg:{namespace}/{scheduling_group}"
    if COSCHEDULING_LABEL in labels:
        return f"cs:{namespace}/{labels[COSCHEDULING_LABEL]}"
    annotations = annotations or {}
    if annotations.get(VOLCANO_ANNOTATION):
        return f"vc:{namespace}/{annotations[VOLCANO_ANNOTATION]}"
    if annotations.get(KAI_ANNOTATION):
        return f"kai:{namespace}/{annotations[KAI_ANNOTATION]}"
    return ""


def _workload(objects: GangObjects, namespace: str, labels: dict[str, str]) -> Resolution:
    name = labels[WORKLOAD_LABEL]
    obj = objects.get(WORKLOAD, namespace, name)
    group_name = labels.get(GROUP_LABEL, "")
    key = gang_key(namespace, labels, "")
    if obj is None:
        return Resolution(key, None, f"waiting for Workload {namespace}/{name}")
    spec = obj.get("spec") or {}
    groups = spec.get("gangGroups") or []
    group = next((g for g in groups if g.get("name") == group_name), None) if group_name else (groups[:1] or [None])[0]
    if group is None:
        return Resolution(key, None, f"Workload {namespace}/{name} has no gang group {group_name!r}")
    count = _group_count(group)
    min_count = int(group.get("minCount") or count or 1)
    ranked = [
        SubGroupSpec(str(rg["name"]), int(rg.get("minCount") or 0), _topology(rg.get("topologyRequest") or {}))
        for rg in group.get("rankedGroups") or []
        if rg.get("name") and (rg.get("topologyRequest") or rg.get("minCount"))
    ]
    # One ranked group with a constraint: every member is in it, labelled or not.
    single = ranked[0].name if len(group.get("rankedGroups") or []) == 1 and ranked else ""
    return Resolution(
        key,
        GangSpec(
            key=key,
            namespace=namespace,
            source=WORKLOAD,
            owner=_owner(obj, "phalanx.io/v1alpha1", "Workload"),
            min_count=min_count,
            count=max(count, min_count),
            declared=count,
            timeout_s=int(group.get("scheduleTimeoutSeconds") or DEFAULT_TIMEOUT_S),
            topology=_topology(group.get("topologyRequest") or {}),
            priority=int(group.get("priority") or 0),
            enabled=group.get("gangMode", "Gang") != "Off",
            subgroups=tuple(ranked),
            subgroup_label=RANKED_GROUP_LABEL,
            default_subgroup=single,
        ),
    )


def _group_count(group: JSON) -> int:
    """Members a gang group expects: the sum of its eqGroups' counts, capped by maxCount."""
    total = sum(int(eq.get("count") or 0) for rg in group.get("rankedGroups") or [] for eq in rg.get("eqGroups") or [])
    if group.get("maxCount"):
        total = min(total, int(group["maxCount"])) if total else int(group["maxCount"])
    return total


def _topology(req: JSON) -> TopologyRequest:
    slices = tuple(Slice(str(s.get("level", "")), int(s.get("size") or 1)) for s in req.get("slices") or [])
    return TopologyRequest(
        str(req.get("required") or ""), str(req.get("preferred") or ""), slices, balanced=req.get("balanced") is True
    )


def _native(objects: GangObjects, namespace: str, name: str) -> Resolution:
    key = f"pg:{namespace}/{name}"
    obj = objects.get(NATIVE_POD_GROUP, namespace, name)
    if obj is None:
        return Resolution(key, None, f"waiting for PodGroup {namespace}/{name} (scheduling.k8s.io)")
    spec = obj.get("spec") or {}
    gang = (spec.get("schedulingPolicy") or {}).get("gang")
    topology = ((spec.get("schedulingConstraints") or {}).get("topology") or [{}])[0].get("key", "")
    min_count = int((gang or {}).get("minCount") or 1)  # mutable in v1beta1: read on every change
    return Resolution(
        key,
        GangSpec(
            key=key,
            namespace=namespace,
            source=NATIVE_POD_GROUP,
            owner=_owner(obj, "scheduling.k8s.io/v1beta1", "PodGroup"),
            min_count=min_count,
            count=0,
            timeout_s=DEFAULT_TIMEOUT_S,
            topology=TopologyRequest(required=topology),
            priority=int(spec.get("priority") or 0),
            enabled=gang is not None,
            disrupt_together="all" in (spec.get("disruptionMode") or {}),
            initially_scheduled=_initially_scheduled(obj),
        ),
    )


def _initially_scheduled(obj: JSON) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(
        isinstance(c, dict) and c.get("type") == INITIALLY_SCHEDULED and c.get("status") == "True" for c in conditions
    )


def same_definition(kind: tuple[str, str], before: JSON, after: JSON) -> bool:
    """Whether a definition's change leaves everything a gang is read from as it was: only its
    status (of which a scheduling.k8s.io PodGroup's `PodGroupInitiallyScheduled` is read),
    resourceVersion or managedFields moved. Such an event need wake no member: each of
    Phalanx's own status writes on a Workload waiting for quorum woke every member created so
    far (for a 512-pod gang, thousands of writes while its pods were still being created)."""
    if any(before.get(k) != after.get(k) for k in before.keys() | after.keys() if k not in ("metadata", "status")):
        return False
    if kind == NATIVE_POD_GROUP and _initially_scheduled(before) != _initially_scheduled(after):
        return False
    old, new = before.get("metadata") or {}, after.get("metadata") or {}
    volatile = ("resourceVersion", "managedFields")
    return all(old.get(k) == new.get(k) for k in old.keys() | new.keys() if k not in volatile)


@dataclass(frozen=True, slots=True)
class _MinMemberKind:
    """A PodGroup kind of another scheduler that states `spec.minMember` (scheduler-plugins'
    coscheduling, Volcano, KAI): they differ only in their key prefix, API version, and
    whether they state a timeout or topology."""

    prefix: str
    kind: tuple[str, str]
    api_version: str
    timeout: bool = False  # reads spec.scheduleTimeoutSeconds
    kai_topology: bool = False  # reads spec.topologyConstraint's levels


_COSCHEDULING = _MinMemberKind("cs", COSCHEDULING_POD_GROUP, "scheduling.x-k8s.io/v1alpha1", timeout=True)
_VOLCANO = _MinMemberKind("vc", VOLCANO_POD_GROUP, "scheduling.volcano.sh/v1beta1")
_KAI = _MinMemberKind("kai", KAI_POD_GROUP, "scheduling.run.ai/v2alpha2", kai_topology=True)


def _min_member(objects: GangObjects, kind: _MinMemberKind, namespace: str, name: str) -> Resolution:
    key = f"{kind.prefix}:{namespace}/{name}"
    obj = objects.get(kind.kind, namespace, name)
    if obj is None:
        return Resolution(key, None, f"waiting for PodGroup {namespace}/{name} ({kind.kind[0]})")
    spec = obj.get("spec") or {}
    constraint = (spec.get("topologyConstraint") or {}) if kind.kai_topology else {}
    subgroups = _kai_subgroups(spec) if kind.kai_topology else ()
    return Resolution(
        key,
        GangSpec(
            key=key,
            namespace=namespace,
            source=kind.kind,
            owner=_owner(obj, kind.api_version, "PodGroup"),
            min_count=int(spec.get("minMember") or 1),
            count=0,
            timeout_s=int(spec.get("scheduleTimeoutSeconds") or DEFAULT_TIMEOUT_S)
            if kind.timeout
            else DEFAULT_TIMEOUT_S,
            topology=_kai_topology(constraint),
            subgroups=subgroups,
            min_subgroups=int(spec.get("minSubGroup") or 0) if subgroups else 0,
            subgroup_label=KAI_SUBGROUP_LABEL if subgroups else "",
        ),
    )


def _kai_topology(constraint: JSON) -> TopologyRequest:
    return TopologyRequest(
        required=str(constraint.get("requiredTopologyLevel") or ""),
        preferred=str(constraint.get("preferredTopologyLevel") or ""),
    )


def _kai_subgroups(spec: JSON) -> tuple[SubGroupSpec, ...]:
    """KAI's leaf sub-groups (pods name a leaf in `kai.scheduler/subgroup-name`). A parent
    sub-group's own topology is not applied: Phalanx's sub-groups are one level deep."""
    entries = [g for g in spec.get("subGroups") or [] if isinstance(g, dict) and g.get("name")]
    parents = {str(g["parent"]) for g in entries if g.get("parent")}
    return tuple(
        SubGroupSpec(str(g["name"]), int(g.get("minMember") or 0), _kai_topology(g.get("topologyConstraint") or {}))
        for g in entries
        if str(g["name"]) not in parents
    )
