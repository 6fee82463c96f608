"""kopf_tweaks: kopf's ToggleSet wakes its waiters only when the set's state changes, and
they are still released exactly when it does (start-up index pre-population)."""

from __future__ import annotations

import asyncio

from kopf._cogs.aiokits.aiotoggles import ToggleSet

from mtp_operator.app import kopf_tweaks


def test_waiters_are_released_when_the_last_toggle_goes_and_not_before():
    kopf_tweaks.apply()

    async def main() -> None:
        ts = ToggleSet(all)
        toggles = [await ts.make_toggle(name=str(i)) for i in range(200)]
        assert ts.is_off()
        released: list[int] = []

        async def waiter(i: int) -> None:
            await ts.wait_for(True)
            released.append(i)

        tasks = [asyncio.create_task(waiter(i)) for i in range(200)]
        for toggle in toggles[:-1]:
            await ts.drop_toggle(toggle)
            await asyncio.sleep(0)
        await asyncio.sleep(0.01)
        assert released == [] and ts.is_off()
        await ts.drop_toggle(toggles[-1])
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert sorted(released) == list(range(200))
        # and back: a new off toggle turns the set off for a waiter of False
        off = asyncio.create_task(ts.wait_for(False))
        await asyncio.sleep(0)
        await ts.make_toggle(name="late")
        await asyncio.wait_for(off, 5)

    asyncio.run(main())
