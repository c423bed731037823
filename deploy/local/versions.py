"""Pinned component versions of the local control plane.

The Kubernetes version decides the staging modules (``v0.<minor>.<patch>``). etcd is a 3.6
release, a server version Kubernetes 1.37 supports (its own go.mod pins the v3.7.0 client).
helm is not part of the control plane: it is built on demand for the chart tests.
"""

from __future__ import annotations

from typing import Final

KUBERNETES_VERSION: Final = "v1.37.2"
"""k8s.io/kubernetes release whose kube-apiserver and kube-scheduler we build."""

ETCD_VERSION: Final = "v3.6.8"
"""go.etcd.io/etcd/server/v3 release."""

KWOK_VERSION: Final = "v0.8.0"
"""sigs.k8s.io/kwok release; v0.8.0 is built against client-go v0.36."""

HELM_VERSION: Final = "v3.22.0"
"""helm.sh/helm/v3 release whose ``cmd/helm`` we build (charts/phalanx is linted and rendered
with it); deploy/local/go/helm/go.mod pins the same version."""


def staging_version(kubernetes_version: str = KUBERNETES_VERSION) -> str:
    """Return the staging-module version (``v1.37.2`` -> ``v0.37.2``)."""
    major, minor, patch = kubernetes_version.removeprefix("v").split(".")
    if major != "1":
        raise ValueError(f"unexpected Kubernetes version {kubernetes_version!r}")
    return f"v0.{minor}.{patch}"
