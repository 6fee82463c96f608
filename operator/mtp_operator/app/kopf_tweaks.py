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

import inspect
import logging
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

PATCHED = "_mtp_operator_patched"
# kopf's own ToggleSet methods, kept when the patch is installed (tests compare with them)
ORIGINALS: dict[str, Any] = {}


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
    if aiotoggles is None:
        try:
            from kopf._cogs.aiokits import aiotoggles
        except ImportError:
            log.warning("kopf_tweaks: kopf._cogs.aiokits.aiotoggles is gone; kopf left unpatched")
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
