"""Merging the policies that apply to a workload, and evaluating a submission against them.

Precedence. The policies scoped to a workload's namespace, to its queue and to the whole cluster
all apply. They rank from the most specific: namespace, then queue, then cluster; within one
scope level by name, ascending, the first name being the most specific (name policies `10-...`,
`20-...` to order them). `merge` sorts, so the order it is given does not matter.
- Defaults: per field, per itemized instance key and per attribute default, the most specific
  policy that gives one wins (a whole instance wins, not attribute by attribute).
- Rules merge to the most restrictive: required true and canEdit false win; min is the largest
  min, max the smallest max; options are the intersection (an empty one allows nothing, and its
  violation says so); step comes from the most specific policy that sets one, counted from that
  policy's own min; canAdd false wins; locked keys are the union. Each merged rule keeps the
  policy that set it (for options, every policy intersected).

Evaluation, per field (`evaluate`), with defaults as `merge` left them:
- A submitted value of the wrong type is a `type` violation and is not used further.
- `canEdit: false`: a submitted value must equal the default; with no default, none may be given.
- The effective value is the submitted one, else the default (recorded in `defaulted`).
- `required`: the effective value must be present and not "" or []. `options`, `min`, `max`
  and `step` check the effective value, whichever side it came from.
- Itemized: default instances are effective unless the submission excludes them
  (`{<key>: k, exclude: true}`); a submitted item with a default's key overrides that instance's
  attributes, attributes it leaves out coming from the instance. `locked` instances can be
  neither excluded nor changed, `canAdd: false` refuses items with other keys, and `canEdit:
  false` on the field refuses any change. Attribute defaults fill attributes that effective
  items lack; attribute rules check every effective item (`tolerations[gpu].seconds`).
- Relations between fields (`relation`): gpuRequestType needs gpuDeviceRequest exactly 1; a
  limit is never below its request; podAffinityTopology and podAffinitySchedulingRule go together.
Submission keys outside the vocabulary are not the policies' business: ignored, left out of
`values`. With no policy at all nothing is looked at: every pod creation passes through here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extender.policy.spec import (
    NO_RULES,
    Bound,
    Defaults,
    Policy,
    PolicyError,
    Rules,
    Sourced,
    flatten,
    natural_breach,
    parse_policy,
)
from extender.policy.vocabulary import FIELDS, JSON, Field, Kind, Rule, magnitude, same, show, type_error

__all__ = [  # parse_policy, Policy and PolicyError too: one import for the policy store
    "NO_POLICY",
    "SUBMISSION",
    "Effective",
    "Evaluation",
    "Policy",
    "PolicyError",
    "Violation",
    "defaults_source",
    "effective_json",
    "evaluate",
    "merge",
    "nest",
    "parse_policy",
]
SUBMISSION = "submission"
_LIMITS = (
    ("compute.gpuPortionLimit", "compute.gpuPortionRequest"),
    ("compute.gpuMemoryLimit", "compute.gpuMemoryRequest"),
    ("compute.cpuCoreLimit", "compute.cpuCoreRequest"),
    ("compute.cpuMemoryLimit", "compute.cpuMemoryRequest"),
)
_TOGETHER = ("podAffinitySchedulingRule", "podAffinityTopology")


def defaults_source(policy: str) -> str:
    return f"policy {policy} (defaults)"


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule. `message` is one sentence naming the field, the rule and what it allows."""

    field: str  # "compute.gpuDeviceRequest", "tolerations[gpu]", "compute.extendedResources[a/b].quantity"
    rule: str  # a `Rule`
    message: str
    policy: str = ""  # the policy that set the rule; "" for relations, types and keys


@dataclass(frozen=True, slots=True)
class Evaluation:
    values: Mapping[str, JSON]  # the effective fields, nested; itemized as lists without `exclude`
    sources: Mapping[str, str]  # dotted path -> "submission" or "policy <name> (defaults)"
    violations: tuple[Violation, ...]
    defaulted: frozenset[str]  # paths whose value came from a default: what a mutating webhook writes

    @property
    def admitted(self) -> bool:
        return not self.violations


