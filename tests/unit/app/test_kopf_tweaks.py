"""kopf_tweaks: the patch is installed on kopf's own ToggleSet, it saves the wake-ups it is
for (counted, against kopf's unpatched methods), waiters are still released exactly when the
set's state changes, and a kopf whose internals differ is left alone with a warning."""

from __future__ import annotations

import asyncio
import logging
import types

import pytest
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.aiokits.aiotoggles import ToggleSet

from mtp_operator.app import kopf_tweaks

pytestmark = pytest.mark.unit

N = 60


class CountingCondition(asyncio.Condition):
    """An asyncio.Condition that counts how often a waiter wakes up."""

    wakeups = 0

    async def wait(self) -> bool:
        result = await super().wait()
        self.wakeups += 1
        return result


async def _start_up(make, drop) -> tuple[int, list[int]]:
    """N workers wait for a set of N toggles to be all gone (kopf's index pre-population);
    returns the wake-ups and the order of release."""
    ts = ToggleSet(all)
    ts._condition = CountingCondition()  # before any toggle takes the condition
    toggles = [await make(ts, name=str(i)) for i in range(N)]
    released: list[int] = []

    async def worker(i: int) -> None:
        await ts.wait_for(True)
        released.append(i)

    tasks = [asyncio.create_task(worker(i)) for i in range(N)]
    await asyncio.sleep(0)
    for toggle in toggles[:-1]:
        await drop(ts, toggle)
        await asyncio.sleep(0)  # let woken workers run and re-check
    await asyncio.sleep(0.01)
    assert released == [] and ts.is_off()  # nobody released while one toggle is left
    await drop(ts, toggles[-1])
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    return ts._condition.wakeups, released


def test_the_patch_is_installed_on_kopfs_toggleset() -> None:
    assert kopf_tweaks.apply() is True
    assert kopf_tweaks.apply() is True  # idempotent
    assert getattr(ToggleSet, kopf_tweaks.PATCHED) is True
    for name in ("make_toggle", "drop_toggle", "drop_toggles"):
        assert getattr(ToggleSet, name) is not kopf_tweaks.ORIGINALS[name], name
        assert kopf_tweaks.ORIGINALS[name].__module__ == "kopf._cogs.aiokits.aiotoggles"


def test_the_patch_saves_the_wake_ups() -> None:
    kopf_tweaks.apply()
    unpatched, _ = asyncio.run(
        _start_up(kopf_tweaks.ORIGINALS["make_toggle"], kopf_tweaks.ORIGINALS["drop_toggle"])
    )
    patched, released = asyncio.run(_start_up(ToggleSet.make_toggle, ToggleSet.drop_toggle))
    assert sorted(released) == list(range(N))
    # kopf's own: every drop wakes every waiter, N-1 useless rounds before the last one
    assert unpatched >= N * (N - 1)
    # patched: each waiter wakes once, when the set turns on
    assert patched == N


def test_waiters_of_off_are_released_when_a_toggle_turns_the_set_off() -> None:
    kopf_tweaks.apply()

    async def main() -> None:
        ts = ToggleSet(all)
        off = asyncio.create_task(ts.wait_for(False))
        await asyncio.sleep(0)
        assert not off.done()
        await ts.make_toggle(name="late")  # an off toggle: the set turns off
        await asyncio.wait_for(off, 5)

    asyncio.run(main())


def test_a_kopf_with_other_internals_is_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    class OtherToggleSet:  # a ToggleSet rewritten without the attributes the patch uses
        def __init__(self, fn) -> None:
            self.fn = fn

        async def make_toggle(self, *a, **kw): ...
        async def drop_toggle(self, toggle): ...
        async def drop_toggles(self, toggles): ...
        def is_on(self) -> bool: ...

    other = types.ModuleType("other_kopf_aiotoggles")
    other.ToggleSet = OtherToggleSet
    other.Toggle = aiotoggles.Toggle
    originals = dict(vars(OtherToggleSet))
    with caplog.at_level(logging.WARNING, logger=kopf_tweaks.__name__):
        assert kopf_tweaks.apply(other) is False
    assert "kopf internals changed (ToggleSet has no _condition or no _toggles set)" in caplog.text
    assert dict(vars(OtherToggleSet)) == originals  # nothing replaced


# --- watch events without managedFields -------------------------------------------------


