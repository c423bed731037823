"""MIG geometry: the shipped tables, violations(), exact capacity() and the placement choice.

Memory slices of one GPU (the profile starts from `nvidia-smi mig -lgipp`):

    slice   0   1   2   3   4   5   6   7
    7g      [==============================]
    4g      [==============]
    3g      [==============][==============]
    2g      [======][======][======]
    1g.2x   [======][======][======][======]        (1g.20gb on A100-80GB / H100)
    1g      [==][==][==][==][==][==][==]            (no 1g instance can start at slice 7)
"""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.mig import (
    BAD_START,
    COMPUTE_OVER,
    COUNT_OVER,
    OVERLAP,
    UNKNOWN_PROFILE,
    DeviceChoice,
    Layout,
    MigCatalog,
    MigDevice,
    MigProfile,
    MigSlot,
    MigTable,
    best_device,
    capacity,
    choose,
    free_starts,
    load_tables,
    violations,
)

CATALOG = load_tables()
TABLES = {t.model: t for t in CATALOG.tables}
A100_40 = TABLES["A100-SXM4-40GB"]
A100 = TABLES["A100-SXM4-80GB"]  # the model the shared examples below use
H100 = TABLES["H100-80GB-HBM3"]
H200 = TABLES["H200-141GB"]


def layout(*slots: str) -> Layout:
    """layout("4g.40gb@0", "1g.10gb@6") -> the MigSlot tuple."""
    return tuple(MigSlot(name, int(start)) for name, start in (s.split("@") for s in slots))


def canonical(slots: Layout) -> Layout:
    return tuple(sorted(slots, key=lambda s: (s.start, s.profile)))


def valid_layouts(table: MigTable) -> set[Layout]:
    """Every valid layout of one model, by adding one valid slot at a time from the empty GPU."""
    seen: set[Layout] = set()
    frontier: list[Layout] = [()]
    while frontier:
        current = frontier.pop()
        if current in seen:
            continue
        seen.add(current)
        for profile in table.profiles:
            for start in profile.starts:
                grown = canonical((*current, MigSlot(profile.name, start)))
                if grown not in seen and not violations(table, grown):
                    frontier.append(grown)
    return seen


LAYOUTS = {model: valid_layouts(table) for model, table in TABLES.items()}


@functools.cache
def brute_capacity(table: MigTable, slots: Layout, profile: str) -> int:
    """Deepest chain of valid single additions of `profile`: the oracle for capacity()."""
    spec = table.profile(profile)
    if spec is None:
        return 0
    best = 0
    for start in spec.starts:
        grown = (*slots, MigSlot(profile, start))
        if not violations(table, grown):
            best = max(best, 1 + brute_capacity(table, canonical(grown), profile))
    return best


def outlook(table: MigTable, slots: Layout) -> tuple[int, ...]:
    return tuple(capacity(table, slots, p.name) for p in table.largest_first)


# --- the shipped tables -------------------------------------------------------------------------

