"""Alert-driven rollback of a pool's speculative settings: rules, signals, policy, evaluator.

Everything in this package is pure (no I/O, no clock); the Kubernetes glue lives elsewhere.
"""
