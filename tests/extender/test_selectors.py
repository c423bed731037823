"""Label selectors in kubectl's syntax (extender/selectors.py): what parses, to what canonical
text, what matches, and that hostile text is refused with a reason instead of raising."""

from __future__ import annotations

import pytest

from extender.selectors import MAX_LENGTH, MAX_REQUIREMENTS, MAX_VALUES, SelectorError, parse

LABELS = {"pool": "a100", "tier": "gold", "gpu.vendor": "nvidia", "example.com/spot": "", "cores": "64"}


@pytest.mark.parametrize(
    ("text", "canonical", "matches"),
    [
        ("pool=a100", "pool=a100", True),
        ("pool==a100", "pool=a100", True),
        ("pool!=a100", "pool!=a100", False),
        ("missing!=x", "missing!=x", True),  # a missing label mismatches any value
        ("gpu.vendor in (nvidia)", "gpu.vendor=nvidia", True),
        ("tier in (silver, gold)", "tier in (gold,silver)", True),
        ("tier notin (gold,silver)", "tier notin (gold,silver)", False),
        ("missing notin (x)", "missing!=x", True),
        ("pool=a100,tier=gold", "pool=a100,tier=gold", True),
        ("tier=gold , pool=h100", "pool=h100,tier=gold", False),  # AND, requirements sorted
        ("pool", "pool", True),
        ("!pool", "!pool", False),
        ("!missing", "!missing", True),
        ("example.com/spot", "example.com/spot", True),
        ("example.com/spot=", "example.com/spot=", True),  # an empty value is a value
        ("cores>32", "cores>32", True),
        ("cores<32", "cores<32", False),
        ("tier>1", "tier>1", False),  # a label that is no integer never compares
        ("\tpool = a100\n", "pool=a100", True),
    ],
)
def test_a_selector_parses_to_its_canonical_text_and_matches(text: str, canonical: str, matches: bool) -> None:
    selector = parse(text)
    assert str(selector) == canonical
    assert parse(canonical) == selector  # the canonical text reads back to the same selector
    assert selector.matches(LABELS) is matches


@pytest.mark.parametrize(
    ("case", "text", "reason"),
    [
        ("empty: it would match every node", "", "empty"),
        ("only spaces", "  \t ", "empty"),
        ("a trailing comma", "a=b,", "expected a label key"),
        ("two commas", "a,,b", "is not a label key"),
        ("an empty set", "a in ()", "set of values is empty"),
        ("in without a set", "a in", "needs '('"),
        ("an unclosed set", "a in (b", "found the end"),
        ("a negated key with an operator", "!a=b", "takes no operator"),
        ("a double negation", "!!a", "is not a label key"),
        ("a value where an operator belongs", "a b", "unexpected 'b'"),
        ("a chained equality", "a=b=c", "expected ','"),
        ("a comparison with a word", "a>x", "needs an integer"),
        ("a comparison past int64", "a>99999999999999999999", "needs an integer"),
        ("a key that starts with a dash", "-a=b", "is not a label key"),
        ("an upper-case prefix", "Example.com/a=b", "is not a label key"),
        ("two slashes", "a/b/c=d", "is not a label key"),
        ("a name past 63 characters", "a" * 64, "is not a label key"),
        ("a value past 63 characters", "a=" + "b" * 64, "is not a label value"),
        ("a parenthesis as a value", "a=(b)", "is not a label value"),
        ("a non-ASCII value", "a=é", "is not a label value"),
        ("a NUL byte", "a=b\x00", "is not a label value"),
        ("unicode whitespace is no separator", "a\u2003=b", "is not a label key"),
        ("too long", "a=b," * (MAX_LENGTH // 4 + 1), "longer than"),
        ("too many requirements", ",".join(f"k{i}" for i in range(MAX_REQUIREMENTS + 1)), "requirements"),
        ("too many values", f"a in ({','.join(f'v{i}' for i in range(MAX_VALUES + 1))})", "values"),
        ("deep parentheses", "(" * 500, "is not a label key"),
    ],
)
def test_hostile_or_malformed_text_is_refused_with_a_reason(case: str, text: str, reason: str) -> None:
    with pytest.raises(SelectorError, match=reason.replace("(", r"\(")):
        parse(text)
