"""KWOK Stage objects, assembled at run time from the kwok module's own ``kustomize/stage``.

The standalone kwok controller ships no stages of its own: it reads them from ``--config``.
The ``kustomize/stage/fast`` set (node-fast, node-heartbeat-with-lease, pod-fast) makes nodes
Ready at once, keeps them heartbeating, runs bound pods immediately, completes Job pods and
finalises deletions. We follow each ``kustomization.yaml`` so the set matches upstream's and
concatenate the Stage documents into one multi-document file.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from deploy.local.versions import KWOK_VERSION

STAGE_SETS = ("fast",)
"""Stage kustomizations to load, relative to ``kustomize/stage`` in the kwok module."""


def kwok_module_dir(version: str = KWOK_VERSION) -> Path:
    """Return the kwok module's folder in the module cache, downloading it if needed."""
    gomodcache = subprocess.run(["go", "env", "GOMODCACHE"], check=True, capture_output=True, text=True).stdout.strip()
    cached = Path(gomodcache) / "sigs.k8s.io" / f"kwok@{version}"
    if cached.is_dir():
        return cached
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"sigs.k8s.io/kwok@{version}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return Path(json.loads(out)["Dir"])


def _stage_files(directory: Path) -> list[Path]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    files: list[Path] = []
    for resource in kustomization.get("resources", []):
        target = (directory / resource).resolve()
        files.extend(_stage_files(target) if target.is_dir() else [target])
    return files


def stage_documents(version: str = KWOK_VERSION, sets: tuple[str, ...] = STAGE_SETS) -> str:
    """Return the Stage objects of ``sets`` as one multi-document YAML string."""
    root = kwok_module_dir(version) / "kustomize" / "stage"
    documents = [path.read_text().strip() for name in sets for path in _stage_files(root / name)]
    return "\n---\n".join(documents) + "\n"


def write_stage_config(path: Path, version: str = KWOK_VERSION) -> Path:
    """Write the stage config file passed to kwok's ``--config``; return its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(stage_documents(version))
    return path
