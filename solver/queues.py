"""Queues and quotas: resource vectors, the queue tree, limits and fair shares.

A queue has a guaranteed amount per resource (`deserved`), a hard cap (`limit`) and a weight
for idle capacity beyond what it deserves. Queues nest: a parent's usage is its own plus its
children's (`rollup`), and every check walks the chain from the queue up to the top.

Fair shares are computed per resource independently, as KAI-Scheduler's "proportion" plugin
does, not with a dominant-resource rule (DRF). Two reasons: what users configure is a quota per
resource (a queue deserves 64 GPUs and 512 cores), and a DRF share would cut a queue's GPU
share because it also asks for a lot of CPU, which no one who set a GPU quota expects. Per
level, siblings first get what they deserve (capped by their demand and limit; scaled down in
proportion to `deserved` when the parent has less than they deserve together), then what is left
is water-filled by weight, each capped by its demand and limit. Capacity nobody demands stays
unassigned, so a queue's share never exceeds what it could use.

Vectors are plain mappings from resource name to integer amount; see `RESOURCES` for the units
and `usage_of` for how a pod is counted. Every function is pure and deterministic: ties go by
queue name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from solver.device import FULL_SHARE
from solver.model import GpuKind, PodShape

Vector = Mapping[str, int]

# cpu: milli-cores; memory: MiB; gpu: whole devices held by whole-GPU pods; gpuShare: milli-GPU
# of every GPU pod (whole = 1000, a share its milli, a MIG slice its compute fraction);
# gpuMemory: MiB of GPU memory. Per GPU model: "gpu/<model>" and so on.
RESOURCES: tuple[str, ...] = ("cpu", "memory", "gpu", "gpuShare", "gpuMemory")
GPU_RESOURCES: tuple[str, ...] = ("gpu", "gpuShare", "gpuMemory")
DEFAULT_QUEUE = "default"
MIG_COMPUTE_SLICES = 7  # compute slices of every MIG-capable GPU (A100, H100, H200)

LIMIT_EXCEEDED = "queue {queue}: {resource} limit {limit}, in use {used}, {what} needs {need}"
OVER_FAIR_SHARE = (
    "queue {queue}: {resource} fair share {share}, in use {used}, {what} needs {need}, "
    "while queue {waiting} waits below its share"
)
NOT_IDLE = "queue {queue}: {resource} fair share {share}, in use {used}, {what} needs {need}, with only {idle} idle"
NO_SUCH_QUEUE = "queue {queue}: no such queue"

_MIG_NAME = re.compile(r"^(\d+)g\.(\d+)gb")


# ---------------------------------------------------------------------------- vectors


def usage_of(shape: PodShape, *, count: int = 1, model: str = "", device_memory_mib: int = 0) -> dict[str, int]:
    """What `count` pods of `shape` count against their queue; zero entries are left out.
    `model` adds the per-model keys; `device_memory_mib` is a whole GPU's memory (whole-GPU
    pods hold all of it)."""
    gpu = shape.gpu
    out = {"cpu": shape.requests.cpu_milli * count, "memory": shape.requests.memory_mib * count}
    devices = gpu.count * count
    gpu_part: dict[str, int] = {}
    if gpu.kind is GpuKind.WHOLE:
        gpu_part = {"gpu": devices, "gpuShare": FULL_SHARE * devices, "gpuMemory": device_memory_mib * devices}
    elif gpu.kind is GpuKind.SHARE:
        gpu_part = {"gpuShare": gpu.milli * devices, "gpuMemory": gpu.memory_mib * devices}
    elif gpu.kind is GpuKind.MIG:
        compute, memory = mig_amounts(gpu.mig_profile)
        gpu_part = {"gpuShare": compute * devices, "gpuMemory": memory * devices}
    out.update(gpu_part)
    if model:
        out.update({f"{key}/{model}": value for key, value in gpu_part.items()})
    return {k: v for k, v in out.items() if v}


def mig_amounts(profile: str) -> tuple[int, int]:
    """(milli-GPU, MiB) of one MIG slice, read from its name: "3g.40gb" is 3/7 of a GPU and
    40 GiB. The name is what the pod asked for, so the count does not depend on which GPU model
    the slice lands on. An unreadable name counts nothing."""
    m = _MIG_NAME.match(profile)
    if m is None:
        return 0, 0
    return round(int(m.group(1)) * FULL_SHARE / MIG_COMPUTE_SLICES), int(m.group(2)) * 1024


def add(a: Vector, b: Vector) -> dict[str, int]:
    """a + b, zero entries left out."""
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return {k: v for k, v in out.items() if v}


def sub(a: Vector, b: Vector) -> dict[str, int]:
    """a - b, zero entries left out (entries may go negative)."""
    return add(a, {k: -v for k, v in b.items()})


def scale(a: Vector, factor: int) -> dict[str, int]:
    return {k: v * factor for k, v in a.items() if v * factor}


def ordered(keys: Iterable[str]) -> list[str]:
    """Resource names in report order: `RESOURCES` first, then per-model keys sorted."""
    keys = set(keys)
    return [r for r in RESOURCES if r in keys] + sorted(keys - set(RESOURCES))


def format_amount(resource: str, amount: int) -> str:
    """An amount as a user writes it: cpu in cores ("15.5"), memory "64Gi" / "512Mi", gpu a
    count, gpuShare in GPUs ("2.5")."""
    base = resource.split("/", 1)[0]
    if base in ("cpu", "gpuShare"):
        return _decimal(amount, 1000)
    if base in ("memory", "gpuMemory"):
        return f"{amount // 1024}Gi" if amount % 1024 == 0 else f"{amount}Mi"
    return str(amount)


def _decimal(amount: int, unit: int) -> str:
    whole, rest = divmod(abs(amount), unit)
    sign = "-" if amount < 0 else ""
    if rest == 0:
        return f"{sign}{whole}"
    return f"{sign}{whole}." + f"{rest:0{len(str(unit)) - 1}d}".rstrip("0")


# ---------------------------------------------------------------------------- the tree


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """One queue: `deserved` is guaranteed (absent = 0), `limit` caps it (absent = no limit),
    `weight` divides idle capacity beyond what siblings deserve (0: none beyond `deserved`)."""

    name: str
    parent: str = ""  # "": top level
    deserved: Mapping[str, int] = field(default_factory=dict)
    limit: Mapping[str, int] = field(default_factory=dict)
    weight: int = 1


class QueueTree:
    """Queues by name, with parent links made consistent by `build` (no unknown parent, no
    cycle): every lookup is total over `names`."""

    def __init__(self, specs: Mapping[str, QueueSpec]) -> None:
        self._specs = dict(specs)
        self.names: tuple[str, ...] = tuple(sorted(specs))
        kids: dict[str, list[str]] = {}
        for name in self.names:
            kids.setdefault(self._specs[name].parent, []).append(name)
        self._children = {k: tuple(v) for k, v in kids.items()}

    @staticmethod
    def build(specs: Iterable[QueueSpec], *, default: str = DEFAULT_QUEUE) -> tuple[QueueTree, list[str]]:
        """The tree and what is wrong with the specs, each error naming the queue and field.
        Errors are repaired, never fatal: a duplicate keeps the first spec, a negative weight is
        0, an unknown parent or a cycle makes the queue top level. `default` always exists."""
        errors: list[str] = []
        by_name: dict[str, QueueSpec] = {}
        for s in specs:
            if s.name in by_name:
                errors.append(f"queue {s.name}: defined twice; the first definition is used")
                continue
            if s.weight < 0:
                errors.append(f"queue {s.name}: weight {s.weight} is negative; 0 is used")
                s = replace(s, weight=0)
            by_name[s.name] = s
        by_name.setdefault(default, QueueSpec(default))
        _orphans(by_name, errors)
        _cycles(by_name, errors)
        tree = QueueTree(by_name)
        errors.extend(_quota_errors(tree))
        return tree, errors

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def get(self, name: str) -> QueueSpec | None:
        return self._specs.get(name)

    def chain(self, name: str) -> tuple[QueueSpec, ...]:
        """The queue, then its parent, ... up to the top (empty for an unknown queue)."""
        out: list[QueueSpec] = []
        spec = self._specs.get(name)
        while spec is not None:
            out.append(spec)
            spec = self._specs.get(spec.parent) if spec.parent else None
        return tuple(out)

    def children(self, name: str) -> tuple[str, ...]:
        """Child queues by name; "" gives the top-level queues."""
        return self._children.get(name, ())

    def siblings(self, name: str) -> tuple[str, ...]:
        """The queue and its siblings (the children of its parent)."""
        spec = self._specs[name]
        return self.children(spec.parent)


def _orphans(by_name: dict[str, QueueSpec], errors: list[str]) -> None:
    for name in sorted(by_name):
        s = by_name[name]
        if s.parent and s.parent not in by_name:
            errors.append(f"queue {name}: parent {s.parent} is not a queue; treated as top level")
            by_name[name] = replace(s, parent="")


def _cycles(by_name: dict[str, QueueSpec], errors: list[str]) -> None:
    """Every queue on a parent cycle becomes top level, each reported with its cycle."""
    cyclic: list[str] = []
    for name in sorted(by_name):
        path: list[str] = []
        at = name
        while at and at not in path:
            path.append(at)
            at = by_name[at].parent
        if at == name:
            cyclic.append(name)
            errors.append(f"queue {name}: parent chain {' -> '.join([*path, name])} is a cycle; treated as top level")
    for name in cyclic:
        by_name[name] = replace(by_name[name], parent="")


def _quota_errors(tree: QueueTree) -> list[str]:
    errors = []
    for name in tree.names:
        s = _spec(tree, name)
        for r in ordered(s.deserved):
            if r in s.limit and s.deserved[r] > s.limit[r]:
                d, lim = format_amount(r, s.deserved[r]), format_amount(r, s.limit[r])
                errors.append(f"queue {name}: deserved {r} {d} is above its limit {lim}")
        kids = [_spec(tree, k) for k in tree.children(name)]
        for r in ordered({r for k in kids for r in k.deserved}):
            total = sum(k.deserved.get(r, 0) for k in kids)
            if total > s.deserved.get(r, 0):
                t, own = format_amount(r, total), format_amount(r, s.deserved.get(r, 0))
                errors.append(f"queue {name}: its children deserve {r} {t} together, above its own deserved {own}")
    return errors


def rollup(tree: QueueTree, own: Mapping[str, Vector]) -> dict[str, dict[str, int]]:
    """Every queue's own amount plus all its descendants' (usage and demand alike). Amounts
    of names that are not queues are ignored: the caller maps unknown queues to the default."""
    out: dict[str, dict[str, int]] = {name: {} for name in tree.names}
    for name, amount in own.items():
        for spec in tree.chain(name):
            out[spec.name] = add(out[spec.name], amount)
    return out


# ---------------------------------------------------------------------------- limits


def limit_check(tree: QueueTree, used: Mapping[str, Vector], queue: str, need: Vector, *, what: str = "gang") -> str:
    """ "" when `queue` and every ancestor stay within their limits with `need` added to their
    rolled-up `used`; else the first violation (the queue itself first, resources in
    `ordered` order) in `LIMIT_EXCEEDED` wording."""
    chain = tree.chain(queue)
    if not chain:
        return NO_SUCH_QUEUE.format(queue=queue)
    keys = ordered(r for r, v in need.items() if v > 0)
    for spec in chain:
        have = used.get(spec.name, {})
        for r in keys:
            if r in spec.limit and have.get(r, 0) + need[r] > spec.limit[r]:
                return LIMIT_EXCEEDED.format(
                    queue=spec.name,
                    resource=r,
                    limit=format_amount(r, spec.limit[r]),
                    used=format_amount(r, have.get(r, 0)),
                    what=what,
                    need=format_amount(r, need[r]),
                )
    return ""


def limit_excess(tree: QueueTree, used: Mapping[str, Vector], queue: str, need: Vector) -> dict[str, dict[str, int]]:
    """How far `need` would take `queue` and each ancestor past their limits (ROLLED-UP
    `used`): queue -> resource -> amount over; empty when every limit holds. What evicting
    work inside those queues must free before the request fits its quota."""
    out: dict[str, dict[str, int]] = {}
    for spec in tree.chain(queue):
        have = used.get(spec.name, {})
        for r, v in need.items():
            over = have.get(r, 0) + v - spec.limit[r] if v > 0 and r in spec.limit else 0
            if over > 0:
                out.setdefault(spec.name, {})[r] = over
    return out


def borrowed(
    deserved: Vector, units: Sequence[tuple[str, Vector]], *, resources: Iterable[str] | None = None
) -> set[str]:
    """Names of one queue's units that are over its quota. `units` come in keep order
    (highest priority first, then oldest); usage accumulates along them and the first unit
    that takes any compared resource past `deserved` (absent = 0) is borrowed, and so is every
    unit after it. The simple rule on purpose: "later units that still fit stay in quota"
    would let a small late unit shield itself behind a large early one, and the answer would
    change with each unit's size rather than its place in the order.

    `resources`: the resources compared (None: every resource the units use). A caller whose
    quotas name only GPUs passes GPU_RESOURCES, or every pod would be borrowed for its CPU."""
    keep = set(resources) if resources is not None else None
    total: dict[str, int] = {}
    out: set[str] = set()
    for name, amount in units:
        total = add(total, amount)
        over = any(v > deserved.get(r, 0) for r, v in total.items() if keep is None or r in keep)
        if out or over:
            out.add(name)
    return out


# ---------------------------------------------------------------------------- fair share


def fair_shares(tree: QueueTree, capacity: Vector, demand: Mapping[str, Vector]) -> dict[str, dict[str, int]]:
    """Each queue's fair share of each resource in `capacity` (zero entries left out), from
    ROLLED-UP `demand` (allocated + pending). Top-down: a parent's share is what its children
    split, after what its own pods demand (pods placed in a parent queue directly come first)."""
    out: dict[str, dict[str, int]] = {name: {} for name in tree.names}
    for r in ordered(capacity):
        _split(tree, "", capacity[r], r, demand, out)
    return out


def _split(
    tree: QueueTree, parent: str, amount: int, r: str, demand: Mapping[str, Vector], out: dict[str, dict[str, int]]
) -> None:
    kids = tree.children(parent)
    if not kids:
        return
    if parent:
        own = demand.get(parent, {}).get(r, 0) - sum(demand.get(k, {}).get(r, 0) for k in kids)
        amount -= min(max(own, 0), amount)
    want = {k: _want(tree, k, r, demand) for k in kids}
    deserved = {k: _spec(tree, k).deserved.get(r, 0) for k in kids}
    base = water_fill(amount, deserved, {k: min(deserved[k], want[k]) for k in kids})
    rest = amount - sum(base.values())
    weights = {k: _spec(tree, k).weight for k in kids}
    extra = water_fill(rest, weights, {k: want[k] - base[k] for k in kids})
    for k in kids:
        share = base[k] + extra[k]
        if share:
            out[k][r] = share
        _split(tree, k, share, r, demand, out)


def _spec(tree: QueueTree, name: str) -> QueueSpec:
    spec = tree.get(name)
    assert spec is not None, name  # names come from the tree itself
    return spec


def _want(tree: QueueTree, name: str, r: str, demand: Mapping[str, Vector]) -> int:
    """What a queue could use of `r`: its demand, capped by its limit."""
    spec = _spec(tree, name)
    wanted = max(0, demand.get(name, {}).get(r, 0))
    return min(wanted, spec.limit[r]) if r in spec.limit else wanted


def water_fill(amount: int, weights: Mapping[str, int], caps: Mapping[str, int]) -> dict[str, int]:
    """Split `amount` in proportion to `weights`, nobody above its cap; what a capped one
    cannot take goes to the others. Integer: floors first, then the units left one each by
    largest remainder, ties by name. Zero weights get nothing; what nobody can take is kept."""
    got = {k: 0 for k in weights}
    active = sorted(k for k in weights if weights[k] > 0 and caps.get(k, 0) > 0)
    while amount > 0 and active:
        total = sum(weights[k] for k in active)
        full = [k for k in active if (caps[k] - got[k]) * total <= amount * weights[k]]
        if full:
            for k in full:
                amount -= caps[k] - got[k]
                got[k] = caps[k]
            active = [k for k in active if k not in full]
            continue
        floors = {k: amount * weights[k] // total for k in active}
        left = amount - sum(floors.values())
        by_remainder = sorted(active, key=lambda k: (-(amount * weights[k] % total), k))
        for k in active:
            got[k] += floors[k] + (1 if k in by_remainder[:left] else 0)
        amount = 0
    return got


def fair_share_check(
    tree: QueueTree,
    *,
    capacity: Vector,
    used: Mapping[str, Vector],
    demand: Mapping[str, Vector],
    shares: Mapping[str, Vector],
    queue: str,
    need: Vector,
    what: str = "gang",
) -> str:
    """The gate for idle capacity: "" when `queue` may take `need`, else why not. `used` and
    `demand` are ROLLED-UP, `shares` from `fair_shares`.

    At each level of the queue's chain (the queue among its siblings, then its parent among
    its siblings, ...) and for each resource the request needs, one of two must hold:
    - within entitlement: used + need <= max(deserved, fair share);
    - only idle capacity nobody else waits for: idle - need >= the sum over the other
      siblings of their unmet share, max(0, min(share, demand) - used);
    - or the queue is the least served of the siblings that wait (used / entitlement lowest,
      ties by name) and the idle capacity holds the request.
    The last two keep capacity from idling when gang sizes do not divide the shares. The
    second alone does not always: queues A and B at 24 of a 32-GPU share each, with gangs of
    12 on 64 GPUs, would each wait for the other's unmet 8 with 16 GPUs idle; the third lets
    A (the name breaks the tie) go to 36, and B's next gang then waits for capacity (or
    reclaims what A borrowed, if B is below its deserved quota).

    Idle at the top level is the capacity minus every top-level queue's use. Below, it is what
    the parent may still take: its entitlement minus its use, or the cluster's idle capacity if
    that is larger (a parent let past its entitlement by the second rule passes that on)."""
    chain = tree.chain(queue)
    if not chain:
        return NO_SUCH_QUEUE.format(queue=queue)
    keys = ordered(r for r, v in need.items() if v > 0)
    view = _ShareView(tree, capacity, used, demand, shares)
    for spec in chain:
        for r in keys:
            why = view.refusal(spec.name, r, need[r], what)
            if why:
                return why
    return ""


@dataclass(frozen=True, slots=True)
class _ShareView:
    """The numbers one fair-share check reads, per queue and resource."""

    tree: QueueTree
    capacity: Vector
    used: Mapping[str, Vector]
    demand: Mapping[str, Vector]
    shares: Mapping[str, Vector]

    def amount(self, of: Mapping[str, Vector], name: str, r: str) -> int:
        return of.get(name, {}).get(r, 0)

    def entitled(self, name: str, r: str) -> int:
        return max(_spec(self.tree, name).deserved.get(r, 0), self.amount(self.shares, name, r))

    def unmet(self, name: str, r: str) -> int:
        share = min(self.amount(self.shares, name, r), self.amount(self.demand, name, r))
        return max(0, share - self.amount(self.used, name, r))

    def idle(self, name: str, r: str) -> int:
        """What `name` and its siblings could still take: the cluster's idle capacity, and no
        more than any ancestor's limit leaves. Whether the parent may grow past its own share
        is the parent's question, asked at its own level of the chain."""
        idle = self.capacity.get(r, 0) - sum(self.amount(self.used, t, r) for t in self.tree.children(""))
        for spec in self.tree.chain(name)[1:]:
            if r in spec.limit:
                idle = min(idle, spec.limit[r] - self.amount(self.used, spec.name, r))
        return idle

    def least_served(self, name: str, r: str, others: Mapping[str, int]) -> bool:
        """No waiting sibling holds a smaller part of its entitlement (ties by name)."""
        mine = (self.amount(self.used, name, r), max(1, self.entitled(name, r)))
        for s in others:
            theirs = (self.amount(self.used, s, r), max(1, self.entitled(s, r)))
            if theirs[0] * mine[1] < mine[0] * theirs[1] or (theirs[0] * mine[1] == mine[0] * theirs[1] and s < name):
                return False
        return True

    def refusal(self, name: str, r: str, need: int, what: str) -> str:
        have = self.amount(self.used, name, r)
        if have + need <= self.entitled(name, r):
            return ""
        others = {s: u for s in self.tree.siblings(name) if s != name and (u := self.unmet(s, r)) > 0}
        idle = self.idle(name, r)
        if idle - need >= sum(others.values()) or (idle >= need and self.least_served(name, r, others)):
            return ""
        fields = {
            "queue": name,
            "resource": r,
            "share": format_amount(r, self.entitled(name, r)),
            "used": format_amount(r, have),
            "what": what,
            "need": format_amount(r, need),
        }
        if others:
            waiting = min(others, key=lambda s: (-others[s], s))
            return OVER_FAIR_SHARE.format(waiting=waiting, **fields)
        return NOT_IDLE.format(idle=format_amount(r, max(0, idle)), **fields)
