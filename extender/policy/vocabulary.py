"""The workload-policy vocabulary: the fields a policy speaks of (`FIELDS`, one line each),
their value kinds, the rules each kind takes, and how values of a kind are read and compared.

Numbers compare exactly: integers and numbers as `Fraction`s of their decimal text (0.3 is a
multiple of 0.1), quantities through `extender.quantity` ("4M" < "5M" == 5000000); the value as
written is what is kept and shown. Pure: no Kubernetes client, no I/O.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import Any

from extender import quantity
from extender.node_pools import NODE_POOLS_ANNOTATION, read

JSON = Any


class Kind(StrEnum):
    """A field's value type, as the reference names them."""

    BOOLEAN = "boolean"
    STRING = "string"
    INTEGER = "integer"
    NUMBER = "number"
    QUANTITY = "quantity"
    ARRAY = "array"  # a list of strings, treated as one value
    ITEMIZED = "itemized"  # a list of objects, each named by its key attribute


@dataclass(frozen=True, slots=True)
class Field:
    kind: Kind
    options: tuple[str, ...] = ()  # the only values the field ever takes, policy or not
    key: str = ""  # itemized: the attribute that names an instance
    attributes: Mapping[str, Field] = dataclasses.field(default_factory=dict)  # itemized, key included
    check: Callable[[JSON], str] | None = None  # what else a value must be ("": fine), policy or not


def _node_pools(value: JSON) -> str:
    """A node-pool list the scheduler can read (extender/node_pools.py): its problem, or ""."""
    return read(json.dumps(value)).error.removeprefix(NODE_POOLS_ANNOTATION + ": ")


def _itemized(key: str, /, **attributes: Kind) -> Field:
    return Field(Kind.ITEMIZED, key=key, attributes={name: Field(kind) for name, kind in attributes.items()})


FIELDS: Mapping[str, Field] = {
    "compute.gpuDeviceRequest": Field(Kind.INTEGER),
    "compute.gpuRequestType": Field(Kind.STRING, options=("portion", "memory", "migProfile")),
    "compute.gpuPortionRequest": Field(Kind.NUMBER),
    "compute.gpuPortionLimit": Field(Kind.NUMBER),
    "compute.gpuMemoryRequest": Field(Kind.QUANTITY),
    "compute.gpuMemoryLimit": Field(Kind.QUANTITY),
    "compute.migProfile": Field(Kind.STRING),
    "compute.cpuCoreRequest": Field(Kind.NUMBER),
    "compute.cpuCoreLimit": Field(Kind.NUMBER),
    "compute.cpuMemoryRequest": Field(Kind.QUANTITY),
    "compute.cpuMemoryLimit": Field(Kind.QUANTITY),
    "compute.extendedResources": _itemized("resource", resource=Kind.STRING, quantity=Kind.QUANTITY),
    "nodePools": Field(Kind.ARRAY, check=_node_pools),
    "priorityClass": Field(Kind.STRING),
    "tolerations": _itemized(
        "key", key=Kind.STRING, operator=Kind.STRING, value=Kind.STRING, effect=Kind.STRING, seconds=Kind.INTEGER
    ),
    "podAffinitySchedulingRule": Field(Kind.STRING, options=("required", "preferred")),
    "podAffinityTopology": Field(Kind.STRING),
    "terminateAfterPreemption": Field(Kind.BOOLEAN),
    "backoffLimit": Field(Kind.INTEGER),
    "annotations": _itemized("name", name=Kind.STRING, value=Kind.STRING),
    "labels": _itemized("name", name=Kind.STRING, value=Kind.STRING),
}


def _children() -> dict[str, tuple[str, ...]]:
    """Group path ("" for the top) -> the names directly under it, fields and groups."""
    children: dict[str, dict[str, None]] = {}
    for path in FIELDS:
        parts = path.split(".")
        for depth in range(len(parts)):
            children.setdefault(".".join(parts[:depth]), {})[parts[depth]] = None
    return {group: tuple(names) for group, names in children.items()}


CHILDREN = _children()


class Rule(StrEnum):
    """Rule names, as policies spell them and violations report them."""

    CAN_EDIT = "canEdit"
    REQUIRED = "required"
    MIN = "min"
    MAX = "max"
    STEP = "step"
    OPTIONS = "options"
    CAN_ADD = "canAdd"
    LOCKED = "locked"
    RELATION = "relation"  # between fields (a limit below its request); no policy sets it
    TYPE = "type"  # a submitted value of the wrong type
    KEY = "key"  # an itemized entry without its key attribute, or a key given twice


RULES_OF: Mapping[Kind, tuple[str, ...]] = {
    Kind.BOOLEAN: ("canEdit", "required"),
    Kind.STRING: ("canEdit", "required", "options"),
    Kind.INTEGER: ("canEdit", "required", "min", "max", "step"),
    Kind.NUMBER: ("canEdit", "required", "min", "max", "step"),
    Kind.QUANTITY: ("canEdit", "required", "min", "max"),
    Kind.ARRAY: ("canEdit", "required", "options"),
    Kind.ITEMIZED: ("canEdit", "required", "instances", "attributes"),
}
ALL_RULES = frozenset(name for names in RULES_OF.values() for name in names)
NUMERIC = frozenset({Kind.INTEGER, Kind.NUMBER, Kind.QUANTITY})
_EXPECTED = {
    Kind.BOOLEAN: "true or false",
    Kind.STRING: "a string",
    Kind.INTEGER: "an integer",
    Kind.NUMBER: "a number",
    Kind.QUANTITY: "a quantity (such as 5M, 10Gi, 500m or 2)",
    Kind.ARRAY: "a list of strings",
    Kind.ITEMIZED: "a list of objects",
}


def show(value: JSON) -> str:
    """A value as JSON, cut short for messages."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def type_error(kind: Kind, value: JSON) -> str:
    """Why `value` is not of `kind` ("expected an integer, got ..."); "" when it is."""
    return "" if _is_kind(kind, value) else f"expected {_EXPECTED[kind]}, got {show(value)}"


def _is_kind(kind: Kind, value: JSON) -> bool:
    if isinstance(value, bool):
        return kind is Kind.BOOLEAN
    match kind:
        case Kind.STRING:
            return isinstance(value, str)
        case Kind.INTEGER:
            return isinstance(value, int)
        case Kind.NUMBER:
            return isinstance(value, int) or (isinstance(value, float) and value - value == 0)  # finite
        case Kind.QUANTITY:
            return _quantity(value) is not None
        case Kind.ARRAY:
            return isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
        case Kind.ITEMIZED:
            return isinstance(value, list | tuple) and all(isinstance(v, Mapping) for v in value)
    return False


def _quantity(value: JSON) -> Fraction | None:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    try:
        return Fraction(quantity.parse(value))
    except ValueError:
        return None


def magnitude(kind: Kind, value: JSON) -> Fraction:
    """The exact amount of a well-typed integer, number or quantity value."""
    if kind is Kind.QUANTITY:
        amount = _quantity(value)
        assert amount is not None, "magnitude of an unchecked quantity"
        return amount
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def same(kind: Kind, a: JSON, b: JSON) -> bool:
    """Whether two well-typed values of `kind` are the same value ("5M" is 5000000)."""
    if kind in NUMERIC:
        return magnitude(kind, a) == magnitude(kind, b)
    if kind is Kind.ARRAY:
        return list(a) == list(b)
    return bool(a == b)
