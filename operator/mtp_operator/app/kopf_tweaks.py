"""Two fixes for kopf's costs with many watched objects (found with kopf 1.45).

1. Start-up wake-ups (`apply`). At start-up kopf holds every handler back until every listed
object of every indexed kind is indexed: each object's worker waits on one ToggleSet (all per-
object toggles gone), and every drop of a toggle wakes every waiting worker (`notify_all`),
which re-acquire the condition one by one and re-check: O(n^2) wake-ups for n objects. With 300
MTPInferences (1,200 pool Deployments and pods) that was ~20 CPU-seconds of the restart. The
set's overall state changes once, so waking the waiters only when it changes is equivalent: a
waiter waits for the set's state (`ToggleSet.wait_for`), and single toggles still notify on
their own change.

2. Watch events without managedFields (`slim_watch_events`). Every listed or watched object
arrives with metadata.managedFields, the server-side apply field sets of each writer (ours
for the whole pod template, the controllers' for the status): about as large as the rest of
a pool Deployment. kopf keeps each event in the object's backlog until its worker has run,
and hands the body to every index and handler; nothing here or in kopf reads the field
sets. Dropping them where kopf's watch stream yields each event keeps every copy downstream
without them (the field itself still exists on the server, for every client that asks).
A kind may also be given a projection (handlers.WATCH_PROJECTIONS: pods keep only what the
pod index reads), applied at the same place.

3. Index-only kinds do not wait (`index_only_kinds_skip_the_gate`). The start-up gate of 1.
holds every listed object's worker (a task, its queue, the body and kopf's wrappers of it)
until every kind is indexed, so that handlers see whole indexes. An object of a kind with
indexes and no other handler (pods and Services here) has nothing to do after its indexing:
its worker drops its toggle as before and goes on at once, so its memory is freed while the
other kinds are still listed, instead of ~10,000 workers held at once at 1,000 resources.
The same holds for the listed objects (events without a type) of a kind whose handlers
ignore those while the start-up is under way (`listed`: pool Deployments, whose resources'
own listed events pass them once the gate opens; handlers.pool_changed).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

PATCHED = "_mtp_operator_patched"
# kopf's own ToggleSet methods, kept when the patch is installed (tests compare with them)
ORIGINALS: dict[str, Any] = {}


def _kopf_module(name: str, otherwise: str) -> ModuleType | None:
    """kopf's internal module `name`; None, with a warning saying `otherwise`, when it is gone."""
    try:
        return importlib.import_module(name)
    except ImportError:
        log.warning("kopf_tweaks: %s is gone; %s", name, otherwise)
        return None


def _mismatch(aiotoggles: ModuleType) -> str | None:
    """Why kopf's internals are not what the patch was written for (None: they are)."""
    cls = getattr(aiotoggles, "ToggleSet", None)
    toggle_cls = getattr(aiotoggles, "Toggle", None)
    if cls is None or toggle_cls is None:
        return "kopf._cogs.aiokits.aiotoggles has no ToggleSet/Toggle"
    wanted = ("make_toggle", "drop_toggle", "drop_toggles", "is_on")
    missing = [n for n in wanted if not hasattr(cls, n)]
    if missing:
        return f"ToggleSet lacks {', '.join(missing)}"
    try:
        probe = cls(all)
    except Exception as err:
        return f"ToggleSet(all) failed: {err!r}"
    if not hasattr(probe, "_condition") or not isinstance(getattr(probe, "_toggles", None), set):
        return "ToggleSet has no _condition or no _toggles set"
    if "condition" not in inspect.signature(toggle_cls).parameters:
        return "Toggle takes no condition"
    return None


def apply(aiotoggles: ModuleType | None = None) -> bool:
    """Patch kopf's ToggleSet (once); True when the patch is in place. A kopf whose
    internals differ is left alone, with a warning: the operator works, only its start-up
    with many objects is slower."""
    aiotoggles = aiotoggles or _kopf_module("kopf._cogs.aiokits.aiotoggles", "kopf left unpatched")
    if aiotoggles is None:
        return False
    cls = getattr(aiotoggles, "ToggleSet", None)
    if cls is not None and getattr(cls, PATCHED, False):
        return True
    why = _mismatch(aiotoggles)
    if why is not None:
        log.warning("kopf_tweaks: kopf internals changed (%s); kopf left unpatched", why)
        return False
    assert cls is not None
    toggle_cls = aiotoggles.Toggle
    originals = {n: getattr(cls, n) for n in ("make_toggle", "drop_toggle", "drop_toggles")}

    async def make_toggle(self: Any, __val: bool = False, *, name: str | None = None) -> Any:
        toggle = toggle_cls(__val, name=name, condition=self._condition)
        async with self._condition:
            before = self.is_on()
            self._toggles.add(toggle)
            if self.is_on() != before:
                self._condition.notify_all()
        return toggle

    async def drop_toggles(self: Any, toggles: Any) -> None:
        async with self._condition:
            before = self.is_on()
            self._toggles.difference_update(toggles)
            if self.is_on() != before:
                self._condition.notify_all()

    async def drop_toggle(self: Any, toggle: Any) -> None:
        await drop_toggles(self, [toggle])

    cls.make_toggle = make_toggle
    cls.drop_toggle = drop_toggle
    cls.drop_toggles = drop_toggles
    setattr(cls, PATCHED, True)
    if aiotoggles.__name__ == "kopf._cogs.aiokits.aiotoggles":
        ORIGINALS.update(originals)
    log.info("kopf_tweaks: ToggleSet wakes its waiters only when the set's state changes")
    return True


Projection = Callable[[dict[str, Any]], dict[str, Any]]
OBJECT_EVENTS = (None, "ADDED", "MODIFIED", "DELETED")  # None: kopf's listed objects


