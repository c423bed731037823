"""Test the oracle: disable each plan-validator check in turn and show that the suite fails.

The validator (`solver/validate.py`) runs the checks in its `CHECKS` registry. For each check,
this script starts a subprocess that replaces that one check by one that reports nothing
(monkeypatching `solver.validate.CHECKS` before any test module is imported), runs the tests
with pytest, and records whether they failed. A check whose removal leaves the suite green is a
hole in the oracle; the script then exits 1. A baseline run with nothing disabled comes first
and must pass.

    python -m tests.validator_mutations                 # quick suite (default)
    python -m tests.validator_mutations --suite full    # all of tests/solver
    python -m tests.validator_mutations --only node_cpu gpu_whole

Suites: `quick` runs tests/solver/test_validate.py (a hand-made bad plan per check) and
tests/solver/test_properties.py (the hypothesis tests whose oracle the validator is); `full`
runs every test file of tests/solver, excluding nothing; `table` only test_validate.py;
`others` every file but test_validate.py (a diagnostic: which checks the rest of the suite
notices on its own; slow, since a caught check is found late). All but `others` start with
test_validate.py and stop at the first failure (`-x`), so a caught mutation costs
one pytest start-up (about 5 s) and only a surviving one runs its whole suite; the baseline
runs the whole suite. Run from the repository root with the project's virtual environment;
the quick suite takes about 3 minutes, the full one about 5, on two cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

FIRST = "tests/solver/test_validate.py"  # the bad-plan table: a caught mutation fails here, fast
OTHERS = tuple(sorted(str(p) for p in Path("tests/solver").rglob("test_*.py") if str(p) != FIRST))
SUITES = {
    "table": (FIRST,),
    "quick": (FIRST, "tests/solver/test_properties.py"),
    "full": (FIRST, *OTHERS),
    "others": OTHERS,
}
PYTEST_ARGS = ("-x", "-q", "-m", "not e2e", "-p", "no:cacheprovider", "-rf")
BASELINE = "(none: baseline)"


@dataclass(frozen=True, slots=True)
class Outcome:
    """One suite run with one check disabled (or none, for the baseline).

    `state`: "FAILED" (some test failed: the mutation was caught), "passed", or "ERROR" (pytest
    could not run the tests: an import or collection error, which proves nothing)."""

    check: str
    reason_name: str
    state: str
    detail: str  # the first failing test, or the last line of an error
    seconds: float


def _reports_nothing(facts: object) -> Iterator[dict[str, object]]:
    return iter(())


def disable(name: str) -> None:
    """Replace the named check in the validator's registry by one that reports nothing."""
    from solver import validate

    if name not in {c.name for c in validate.CHECKS}:
        raise SystemExit(f"no validator check named {name!r}")
    validate.CHECKS = tuple(
        dataclasses.replace(c, find=_reports_nothing) if c.name == name else c for c in validate.CHECKS
    )


def reason_names() -> dict[str, str]:
    """Each check's name -> the name of its reason constant in solver/validate.py."""
    from solver import validate

    constants = {v: k for k, v in vars(validate).items() if k.isupper() and isinstance(v, str)}
    return {c.name: constants.get(c.reason, "?") for c in validate.CHECKS}


def run_one(check: str, suite: Sequence[str]) -> Outcome:
    """The suite in a subprocess with `check` disabled (BASELINE: nothing disabled)."""
    args = [sys.executable, "-m", "tests.validator_mutations"]
    if check != BASELINE:
        args += ["--disable", check]
    args += ["--pytest", *PYTEST_ARGS, *suite]
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": ""})
    seconds = time.perf_counter() - started
    failures = re.findall(r"^FAILED (.+?)(?: - .*)?$", done.stdout, flags=re.MULTILINE)
    if done.returncode == 0:
        state, detail = "passed", ""
    elif done.returncode == 1 and failures:
        state, detail = "FAILED", failures[0].split("/")[-1]
    else:
        lines = (done.stdout + done.stderr).strip().splitlines() or [""]
        state, detail = "ERROR", f"exit {done.returncode}: {lines[-1]}"
    return Outcome(check, reason_names().get(check, ""), state, detail, seconds)


def table(outcomes: Sequence[Outcome]) -> str:
    rows = [("check", "reason", "suite", "seconds", "first failing test")]
    for o in outcomes:
        rows.append((o.check, o.reason_name, o.state, f"{o.seconds:.1f}", o.detail))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r[:4], widths, strict=True)) + "  " + r[4] for r in rows
    )


def survivors(outcomes: Sequence[Outcome]) -> list[str]:
    """Problems: a baseline that does not pass, a run that errors, or a check whose removal
    leaves the suite green."""
    problems = [f"{o.check}: {o.state} ({o.detail})" for o in outcomes if o.state == "ERROR"]
    problems += [f"baseline {o.state} ({o.detail})" for o in outcomes if o.check == BASELINE and o.state == "FAILED"]
    problems += [f"{o.check}: suite passes without it" for o in outcomes if o.check != BASELINE and o.state == "passed"]
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=sorted(SUITES), default="quick")
    parser.add_argument("--only", nargs="+", metavar="CHECK", help="disable only these checks, one at a time")
    parser.add_argument("--disable", help=argparse.SUPPRESS)  # child: disable this check, then run pytest
    parser.add_argument("--pytest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.pytest is not None:
        import pytest

        if ns.disable:
            disable(ns.disable)
        return int(pytest.main(ns.pytest))
    from solver.validate import CHECKS

    checks = ns.only or [c.name for c in CHECKS]
    outcomes = []
    for check in [BASELINE, *checks]:
        outcomes.append(run_one(check, SUITES[ns.suite]))
        print(f"{check}: {outcomes[-1].state}", file=sys.stderr, flush=True)
    print(table(outcomes))
    problems = survivors(outcomes)
    for p in problems:
        print(f"PROBLEM: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
