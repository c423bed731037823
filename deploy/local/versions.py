"""Pinned component versions of the local control plane.

The Kubernetes version decides the staging modules (``v0.<minor>.<patch>``); etcd follows the
version k8s.io/kubernetes pins in its go.mod, so the pair is the one upstream tests together.
"""

from __future__ import annotations

from typing import Final

KUBERNETES_VERSION: Final = "v1.36.3"
"""k8s.io/kubernetes release whose kube-apiserver and kube-scheduler we build."""

ETCD_VERSION: Final = "v3.6.8"
"""go.etcd.io/etcd/server/v3 release; the one k8s.io/kubernetes v1.36.3 requires."""

KWOK_VERSION: Final = "v0.8.0"
"""sigs.k8s.io/kwok release; v0.8.0 is built against client-go v0.36."""


def staging_version(kubernetes_version: str = KUBERNETES_VERSION) -> str:
    """Return the staging-module version (``v1.36.3`` -> ``v0.36.3``)."""
    major, minor, patch = kubernetes_version.removeprefix("v").split(".")
    if major != "1":
        raise ValueError(f"unexpected Kubernetes version {kubernetes_version!r}")
    return f"v0.{minor}.{patch}"
