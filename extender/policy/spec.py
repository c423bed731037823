"""The workload-policy document: what a policy may say, and `parse_policy`.

A WorkloadPolicy (phalanx.io/v1alpha1, cluster-scoped) follows NVIDIA Run:ai's policy YAML
(/work/shared/seeds/workload-policy-yaml-reference.txt). Its `spec` has three sections:
`scope` ({namespace: x}, {queue: y}, or nothing for the whole cluster), `defaults` (values for
fields a workload leaves out) and `rules` (constraints on the workload's values). Defaults and
rules nest as the field vocabulary does (`compute: {gpuDeviceRequest: ...}`); the vocabulary is
the one table `FIELDS` (`vocabulary.py`), and a field's `Kind` decides the rules it takes.

Itemized fields (lists of objects named by a key attribute, such as `tolerations` by `key`) take
Run:ai's two sub-sections: defaults `{instances: [...], attributes: {<attr>: default}}`, rules
`{instances: {canAdd, locked}, attributes: {<attr>: <rules of the attribute's kind>}}`, plus
`canEdit` and `required` on the field itself.

`parse_policy` checks one document in one pass and raises `PolicyError` listing every problem
with its path (`spec.rules.compute.gpuDeviceRequest.max: expected an integer, got "eight"`):
unknown sections, fields, attributes and rules (strict: `Step` is not `step`, but the message
asks "did you mean step?"), values of the wrong type, rules the field's kind does not take, min
above max, a step not above 0, empty options, a bad scope, and defaults that break the policy's
own rules. It raises nothing else, whatever JSON it is given; nulls count as absent.

Every default and rule is held as `Sourced(value, policy)`, so that `evaluate.merge` can combine
policies and still say which one set what. Pure: no Kubernetes client, no I/O.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from fractions import Fraction
from typing import Any, Generic, TypeVar

from extender.policy.vocabulary import (
    ALL_RULES,
    CHILDREN,
    FIELDS,
    JSON,
    NUMERIC,
    RULES_OF,
    Field,
    Kind,
    Rule,
    magnitude,
    show,
    type_error,
)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Sourced(Generic[T]):
    """A default or rule, and the policy that set it ("a, b" for an intersection of options)."""

    value: T
    policy: str


@dataclass(frozen=True, slots=True)
class Bound:
    """A min, max or step as written ("5M", 8, 0.1), and its exact amount."""

    text: JSON
    amount: Fraction


@dataclass(frozen=True, slots=True)
class Step:
    """Allowed values are `base + k * size`; `base` is the min of the policy that set the step."""

    size: Bound
    base: Bound | None


@dataclass(frozen=True, slots=True)
class Breach:
    """A value against one rule: which rule, why (naming the rule and what it allows), whose rule."""

    rule: Rule
    detail: str
    policy: str


@dataclass(frozen=True, slots=True)
class Rules:
    """The rules on one field or attribute; None (or empty) where the policies say nothing."""

    can_edit: Sourced[bool] | None = None
    required: Sourced[bool] | None = None
    min: Sourced[Bound] | None = None
    max: Sourced[Bound] | None = None
    step: Sourced[Step] | None = None
    options: Sourced[tuple[str, ...]] | None = None
    can_add: Sourced[bool] | None = None  # itemized
    locked: Mapping[str, str] = dataclasses.field(default_factory=dict)  # itemized: instance key -> policy
    attributes: Mapping[str, Rules] = dataclasses.field(default_factory=dict)  # itemized

    @property
    def frozen(self) -> bool:
        return self.can_edit is not None and not self.can_edit.value

    @property
    def needed(self) -> bool:
        return self.required is not None and self.required.value

    @property
    def closed(self) -> bool:
        return self.can_add is not None and not self.can_add.value

    def check(self, kind: Kind, value: JSON) -> list[Breach]:
        """What a present, well-typed value breaks among options, min, max and step."""
        breaches = []
        if self.options is not None and (breach := option_breach(kind, value, self.options)):
            breaches.append(breach)
        if kind in NUMERIC and (self.min or self.max or self.step):
            breaches += self._range(magnitude(kind, value), show(value))
        return breaches

    def _range(self, amount: Fraction, shown: str) -> list[Breach]:
        breaches = []
        if self.min is not None and amount < self.min.value.amount:
            breaches.append(Breach(Rule.MIN, f"{shown} is below min {show(self.min.value.text)}", self.min.policy))
        if self.max is not None and amount > self.max.value.amount:
            breaches.append(Breach(Rule.MAX, f"{shown} is above max {show(self.max.value.text)}", self.max.policy))
        if self.step is not None:
            size, base = self.step.value.size, self.step.value.base
            if (amount - (base.amount if base else 0)) % size.amount:
                start = f"{show(base.text)} plus " if base else ""
                detail = f"{shown} is not {start}a multiple of step {show(size.text)}"
                breaches.append(Breach(Rule.STEP, detail, self.step.policy))
        return breaches


NO_RULES = Rules()


def option_breach(kind: Kind, value: JSON, options: Sourced[tuple[str, ...]]) -> Breach | None:
    """The options rule against a value (each element of an array); None when it holds."""
    bad = [v for v in (value if kind is Kind.ARRAY else [value]) if v not in options.value]
    if not bad:
        return None
    if not options.value:
        detail = f"{show(bad[0])} is not allowed: the options of these policies have nothing in common"
    else:
        listed = ", ".join(show(o) for o in options.value[:12]) + (", ..." if len(options.value) > 12 else "")
        detail = f"{show(bad[0])} is not among the options {listed}"
    return Breach(Rule.OPTIONS, detail, options.policy)


def natural_breach(field: Field, value: JSON) -> Breach | None:
    """A value outside the options the field has whatever the policies say (gpuRequestType), or
    one its own check refuses (a node-pool list the scheduler cannot read)."""
    if field.check is not None and (problem := field.check(value)):
        return Breach(Rule.TYPE, f"{show(value)}: {problem} (type)", "")
    return option_breach(field.kind, value, Sourced(field.options, "")) if field.options else None


@dataclass(frozen=True, slots=True)
class Stray:
    """Something in a nested field tree that is not a field: an unknown name, or a group not an object."""

    path: str
    detail: str
    unknown: bool


def flatten(tree: Mapping[str, JSON], group: str = "") -> tuple[dict[str, JSON], list[Stray]]:
    """The fields of a tree nested as the vocabulary, by dotted path (nulls left out), and the strays."""
    leaves: dict[str, JSON] = {}
    strays: list[Stray] = []
    for name, value in tree.items():
        path = f"{group}.{name}" if group else str(name)
        if name not in CHILDREN[group]:
            strays.append(Stray(path, "unknown field" + suggest(str(name), CHILDREN[group]), unknown=True))
        elif value is None:
            continue
        elif path in FIELDS:
            leaves[path] = value
        elif isinstance(value, Mapping):
            inner, inner_strays = flatten(value, path)  # the vocabulary is two levels deep
            leaves |= inner
            strays += inner_strays
        else:
            strays.append(Stray(path, f"expected an object of {path} fields, got {show(value)}", unknown=False))
    return leaves, strays


def suggest(name: str, known: Iterable[str]) -> str:
    """A "did you mean X?" for a near miss (case first), else the list of what is known."""
    known = tuple(known)
    folded = [k for k in known if k.lower() == name.lower()]
    close = folded or (difflib.get_close_matches(name, known, n=1) if len(name) <= 64 else [])
    return f"; did you mean {close[0]}?" if close else f" (expected one of {', '.join(known)})"


class Level(IntEnum):
    """How specific a scope is: the higher, the more its policies' defaults win."""

    CLUSTER = 0
    QUEUE = 1
    NAMESPACE = 2