@dataclass(frozen=True, slots=True)
class Effective:
    """The merged defaults and rules of the policies that apply to one workload."""

    policies: tuple[str, ...]  # most specific first
    defaults: Defaults
    rules: Mapping[str, Rules]

    @property
    def empty(self) -> bool:
        """No policy applies: every submission passes untouched."""
        return not self.policies


NO_POLICY = Effective((), Defaults({}, {}, {}), {})


def merge(policies: Iterable[Policy]) -> Effective:
    """The policies combined by precedence (see the module docstring), in whatever order given."""
    ranked = sorted(policies, key=Policy.precedence)
    if not ranked:
        return NO_POLICY
    values: dict[str, Sourced[JSON]] = {}
    instances: dict[str, dict[str, Sourced[Mapping[str, JSON]]]] = {}
    attributes: dict[str, dict[str, Sourced[JSON]]] = {}
    for policy in ranked:  # most specific first: the first default given stays
        for path, value in policy.defaults.values.items():
            values.setdefault(path, value)
        for path, by_key in policy.defaults.instances.items():
            for key, instance in by_key.items():
                instances.setdefault(path, {}).setdefault(key, instance)
        for path, by_name in policy.defaults.attributes.items():
            for name, value in by_name.items():
                attributes.setdefault(path, {}).setdefault(name, value)
    paths = [path for path in FIELDS if any(path in p.rules for p in ranked)]
    rules = {path: _merge_rules([p.rules[path] for p in ranked if path in p.rules]) for path in paths}
    return Effective(tuple(p.name for p in ranked), Defaults(values, instances, attributes), rules)


def _merge_rules(ranked: Sequence[Rules]) -> Rules:
    if len(ranked) == 1:
        return ranked[0]
    locked: dict[str, str] = {}
    for rules in ranked:
        for key, policy in rules.locked.items():
            locked.setdefault(key, policy)
    names = dict.fromkeys(name for rules in ranked for name in rules.attributes)
    return Rules(
        can_edit=_winning([r.can_edit for r in ranked], wins=False),
        required=_winning([r.required for r in ranked], wins=True),
        min=_extreme([r.min for r in ranked], largest=True),
        max=_extreme([r.max for r in ranked], largest=False),
        step=next((r.step for r in ranked if r.step is not None), None),
        options=_intersection([r.options for r in ranked]),
        can_add=_winning([r.can_add for r in ranked], wins=False),
        locked=locked,
        attributes={n: _merge_rules([r.attributes[n] for r in ranked if n in r.attributes]) for n in names},
    )


def _winning(flags: Sequence[Sourced[bool] | None], *, wins: bool) -> Sourced[bool] | None:
    given = [flag for flag in flags if flag is not None]
    return next((flag for flag in given if flag.value is wins), given[0] if given else None)


def _extreme(bounds: Sequence[Sourced[Bound] | None], *, largest: bool) -> Sourced[Bound] | None:
    given = [bound for bound in bounds if bound is not None]
    if not given:
        return None
    pick = max if largest else min  # both keep the first of equals: the most specific policy
    return pick(given, key=lambda bound: bound.value.amount)


def _intersection(options: Sequence[Sourced[tuple[str, ...]] | None]) -> Sourced[tuple[str, ...]] | None:
    given = [o for o in options if o is not None]
    if len(given) <= 1:
        return given[0] if given else None
    allowed = tuple(v for v in given[0].value if all(v in o.value for o in given[1:]))
    return Sourced(allowed, ", ".join(o.policy for o in given))


def evaluate(effective: Effective, submission: Mapping[str, Any], *, only: Collection[str] | None = None) -> Evaluation:
    """The effective workload fields for `submission` under `effective`, and every violation.
    `only`: the fields to look at, None for all (a pod template has no backoffLimit to require)."""
    if not effective.policies:
        return Evaluation(values=submission, sources={}, violations=(), defaulted=frozenset())
    run = _Run(effective, FIELDS.keys() if only is None else only)
    leaves, strays = flatten(submission)
    for stray in strays:
        if not stray.unknown:
            run.violate(stray.path, Rule.TYPE, f"wrong type: {stray.detail}")
    defaults = effective.defaults
    for path, field in FIELDS.items():
        if path not in run.only:
            continue
        given, rules = leaves.get(path), effective.rules.get(path)
        if field.kind is Kind.ITEMIZED:
            if given is not None or rules is not None or path in defaults.instances:
                _Items(run, path, field, rules or NO_RULES).evaluate(given)
        elif given is not None or rules is not None or path in defaults.values:
            value = run.settle(path, field, given, defaults.values.get(path), rules or NO_RULES, mark=True)
            if value is not None:
                run.values[path] = value
    run.relations()
    return run.result()


