"""The protocols of control/ports.py: the real adapters and the unit tests' fakes
(tests/support/fake_cluster.py) implement the same methods with the same parameters, so a
unit test over the fakes exercises the calls production makes; the reconcile core the tuner
is typed against (`ReconcileCore`) is the real reconciler (the tests use it, no fake)."""

from __future__ import annotations

import inspect

import pytest

from mtp_operator.adapters.kube import KubeClient
from mtp_operator.app.handlers import KopfView
from mtp_operator.control.ports import ClusterView, Kube, ReconcileCore
from mtp_operator.control.reconciler import Reconciler
from mtp_operator.settings import OperatorSettings
from support.fake_cluster import FakeKube, FakeView

pytestmark = pytest.mark.unit


def _members(protocol: type) -> list[str]:
    return [n for n in protocol.__dict__ if not n.startswith("_")]


@pytest.mark.parametrize(
    ("protocol", "real", "fake"),
    [(Kube, KubeClient, FakeKube), (ClusterView, KopfView, FakeView),
     (ReconcileCore, Reconciler, None)],
)
def test_real_and_fake_implement_the_protocol(
    protocol: type, real: type, fake: type | None
) -> None:
    names = _members(protocol)
    assert names, protocol
    for cls in (real, fake) if fake is not None else (real,):
        for name in names:
            want, got = getattr(protocol, name), getattr(cls, name, None)
            assert got is not None, f"{cls.__name__} lacks {name}"
            if isinstance(want, property):
                assert isinstance(got, property), f"{cls.__name__}.{name} is not a property"
                continue
            assert inspect.iscoroutinefunction(got) == inspect.iscoroutinefunction(want), name
            assert list(inspect.signature(got).parameters) == list(
                inspect.signature(want).parameters
            ), f"{cls.__name__}.{name}"


def test_instances_pass_the_runtime_check() -> None:
    assert isinstance(FakeKube(), Kube) and isinstance(FakeView(), ClusterView)
    assert isinstance(KopfView(), ClusterView)
    assert not isinstance(object(), Kube)
    reconciler = Reconciler(FakeKube(), FakeView(), OperatorSettings())
    assert isinstance(reconciler, ReconcileCore) and not isinstance(FakeView(), ReconcileCore)
