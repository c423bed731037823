"""Quantity parsing on the watch path: extender/quantity.py against kubernetes.utils.parse_quantity.

Every pod event parses the pod's CPU (milli), memory (MiB) and GPU count, so the per-value cost
is what matters. The values are a pod-spec mix ("500m", "32Gi", "8", 8, ...). Three ways:

- phalanx: `extender.quantity.milli/mib/count` (grammar check, 64-character and 2^63-1 bounds);
- parse_quantity: the client library's parser with the same rounding, no bounds (it takes
  "Infinity", "1_000" and "1e999999", the last of which then takes about 50 s to turn into an int);
- parse_quantity, bounded: the same checks as phalanx in front of it, i.e. the cost of switching.

    python -m benchmarks.quantity_parse [--quick] [--no-record]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from decimal import Decimal

from kubernetes.utils import parse_quantity as _untyped_parse_quantity

from benchmarks.common import finish, parser
from extender import quantity
from extender.quantity import _MAX, _MAX_TEXT, _QUANTITY  # the same checks, to price a switch honestly

CPU = ["500m", "8", "100m", "2", "250m"]
MEMORY = ["1Gi", "32Gi", "128Mi", "512Mi", "4Gi"]
COUNTS: list[str | int] = ["1", "8", 1, 8, "110"]
Parse = Callable[[str | int | float], Decimal]
parse_quantity: Parse = _untyped_parse_quantity


def bounded_parse_quantity(value: str | int | float) -> Decimal:
    text = str(value).strip()
    if len(text) > _MAX_TEXT or _QUANTITY.fullmatch(text) is None:
        raise ValueError(f"malformed quantity {value!r}")
    result: Decimal = parse_quantity(text)
    if abs(result) > _MAX:
        raise ValueError(f"quantity {value!r} exceeds 2^63-1")
    return result


def pod_values(parse: Parse) -> Callable[[], None]:
    """One pass over the mix, converted as objects.py converts a pod's resources."""

    def run() -> None:
        for cpu, memory, count in zip(CPU, MEMORY, COUNTS, strict=True):
            int((parse(cpu) * 1000).to_integral_value(rounding="ROUND_CEILING"))
            int((parse(memory) / 2**20).to_integral_value(rounding="ROUND_CEILING"))
            int(parse(count).to_integral_value(rounding="ROUND_CEILING"))

    return run


def phalanx() -> None:
    for cpu, memory, count in zip(CPU, MEMORY, COUNTS, strict=True):
        quantity.milli(cpu)
        quantity.mib(memory)
        quantity.count(count)


def ns_per_value(ways: dict[str, Callable[[], None]], passes: int, rounds: int = 7) -> dict[str, float]:
    """Best of `rounds` per way, the ways interleaved within each round, so that load from other
    processes on a shared machine falls on all of them alike."""
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(rounds):
        for name, run in ways.items():
            t0 = time.perf_counter_ns()
            for _ in range(passes):
                run()
            best[name] = min(best[name], (time.perf_counter_ns() - t0) / (passes * 3 * len(CPU)))
    return best


def main() -> None:
    args = parser(__doc__, quick="2,000 passes per round instead of 10,000").parse_args()
    passes = 2_000 if args.quick else 10_000
    ways = {
        "phalanx": phalanx,
        "parse_quantity": pod_values(parse_quantity),
        "parse_quantity, bounded": pod_values(bounded_parse_quantity),
    }
    figures = ns_per_value(ways, passes)
    lines = [f"{name:<24} {ns / 1000:6.2f} µs per value" for name, ns in figures.items()]
    lines.append(f"{passes} passes over {3 * len(CPU)} pod-spec values, best of 7 interleaved rounds")
    headline = {name.replace(", ", "_").replace(" ", "_") + "_us": round(ns / 1000, 3) for name, ns in figures.items()}
    finish("quantity_parse", args, lines, headline)


if __name__ == "__main__":
    main()