def _deployment(name: str) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": "7",
            "labels": {"app": name},
            "managedFields": [{"manager": "mtp-operator", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {"replicas": 1},
    }


def _kopf_watch(monkeypatch, resource, listed: list, watched: list) -> list:
    """Run kopf's real infinite_watch -> continuous_watch chain once for `resource`: a
    listing of `listed`, then a watch stream of `watched` events ended by 410 Gone."""
    import kopf
    from kopf._cogs.clients import fetching, watching

    async def fetch_objs(**_):
        yield listed, "7"

    async def watch_objs(**_):
        for event in watched:
            yield event
        yield {"type": "ERROR", "object": {"code": 410}}

    monkeypatch.setattr(fetching, "fetch_objs", fetch_objs)
    monkeypatch.setattr(watching, "watch_objs", watch_objs)
    settings = kopf.OperatorSettings()
    settings.watching.reconnect_backoff = 0

    async def collect() -> list:
        return [
            e async for e in watching.infinite_watch(
                settings=settings, resource=resource, namespace=None, _iterations=1
            )
        ]

    return asyncio.run(collect())


def test_kopfs_own_watch_stream_yields_events_without_managed_fields(monkeypatch) -> None:
    """kopf's real infinite_watch -> continuous_watch chain, fed by a listing of two objects
    and a watch stream of one event (then 410 Gone, which ends the stream)."""
    from kopf._cogs.clients import watching
    from kopf._cogs.structs import references

    assert kopf_tweaks.slim_watch_events() is True
    assert kopf_tweaks.slim_watch_events() is True  # idempotent
    assert watching.continuous_watch.__wrapped__.__module__ == "kopf._cogs.clients.watching"

    resource = references.Resource("apps", "v1", "deployments", namespaced=True)
    events = _kopf_watch(
        monkeypatch, resource, [_deployment("a"), _deployment("b")],
        [{"type": "MODIFIED", "object": _deployment("c")}],
    )
    assert watching.Bookmark.LISTED in events  # kopf's bookmark passes as it is
    bodies = [e["object"] for e in events if isinstance(e, dict)]
    assert [b["metadata"]["name"] for b in bodies] == ["a", "b", "c"]
    for b in bodies:
        assert "managedFields" not in b["metadata"]
        # everything else is kept
        assert b["metadata"]["labels"] == {"app": b["metadata"]["name"]}
        assert b["metadata"]["uid"] == f"uid-{b['metadata']['name']}"
        assert b["spec"] == {"replicas": 1}


def test_closing_the_wrapped_stream_closes_kopfs_own() -> None:
    closed: list[bool] = []
    ns: dict = {"closed": closed}
    exec(
        "async def continuous_watch(**kw):\n"
        "    try:\n"
        "        for i in range(10):\n"
        "            yield {'type': 'ADDED', 'object': {'metadata': {'managedFields': [i]}}}\n"
        "    finally:\n"
        "        closed.append(True)\n"
        "async def infinite_watch(**kw):\n"
        "    async for e in continuous_watch(**kw):\n"
        "        yield e\n",
        ns,
    )
    fake = types.ModuleType("fake_kopf_watching")
    fake.continuous_watch, fake.infinite_watch = ns["continuous_watch"], ns["infinite_watch"]
    assert kopf_tweaks.slim_watch_events(fake) is True

    async def first_then_close() -> dict:
        stream = fake.continuous_watch()
        first = await stream.__anext__()
        await stream.aclose()
        return first

    first = asyncio.run(first_then_close())
    assert first == {"type": "ADDED", "object": {"metadata": {}}}
    assert closed == [True]


def test_a_kopf_whose_watch_differs_keeps_events_whole(caplog: pytest.LogCaptureFixture) -> None:
    async def continuous_watch(**_):
        yield {}

    async def infinite_watch(**_):  # calls nothing by the name continuous_watch
        yield {}

    other = types.ModuleType("other_kopf_watching")
    other.continuous_watch = continuous_watch
    other.infinite_watch = infinite_watch
    with caplog.at_level(logging.WARNING, logger=kopf_tweaks.__name__):
        assert kopf_tweaks.slim_watch_events(other) is False
    assert "infinite_watch does not call continuous_watch by its module name" in caplog.text
    assert other.continuous_watch is continuous_watch


def test_a_kind_with_a_projection_keeps_only_its_projection(monkeypatch) -> None:
    """Pods pass through handlers.WATCH_PROJECTIONS on kopf's real chain; Deployments,
    which have none, keep everything but managedFields."""
    from kopf._cogs.structs import references

    from mtp_operator.app import handlers

    def pod(name: str) -> dict:
        body = _deployment(name)
        body.update(kind="Pod", apiVersion="v1")
        body["spec"] = {"containers": [{"name": "vllm", "image": "x", "env": [{"name": "A"}]}]}
        body["status"] = {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "vllm", "ready": True}],
        }
        return body

    assert kopf_tweaks.slim_watch_events(projections=handlers.WATCH_PROJECTIONS) is True
    pods = references.Resource("", "v1", "pods", namespaced=True)
    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "8"}}}
    events = _kopf_watch(
        monkeypatch, pods, [pod("a")], [bookmark, {"type": "MODIFIED", "object": pod("b")}]
    )
    events = [e for e in events if isinstance(e, dict)]
    # BOOKMARK events pass as they came (kopf skips them; no projection of a non-object)
    assert events[1] == {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "8"}}}
    for event in (events[0], events[2]):
        body = event["object"]
        assert set(body) == {"apiVersion", "kind", "metadata", "status"}
        assert set(body["status"]) == {"phase", "podIP", "conditions"}
        assert "managedFields" not in body["metadata"]
        assert body["metadata"]["labels"] == {"app": body["metadata"]["name"]}
    kopf_tweaks.slim_watch_events()  # projections back to none for the other tests


