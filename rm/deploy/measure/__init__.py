"""Measurements for plan deployment: per-thread RAVs and a NUMA node's bandwidth (I/O lives here, not in the planner)."""
