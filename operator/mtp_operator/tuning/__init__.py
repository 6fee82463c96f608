"""Measured K: each pool finds the K that gives it the most output tokens per second.

Pure layer: `counters` (vLLM's counters over a window), `estimator` (measurements, the fitted
step cost, estimates for every candidate K) and `decision` (recommend, trial, adopt).
"""