# ---- index-only kinds skip the start-up gate -----------------------------------------------


def _kopf_processing_world():
    """kopf's own registry, indexers and memories with a pod index (an index-only kind) and a
    Deployment event handler (a kind that waits at the gate), as kopf's running.py builds
    them; returns (call, pod index, handled Deployments)."""
    import kopf
    from kopf._cogs.structs.ephemera import Memo
    from kopf._cogs.structs.references import Resource
    from kopf._core.engines.indexing import OperatorIndexers
    from kopf._core.reactor import processing
    from kopf._core.reactor.inventory import ResourceMemories

    registry = kopf.OperatorRegistry()
    handled: list[str] = []

    @kopf.index("v1", "pods", id="pods", registry=registry)
    async def pods(name: str, **_) -> dict:
        return {name: True}

    @kopf.on.event("apps", "v1", "deployments", registry=registry)
    async def deployments(name: str, **_) -> None:
        handled.append(name)

    indexers = OperatorIndexers()
    indexers.ensure(registry._indexing.get_all_handlers())
    settings = kopf.OperatorSettings()
    memories = ResourceMemories()
    kinds = {
        "pods": Resource("", "v1", "pods", namespaced=True),
        "deployments": Resource("apps", "v1", "deployments", namespaced=True),
    }

    async def call(kind: str, name: str, gate: ToggleSet, toggle, type_: str | None = None) -> None:
        raw = {"type": type_, "object": {"apiVersion": "v1", "kind": kind, "metadata": {
            "name": name, "namespace": "ns", "uid": f"uid-{name}"}}}
        await processing.process_resource_event(
            lifecycle=kopf.lifecycles.all_at_once, indexers=indexers, registry=registry,
            settings=settings, memories=memories, memobase=Memo(), resource=kinds[kind],
            raw_event=raw, event_queue=asyncio.Queue(), operator_indexed=gate,
            resource_indexed=toggle, no_throttling=True,
        )

    return call, indexers["pods"].index, handled


@pytest.fixture
def gate_skipped(monkeypatch: pytest.MonkeyPatch):
    from kopf._core.reactor import processing

    monkeypatch.setattr(processing, "process_resource_event", processing.process_resource_event)
    assert kopf_tweaks.index_only_kinds_skip_the_gate()
    return processing


def test_an_index_only_kinds_object_goes_on_while_other_kinds_are_listed(gate_skipped) -> None:
    """A pod (indexes only) is indexed, drops its toggle and returns although another kind is
    still listing; a Deployment (an event handler) waits until every toggle is gone, then its
    handler runs."""

    async def scenario() -> None:
        call, pod_index, handled = _kopf_processing_world()
        gate = ToggleSet(all)
        listing = await gate.make_toggle(name="deployments still listing")
        pod_toggle = await gate.make_toggle(name="pod")
        await asyncio.wait_for(call("pods", "p1", gate, pod_toggle), 2)
        assert "p1" in pod_index and pod_toggle not in gate._toggles
        dep_toggle = await gate.make_toggle(name="deployment")
        waiting = asyncio.create_task(call("deployments", "d1", gate, dep_toggle))
        await asyncio.sleep(0.05)
        assert not waiting.done() and handled == []
        await gate.drop_toggle(listing)
        await asyncio.wait_for(waiting, 2)
        assert handled == ["d1"]

    asyncio.run(scenario())