EXPECTED_PROFILES = {
    "A100-SXM4-40GB": {"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"},
    "A100-SXM4-80GB": {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
    "H100-80GB-HBM3": {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
    "H200-141GB": {"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"},
}


@pytest.mark.parametrize("model", sorted(EXPECTED_PROFILES))
def test_each_model_lists_the_guides_profiles(model: str) -> None:
    """Each model carries exactly the profiles of its MIG User Guide table."""
    assert {p.name for p in TABLES[model].profiles} == EXPECTED_PROFILES[model]


@pytest.mark.parametrize("model", sorted(TABLES))
def test_every_placement_fits_the_gpu(model: str) -> None:
    """8 memory slices, 7 compute slices; no start runs past slice 8; memory within the GPU's."""
    table = TABLES[model]
    assert (table.memory_slices, table.compute_slices) == (8, 7)
    for profile in table.profiles:
        assert profile.starts and all(s + profile.memory_slices <= 8 for s in profile.starts)
        assert 1 <= profile.compute_slices <= 7 and 1 <= profile.max_count <= len(profile.starts)
        assert 0 < profile.memory_mib <= table.memory_mib


@pytest.mark.parametrize("model", sorted(TABLES))
def test_geometry_matches_lgipp(model: str) -> None:
    """Placements by (compute, memory) slices are the `nvidia-smi mig -lgipp` ones for every model."""
    starts = {(p.compute_slices, p.memory_slices, p.name.endswith("+me")): p.starts for p in TABLES[model].profiles}
    assert starts == {
        (1, 1, False): (0, 1, 2, 3, 4, 5, 6),
        (1, 1, True): (0, 1, 2, 3, 4, 5, 6),
        (1, 2, False): (0, 2, 4, 6),
        (2, 2, False): (0, 2, 4),
        (3, 4, False): (0, 4),
        (4, 4, False): (0,),
        (7, 8, False): (0,),
    }


@pytest.mark.parametrize(
    ("product", "model"),
    [
        ("NVIDIA-A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("A100-PCIE-40GB", "A100-SXM4-40GB"),
        ("NVIDIA-A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA-A100-80GB-PCIe", "A100-SXM4-80GB"),
        ("a100-80gb", "A100-SXM4-80GB"),
        ("NVIDIA-H100-80GB-HBM3", "H100-80GB-HBM3"),
        ("NVIDIA-H100-PCIe", "H100-80GB-HBM3"),
        ("NVIDIA-H200", "H200-141GB"),
        ("NVIDIA-H200-NVL", "H200-141GB"),
        ("NVIDIA H200", "H200-141GB"),
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "A100-SXM4-40GB"),
        ("NVIDIA-H100-80GB-HBM3-SHARED", "H100-80GB-HBM3"),
    ],
    ids=lambda value: str(value),
)
def test_gpu_product_labels_resolve(product: str, model: str) -> None:
    """GFD product labels, short forms, any case and the MIG/SHARED suffixes find the model."""
    table = CATALOG.table_for(product)
    assert table is not None and table.model == model


@pytest.mark.parametrize("product", ["Tesla-T4", "NVIDIA-H100-NVL", "NVIDIA-L40S", ""])
def test_unknown_products_have_no_table(product: str) -> None:
    """A GPU without a table (not MIG-capable, or another memory size) resolves to None."""
    assert CATALOG.table_for(product) is None


def test_an_alias_under_two_models_is_an_error() -> None:
    """A name that would resolve to two tables is refused when the catalog is built."""
    twin = MigTable("twin", ("A100-80GB",), 8, 7, 1, A100.profiles)
    with pytest.raises(ValueError, match="two MIG tables"):
        MigCatalog((A100, twin))


def test_misspelt_yaml_keys_are_refused(tmp_path: Path) -> None:
    """A typo in the profile file fails the load instead of silently dropping a field."""
    bad = tmp_path / "mig.yaml"
    bad.write_text(
        "models:\n  - {name: X, aliases: [], memorySlices: 8, computeSlice: 7, memoryMiB: 1, profiles: []}\n"
    )
    with pytest.raises(ValueError, match="expected keys"):
        load_tables(bad)


def test_tables_compare_by_value_not_by_memo() -> None:
    """Memo dicts are not part of a table's value: a fresh copy equals the used one."""
    choose(A100, (), "1g.10gb")
    assert MigTable(A100.model, A100.aliases, 8, 7, A100.memory_mib, A100.profiles) == A100


# --- violations ---------------------------------------------------------------------------------

VIOLATION_CASES = [
    ("empty GPU", (), []),
    ("whole GPU as 7g", layout("7g.80gb@0"), []),
    ("4g + 3g (allowed since R510)", layout("4g.40gb@0", "3g.40gb@4"), []),
    ("seven 1g", layout(*(f"1g.10gb@{s}" for s in range(7))), []),
    ("3 x 2g + 1g", layout("2g.20gb@0", "2g.20gb@2", "2g.20gb@4", "1g.10gb@6"), []),
    ("4 x 1g.20gb", layout("1g.20gb@0", "1g.20gb@2", "1g.20gb@4", "1g.20gb@6"), []),
    ("unknown profile", layout("1g.5gb@0"), [UNKNOWN_PROFILE.format(profile="1g.5gb", model="A100-SXM4-80GB")]),
    ("4g off its only placement", layout("4g.40gb@4"), [BAD_START.format(profile="4g.40gb", start=4, starts=[0])]),
    ("1g at slice 7", layout("1g.10gb@7"), [BAD_START.format(profile="1g.10gb", start=7, starts=list(range(7)))]),
    (
        "3g over a 1g",
        layout("3g.40gb@4", "1g.10gb@5"),
        [OVERLAP.format(a="3g.40gb", a_start=4, b="1g.10gb", b_start=5)],
    ),
    (
        "two slices on one start",
        layout("1g.10gb@3", "1g.10gb@3"),
        [OVERLAP.format(a="1g.10gb", a_start=3, b="1g.10gb", b_start=3)],
    ),
    (
        "7g plus anything",
        layout("7g.80gb@0", "1g.10gb@6"),
        [OVERLAP.format(a="7g.80gb", a_start=0, b="1g.10gb", b_start=6), COMPUTE_OVER.format(used=8, total=7)],
    ),
    (
        "two media-extension instances",
        layout("1g.10gb+me@0", "1g.10gb+me@1"),
        [COUNT_OVER.format(count=2, profile="1g.10gb+me", max_count=1)],
    ),
]


@pytest.mark.parametrize(("slots", "expected"), [c[1:] for c in VIOLATION_CASES], ids=[c[0] for c in VIOLATION_CASES])
def test_violations(slots: Layout, expected: list[str]) -> None:
    """violations() names each broken rule with its stable reason string, and nothing for valid layouts."""
    assert violations(A100, slots) == expected


def test_compute_limit_is_checked_on_its_own() -> None:
    """A table whose memory would allow more compute than the GPU has still caps compute slices."""
    wide = MigProfile("2g.wide", compute_slices=2, memory_slices=1, memory_mib=1, starts=tuple(range(8)), max_count=8)
    table = MigTable("toy", (), 8, 7, 8, (wide,))
    slots = tuple(MigSlot("2g.wide", s) for s in range(4))
    assert violations(table, slots) == [COMPUTE_OVER.format(used=8, total=7)]
    assert capacity(table, slots[:3], "2g.wide") == 0 and free_starts(table, slots[:3], "2g.wide") == ()


# --- free_starts and capacity -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slots", "profile", "expected"),
    [
        ((), "4g.40gb", (0,)),
        (layout("1g.10gb@6"), "2g.20gb", (0, 2, 4)),
        (layout("1g.10gb@5"), "2g.20gb", (0, 2)),
        (layout("4g.40gb@0"), "3g.40gb", (4,)),
        (layout("1g.10gb+me@3"), "1g.10gb+me", ()),
        (layout("1g.10gb@0"), "1g.5gb", ()),
    ],
    ids=["empty GPU", "1g@6 leaves every 2g", "1g@5 blocks 2g@4", "4g leaves 3g@4", "+me used up", "unknown profile"],
)
def test_free_starts(slots: Layout, profile: str, expected: tuple[int, ...]) -> None:
    """free_starts() lists the placements still open for one more instance."""
    assert free_starts(A100, slots, profile) == expected


@pytest.mark.parametrize("model", sorted(TABLES))
def test_capacity_equals_brute_force_on_every_valid_layout(model: str) -> None:
    """capacity() is exact: it matches a search over all chains of valid additions."""
    table = TABLES[model]
    for slots in LAYOUTS[model]:
        for profile in table.profiles:
            assert capacity(table, slots, profile.name) == brute_capacity(table, slots, profile.name), (slots, profile)


def test_capacity_of_an_unknown_profile_is_zero() -> None:
    """A profile the model does not have fits zero times (a value, not an error)."""
    assert capacity(A100, (), "1g.5gb") == 0 and choose(A100, (), "1g.5gb") is None


# --- choose -------------------------------------------------------------------------------------


def test_first_1g_goes_to_the_last_slot() -> None:
    """On an empty GPU a 1g slice goes to slice 6: 4g@0 and all three 2g stay placeable."""
    assert choose(A100, (), "1g.10gb") == layout("1g.10gb@6")


def test_first_2g_leaves_the_4g_placement() -> None:
    """A 2g slice goes to slice 4, keeping 4g@0 (and 3g@0)."""
    assert choose(A100, (), "2g.20gb") == layout("2g.20gb@4")


def test_ties_go_to_the_lowest_start() -> None:
    """Tie-breaker: with 4-7 used, every 1g start in 0-3 scores alike and the lowest wins."""
    taken = layout("3g.40gb@4")
    assert len({outlook(A100, (*taken, MigSlot("1g.10gb", s))) for s in range(4)}) == 1
    assert choose(A100, taken, "1g.10gb") == layout("1g.10gb@0")


def test_choose_places_several_slices_at_once() -> None:
    """count > 1 returns that many non-overlapping slots in start order, or None when they do not fit."""
    assert choose(A100, (), "1g.10gb", 3) == layout("1g.10gb@4", "1g.10gb@5", "1g.10gb@6")
    assert choose(A100, (), "3g.40gb", 2) == layout("3g.40gb@0", "3g.40gb@4")
    assert choose(A100, layout("4g.40gb@0"), "3g.40gb", 2) is None


def test_choose_rejects_a_non_positive_count() -> None:
    """count < 1 is a caller bug."""
    with pytest.raises(ValueError, match="count must be positive"):
        choose(A100, (), "1g.10gb", 0)


@pytest.mark.parametrize("model", sorted(TABLES))
def test_choose_is_optimal_for_one_slice_on_every_valid_layout(model: str) -> None:
    """For count=1 choose() reaches the best capacity vector of all valid starts, at the lowest such start."""
    table = TABLES[model]
    for slots in LAYOUTS[model]:
        for profile in table.profiles:
            options = {
                s: outlook(table, canonical((*slots, MigSlot(profile.name, s))))
                for s in profile.starts
                if not violations(table, (*slots, MigSlot(profile.name, s)))
            }
            chosen = choose(table, slots, profile.name)
            if not options:
                assert chosen is None
                continue
            best = max(options.values())
            assert chosen == (MigSlot(profile.name, min(s for s, v in options.items() if v == best)),)


def test_choose_is_optimal_for_two_slices() -> None:
    """For count=2 choose() matches the best capacity vector over every valid pair of starts."""
    table = H100
    for slots in LAYOUTS[table.model]:
        for profile in table.profiles:
            pairs = {
                pair: outlook(table, canonical((*slots, *pair)))
                for pair in itertools.combinations([MigSlot(profile.name, s) for s in profile.starts], 2)
                if not violations(table, (*slots, *pair))
            }
            chosen = choose(table, slots, profile.name, 2)
            assert (chosen is None) == (not pairs)
            if chosen is not None:
                assert outlook(table, canonical((*slots, *chosen))) == max(pairs.values())


Requests = tuple[MigTable, list[tuple[str, int]]]


@st.composite
def requests(draw: st.DrawFn) -> Requests:
    table = draw(st.sampled_from(sorted(TABLES.values(), key=lambda t: t.model)))
    names = [p.name for p in table.profiles]
    steps = draw(st.lists(st.tuples(st.sampled_from(names), st.integers(1, 3)), max_size=12))
    return table, steps


@settings(max_examples=300, deadline=None)
@given(requests())
def test_choose_sequences_stay_valid_and_protect_the_largest_profile(case: Requests) -> None:
    """Any sequence of choose() calls keeps the layout valid; each single slice loses no more
    capacity of the largest still-placeable profile than any other valid start would."""
    table, steps = case
    slots: Layout = ()
    for profile, count in steps:
        fits = capacity(table, slots, profile) >= count
        chosen = choose(table, slots, profile, count)
        assert (chosen is not None) == fits
        if count == 1 and chosen is not None:
            largest = next(p.name for p in table.largest_first if capacity(table, slots, p.name) > 0)
            alternatives = [MigSlot(profile, s) for s in free_starts(table, slots, profile)]
            kept = capacity(table, canonical((*slots, *chosen)), largest)
            assert all(kept >= capacity(table, canonical((*slots, alt)), largest) for alt in alternatives)
        if chosen is not None:
            slots = (*slots, *chosen)
        assert violations(table, slots) == []


# --- best_device --------------------------------------------------------------------------------


def test_best_device_prefers_a_gpu_already_cut() -> None:
    """Tie-breaker 1: a GPU already in MIG use beats an idle one, which keeps its 7g."""
    devices = [MigDevice(A100), MigDevice(A100, layout("3g.40gb@0"))]
    assert best_device(devices, "1g.10gb") == DeviceChoice(1, layout("1g.10gb@6"))


def test_best_device_picks_the_smallest_loss() -> None:
    """Tie-breaker 2: the slice goes where it costs the large profiles least."""
    keeps_4g = MigDevice(A100, layout("1g.10gb@6"))  # a 1g next to it keeps 4g@0
    loses_3g = MigDevice(A100, layout("4g.40gb@0"))  # a 1g here removes the last 3g placement
    assert best_device([loses_3g, keeps_4g], "1g.10gb") == DeviceChoice(1, layout("1g.10gb@4"))


def test_best_device_packs_the_fuller_gpu_on_equal_loss() -> None:
    """Tie-breaker 3: with equal loss, the GPU left with fewer free memory slices wins."""
    roomy = MigDevice(A100, layout("1g.10gb@6"))  # a 1g at slice 4 costs one 2g, one 1g.20gb, one 1g
    full = MigDevice(A100, layout("2g.20gb@0"))  # a 1g at slice 2 (keeping 3g@4) costs the same
    assert best_device([roomy, full], "1g.10gb") == DeviceChoice(1, layout("1g.10gb@2"))


def test_best_device_breaks_full_ties_by_position() -> None:
    """Tie-breaker 4: identical devices go by input order."""
    same = MigDevice(A100, layout("4g.40gb@0"))
    assert best_device([same, same], "2g.20gb") == DeviceChoice(0, layout("2g.20gb@4"))


def test_best_device_skips_full_gpus_and_other_models() -> None:
    """Devices without room, or whose model lacks the profile, are skipped; None if that is all of them."""
    whole = MigDevice(A100, layout("7g.80gb@0"))
    assert best_device([whole, MigDevice(H200), MigDevice(A100_40)], "1g.10gb") == DeviceChoice(2, layout("1g.10gb@6"))
    assert best_device([whole, MigDevice(H200)], "1g.10gb") is None