class _Run:
    """What one evaluation has found so far."""

    def __init__(self, effective: Effective, only: Collection[str]) -> None:
        self.effective, self.only = effective, only
        self.values: dict[str, JSON] = {}
        self.sources: dict[str, str] = {}
        self.violations: list[Violation] = []
        self.defaulted: set[str] = set()

    def violate(self, field: str, rule: Rule, detail: str, policy: str = "") -> None:
        whose = (f" (policies {policy})" if ", " in policy else f" (policy {policy})") if policy else ""
        self.violations.append(Violation(field, rule.value, f"{field}: {detail}{whose}", policy))

    def settle(
        self, path: str, field: Field, given: JSON, default: Sourced[JSON] | None, rules: Rules, *, mark: bool
    ) -> JSON:
        """The effective value of one field or attribute, checked; None when there is none."""
        if given is not None:
            if error := type_error(field.kind, given):
                self.violate(path, Rule.TYPE, f"wrong type: {error}")
                return None
            if rules.can_edit is not None and rules.frozen:
                self.unchanged(path, field.kind, given, default, rules.can_edit.policy)
            self.sources[path] = SUBMISSION
            value = given
        elif default is not None:
            value = default.value
            self.sources[path] = defaults_source(default.policy)
            if mark:
                self.defaulted.add(path)
        else:
            value = None
        if value is None or value == "" or value == []:
            if rules.required is not None and rules.needed:
                self.violate(
                    path, Rule.REQUIRED, "is required but has no value, given or default", rules.required.policy
                )
            return value
        breaches = rules.check(field.kind, value)
        if natural := natural_breach(field, value):
            breaches.insert(0, natural)
        for breach in breaches:
            self.violate(path, breach.rule, breach.detail, breach.policy)
        return value

    def unchanged(self, path: str, kind: Kind, given: JSON, default: Sourced[JSON] | None, policy: str) -> None:
        if default is None:
            self.violate(path, Rule.CAN_EDIT, "canEdit is false and there is no default: leave it out", policy)
        elif not same(kind, given, default.value):
            detail = f"{show(given)} differs from the default {show(default.value)} and canEdit is false"
            self.violate(path, Rule.CAN_EDIT, detail, policy)

    def relations(self) -> None:
        """Rules between fields, on well-typed effective values; a field outside `only` is never missing."""
        values, devices = self.values, "compute.gpuDeviceRequest"
        request_type = values.get("compute.gpuRequestType")
        if request_type is not None and devices in self.only and values.get(devices) != 1:
            count = show(values[devices]) if devices in values else "not set"
            detail = f"{show(request_type)} needs {devices} 1, which is {count} (relation)"
            self.violate("compute.gpuRequestType", Rule.RELATION, detail)
        for limit, request in _LIMITS:
            kind = FIELDS[limit].kind
            if (
                limit in values
                and request in values
                and magnitude(kind, values[limit]) < magnitude(kind, values[request])
            ):
                detail = f"{show(values[limit])} is below {request} {show(values[request])} (relation)"
                self.violate(limit, Rule.RELATION, detail)
        first, second = _TOGETHER
        if first in self.only and second in self.only and (first in values) != (second in values):
            alone, missing = (first, second) if first in values else (second, first)
            self.violate(alone, Rule.RELATION, f"is set without {missing}; the two go together (relation)")

    def result(self) -> Evaluation:
        return Evaluation(nest(self.values), self.sources, tuple(self.violations), frozenset(self.defaulted))


