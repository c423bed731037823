"""Phalanx extender: everything Kubernetes-facing around the pure `solver` package."""
