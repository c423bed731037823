"""Kubernetes resource quantities ("500m", "1Gi", "2") as integers in Phalanx units."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

_SUFFIX = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def parse(value: str | int | float) -> Decimal:
    """A quantity as a Decimal in base units; ValueError with the text on malformed input."""
    if isinstance(value, int | float):
        return Decimal(str(value))
    text = str(value).strip()
    for size in (2, 1, 0):
        suffix = text[len(text) - size :] if size else ""
        if suffix in _SUFFIX and (size == 0 or len(text) > size):
            number = text[: len(text) - size] if size else text
            try:
                return Decimal(number) * _SUFFIX[suffix]
            except InvalidOperation:
                break
    raise ValueError(f"malformed quantity {value!r}")


def milli(value: str | int | float) -> int:
    """CPU-style quantity in thousandths, rounded up (as the scheduler does)."""
    return int((parse(value) * 1000).to_integral_value(rounding="ROUND_CEILING"))


def mib(value: str | int | float) -> int:
    """Memory-style quantity in MiB, rounded up."""
    return int((parse(value) / 2**20).to_integral_value(rounding="ROUND_CEILING"))


def count(value: str | int | float) -> int:
    return int(parse(value).to_integral_value(rounding="ROUND_CEILING"))