@dataclass(frozen=True, slots=True)
class Scope:
    level: Level = Level.CLUSTER
    name: str = ""  # the namespace or the queue; "" for the cluster

    def applies(self, namespace: str, queue: str) -> bool:
        """Whether a workload in `namespace`, submitted to `queue`, falls under this scope."""
        match self.level:
            case Level.NAMESPACE:
                return self.name == namespace
            case Level.QUEUE:
                return self.name == queue
        return True


@dataclass(frozen=True, slots=True)
class Defaults:
    values: Mapping[str, Sourced[JSON]]  # non-itemized field -> default
    instances: Mapping[str, Mapping[str, Sourced[Mapping[str, JSON]]]]  # itemized -> key -> instance, in order
    attributes: Mapping[str, Mapping[str, Sourced[JSON]]]  # itemized -> attribute -> default


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    scope: Scope
    defaults: Defaults
    rules: Mapping[str, Rules]

    def precedence(self) -> tuple[int, str]:
        """Sort key, most specific first: namespace, queue, cluster; then by name, ascending."""
        return -self.scope.level, self.name


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong in a policy document: a path into it (`spec.rules...`) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class PolicyError(ValueError):
    """A policy document rejected as a whole; `violations` lists every problem found."""

    def __init__(self, name: str, violations: list[Problem]) -> None:
        self.violations = list(violations)
        lines = "\n".join(f"  - {p}" for p in self.violations)
        super().__init__(f"workload policy {name}: {len(self.violations)} problem(s):\n{lines}")


