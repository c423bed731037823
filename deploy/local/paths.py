"""Where the local control plane keeps its sources, builds and run-time state.

Everything built or downloaded lives under one cache root outside the repository
(``~/.cache/phalanx`` unless ``PHALANX_CACHE_DIR`` says otherwise), so a fresh work tree
reuses earlier builds and the repository never holds binaries.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "PHALANX_CACHE_DIR"
STATE_ENV = "PHALANX_STATE_DIR"
DEFAULT_CLUSTER_NAME = "phalanx"

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parents[1]
GO_SOURCES = PACKAGE_DIR / "go"
DEFAULT_CLUSTER_CONFIG = REPO_ROOT / "config" / "cluster.yaml"


def cache_root() -> Path:
    """Return the cache root, ``$PHALANX_CACHE_DIR`` or ``~/.cache/phalanx``."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "phalanx"


def bin_root() -> Path:
    """Return the folder holding one sub-folder of binaries per component version."""
    return cache_root() / "bin"


def state_dir(name: str = DEFAULT_CLUSTER_NAME, override: str | Path | None = None) -> Path:
    """Return a cluster's state folder: ``override``, ``$PHALANX_STATE_DIR`` or the default.

    The default is ``<cache root>/cluster/<name>``; the folder holds PKI, kubeconfigs, etcd data,
    component configs, logs and the ``state.json`` that records pids and ports.
    """
    if override is not None:
        return Path(override).expanduser().resolve()
    configured = os.environ.get(STATE_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    return cache_root() / "cluster" / name
