"""Kubernetes resource quantities ("500m", "1Gi", "2", "1e3") as integers in Phalanx units.

Why not `kubernetes.utils.parse_quantity`: it takes whatever `Decimal` takes, so "Infinity",
"NaN" and "1_000" pass, and "1e999999" comes back as a number whose conversion to an int ran for
about 50 s here. Pod annotations (GPU shares, GPU memory) are free text and reach this module on
every watch event. This parser follows the API's grammar (sign, digits, then a binary SI, decimal
SI or decimal exponent suffix), caps the text at 64 characters, the exponent at 99 and the
magnitude at 2^63-1 (the largest quantity Kubernetes represents), and raises ValueError naming
the text otherwise.

It computes with an exact integer ratio, no Decimal, which also makes it the faster one on the
watch path. benchmarks/quantity_parse.py, a pod-spec mix of CPU, memory and GPU values on a
2-core machine under load (load average 7, ways interleaved): 1.7-2.4 µs per value here,
3.5-4.2 µs for parse_quantity with the same rounding, 6.2-6.7 µs for parse_quantity behind the
same bounds; the Decimal parser this replaced measured as parse_quantity did (3.1-3.5 µs).
"""

from __future__ import annotations

import re
from decimal import Decimal

_MAX = 2**63 - 1
_MAX_TEXT = 64
_MAX_EXPONENT = 99  # 2^63 has 19 digits and the text at most 64: a larger exponent is never a real quantity
# suffix -> (multiplier, divisor)
_SCALE = {
    "n": (1, 10**9),
    "u": (1, 10**6),
    "m": (1, 10**3),
    "": (1, 1),
    **{s: (1000**i, 1) for i, s in enumerate("kMGTPE", start=1)},
    **{s + "i": (1024**i, 1) for i, s in enumerate("KMGTPE", start=1)},
}
# The API's grammar: a signed number (at least one digit), then one suffix of the three kinds.
_QUANTITY = re.compile(r"([+-]?)(?=\.?[0-9])([0-9]*)(?:\.([0-9]*))?(?:([KMGTPE]i|[numkMGTPE]?)|[eE]([+-]?[0-9]+))")
# (numerator, denominator > 0): exact. A plain pair, as a NamedTuple cost a fifth of the parse.
_Ratio = tuple[int, int]


def parse(value: str | int | float) -> Decimal:
    """A quantity as a Decimal in base units; ValueError naming the text when it is malformed or
    out of bounds."""
    n, d = _ratio(value)
    return Decimal(n) / d if d != 1 else Decimal(n)


def milli(value: str | int | float) -> int:
    """CPU-style quantity in thousandths, rounded up (as the scheduler does)."""
    n, d = _ratio(value)
    return -(-n * 1000 // d)


def mib(value: str | int | float) -> int:
    """Memory-style quantity in MiB, rounded up."""
    n, d = _ratio(value)
    return -(-n // (d << 20))


def count(value: str | int | float) -> int:
    """A count (GPUs, pods, percent), rounded up."""
    n, d = _ratio(value)
    return -(-n // d)


def _ratio(value: str | int | float) -> _Ratio:
    text = str(value).strip()
    if text.isascii() and text.isdigit() and len(text) < 19:  # "8", "110": most values, and surely in bounds
        return int(text), 1
    if len(text) > _MAX_TEXT:
        raise ValueError(f"quantity {text[:20]!r}... is longer than {_MAX_TEXT} characters")
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(f"malformed quantity {value!r}")
    sign, whole, fraction, suffix, exponent = match.groups()
    fraction = fraction or ""
    n, d = int(whole + fraction), 10 ** len(fraction)
    if exponent is None:
        multiplier, divisor = _SCALE[suffix]
    elif abs(e := int(exponent)) <= _MAX_EXPONENT:
        multiplier, divisor = (10**e, 1) if e >= 0 else (1, 10**-e)
    else:
        raise ValueError(f"quantity {value!r}: exponent out of range (at most {_MAX_EXPONENT} either way)")
    n, d = n * multiplier, d * divisor
    if n > _MAX * d:
        raise ValueError(f"quantity {value!r} exceeds 2^63-1 in magnitude")
    return (-n if sign == "-" else n), d
