"""Phalanx benchmarks: each prints its figures, appends them to RESULTS.md, and ends with
one JSON line of headline figures."""
