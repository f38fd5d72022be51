"""The pure lock table: grants, FIFO queues, fences, expiry and a new coordinator's take-over."""

from __future__ import annotations

import pytest

from node.errors import LockError
from node.locks.table import (
    WAITER_GRACE_S,
    LockFence,
    LockState,
    LockTable,
    Waiter,
    acquire,
    expire,
    release,
    renew,
    take_over,
)


def test_a_free_lock_is_granted_with_a_fence_and_others_queue_in_order() -> None:
    table, a = acquire(LockTable(), 1, "train", "a", 10.0, True, 0.0)
    assert a.granted
    assert a.position == 0
    assert a.fence == LockFence(1, 1)
    table, b = acquire(table, 1, "train", "b", 10.0, True, 0.0)
    table, c = acquire(table, 1, "train", "c", 10.0, True, 0.0)
    assert (b.granted, b.position, c.position) == (False, 1, 2)
    table, d = acquire(table, 1, "train", "d", 10.0, False, 0.0)
    assert (d.granted, d.position) == (False, None)
    assert [w.holder for w in table.get("train").waiters] == ["b", "c"]


def test_release_passes_the_lock_to_the_first_waiter_under_a_newer_fence() -> None:
    table, a = acquire(LockTable(), 1, "l", "a", 10.0, True, 0.0)
    table, _ = acquire(table, 1, "l", "b", 10.0, True, 0.0)
    table, _ = acquire(table, 1, "l", "c", 10.0, True, 0.0)
    table = release(table, 1, "l", "a", a.fence, 1.0)
    state = table.get("l")
    assert state.holder == "b"
    assert a.fence is not None
    assert state.fence is not None
    assert state.fence > a.fence
    assert state.expires_at == 11.0
    assert [w.holder for w in state.waiters] == ["c"]


def test_an_older_fence_is_refused_with_409() -> None:
    table, a = acquire(LockTable(), 1, "l", "a", 1.0, True, 0.0)
    table = expire(table, 1, 5.0)
    table, again = acquire(table, 1, "l", "a", 1.0, True, 5.0)
    assert again.fence is not None
    assert a.fence is not None
    assert again.fence > a.fence
    with pytest.raises(LockError) as caught:
        renew(table, 1, "l", "a", a.fence, 5.5)
    assert (caught.value.status, caught.value.code) == (409, "stale_lock_fence")
    with pytest.raises(LockError) as caught:
        release(table, 1, "l", "b", None, 5.5)
    assert caught.value.code == "not_holder"


def test_a_holder_that_stops_renewing_loses_the_lock_after_ttl() -> None:
    table, _ = acquire(LockTable(), 1, "l", "a", 2.0, True, 0.0)
    table, _ = acquire(table, 1, "l", "b", 2.0, True, 0.0)
    assert expire(table, 1, 1.9) is table
    table, _ = renew(table, 1, "l", "a", None, 1.9)
    assert expire(table, 1, 3.8).get("l").holder == "a"
    assert expire(table, 1, 3.9).get("l").holder == "b"


def test_a_lock_handed_over_by_lease_expiry_carries_a_strictly_larger_fence() -> None:
    table, a = acquire(LockTable(), 1, "l", "a", 2.0, True, 0.0)
    table, _ = acquire(table, 1, "l", "b", 2.0, True, 0.0)
    before = table.version
    table = expire(table, 1, 2.5)
    state = table.get("l")
    assert state.holder == "b"
    assert a.fence is not None
    assert state.fence is not None
    assert state.fence > a.fence
    assert state.fence == table.version > before
    with pytest.raises(LockError) as caught:
        renew(table, 1, "l", "a", a.fence, 2.6)
    assert caught.value.code == "not_holder"
    _, answer = renew(table, 1, "l", "b", state.fence, 2.6)
    assert answer.fence == state.fence


def test_a_lease_expiry_skips_a_waiter_whose_wait_expired_and_grants_a_larger_fence() -> None:
    table, a = acquire(LockTable(), 1, "l", "a", 20.0, True, 0.0)
    table, _ = acquire(table, 1, "l", "b", 1.0, True, 0.0)  # waits until WAITER_GRACE_S
    table, _ = acquire(table, 1, "l", "c", 1.0, True, 0.0)
    table, _ = acquire(table, 1, "l", "c", 1.0, True, 15.0)  # c asks again; b does not
    before = table.version
    table = expire(table, 1, 21.0)
    state = table.get("l")
    assert (state.holder, state.waiters) == ("c", ())
    assert a.fence is not None
    assert state.fence is not None
    assert state.fence > a.fence
    assert state.fence == table.version > before


def test_a_free_lock_whose_first_waiter_expired_is_granted_under_a_larger_fence() -> None:
    """A free lock with waiters (a table stored so, read back from the voters): once the first
    waiter's wait expires, the next one gets the lock under the fence of that change."""
    stored = LockTable(
        LockFence(1, 5),
        {
            "l": LockState(
                holder=None,
                fence=LockFence(1, 2),
                waiters=(Waiter("b", 1.0, 10.0), Waiter("c", 1.0, 30.0)),
            )
        },
    )
    table = LockTable.from_dict(stored.to_dict())
    assert expire(table, 1, 9.0) is table
    table = expire(table, 1, 11.0)
    state = table.get("l")
    assert (state.holder, state.waiters) == ("c", ())
    assert state.fence is not None
    assert state.fence > LockFence(1, 5)
    assert state.fence == table.version
    assert state.expires_at == 12.0


def test_a_waiter_that_stops_asking_leaves_the_queue() -> None:
    table, _ = acquire(LockTable(), 1, "l", "a", 100.0, True, 0.0)
    table, _ = acquire(table, 1, "l", "b", 1.0, True, 0.0)
    table, _ = acquire(table, 1, "l", "c", 1.0, True, 0.0)
    table, _ = acquire(table, 1, "l", "c", 1.0, True, 5.0)
    later = expire(table, 1, WAITER_GRACE_S + 1.0)
    assert [w.holder for w in later.get("l").waiters] == ["c"]


def test_fences_strictly_increase_across_a_take_over() -> None:
    table, a = acquire(LockTable(), 3, "l", "a", 1.0, True, 0.0)
    for _ in range(5):
        table, _ = renew(table, 3, "l", "a", a.fence, 0.5)
    moved = take_over(table, 4, 100.0)
    assert moved.version > table.version
    assert moved.version.term == 4
    assert moved.get("l").holder == "a"
    assert moved.get("l").expires_at == 101.0
    moved = release(moved, 4, "l", "a", a.fence, 100.5)
    moved, b = acquire(moved, 4, "l", "b", 1.0, True, 100.5)
    assert b.fence is not None
    assert a.fence is not None
    assert b.fence > a.fence
    with pytest.raises(LockError) as caught:
        acquire(moved, 3, "l", "c", 1.0, True, 101.0)
    assert caught.value.code == "stale_term"


def test_the_table_round_trips_through_json() -> None:
    table, _ = acquire(LockTable(), 2, "x", "a", 3.0, True, 1.0)
    table, _ = acquire(table, 2, "x", "b", 3.0, True, 1.0)
    assert LockTable.from_dict(table.to_dict()) == table
    with pytest.raises(LockError):
        LockTable.from_dict({"version": [1], "locks": {}})
    with pytest.raises(LockError):
        LockFence.parse([1, True])