@dataclass(slots=True)
class _Item:
    base: Sourced[Mapping[str, JSON]] | None  # the default instance
    given: Mapping[str, JSON] | None  # the submission's attributes, when it gave the item


class _Items:
    """One itemized field of one evaluation."""

    def __init__(self, run: _Run, path: str, field: Field, rules: Rules) -> None:
        self.run, self.path, self.field, self.rules = run, path, field, rules
        defaults = run.effective.defaults
        self.defaults = defaults.instances.get(path, {})
        self.attribute_defaults = defaults.attributes.get(path, {})
        self.items = {key: _Item(instance, None) for key, instance in self.defaults.items()}
        self.seen: set[str] = set()

    def evaluate(self, given: JSON) -> None:
        if given is not None and not isinstance(given, list):
            self.run.violate(self.path, Rule.TYPE, f"wrong type: expected a list of objects, got {show(given)}")
        for i, raw in enumerate(given if isinstance(given, list) else []):
            self.submitted(i, raw)
        items = [self.settle(key, item) for key, item in self.items.items()]
        if not items and self.rules.required is not None and self.rules.needed:
            self.run.violate(self.path, Rule.REQUIRED, "is required but has no items", self.rules.required.policy)
        if items or given is not None:
            self.run.values[self.path] = items

    def submitted(self, i: int, raw: JSON) -> None:
        run, key_name = self.run, self.field.key
        if not isinstance(raw, Mapping):
            run.violate(f"{self.path}[{i}]", Rule.TYPE, f"wrong type: expected an object, got {show(raw)}")
            return
        key = raw.get(key_name)
        if not isinstance(key, str) or not key:
            run.violate(f"{self.path}[{i}]", Rule.KEY, f"has no key attribute {key_name} (a non-empty string)")
            return
        where = f"{self.path}[{key}]"
        if key in self.seen:
            run.violate(where, Rule.KEY, f"the key {key_name} {show(key)} is given twice")
            return
        self.seen.add(key)
        exclude = raw.get("exclude")
        if exclude is not None and not isinstance(exclude, bool):
            run.violate(f"{where}.exclude", Rule.TYPE, f"wrong type: expected true or false, got {show(exclude)}")
        elif exclude:
            self.exclude(where, key)
        else:
            self.give(where, key, self.typed(where, raw))

    def typed(self, where: str, raw: Mapping[str, JSON]) -> dict[str, JSON]:
        attributes = {}
        for name, value in raw.items():
            if name in self.field.attributes and value is not None:
                if error := type_error(self.field.attributes[name].kind, value):
                    self.run.violate(f"{where}.{name}", Rule.TYPE, f"wrong type: {error}")
                else:
                    attributes[name] = value
        return attributes

    def exclude(self, where: str, key: str) -> None:
        if key not in self.defaults:
            return  # nothing to exclude
        if key in self.rules.locked:
            self.run.violate(where, Rule.LOCKED, "is locked: it cannot be excluded", self.rules.locked[key])
        elif self.rules.can_edit is not None and self.rules.frozen:
            self.run.violate(where, Rule.CAN_EDIT, "cannot be excluded: canEdit is false", self.rules.can_edit.policy)
        else:
            del self.items[key]

    def give(self, where: str, key: str, attributes: dict[str, JSON]) -> None:
        run, rules = self.run, self.rules
        if key in self.defaults:
            change = self.change(self.defaults[key], attributes)
            if change and key in rules.locked:
                run.violate(where, Rule.LOCKED, f"is locked: it cannot be modified ({change})", rules.locked[key])
            elif change and rules.can_edit is not None and rules.frozen:
                detail = f"cannot be modified: canEdit is false ({change})"
                run.violate(where, Rule.CAN_EDIT, detail, rules.can_edit.policy)
            else:
                self.items[key].given = attributes
        elif rules.can_add is not None and rules.closed:
            known = ", ".join(self.defaults) or "none"
            detail = f"is not among the default instances ({known}) and canAdd is false"
            run.violate(where, Rule.CAN_ADD, detail, rules.can_add.policy)
        elif key in rules.locked:
            run.violate(
                where, Rule.LOCKED, "is locked and has no default instance: it cannot be given", rules.locked[key]
            )
        elif rules.can_edit is not None and rules.frozen:
            run.violate(where, Rule.CAN_EDIT, "adds an item, and canEdit is false", rules.can_edit.policy)
        else:
            self.items[key] = _Item(None, attributes)

    def change(self, base: Sourced[Mapping[str, JSON]], attributes: Mapping[str, JSON]) -> str:
        """The first attribute given that differs from the default instance, as 'name x, default y'; "" if none."""
        for name, value in attributes.items():
            default = self.default(base, name)
            if default is None or not same(self.field.attributes[name].kind, value, default.value):
                return f"{name} {show(value)}, default {show(default.value) if default else 'none'}"
        return ""

    def default(self, base: Sourced[Mapping[str, JSON]] | None, name: str) -> Sourced[JSON] | None:
        if base is not None and name in base.value:
            return Sourced(base.value[name], base.policy)
        return self.attribute_defaults.get(name)

    def settle(self, key: str, item: _Item) -> dict[str, JSON]:
        where, run = f"{self.path}[{key}]", self.run
        if item.given is None:
            assert item.base is not None, "an item neither given nor defaulted"
            run.sources[where] = defaults_source(item.base.policy)
            run.defaulted.add(where)
        else:
            run.sources[where] = SUBMISSION
        settled = {}
        for name, field in self.field.attributes.items():
            given = item.given.get(name) if item.given is not None else None
            rules = self.rules.attributes.get(name, NO_RULES)
            default = self.default(item.base, name)
            value = run.settle(f"{where}.{name}", field, given, default, rules, mark=item.given is not None)
            if value is not None:
                settled[name] = value
        return settled