def test_listed_objects_of_a_listed_kind_go_on_while_other_kinds_are_listed(monkeypatch) -> None:
    """With Deployments among `listed`, a listed Deployment (an event without a type) is
    indexed and handed to its handler without waiting for the other kinds; a watched change
    (MODIFIED) of the same kind still waits for the gate."""
    from kopf._core.reactor import processing

    monkeypatch.setattr(processing, "process_resource_event", processing.process_resource_event)
    assert kopf_tweaks.index_only_kinds_skip_the_gate(listed=[("apps", "v1", "deployments")])

    async def scenario() -> None:
        call, _pod_index, handled = _kopf_processing_world()
        gate = ToggleSet(all)
        listing = await gate.make_toggle(name="pods still listing")
        toggle = await gate.make_toggle(name="d1")
        await asyncio.wait_for(call("deployments", "d1", gate, toggle), 2)
        assert handled == ["d1"] and toggle not in gate._toggles
        toggle = await gate.make_toggle(name="d2")
        waiting = asyncio.create_task(call("deployments", "d2", gate, toggle, "MODIFIED"))
        await asyncio.sleep(0.05)
        assert not waiting.done() and handled == ["d1"]
        await gate.drop_toggle(listing)
        await asyncio.wait_for(waiting, 2)
        assert handled == ["d1", "d2"]

    try:
        asyncio.run(scenario())
    finally:
        kopf_tweaks.index_only_kinds_skip_the_gate()  # `listed` back to none


def test_a_listed_pool_before_the_first_index_brings_no_pass() -> None:
    """handlers.pool_changed ignores a listed pool Deployment while the first full index is
    not done (it may run before kopf's gate: LISTED_WITHOUT_THE_GATE); its resource's own
    listed event passes it. Once the view is bound, a listed pool is handled as any event."""
    import kopf

    from mtp_operator.app import handlers

    class Recorder:
        def __init__(self) -> None:
            self.passes: list[tuple[str, str]] = []

        def pool_seen(self, key, body) -> None:
            pass

        def pool_news(self, key, body) -> bool:
            return True

        async def reconcile_or_retry(self, key) -> None:
            self.passes.append(key)

    registry = kopf.OperatorRegistry()
    view = handlers.KopfView()
    rec = Recorder()
    handlers.register(registry, rec, view)  # type: ignore[arg-type]
    fn = next(
        h.fn for h in registry._watching.get_all_handlers() if h.fn.__name__ == "pool_changed"
    )
    body = {"metadata": {"name": "res-h100", "namespace": "ml", "ownerReferences": [
        {"kind": "MTPInference", "apiVersion": "mtp-operator.io/v1alpha1", "name": "res"}]}}
    indexes = {name: {} for name in ("mtpi_index", "gpu_node_index", "pool_deployment_index",
                                      "pool_lws_index", "service_index", "pool_pod_index",
                                      "canary_pod_index", "claim_index")}
    asyncio.run(fn(event={"type": None, "object": body}, body=body, **indexes))
    assert rec.passes == [] and not view.ready
    asyncio.run(fn(event={"type": "MODIFIED", "object": body}, body=body, **indexes))
    assert rec.passes == [("ml", "res")] and view.ready
    asyncio.run(fn(event={"type": None, "object": body}, body=body, **indexes))
    assert rec.passes == [("ml", "res")] * 2


def test_without_the_wrapper_kopf_holds_the_pod_at_the_gate(monkeypatch) -> None:
    """The same pod against kopf's own process_resource_event waits for the other kind: what
    the wrapper saves (this fails if kopf stops holding index-only kinds, making it moot)."""
    from kopf._core.reactor import processing

    original = getattr(processing.process_resource_event, "__wrapped__",
                       processing.process_resource_event)
    monkeypatch.setattr(processing, "process_resource_event", original)

    async def scenario() -> None:
        call, pod_index, _ = _kopf_processing_world()
        gate = ToggleSet(all)
        listing = await gate.make_toggle(name="deployments still listing")
        waiting = asyncio.create_task(call("pods", "p1", gate, await gate.make_toggle()))
        await asyncio.sleep(0.05)
        assert not waiting.done() and "p1" in pod_index
        await gate.drop_toggle(listing)
        await asyncio.wait_for(waiting, 2)

    asyncio.run(scenario())


def test_a_kopf_whose_processing_differs_keeps_the_gate(caplog: pytest.LogCaptureFixture) -> None:
    async def process_resource_event(*, raw_event, resource) -> None:  # no gate arguments
        return None

    fake = types.SimpleNamespace(process_resource_event=process_resource_event)
    with caplog.at_level(logging.WARNING):
        assert not kopf_tweaks.index_only_kinds_skip_the_gate(fake)  # type: ignore[arg-type]
    assert fake.process_resource_event is process_resource_event
    assert "the gate kept" in caplog.text and "operator_indexed" in caplog.text