def _slim_event(item: Any, project: Projection | None) -> Any:
    """The event itself, its object without metadata.managedFields (in place: the event was
    parsed for kopf alone) and, for a kind with a projection, replaced by its projection;
    anything that is no object event (kopf's bookmarks, BOOKMARK events) as it is."""
    if not isinstance(item, dict) or item.get("type") not in OBJECT_EVENTS:
        return item
    obj = item.get("object")
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
        if project is not None:
            item["object"] = project(obj)
    return item


def _kind(resource: Any) -> tuple[str, str, str]:
    return (
        getattr(resource, "group", ""),
        getattr(resource, "version", ""),
        getattr(resource, "plural", ""),
    )


def slim_watch_events(
    watching: ModuleType | None = None,
    projections: Mapping[tuple[str, str, str], Projection] | None = None,
) -> bool:
    """Wrap kopf's `continuous_watch` so that the events it yields carry no managedFields,
    and objects of a kind in `projections` ((group, version, plural) -> function) only their
    projection; True when the wrapper is in place (a second call replaces the projections).
    A kopf whose watch module differs is left alone, with a warning: the operator works and
    holds more memory."""
    watching = watching or _kopf_module("kopf._cogs.clients.watching", "events kept whole")
    if watching is None:
        return False
    original = getattr(watching, "continuous_watch", None)
    if original is not None and getattr(original, PATCHED, False):
        original.projections = dict(projections or {})
        return True
    infinite = getattr(watching, "infinite_watch", None)
    if not inspect.isasyncgenfunction(original) or not inspect.isasyncgenfunction(infinite):
        why = "no continuous_watch/infinite_watch async generators"
    elif "continuous_watch" not in infinite.__code__.co_names:
        why = "infinite_watch does not call continuous_watch by its module name"
    else:
        why = None
    if why is not None:
        log.warning("kopf_tweaks: kopf internals changed (%s); events kept whole", why)
        return False

    async def continuous_watch(**kwargs: Any) -> AsyncIterator[Any]:
        project = continuous_watch.projections.get(_kind(kwargs.get("resource")))
        async with contextlib.aclosing(original(**kwargs)) as stream:
            async for item in stream:
                yield _slim_event(item, project)

    continuous_watch.projections = dict(projections or {})  # type: ignore[attr-defined]
    setattr(continuous_watch, PATCHED, True)
    continuous_watch.__wrapped__ = original  # type: ignore[attr-defined]
    watching.continuous_watch = continuous_watch
    log.info("kopf_tweaks: watch events are handed on without metadata.managedFields")
    return True


AFTER_THE_GATE = ("_watching", "_spawning", "_changing")  # registries of handlers that wait


class _DropsWithoutWaiting:
    """kopf's operator-wide ToggleSet for one object of an index-only kind: the object's
    toggle is dropped as kopf would, and waiting for the other kinds returns at once."""

    def __init__(self, toggles: Any) -> None:
        self._toggles = toggles

    async def drop_toggle(self, toggle: Any) -> None:
        await self._toggles.drop_toggle(toggle)

    async def wait_for(self, value: bool) -> None:
        return None


def index_only(registry: Any, resource: Any) -> bool:
    """True when `resource` has no handler that runs after kopf's start-up gate (only
    indexes); False too when the registry is not what this was written for (the gate kept)."""
    try:
        return not any(getattr(registry, name).has_handlers(resource) for name in AFTER_THE_GATE)
    except AttributeError:
        return False


def index_only_kinds_skip_the_gate(
    processing: ModuleType | None = None,
    listed: Iterable[tuple[str, str, str]] = (),
) -> bool:
    """Wrap kopf's `process_resource_event` so that objects of index-only kinds, and listed
    objects of the kinds in `listed` ((group, version, plural)), do not wait at the start-up
    gate; True when the wrapper is in place (a second call replaces `listed`). A kopf whose
    processing differs is left alone, with a warning: the operator works and holds more
    memory at start-up."""
    processing = processing or _kopf_module("kopf._core.reactor.processing", "the gate kept")
    if processing is None:
        return False
    original = getattr(processing, "process_resource_event", None)
    if original is not None and getattr(original, PATCHED, False):
        original.listed = frozenset(listed)
        return True
    wanted = {"registry", "resource", "operator_indexed", "resource_indexed"}
    params = set(inspect.signature(original).parameters) if callable(original) else set()
    if not inspect.iscoroutinefunction(original) or not wanted <= params:
        log.warning("kopf_tweaks: kopf internals changed (process_resource_event takes no "
                    "%s); the gate kept", ", ".join(sorted(wanted - params)) or "coroutine")
        return False
    verdicts: dict[tuple[str, str, str], bool] = {}

    async def process_resource_event(**kwargs: Any) -> Any:
        gate = kwargs.get("operator_indexed")
        if gate is not None:
            kind = _kind(kwargs.get("resource"))
            if kind not in verdicts:
                verdicts[kind] = index_only(kwargs.get("registry"), kwargs.get("resource"))
            raw = kwargs.get("raw_event")
            listed_event = isinstance(raw, Mapping) and raw.get("type") is None
            if verdicts[kind] or (listed_event and kind in process_resource_event.listed):
                kwargs["operator_indexed"] = _DropsWithoutWaiting(gate)
        return await original(**kwargs)

    process_resource_event.listed = frozenset(listed)  # type: ignore[attr-defined]
    setattr(process_resource_event, PATCHED, True)
    process_resource_event.__wrapped__ = original  # type: ignore[attr-defined]
    processing.process_resource_event = process_resource_event
    log.info("kopf_tweaks: objects of index-only kinds skip the start-up gate")
    return True