def nest(flat: Mapping[str, JSON]) -> dict[str, JSON]:
    """Dotted paths to the nested tree policies and submissions are written in."""
    tree: dict[str, JSON] = {}
    for path, value in flat.items():
        *groups, name = path.split(".")
        node = tree
        for group in groups:
            node = node.setdefault(group, {})
        node[name] = value
    return tree


def effective_json(effective: Effective) -> dict[str, JSON]:
    """The merged defaults and rules nested as a policy spec, each value with its policy (a preview)."""
    defaults: dict[str, JSON] = {}
    for path in FIELDS:
        if path in effective.defaults.values:
            defaults[path] = _sourced(effective.defaults.values[path])
        instances = effective.defaults.instances.get(path, {})
        attributes = effective.defaults.attributes.get(path, {})
        if instances or attributes:
            defaults[path] = {
                "instances": [_sourced(instance, dict(instance.value)) for instance in instances.values()],
                "attributes": {name: _sourced(value) for name, value in attributes.items()},
            }
    rules = {path: _rules_json(effective.rules[path]) for path in FIELDS if path in effective.rules}
    return {"policies": list(effective.policies), "defaults": nest(defaults), "rules": nest(rules)}


def _sourced(sourced: Sourced[Any], value: JSON = None) -> dict[str, JSON]:
    return {"value": sourced.value if value is None else value, "policy": sourced.policy}


def _rules_json(rules: Rules) -> dict[str, JSON]:
    out: dict[str, JSON] = {}
    for name, flag in (("canEdit", rules.can_edit), ("required", rules.required)):
        if flag is not None:
            out[name] = _sourced(flag)
    for name, bound in (("min", rules.min), ("max", rules.max)):
        if bound is not None:
            out[name] = _sourced(bound, bound.value.text)
    if rules.step is not None:
        step = rules.step.value
        out["step"] = {**_sourced(rules.step, step.size.text), "from": step.base.text if step.base else 0}
    if rules.options is not None:
        out["options"] = _sourced(rules.options, list(rules.options.value))
    instances: dict[str, JSON] = {}
    if rules.can_add is not None:
        instances["canAdd"] = _sourced(rules.can_add)
    if rules.locked:
        instances["locked"] = [{"value": key, "policy": policy} for key, policy in rules.locked.items()]
    if instances:
        out["instances"] = instances
    if rules.attributes:
        out["attributes"] = {name: _rules_json(r) for name, r in rules.attributes.items()}
    return out
