"""`make run` end to end: `python -m deploy.local run --once` on a cluster of its own, as a new
user runs it (kube-controller-manager and the JobSet controller make the samples' pods)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.local.paths import REPO_ROOT

pytestmark = pytest.mark.e2e


def test_make_run_places_the_samples_and_prints_each_gang(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    argv = [sys.executable, "-m", "deploy.local", "--name", "run-e2e", "--state-dir", str(tmp_path), "run", "--once"]
    done = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]
    rows = {m[0]: m[1:] for m in re.findall(r"^(\S+)\s+(\S+)\s+(\S+)\s+(.*)$", out, re.MULTILINE)}
    # the training JobSet: 8 workers of 8 GPUs, one per node, all in one rack, one gang
    workers = {k: v for k, v in rows.items() if k.startswith("llm-pretrain-workers-")}
    assert len(workers) == 8 and all(v[2] == "GPUs 0-7" for v in workers.values()), workers
    assert len({v[0] for v in workers.values()}) == 8 and len({v[1] for v in workers.values()}) == 1
    (rack,) = {v[1] for v in workers.values()}
    summary = rf"^JobSet/llm-pretrain\s+{rack}\s+bound 8 of 8 pending members on 1 block, 1 rack, 8 hosts \(.* ms\)$"
    assert re.search(summary, out, re.M), out
    # the fractional Deployment's 4 halves: packed. Each shares its GPU with another share (a
    # half, or a single-pod sample's: which depends on the order the pods come in), but for at
    # most one (five halves in all with the 0.5 sample: one may be alone); at most 3 GPUs.
    halves = [(v[0], v[2]) for k, v in rows.items() if k.startswith("chat-infer-")]
    assert len(halves) == 4 and all(d.endswith(": 0.5") for _, d in halves), halves
    shares: dict[tuple[str, str], int] = {}
    for node, _, devices in rows.values():
        for gpu in re.findall(r"GPU (\d+): [0-9.]+", devices):
            shares[(node, gpu)] = shares.get((node, gpu), 0) + 1
    on = [(node, d.split(":")[0].removeprefix("GPU ")) for node, d in halves]
    assert sum(1 for g in on if shares[g] < 2) <= 1 and len(set(on)) <= 3, (halves, shares)
    # the gang too big for any rack: nothing bound, and why
    assert re.search(r"^JobSet/too-big-for-a-rack\s+-\s+waiting \(0/12 bound.*one rack", out, re.M), out
    assert all(v[0] == "-" for k, v in rows.items() if k.startswith("too-big-for-a-rack-"))
    assert "cluster 'run-e2e' is down" in out
