"""Workload policies (phalanx.io/v1alpha1 WorkloadPolicy): `spec` parses one, `evaluate` applies them."""
