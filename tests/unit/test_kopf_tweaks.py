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
