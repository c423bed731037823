"""What every benchmark shares: its common flags, machine facts, percentiles, and the RESULTS.md record."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def parser(doc: str | None, *, quick: str) -> argparse.ArgumentParser:
    """The flags every benchmark takes: --quick (`quick` says what it shrinks to) and --no-record."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--no-record", action="store_true", help="print only; do not append to RESULTS.md")
    return ap


def finish(name: str, args: argparse.Namespace, lines: list[str], headline: dict[str, Any]) -> None:
    """Print the report, record it in RESULTS.md unless --no-record, and end with the headline as
    one JSON line (what scripts read)."""
    print("\n".join(lines))
    if not args.no_record:
        record(name + (" --quick" if args.quick else ""), "```\n" + "\n".join(lines) + "\n```", headline)
    print(json.dumps(headline, sort_keys=True))


def machine() -> str:
    cpu = "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return (
        f"{os.cpu_count()} cores ({cpu}), {mem_gib:.0f} GiB, Python {platform.python_version()}, "
        f"load average {load:.2f} at start"
    )


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); with few samples p99 is the maximum."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def record(title: str, body: str, headline: dict[str, Any]) -> None:
    """Append one run to RESULTS.md: title, date, exact command, machine, body, JSON."""
    command = "python -m " + " ".join(shlex.quote(a) for a in [_module(), *sys.argv[1:]])
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = (
        f"\n## {title} — {stamp}\n\n"
        f"- command: `{command}`\n- machine: {machine()}\n\n{body.rstrip()}\n\n"
        f"```json\n{json.dumps(headline, sort_keys=True)}\n```\n"
    )
    if not RESULTS.exists():
        RESULTS.write_text("# Benchmark results\n\nEvery run appends here: newest last.\n")
    with RESULTS.open("a") as f:
        f.write(text)


def _module() -> str:
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None else Path(sys.argv[0]).stem
