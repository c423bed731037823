"""MIG geometry on one GPU: which slices a layout holds, how many more fit, and where to cut them.

Interval model. A MIG-capable GPU (A100, H100, H200) has 8 memory slices and 7 compute slices. A
GPU instance of a profile occupies the memory-slice interval [start, start + memory_slices) and
`compute_slices` of the 7, and `start` must be one of the profile's placements (`nvidia-smi mig
-lgipp`). A layout -- the instances cut on one GPU, a tuple of `MigSlot` -- is valid when its
intervals do not overlap, its compute slices sum to at most the GPU's, and no profile exceeds its
instance count (which binds beyond the placements only for the single `+me` instance).

Why placement matters. Placements are aligned: 7g only at 0 (all 8 slices), 4g only at 0, 3g at 0
or 4, 2g at 0/2/4, 1g anywhere in 0..6. A 1g slice cut at slice 0 removes the only 4g placement;
cut at slice 6 it still leaves 4g@0 + 2g@4. Where a slice lands therefore decides which large
profiles the GPU can still host, so `choose` picks starts that keep them placeable: among every
valid way to add the slices it maximises, lexicographically, the vector of `capacity(after, p)`
over the table's profiles from largest to smallest (memory slices, then compute slices, then
name), and breaks ties by the lowest starts. `best_device` applies the same measure across GPUs.

Sources: the profile tables in config/mig-profiles.yaml come from the NVIDIA MIG User Guide
("Supported MIG Profiles" tables and the `nvidia-smi mig -lgipp` placements) and from
gpu-feature-discovery labels seen on real nodes; that file's header cites each figure.

Speed: `capacity` and `choose` run in the solver's inner loops, so each `MigTable` carries memo
dicts keyed by (layout, profile[, count]). Layouts are tiny (at most 7 slots), so the caches stay
small; they are cleared past `_MEMO_LIMIT` entries as a guard against callers that permute slots.
The memo is not part of a table's value: equality and hashing ignore it.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "config" / "mig-profiles.yaml"

# Reasons returned by violations(); stable wording, tests assert on them.
UNKNOWN_PROFILE = "unknown profile {profile} for {model}"
BAD_START = "{profile} cannot start at memory slice {start} (valid starts: {starts})"
OVERLAP = "{a}@{a_start} and {b}@{b_start} overlap in memory slices"
COMPUTE_OVER = "{used} compute slices exceed the GPU's {total}"
COUNT_OVER = "{count} x {profile} exceeds its maximum of {max_count}"

_MEMO_LIMIT = 1 << 16  # entries per memo dict; valid layouts number in the hundreds per model

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile, named as in the resource `nvidia.com/mig-<name>`."""

    name: str
    compute_slices: int
    memory_slices: int
    memory_mib: int
    starts: tuple[int, ...]  # valid first memory slices, ascending
    max_count: int

    def __post_init__(self) -> None:
        # capacity() packs greedily in start order, which is optimal only over ascending starts.
        object.__setattr__(self, "starts", tuple(sorted(set(self.starts))))

    def mask(self, start: int) -> int:
        """Memory slices [start, start + memory_slices) as a bit mask."""
        return ((1 << self.memory_slices) - 1) << start


@dataclass(frozen=True, slots=True)
class MigSlot:
    """One GPU instance cut on a GPU: its profile name and first memory slice."""

    profile: str
    start: int


Layout = tuple[MigSlot, ...]


@dataclass(frozen=True, slots=True)
class _Usage:
    occupied: int  # bit mask of memory slices in use
    compute: int
    counts: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class MigTable:
    """The MIG profiles of one GPU model."""

    model: str
    aliases: tuple[str, ...]
    memory_slices: int
    compute_slices: int
    memory_mib: int
    profiles: tuple[MigProfile, ...]
    largest_first: tuple[MigProfile, ...] = field(init=False, repr=False, compare=False)
    _by_name: dict[str, MigProfile] = field(init=False, repr=False, compare=False)
    _usages: dict[Layout, _Usage] = field(init=False, repr=False, compare=False)
    _capacities: dict[tuple[Layout, str], int] = field(init=False, repr=False, compare=False)
    _choices: dict[tuple[Layout, str, int], Layout | None] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ranked = sorted(self.profiles, key=lambda p: (-p.memory_slices, -p.compute_slices, p.name))
        object.__setattr__(self, "largest_first", tuple(ranked))
        object.__setattr__(self, "_by_name", {p.name: p for p in self.profiles})
        for memo in ("_usages", "_capacities", "_choices"):
            object.__setattr__(self, memo, {})

    def profile(self, name: str) -> MigProfile | None:
        return self._by_name.get(name)


