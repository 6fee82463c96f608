"""A pool whose Deployment name changed (an operator upgrade that names it differently, as
d85539b did for GPU product labels that normalising changes) leaves no Deployment behind
(issue 36): the pass makes the pool under its new name and deletes the old one."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mtp_operator.control.reconciler import Reconciler
from mtp_operator.settings import OperatorSettings
from support.fake_cluster import FakeKube, FakeView, mtpinference, node

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 8, 0, 0, tzinfo=UTC)
KEY = ("ml", "res")
PRODUCT = "NVIDIA_H200"  # not GFD's spelling: its pool name carries a hash suffix


def deployment_names(kube: FakeKube) -> list[str]:
    return sorted(name for kind, _, name in kube.objects if kind == "Deployment")


async def test_a_renamed_pool_leaves_no_deployment_behind() -> None:
    kube = FakeKube()
    view = FakeView(nodes=[node("n1", PRODUCT)])
    view.add(mtpinference("res", {"model": "org/model", "tensorParallelSize": 8}))
    await Reconciler(kube, view, OperatorSettings(), clock=lambda: T0).reconcile(KEY)
    (name,) = deployment_names(kube)
    assert name != "res-h200"  # today's name has the suffix
    # the pool as the operator before d85539b named it, and no Deployment of today's name
    old = kube.objects.pop(("Deployment", "ml", name))
    old["metadata"]["name"] = "res-h200"
    kube.objects[("Deployment", "ml", "res-h200")] = old
    view.deliver(kube, ready=True)
    kube.calls.clear()
    rec = Reconciler(kube, view, OperatorSettings(), clock=lambda: T0)  # the upgraded one
    await rec.reconcile(KEY)
    view.deliver(kube, ready=True)
    # a change of the pool (here a spec edit; a rollback's K alike) is written under the
    # pool's name of today
    view.add(mtpinference("res", {"model": "org/model", "tensorParallelSize": 8,
                                  "replicas": 2}, generation=2))
    for _ in range(3):
        await rec.reconcile(KEY)
        view.deliver(kube, ready=True)
    assert deployment_names(kube) == [name]
    assert ("delete_deployment", "res-h200") in kube.calls
    said = [m for _, reason, m, _ in kube.events if reason == "PoolRemoved"]
    assert said and "res-h200" in said[0] and name in said[0], said
