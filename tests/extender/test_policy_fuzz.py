"""Random policy documents (mostly well-shaped, some garbage) against random submissions: the parser
raises only PolicyError, the evaluator never raises, and every violation names its field and rule."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.policy.evaluate import SUBMISSION, effective_json, evaluate, merge, nest
from extender.policy.spec import Policy, PolicyError, parse_policy
from extender.policy.vocabulary import CHILDREN, FIELDS, RULES_OF, Field, Kind, Rule

NAMES = sorted({name for names in CHILDREN.values() for name in names} | {"instances", "attributes", "exclude"})
RULE_NAMES = sorted({r.value for r in Rule} | {"Step", "defaultFrom", "instances", "attributes"})
KEYS = ["a", "b", "default/cpu", "HOME"]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 10),
    st.integers(),
    st.floats(),
    st.sampled_from(["5M", "1Gi", "500m", "1e3", "a", "b", "", "eight", "portion", "required", *KEYS]),
    st.text(max_size=4),
)
JSONS = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(NAMES) | st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
GOOD = {
    Kind.BOOLEAN: st.booleans(),
    Kind.STRING: st.sampled_from(["a", "b", "portion", "memory", "required", "preferred"]),
    Kind.INTEGER: st.integers(-2, 12),
    Kind.NUMBER: st.integers(0, 8) | st.sampled_from([0.1, 0.3, 0.5, 2.5, 1e-9]),
    Kind.QUANTITY: st.sampled_from(["1", "4M", "5M", "1Gi", "500m", 3, 2.5, "1e3"]),
    Kind.ARRAY: st.lists(st.sampled_from(["a", "b", "c"]), max_size=3),
}


def value_of(field: Field, dirty: bool) -> st.SearchStrategy[Any]:
    """A value of the field's kind; when `dirty`, anything else now and then."""
    if field.kind is Kind.ITEMIZED:
        items = st.lists(item_of(field, dirty), max_size=3)
        return items | JSONS if dirty else items
    return st.one_of(GOOD[field.kind], GOOD[field.kind], JSONS) if dirty else GOOD[field.kind]


def item_of(field: Field, dirty: bool) -> st.SearchStrategy[Any]:
    attributes = {name: value_of(attr, dirty) for name, attr in field.attributes.items() if name != field.key}
    exclude = st.booleans() | JSONS if dirty else st.booleans()
    item = st.fixed_dictionaries({field.key: st.sampled_from(KEYS)}, optional={**attributes, "exclude": exclude})
    return item | JSONS if dirty else item


def rules_of(field: Field, dirty: bool) -> st.SearchStrategy[Any]:
    rules: dict[str, st.SearchStrategy[Any]] = {
        "canEdit": st.booleans(),
        "required": st.booleans(),
        "options": st.lists(st.sampled_from(["a", "b", "c", "portion", "memory", "required"]), min_size=1, max_size=3),
    }
    if field.kind is Kind.ITEMIZED:
        locked = st.lists(st.sampled_from(KEYS))
        instances = st.fixed_dictionaries({}, optional={"canAdd": st.booleans(), "locked": locked})
        attributes = st.fixed_dictionaries({}, optional={n: rules_of(a, dirty) for n, a in field.attributes.items()})
        rules |= {"instances": instances, "attributes": attributes}
    else:
        rules |= {name: value_of(field, dirty) for name in ("min", "max", "step")}
    valid = st.fixed_dictionaries({}, optional={name: rules[name] for name in RULES_OF[field.kind]})
    if not dirty:
        return valid
    return (
        st.fixed_dictionaries({}, optional=rules)
        | st.dictionaries(st.sampled_from(RULE_NAMES), JSONS, max_size=1)
        | JSONS
    )


def default_of(field: Field, dirty: bool) -> st.SearchStrategy[Any]:
    if field.kind is not Kind.ITEMIZED:
        return value_of(field, dirty)
    attributes = {n: value_of(a, dirty) for n, a in field.attributes.items() if n != field.key}
    sections = {
        "instances": st.lists(item_of(field, dirty), max_size=3),
        "attributes": st.fixed_dictionaries({}, optional=attributes),
    }
    return st.fixed_dictionaries({}, optional=sections)


@st.composite
def policy_spec(draw: st.DrawFn) -> Any:
    """Three in four clean (well-typed, known names), the rest dirty; one in ten pure garbage."""
    if draw(st.integers(0, 9)) == 0:
        return draw(JSONS)
    dirty = draw(st.integers(0, 3)) == 0
    paths = draw(st.lists(st.sampled_from(list(FIELDS)), max_size=4, unique=True))
    defaults = {p: draw(default_of(FIELDS[p], dirty)) for p in paths if draw(st.booleans())}
    rules = {p: draw(rules_of(FIELDS[p], dirty)) for p in paths if draw(st.booleans())}
    spec = {"defaults": nest(defaults), "rules": nest(rules)}
    scope = st.sampled_from([None, {}, {"namespace": "ns"}, {"queue": "q"}])
    spec["scope"] = draw(scope | JSONS if dirty else scope)
    return spec | draw(st.dictionaries(st.sampled_from(NAMES), JSONS, max_size=1)) if dirty else spec


@st.composite
def submission(draw: st.DrawFn) -> dict[str, Any]:
    dirty = draw(st.booleans())
    paths = draw(st.lists(st.sampled_from(list(FIELDS)), max_size=6, unique=True))
    tree = nest({p: draw(value_of(FIELDS[p], dirty)) for p in paths})
    return tree | draw(st.dictionaries(st.sampled_from(NAMES), JSONS, max_size=1)) if dirty else tree


def check_violations(policies: list[Policy], sub: dict[str, Any]) -> None:
    result = evaluate(merge(policies), sub)
    roots = tuple(FIELDS) + tuple(group for group in CHILDREN if group)
    rules = {r.value for r in Rule}
    for v in result.violations:
        assert v.field.startswith(roots), v
        assert v.rule in rules, v
        assert v.field in v.message and v.rule in v.message, v
        assert v.policy in {p.name for p in policies} | {""} or ", " in v.policy, v
    for path in result.defaulted:
        assert result.sources[path].endswith("(defaults)")
    assert all(source == SUBMISSION or source.startswith("policy ") for source in result.sources.values())
    json.dumps(result.values)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(specs=st.lists(policy_spec(), max_size=3), submissions=st.lists(submission(), min_size=1, max_size=3))
def test_policies_against_submissions(specs: list[Any], submissions: list[dict[str, Any]]) -> None:
    policies = []
    for i, spec in enumerate(specs):
        try:
            policies.append(parse_policy(f"p{i}", spec))
        except PolicyError as e:
            assert e.violations and all(p.path.startswith("spec") and p.message for p in e.violations)
    json.dumps(effective_json(merge(policies)))
    for sub in submissions:
        check_violations(policies, sub)