@dataclass(frozen=True, slots=True)
class MigCatalog:
    """All known GPU models; `table_for` resolves a `nvidia.com/gpu.product` value."""

    tables: tuple[MigTable, ...]
    _index: dict[str, MigTable] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index: dict[str, MigTable] = {}
        for table in self.tables:
            for name in (table.model, *table.aliases):
                key = _product_key(name)
                if index.get(key, table) is not table:
                    raise ValueError(f"GPU model name {name!r} is listed under two MIG tables")
                index[key] = table
        object.__setattr__(self, "_index", index)

    def table_for(self, model: str) -> MigTable | None:
        return self._index.get(_product_key(model))


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One GPU as `best_device` sees it: its model's table and the slices already cut on it."""

    table: MigTable
    layout: Layout = ()


@dataclass(frozen=True, slots=True)
class DeviceChoice:
    """Where `best_device` puts the new slices: the device's position in its input and the slots."""

    index: int
    slots: Layout


def _product_key(name: str) -> str:
    """Case-insensitive key that also drops GFD's single-strategy "-MIG-<profile>" and "-SHARED" suffixes."""
    key = name.strip().upper().replace(" ", "-").replace("_", "-")
    key = key.split("-MIG-", 1)[0]
    return key.removesuffix("-SHARED")


def _remember(memo: dict[K, V], key: K, value: V) -> V:
    if len(memo) >= _MEMO_LIMIT:
        memo.clear()
    memo[key] = value
    return value


def _usage(table: MigTable, layout: Layout) -> _Usage:
    """Memory, compute and counts in use; slots of unknown profiles are left out (see violations())."""
    usage = table._usages.get(layout)
    if usage is not None:
        return usage
    occupied = compute = 0
    counts: Counter[str] = Counter()
    for slot in layout:
        profile = table.profile(slot.profile)
        if profile is not None:
            occupied |= profile.mask(slot.start)
            compute += profile.compute_slices
            counts[profile.name] += 1
    return _remember(table._usages, layout, _Usage(occupied, compute, counts))


def _room(table: MigTable, usage: _Usage, profile: MigProfile) -> int:
    """How many more instances of `profile` the compute slices and its instance count allow."""
    by_compute = (table.compute_slices - usage.compute) // profile.compute_slices
    return min(by_compute, profile.max_count - usage.counts.get(profile.name, 0))


def violations(table: MigTable, layout: Layout) -> list[str]:
    """Everything that makes `layout` impossible on a GPU of this model; empty when it is valid."""
    found: list[str] = []
    placed: list[tuple[MigSlot, MigProfile]] = []
    for slot in layout:
        profile = table.profile(slot.profile)
        if profile is None:
            found.append(UNKNOWN_PROFILE.format(profile=slot.profile, model=table.model))
            continue
        if slot.start not in profile.starts:
            found.append(BAD_START.format(profile=profile.name, start=slot.start, starts=list(profile.starts)))
        placed.append((slot, profile))
    for (a, pa), (b, pb) in itertools.combinations(placed, 2):
        if a.start < b.start + pb.memory_slices and b.start < a.start + pa.memory_slices:
            found.append(OVERLAP.format(a=a.profile, a_start=a.start, b=b.profile, b_start=b.start))
    used = sum(profile.compute_slices for _, profile in placed)
    if used > table.compute_slices:
        found.append(COMPUTE_OVER.format(used=used, total=table.compute_slices))
    counts = Counter(profile.name for _, profile in placed)
    for name in sorted(counts):
        if counts[name] > table._by_name[name].max_count:
            found.append(COUNT_OVER.format(count=counts[name], profile=name, max_count=table._by_name[name].max_count))
    return found


def free_starts(table: MigTable, layout: Layout, profile: str) -> tuple[int, ...]:
    """Starts at which one more `profile` instance fits now; () when compute or its count is exhausted."""
    wanted = table.profile(profile)
    if wanted is None:
        return ()
    usage = _usage(table, layout)
    if _room(table, usage, wanted) <= 0:
        return ()
    return tuple(start for start in wanted.starts if not wanted.mask(start) & usage.occupied)


def capacity(table: MigTable, layout: Layout, profile: str) -> int:
    """Exactly how many more `profile` instances fit on this layout (0 for an unknown profile)."""
    key = (layout, profile)
    cached = table._capacities.get(key)
    if cached is not None:
        return cached
    wanted = table.profile(profile)
    count = 0
    if wanted is not None:
        usage = _usage(table, layout)
        # All candidates have the same length, so taking free starts in ascending order packs the
        # most of them (interval scheduling); compute and the instance count only cap the number.
        taken = usage.occupied
        for start in wanted.starts:
            if not wanted.mask(start) & taken:
                taken |= wanted.mask(start)
                count += 1
        count = max(0, min(count, _room(table, usage, wanted)))
    return _remember(table._capacities, key, count)


def _by_start(layout: Layout) -> Layout:
    """Canonical slot order, so layouts built in different orders share memo entries."""
    return tuple(sorted(layout, key=lambda slot: (slot.start, slot.profile)))


def _outlook(table: MigTable, layout: Layout) -> tuple[int, ...]:
    """Capacity for every profile, largest first: the vector choose() maximises."""
    return tuple(capacity(table, layout, p.name) for p in table.largest_first)


