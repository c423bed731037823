"""A real local Kubernetes control plane for Phalanx, built from Go modules.

No container engine or release download is available, so every component is compiled from
the Go module proxy and cached outside the repository (``~/.cache/phalanx``):

* etcd, kube-apiserver and kube-scheduler from small wrapper modules under ``go/``;
* KWOK from ``go install``; its stages come from the module cache at run time.

Fake GPU nodes described by ``config/cluster.yaml`` are plain Node objects with status; KWOK
keeps them Ready and runs the pods bound to them. The entry points are the ``python -m
deploy.local up|down|status`` CLI and :class:`deploy.local.cluster.LocalCluster`.
"""

from deploy.local.cluster import LocalCluster
from deploy.local.topology import ClusterSpec, load_cluster_spec

__all__ = ["ClusterSpec", "LocalCluster", "load_cluster_spec"]
