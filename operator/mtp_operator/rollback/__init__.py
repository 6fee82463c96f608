"""Alert-driven rollback of a pool's speculative settings, as pure logic: signals, policy,
per-pool state, the evaluator's maths, Alertmanager payload parsing and the shipped rules.

Everything in this package is pure (no I/O, no clock: time is an argument); acting on a
decision (status, Events, the Deployment) is `mtp_operator.control.rollback`.
"""