def choose(table: MigTable, layout: Layout, profile: str, count: int = 1) -> Layout | None:
    """The `count` new slots for `profile` that keep large profiles placeable; None if they do not fit.

    Preference: the resulting layout's capacity vector (largest profile first) is lexicographically
    maximal over all valid placements; ties go to the lexicographically lowest starts.
    """
    if count < 1:
        raise ValueError(f"count must be positive, got {count}")
    key = (layout, profile, count)
    if key in table._choices:
        return table._choices[key]
    return _remember(table._choices, key, _choose(table, layout, profile, count))


def _choose(table: MigTable, layout: Layout, profile: str, count: int) -> Layout | None:
    wanted = table.profile(profile)
    if wanted is None or capacity(table, layout, profile) < count:
        return None
    best: Layout | None = None
    best_outlook: tuple[int, ...] = ()
    # combinations() yields ascending start tuples in lexicographic order, so keeping the first
    # maximum is the lowest-starts tie-break.
    for starts in itertools.combinations(free_starts(table, layout, profile), count):
        masks = [wanted.mask(start) for start in starts]
        if sum(masks) != functools.reduce(int.__or__, masks):
            continue  # two of the new slices overlap each other
        slots = tuple(MigSlot(profile, start) for start in starts)
        outlook = _outlook(table, _by_start(layout + slots))
        if best is None or outlook > best_outlook:
            best, best_outlook = slots, outlook
    return best


def best_device(devices: Sequence[MigDevice], profile: str, count: int = 1) -> DeviceChoice | None:
    """The device whose capacity vector loses least by taking `count` slices of `profile`.

    Order: devices that already hold slices before idle ones (an idle GPU keeps its whole-GPU and
    7g capacity); then the smallest loss vector, largest profile first; then the fewest memory
    slices left free (pack tight); then input position. None when no device fits the slices.
    """
    best: tuple[tuple[bool, tuple[int, ...], int, int], DeviceChoice] | None = None
    for index, device in enumerate(devices):
        slots = choose(device.table, device.layout, profile, count)
        if slots is None:
            continue
        after = _by_start(device.layout + slots)
        before_outlook, after_outlook = _outlook(device.table, device.layout), _outlook(device.table, after)
        loss = tuple(b - a for b, a in zip(before_outlook, after_outlook, strict=True))
        free = device.table.memory_slices - _usage(device.table, after).occupied.bit_count()
        rank = (not device.layout, loss, free, index)
        if best is None or rank < best[0]:
            best = (rank, DeviceChoice(index, slots))
    return None if best is None else best[1]


def load_tables(path: Path | str | None = None) -> MigCatalog:
    """Read the MIG profile tables (default: the repository's config/mig-profiles.yaml)."""
    return _load(Path(path or DEFAULT_PATH).resolve())


@functools.cache
def _load(path: Path) -> MigCatalog:
    raw = yaml.safe_load(path.read_text())
    return MigCatalog(tuple(_table(model) for model in _fields(raw, {"models"}, "file")["models"]))


def _fields(raw: Any, keys: set[str], where: str) -> Mapping[str, Any]:
    """A mapping with exactly `keys`; a misspelt or missing key in the YAML is a loud error."""
    if not isinstance(raw, Mapping) or set(raw) != keys:
        got = sorted(raw) if isinstance(raw, Mapping) else type(raw).__name__
        raise ValueError(f"MIG table {where}: expected keys {sorted(keys)}, got {got}")
    return raw


def _table(raw: Any) -> MigTable:
    keys = {"name", "aliases", "memorySlices", "computeSlices", "memoryMiB", "profiles"}
    spec = _fields(raw, keys, "model")
    table = MigTable(
        model=str(spec["name"]),
        aliases=tuple(str(alias) for alias in spec["aliases"]),
        memory_slices=int(spec["memorySlices"]),
        compute_slices=int(spec["computeSlices"]),
        memory_mib=int(spec["memoryMiB"]),
        profiles=tuple(_profile(p, str(spec["name"])) for p in spec["profiles"]),
    )
    for profile in table.profiles:
        if not profile.starts:
            raise ValueError(f"{table.model} {profile.name}: no starts")
        if profile.starts[-1] + profile.memory_slices > table.memory_slices:
            raise ValueError(f"{table.model} {profile.name}: a start runs past {table.memory_slices} memory slices")
        if profile.compute_slices > table.compute_slices or profile.max_count < 1:
            raise ValueError(f"{table.model} {profile.name}: compute slices or maxCount out of range")
    return table


def _profile(raw: Any, model: str) -> MigProfile:
    keys = {"name", "computeSlices", "memorySlices", "memoryMiB", "starts", "maxCount"}
    spec = _fields(raw, keys, f"{model} profile")
    return MigProfile(
        name=str(spec["name"]),
        compute_slices=int(spec["computeSlices"]),
        memory_slices=int(spec["memorySlices"]),
        memory_mib=int(spec["memoryMiB"]),
        starts=tuple(int(start) for start in spec["starts"]),
        max_count=int(spec["maxCount"]),
    )
