"""events.pool_messages: one Event per reason and pass, never a pool's message cut."""

from __future__ import annotations

from mtp_operator.events import MESSAGE_LIMIT, POOL_SEPARATOR, pool_messages


def test_the_pools_of_a_pass_share_one_message_in_order() -> None:
    assert pool_messages(["pool A: K=4", "pool B: K=6"]) == ["pool A: K=4; pool B: K=6"]
    assert pool_messages(["pool A: K=4"]) == ["pool A: K=4"]
    assert pool_messages([]) == []


def test_messages_that_do_not_fit_one_event_go_on_in_the_next() -> None:
    pools = [f"pool P{i}: " + "x" * 300 for i in range(7)]  # 308 characters each
    out = pool_messages(pools)
    # 3 fit in 1024 (3 x 308 + 2 separators = 928; a 4th would make 1238)
    assert [m.count("pool P") for m in out] == [3, 3, 1]
    assert all(len(m) <= MESSAGE_LIMIT for m in out)
    assert POOL_SEPARATOR.join(out) == POOL_SEPARATOR.join(pools)  # all of them, in order


def test_a_message_longer_than_the_limit_stands_alone_and_whole() -> None:
    long = "pool Z: " + "y" * (MESSAGE_LIMIT + 10)
    assert pool_messages(["pool A: K=1", long, "pool B: K=2"]) == [
        "pool A: K=1", long, "pool B: K=2"]
