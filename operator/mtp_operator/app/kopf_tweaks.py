"""A fix for kopf's start-up cost with many watched objects (found with kopf 1.45).

At start-up kopf holds every handler back until every listed object of every indexed kind is
indexed: each object's worker waits on one ToggleSet (all per-object toggles gone), and every
drop of a toggle wakes every waiting worker (`notify_all`), which re-acquire the condition
one by one and re-check: O(n^2) wake-ups for n objects. With 300 MTPInferences (1,200 pool
Deployments and pods) that was ~20 CPU-seconds of the restart. The set's overall state
changes once, so waking the waiters only when it changes is equivalent: a waiter waits for
the set's state (`ToggleSet.wait_for`), and single toggles still notify on their own change.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

_APPLIED = False


def apply() -> None:
    """Patch kopf's ToggleSet once; a kopf without the expected internals is left alone."""
    global _APPLIED
    if _APPLIED:
        return
    try:
        from kopf._cogs.aiokits import aiotoggles
    except ImportError:  # pragma: no cover - kopf reorganised
        return
    cls = getattr(aiotoggles, "ToggleSet", None)
    toggle_cls = getattr(aiotoggles, "Toggle", None)
    if cls is None or toggle_cls is None or not hasattr(cls, "drop_toggles"):
        return  # pragma: no cover
    originals = {n: getattr(cls, n) for n in ("make_toggle", "drop_toggle", "drop_toggles")}

    def usable(ts: Any) -> bool:
        return hasattr(ts, "_condition") and isinstance(getattr(ts, "_toggles", None), set)

    async def make_toggle(self: Any, __val: bool = False, *, name: str | None = None) -> Any:
        if not usable(self):
            return await originals["make_toggle"](self, __val, name=name)
        toggle = toggle_cls(__val, name=name, condition=self._condition)
        async with self._condition:
            before = self.is_on()
            self._toggles.add(toggle)
            if self.is_on() != before:
                self._condition.notify_all()
        return toggle

    async def drop_toggles(self: Any, toggles: Any) -> None:
        if not usable(self):
            return await originals["drop_toggles"](self, toggles)
        async with self._condition:
            before = self.is_on()
            self._toggles.difference_update(toggles)
            if self.is_on() != before:
                self._condition.notify_all()

    async def drop_toggle(self: Any, toggle: Any) -> None:
        if not usable(self):
            return await originals["drop_toggle"](self, toggle)
        await drop_toggles(self, [toggle])

    cls.make_toggle = make_toggle
    cls.drop_toggle = drop_toggle
    cls.drop_toggles = drop_toggles
    _APPLIED = True
