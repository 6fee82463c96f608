"""The stateful loops that combine pure logic with I/O: the reconciler, acting on rollback
signals, the built-in evaluator loop, the Alertmanager webhook server and leader election.
"""
