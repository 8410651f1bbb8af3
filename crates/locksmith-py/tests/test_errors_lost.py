"""`Lost` carries why the hold was lost: its `cause` on the checked release,
on the exit of `with` and `async with`, and on a leadership's resign, as the
guard's own `lost_cause` says."""

from __future__ import annotations

import asyncio

import pytest

import locksmith
import locksmith.aio
from conftest import BACKENDS, url_of

# The stores where an operator's release reaches the holder as such.
FORCE_RELEASED_ON = ["memory", "server"]


@pytest.fixture(params=FORCE_RELEASED_ON)
def url(request, stores) -> str:
    return url_of(stores, request.param)


@pytest.fixture
def clients(url):
    """A holder and an operator, closed after the test."""
    holder = locksmith.connect(url, session_ttl=5.0)
    operator = locksmith.connect(url, session_ttl=5.0)
    yield holder, operator
    for client in (holder, operator):
        try:
            client.close()
        except locksmith.Error:
            pass


def taken_away(operator: locksmith.Client, hold: locksmith.Guard | locksmith.Leadership) -> str:
    """Force-releases the hold and waits until its holder sees it lost."""
    operator.force_release(hold.name)
    reason = hold.lost(timeout=30)
    assert reason is not None, "the hold was not lost within 30 s"
    assert hold.lost_cause is locksmith.LostCause.FORCE_RELEASED
    return reason


def test_release(clients, name):
    holder, operator = clients
    guard = holder.lock(name).acquire()
    reason = taken_away(operator, guard)
    with pytest.raises(locksmith.Lost) as raised:
        guard.release()
    assert raised.value.cause is locksmith.LostCause.FORCE_RELEASED
    assert raised.value.reason == reason


def test_with_exit(clients, name):
    holder, operator = clients
    with pytest.raises(locksmith.Lost) as raised:
        with holder.lock(name) as guard:
            taken_away(operator, guard)
    assert raised.value.cause is locksmith.LostCause.FORCE_RELEASED


def test_leadership_resign_and_with_exit(clients, name):
    holder, operator = clients
    leadership = holder.election(name).campaign("me")
    taken_away(operator, leadership)
    with pytest.raises(locksmith.Lost) as raised:
        leadership.resign()
    assert raised.value.cause is locksmith.LostCause.FORCE_RELEASED
    with pytest.raises(locksmith.Lost) as raised:
        with holder.election(name).campaign("me") as leadership:
            taken_away(operator, leadership)
    assert raised.value.cause is locksmith.LostCause.FORCE_RELEASED


async def taken_away_async(
    operator: locksmith.aio.Client, hold: locksmith.aio.Guard | locksmith.aio.Leadership
) -> None:
    await operator.force_release(hold.name)
    assert await asyncio.wait_for(hold.lost(), 30) is not None
    assert hold.lost_cause is locksmith.LostCause.FORCE_RELEASED


def test_async_release_and_exits(url, name):
    async def main() -> list[locksmith.Lost]:
        raised = []
        async with await locksmith.aio.connect(url) as holder, \
                await locksmith.aio.connect(url) as operator:
            guard = await holder.lock(name).acquire()
            await taken_away_async(operator, guard)
            try:
                await guard.release()
            except locksmith.Lost as lost:
                raised.append(lost)
            try:
                async with holder.lock(name) as guard:
                    await taken_away_async(operator, guard)
            except locksmith.Lost as lost:
                raised.append(lost)
            try:
                async with await holder.election(name).campaign("me") as leadership:
                    await taken_away_async(operator, leadership)
            except locksmith.Lost as lost:
                raised.append(lost)
        return raised

    raised = asyncio.run(main())
    assert [lost.cause for lost in raised] == [locksmith.LostCause.FORCE_RELEASED] * 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_release_says_the_cause_the_guard_says(stores, backend, name):
    """On every store, the checked release's `Lost` has the cause of the
    guard's loss, whatever the store makes of a force-release."""
    url = url_of(stores, backend)
    with locksmith.connect(url, session_ttl=5.0) as holder, \
            locksmith.connect(url, session_ttl=5.0) as operator:
        guard = holder.lock(name).acquire()
        operator.force_release(name)
        assert guard.lost(timeout=30) is not None, "the hold was not lost within 30 s"
        with pytest.raises(locksmith.Lost) as raised:
            guard.release()
        assert guard.lost_cause is not None
        assert raised.value.cause is guard.lost_cause
        assert raised.value.reason == guard.lost_reason
