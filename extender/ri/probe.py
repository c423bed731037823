"""Registration probe: every definition's jq is timed on pod-sized documents before it is accepted.

Static rules (`jqlint`) make every expression terminate, but not quickly: `[range(9999) as $a |
range(9999)]` is legal and takes minutes. So at registration all of a definition's expressions
run as one program (as the pod side runs them: one jq run per pod) on `PROBE_DOCS`, in a child
process (`probe_child`) that is killed past its deadline, since libjq cannot be interrupted. The
program must finish within `budget.budget_s(size)` of each document, in CPU time (a loaded node
must not reject a good definition), best of `REPEAT` runs. A program still running past its
wall-clock deadline (`DEADLINE_FACTOR` times its budget, plus start-up slack) is killed and
rejected. When the whole is over budget, each expression is timed alone to name the slow ones.

Documents: a realistic pod (shaped like the controllers' pods in benchmarks/ri_samples: labels,
annotations, owner references, managedFields, containers with env and resources; ~3 KB) and a
wide one (64 labels, 64 long annotations, 16 containers of 32 env variables; ~70 KB), so that
nested iteration over a pod's lists shows its cost. They serve as CR stand-ins too: a CR path
that finds nothing there costs little, which is what runs at registration can say about it.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extender.ri import jqx
from extender.ri.budget import budget_s
from extender.ri.model import Violation
from extender.ri.structure import Definition
from extender.ri.validate import all_expressions

REPEAT = 3
# A program is killed past DEADLINE_FACTOR times its budget (for all repeats on all documents),
# plus the child's start-up (~50 ms idle) and slack for a loaded node; ~1.7 s in all.
DEADLINE_FACTOR = 5
STARTUP_S = 1.0
CHILD = Path(__file__).resolve().parent / "probe_child.py"


def probe_pod(*, labels: int = 8, annotations: int = 4, containers: int = 1, env: int = 8) -> dict[str, Any]:
    """A pod as a training operator creates it, sized by its list lengths."""
    name = "probe-worker-0"
    base_labels = {
        "training.kubeflow.org/job-name": "probe",
        "training.kubeflow.org/replica-type": "worker",
        "training.kubeflow.org/replica-index": "0",
        "training.kubeflow.org/job-role": "worker",
        "jobset.sigs.k8s.io/jobset-name": "probe",
        "jobset.sigs.k8s.io/replicatedjob-name": "workers",
        "leaderworkerset.sigs.k8s.io/name": "probe",
        "leaderworkerset.sigs.k8s.io/group-index": "0",
        "leaderworkerset.sigs.k8s.io/worker-index": "0",
        "ray.io/cluster": "probe",
        "ray.io/node-type": "worker",
        "ray.io/group": "gpu",
        "component": "predictor",
        "serving.kserve.io/inferenceservice": "probe",
    }
    meta_labels = {**base_labels, **{f"example.com/label-{i}": f"value-{i}" for i in range(labels)}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": "0c0ffee0-0000-4000-8000-000000000001",
            "labels": meta_labels,
            "annotations": {f"example.com/note-{i}": "n" * 200 for i in range(annotations)},
            "ownerReferences": [
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": "probe",
                    "uid": "0c0ffee0-1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "training-operator",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {f"f:{k}": {} for k in meta_labels}},
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": f"main-{c}",
                    "image": "registry.example.com/ml/trainer:2024.05",
                    "command": ["torchrun", "--nnodes=8", "train.py"],
                    "env": [{"name": f"VAR_{i}", "value": f"value-{i}"} for i in range(env)],
                    "resources": {"limits": {"nvidia.com/gpu": "8", "cpu": "32", "memory": "256Gi"}},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
                for c in range(containers)
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "schedulerName": "default-scheduler",
        },
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False"}]},
    }


PROBE_DOCS: tuple[dict[str, Any], ...] = (
    probe_pod(),
    probe_pod(labels=64, annotations=64, containers=16, env=32),
)


@dataclass(frozen=True, slots=True)
class Timing:
    """Best seconds per probe document, or why there are none (`over`: killed past the deadline)."""

    seconds: tuple[float, ...] = ()
    over: bool = False
    error: str = ""


class _Child:
    """The probe child process, started on first use and again after it is killed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self.sizes = tuple(len(json.dumps(doc)) for doc in PROBE_DOCS)
        atexit.register(self.close)

    def time(self, programs: Sequence[str], limits: Sequence[float], deadline_s: float) -> list[Timing]:
        """Timings of `programs` in order; those after one that overran its deadline are not run."""
        with self._lock:
            proc = self._start()
            assert proc.stdin is not None
            proc.stdin.write(
                (json.dumps({"programs": list(programs), "limits": list(limits), "repeat": REPEAT}) + "\n").encode()
            )
            proc.stdin.flush()
            found: list[Timing] = []
            for _ in programs:
                line = self._line(proc, time.monotonic() + deadline_s)
                if line is None:
                    self._kill()
                    return [*found, Timing(over=True)]
                reply = json.loads(line)
                found.append(Timing(tuple(reply.get("seconds", ())), error=reply.get("error", "")))
            return found

    def _start(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, str(CHILD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
            )
            self._buffer = b""
            assert self._proc.stdin is not None
            self._proc.stdin.write((json.dumps(PROBE_DOCS) + "\n").encode())
            self._proc.stdin.flush()
        return self._proc

    def _line(self, proc: subprocess.Popen[bytes], deadline: float) -> bytes | None:
        assert proc.stdout is not None
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
                return None
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                if pipe is not None:
                    pipe.close()
            self._proc = None

    def close(self) -> None:
        with self._lock:
            self._kill()


_CHILD = _Child()
# Programs that passed: the same definition (the shipped ones at every start, a ConfigMap
# re-read) is not timed again. Bounded; cleared when full.
_PASSED: set[tuple[str, float]] = set()


def check(definition: Definition, *, share: float = 1.0) -> list[Violation]:
    """Violations for a valid definition whose jq overruns `share` of its budget on the probe documents."""
    expressions = [(path, text) for path, text, _ in all_expressions(definition)]
    if not expressions:
        return []
    limits = [share * budget_s(size) for size in _CHILD.sizes]
    deadline = DEADLINE_FACTOR * sum(limits) * REPEAT + STARTUP_S
    whole = "[" + ", ".join(_counted(text) for _, text in expressions) + "]"
    if (whole, share) in _PASSED:
        return []
    (timing,) = _CHILD.time([jqx.PRELUDE + whole], limits, deadline)
    if _within(timing, limits):
        if len(_PASSED) >= 1024:
            _PASSED.clear()
        _PASSED.add((whole, share))
        return []
    if len(expressions) == 1:
        return [Violation(expressions[0][0], _too_slow(timing, limits, expressions[0][1]))]
    alone = _CHILD.time([jqx.PRELUDE + _counted(text) for _, text in expressions], limits, deadline)
    found = [
        Violation(path, _too_slow(t, limits, text))
        for (path, text), t in zip(expressions, alone, strict=False)
        if not _within(t, limits)
    ]
    if found or len(alone) < len(expressions):
        return found
    return [Violation("", _too_slow(timing, limits, "the definition's expressions together"))]


def _counted(text: str) -> str:
    return f"([({text}\n)?] | length)"


def _within(timing: Timing, limits: list[float]) -> bool:
    return not timing.over and all(s <= limit for s, limit in zip(timing.seconds, limits, strict=False))


def _too_slow(timing: Timing, limits: list[float], what: str) -> str:
    small, wide = _CHILD.sizes[0], _CHILD.sizes[-1]
    budget = f"budget {limits[0] * 1000:.1f} ms on a {small}-byte pod, {limits[-1] * 1000:.1f} ms on a {wide}-byte one"
    if timing.over:
        return f"jq too slow: {what} did not finish in {DEADLINE_FACTOR}x its budget ({budget})"
    took = ", ".join(f"{s * 1000:.1f} ms" for s in timing.seconds)
    return f"jq too slow: {what} took {took} on the probe pods ({budget})"