def parse_policy(name: str, spec: Mapping[str, Any]) -> Policy:
    """The policy `name` from its CR's `spec`; PolicyError listing every problem if it has any."""
    parser = _Parser(str(name))
    policy = parser.policy(spec)
    if parser.problems:
        raise PolicyError(policy.name, parser.problems)
    return policy


_SECTIONS = ("scope", "defaults", "rules")
_SCOPES = ("namespace", "queue")
_INSTANCE_RULES = ("canAdd", "locked")
_ITEM_DEFAULTS = ("instances", "attributes")


class _Parser:
    """One pass over one document; every method records problems and returns what it could read."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.problems: list[Problem] = []

    def problem(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))

    def mapping(self, raw: JSON, path: str, expected: str) -> Mapping[str, JSON]:
        """`raw` if it is an object ({} for null), else a problem and {}."""
        if raw is None:
            return {}
        if not isinstance(raw, Mapping):
            self.problem(path, f"expected {expected}, got {show(raw)}")
            return {}
        return raw

    def known(self, raw: Mapping[str, JSON], path: str, names: tuple[str, ...], what: str) -> None:
        for key in raw:
            if key not in names:
                self.problem(f"{path}.{key}", f"unknown {what}" + suggest(str(key), names))

    def policy(self, spec: JSON) -> Policy:
        spec = self.mapping(spec, "spec", "an object with scope, defaults and rules")
        self.known(spec, "spec", _SECTIONS, "section")
        scope = self.scope(spec.get("scope"))
        defaults = self.defaults(spec.get("defaults"))
        rules = self.rules(spec.get("rules"))
        self.check_defaults(defaults, rules)
        return Policy(self.name, scope, defaults, rules)

    def scope(self, raw: JSON) -> Scope:
        raw = self.mapping(raw, "spec.scope", "{namespace: <name>}, {queue: <name>} or {} for the cluster")
        self.known(raw, "spec.scope", _SCOPES, "scope")
        given = {key: raw[key] for key in _SCOPES if raw.get(key) is not None}
        for key, value in given.items():
            if not isinstance(value, str) or not value:
                self.problem(f"spec.scope.{key}", f"expected a non-empty string, got {show(value)}")
                return Scope()
        if len(given) > 1:
            self.problem("spec.scope", "give a namespace or a queue, not both")
            return Scope()
        return next((Scope(Level[key.upper()], value) for key, value in given.items()), Scope())

    def defaults(self, raw: JSON) -> Defaults:
        values: dict[str, Sourced[JSON]] = {}
        instances: dict[str, dict[str, Sourced[Mapping[str, JSON]]]] = {}
        attributes: dict[str, dict[str, Sourced[JSON]]] = {}
        leaves = self.leaves(raw, "spec.defaults")
        for path, value in leaves.items():
            field, where = FIELDS[path], f"spec.defaults.{path}"
            if field.kind is Kind.ITEMIZED:
                raw_items = self.mapping(value, where, "{instances: [...], attributes: {...}}")
                self.known(raw_items, where, _ITEM_DEFAULTS, "section of itemized defaults")
                instances[path] = self.instances(field, raw_items.get("instances"), f"{where}.instances")
                attributes[path] = self.attribute_defaults(field, raw_items.get("attributes"), f"{where}.attributes")
            elif error := self.value_error(field, value):
                self.problem(where, error)
            else:
                values[path] = Sourced(value, self.name)
        return Defaults(values, _non_empty(instances), _non_empty(attributes))

    def leaves(self, raw: JSON, path: str) -> dict[str, JSON]:
        tree = self.mapping(raw, path, "an object nested as the workload fields (compute: {...}, ...)")
        leaves, strays = flatten(tree)
        for stray in strays:
            self.problem(f"{path}.{stray.path}", stray.detail)
        return leaves

    def value_error(self, field: Field, value: JSON) -> str:
        if error := type_error(field.kind, value):
            return error
        breach = natural_breach(field, value)
        return breach.detail if breach else ""

    def instances(self, field: Field, raw: JSON, path: str) -> dict[str, Sourced[Mapping[str, JSON]]]:
        found: dict[str, Sourced[Mapping[str, JSON]]] = {}
        if raw is None:
            return found
        if not isinstance(raw, list | tuple):
            self.problem(path, f"expected a list of instances, got {show(raw)}")
            return found
        for i, item in enumerate(raw):
            where = f"{path}[{i}]"
            if not isinstance(item, Mapping):
                self.problem(where, f"expected an object, got {show(item)}")
                continue
            key = item.get(field.key)
            if not isinstance(key, str) or not key:
                self.problem(where, f"an instance needs its key attribute {field.key} (a non-empty string)")
            elif key in found:
                self.problem(where, f"{field.key} {show(key)} is given twice")
            else:
                found[key] = Sourced(self.attributes_of(field, item, where), self.name)
        return found

    def attributes_of(self, field: Field, item: Mapping[str, JSON], path: str) -> dict[str, JSON]:
        self.known(item, path, tuple(field.attributes), "attribute")
        kept = {}
        for name, value in item.items():
            if name in field.attributes and value is not None:
                if error := self.value_error(field.attributes[name], value):
                    self.problem(f"{path}.{name}", error)
                else:
                    kept[name] = value
        return kept

    def attribute_defaults(self, field: Field, raw: JSON, path: str) -> dict[str, Sourced[JSON]]:
        raw = self.mapping(raw, path, "an object of attribute defaults")
        if field.key in raw:
            self.problem(f"{path}.{field.key}", "the key attribute takes no default")
        kept = self.attributes_of(field, {k: v for k, v in raw.items() if k != field.key}, path)
        return {name: Sourced(value, self.name) for name, value in kept.items()}

    def rules(self, raw: JSON) -> dict[str, Rules]:
        leaves = self.leaves(raw, "spec.rules")
        return {path: self.field_rules(FIELDS[path], value, f"spec.rules.{path}") for path, value in leaves.items()}

    def field_rules(self, field: Field, raw: JSON, path: str) -> Rules:
        valid = RULES_OF[field.kind]
        raw = self.mapping(raw, path, f"an object of rules ({', '.join(valid)})")
        for name in raw:
            if name not in valid:
                self.problem(f"{path}.{name}", self.unknown_rule(str(name), field.kind))
        given = {name: value for name, value in raw.items() if name in valid and value is not None}
        low, high = self.bound(field.kind, given, "min", path), self.bound(field.kind, given, "max", path)
        if low and high and low.value.amount > high.value.amount:
            self.problem(f"{path}.min", f"min {show(low.value.text)} is above max {show(high.value.text)}")
        size = self.bound(field.kind, given, "step", path)
        if size and size.value.amount <= 0:
            self.problem(f"{path}.step", f"step must be above 0, got {show(size.value.text)}")
            size = None
        step = Sourced(Step(size.value, low.value if low else None), self.name) if size else None
        instances = self.mapping(given.get("instances"), f"{path}.instances", "{canAdd: ..., locked: [...]}")
        self.known(instances, f"{path}.instances", _INSTANCE_RULES, "instances rule")
        return Rules(
            can_edit=self.flag(given, "canEdit", path),
            required=self.flag(given, "required", path),
            min=low,
            max=high,
            step=step,
            options=self.options(field, given.get("options"), f"{path}.options"),
            can_add=self.flag(instances, "canAdd", f"{path}.instances"),
            locked=self.locked(instances.get("locked"), f"{path}.instances.locked"),
            attributes=self.attribute_rules(field, given.get("attributes"), f"{path}.attributes"),
        )

    def unknown_rule(self, name: str, kind: Kind) -> str:
        valid = RULES_OF[kind]
        if name in ALL_RULES:
            return f"rule {name} does not apply to {kind} fields (their rules: {', '.join(valid)})"
        return "unknown rule" + suggest(name, valid)

    def flag(self, given: Mapping[str, JSON], name: str, path: str) -> Sourced[bool] | None:
        value = given.get(name)
        if value is not None and not isinstance(value, bool):
            self.problem(f"{path}.{name}", f"expected true or false, got {show(value)}")
            return None
        return None if value is None else Sourced(value, self.name)

    def bound(self, kind: Kind, given: Mapping[str, JSON], name: str, path: str) -> Sourced[Bound] | None:
        value = given.get(name)
        if value is None:
            return None
        if error := type_error(kind, value):
            self.problem(f"{path}.{name}", error)
            return None
        return Sourced(Bound(value, magnitude(kind, value)), self.name)

    def options(self, field: Field, raw: JSON, path: str) -> Sourced[tuple[str, ...]] | None:
        if raw is None:
            return None
        if not isinstance(raw, list | tuple) or not raw:
            self.problem(path, f"expected a non-empty list of strings or of {{value, displayed}}, got {show(raw)}")
            return None
        values: dict[str, None] = {}
        for i, option in enumerate(raw):
            value = self.option(option, f"{path}[{i}]")
            if value is not None and field.options and value not in field.options:
                self.problem(f"{path}[{i}]", f"{show(value)} is not one of {', '.join(field.options)}")
            elif value is not None:
                values[value] = None
        return Sourced(tuple(values), self.name)

    def option(self, raw: JSON, path: str) -> str | None:
        """An option's value: a string, or Run:ai's {value: x, displayed: y}."""
        if isinstance(raw, Mapping):
            self.known(raw, path, ("value", "displayed"), "option attribute")
            if raw.get("displayed") is not None and not isinstance(raw["displayed"], str):
                self.problem(f"{path}.displayed", f"expected a string, got {show(raw['displayed'])}")
            raw = raw.get("value")
        if isinstance(raw, str):
            return raw
        self.problem(path, f"expected a string or {{value: <string>, displayed: <string>}}, got {show(raw)}")
        return None

    def locked(self, raw: JSON, path: str) -> dict[str, str]:
        if raw is None:
            return {}
        if not isinstance(raw, list | tuple):
            self.problem(path, f"expected a list of instance keys, got {show(raw)}")
            return {}
        for i, key in enumerate(raw):
            if not isinstance(key, str) or not key:
                self.problem(f"{path}[{i}]", f"expected an instance key (a non-empty string), got {show(key)}")
        return {key: self.name for key in raw if isinstance(key, str) and key}

    def attribute_rules(self, field: Field, raw: JSON, path: str) -> dict[str, Rules]:
        raw = self.mapping(raw, path, "an object of attribute rules")
        self.known(raw, path, tuple(field.attributes), "attribute")
        return {
            name: self.field_rules(field.attributes[name], value, f"{path}.{name}")
            for name, value in raw.items()
            if name in field.attributes and value is not None
        }

    def check_defaults(self, defaults: Defaults, rules: Mapping[str, Rules]) -> None:
        """Defaults must keep the policy's own rules; required + canEdit false needs a default."""
        for path, default in defaults.values.items():
            self.keeps(f"spec.defaults.{path}", FIELDS[path], default.value, rules.get(path, NO_RULES))
        for path, attrs in defaults.attributes.items():
            field, attr_rules = FIELDS[path], rules.get(path, NO_RULES).attributes
            for name, default in attrs.items():
                where = f"spec.defaults.{path}.attributes.{name}"
                self.keeps(where, field.attributes[name], default.value, attr_rules.get(name, NO_RULES))
        for path, instances in defaults.instances.items():
            field, attr_rules = FIELDS[path], rules.get(path, NO_RULES).attributes
            for key, instance in instances.items():
                for name, value in instance.value.items():
                    where = f"spec.defaults.{path}.instances[{key}].{name}"
                    self.keeps(where, field.attributes[name], value, attr_rules.get(name, NO_RULES))
        for path, field_rules in rules.items():
            if field_rules.needed and field_rules.frozen and not _has_default(defaults, path):
                self.problem(f"spec.rules.{path}", "required and canEdit: false without a default: nothing can pass")

    def keeps(self, path: str, field: Field, value: JSON, rules: Rules) -> None:
        for breach in rules.check(field.kind, value):
            self.problem(path, f"the default breaks this policy's own rule: {breach.detail}")


def _has_default(defaults: Defaults, path: str) -> bool:
    return path in defaults.values or path in defaults.instances


def _non_empty(by_field: dict[str, dict[str, Sourced[Any]]]) -> dict[str, dict[str, Sourced[Any]]]:
    return {path: entries for path, entries in by_field.items() if entries}
