"""A namespace acted on from the alert webhook must have opted in (issue 36, what one token
may do): the label mtp-operator.io/alert-rollback=enabled on the Namespace, read through
adapters/namespaces.NamespaceOptIn (a GET, kept a few seconds) and checked by
control/rollback.RollbackActions for webhook alerts only."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from mtp_operator.adapters.namespaces import OPT_IN_CACHE_SECONDS, NamespaceOptIn
from mtp_operator.control.reconciler import Reconciler
from mtp_operator.control.rollback import RollbackActions
from mtp_operator.naming import LABEL_ALERT_ROLLBACK
from mtp_operator.rollback.signals import AlertSignal, PoolRef
from mtp_operator.settings import OperatorSettings
from support.fake_cluster import FakeKube, FakeView, api_error, mtpinference, node

pytestmark = pytest.mark.unit

H100 = "NVIDIA-H100-80GB-HBM3"


class Labels:
    """Stands in for KubeClient.namespace_labels: counts the reads."""

    def __init__(self, namespaces: Mapping[str, Mapping[str, str]]) -> None:
        self.namespaces = dict(namespaces)
        self.reads: list[str] = []
        self.fail: Exception | None = None

    async def __call__(self, name: str) -> Mapping[str, str] | None:
        self.reads.append(name)
        if self.fail is not None:
            raise self.fail
        return self.namespaces.get(name)


class Tick:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


async def test_only_the_enabled_label_opts_a_namespace_in() -> None:
    labels = Labels({
        "in": {LABEL_ALERT_ROLLBACK: "enabled"},
        "off": {LABEL_ALERT_ROLLBACK: "disabled"},
        "case": {LABEL_ALERT_ROLLBACK: "Enabled"},
        "other": {"team": "ml"},
        "bare": {},
    })
    opted = NamespaceOptIn(labels, clock=Tick())
    assert [await opted(ns) for ns in ("in", "off", "case", "other", "bare", "gone")] == [
        True, False, False, False, False, False]  # "gone": 404, no such namespace


async def test_an_answer_is_kept_for_a_few_seconds_then_read_again() -> None:
    labels, tick = Labels({"ml": {}}), Tick()
    opted = NamespaceOptIn(labels, clock=tick)
    assert not await opted("ml")
    labels.namespaces["ml"] = {LABEL_ALERT_ROLLBACK: "enabled"}
    tick.t += OPT_IN_CACHE_SECONDS - 1
    assert not await opted("ml") and labels.reads == ["ml"]  # from the cache
    tick.t += 2
    assert await opted("ml") and labels.reads == ["ml", "ml"]
    # and a label taken off is seen as quickly
    labels.namespaces["ml"] = {}
    tick.t += OPT_IN_CACHE_SECONDS + 1
    assert not await opted("ml")
    assert OPT_IN_CACHE_SECONDS <= 10


async def test_a_failed_read_is_not_an_answer() -> None:
    # the API server away or forbidding the read: the error reaches the request (a 500,
    # Alertmanager retries) and nothing is cached
    labels, tick = Labels({"ml": {LABEL_ALERT_ROLLBACK: "enabled"}}), Tick()
    opted = NamespaceOptIn(labels, clock=tick)
    labels.fail = api_error(403, "namespaces \"ml\" is forbidden")
    with pytest.raises(Exception, match="forbidden"):
        await opted("ml")
    labels.fail = None
    assert await opted("ml") and labels.reads == ["ml", "ml"]


async def test_the_cache_is_bounded() -> None:
    labels, tick = Labels({}), Tick()
    opted = NamespaceOptIn(labels, clock=tick, max_entries=3)
    for i in range(10):
        await opted(f"ns{i}")
    assert len(opted._answers) == 3


# ---- RollbackActions: webhook alerts for a namespace that has not opted in ----------------


async def actions_for(namespaces: dict[str, Mapping[str, str]]):
    kube = FakeKube()
    view = FakeView(nodes=[node("n0", H100), node("n1", H100)])
    for ns in ("ml", "web"):
        view.add(mtpinference("res", {"model": "org/model", "tensorParallelSize": 8,
                                      "rollback": {"cooldownSeconds": 0}}, namespace=ns))
    reconciler = Reconciler(kube, view, OperatorSettings())
    for ns in ("ml", "web"):
        await reconciler.reconcile((ns, "res"))
    view.deliver(kube, ready=True)
    kube.calls.clear()
    kube.events.clear()
    labels = Labels(namespaces)
    actions = RollbackActions(kube, view, reconciler,
                              namespace_opted_in=NamespaceOptIn(labels, clock=Tick()))
    return kube, labels, actions


def alert(namespace: str, via: str = "alertmanager", name: str = "res") -> AlertSignal:
    return AlertSignal("MTPHitRateLow", "firing", PoolRef(namespace, name, H100), 0.6, 0.88,
                       via)  # type: ignore[arg-type]


async def test_a_webhook_alert_for_a_namespace_not_opted_in_is_ignored_and_counted() -> None:
    kube, labels, actions = await actions_for({"ml": {LABEL_ALERT_ROLLBACK: "enabled"},
                                               "web": {}})
    outcome = await actions.apply_signals([alert("web"), alert("web"), alert("ml")])
    assert outcome.rolled_back == 1 and outcome.unchanged == 0
    assert outcome.ignored == {"namespace_not_opted_in": 2}
    # only the opted-in namespace's pool was written, each namespace read once
    assert [c for c in kube.calls if c[0] == "patch_status"] == [("patch_status", "res")]
    assert kube.statuses[("ml", "res")]["rollbacks"]
    assert not kube.statuses[("web", "res")].get("rollbacks")
    assert sorted(labels.reads) == ["ml", "web"]


async def test_the_evaluator_needs_no_opt_in() -> None:
    # its signals come from the operator's own scrapes, not from a token holder
    _kube, labels, actions = await actions_for({})
    outcome = await actions.apply_signals([alert("web", via="evaluator")])
    assert (outcome.rolled_back, outcome.ignored) == (1, {})
    assert labels.reads == []


async def test_an_unknown_resource_costs_no_namespace_read() -> None:
    # anyone with the token may name any namespace: no read is made for one that holds no
    # resource the operator knows (unknown_target, as before)
    kube, labels, actions = await actions_for({})
    outcome = await actions.apply_signals([alert("elsewhere"), alert("web", name="nope")])
    assert len(outcome.unknown) == 2 and outcome.ignored == {}
    assert labels.reads == [] and kube.calls == []
