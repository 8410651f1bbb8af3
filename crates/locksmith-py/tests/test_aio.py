"""The asyncio API on every backend (each test runs its own event loop)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import locksmith
import locksmith.aio


def run(test):
    """Runs `test(client)` in an event loop with an asyncio client of `url`."""

    def runner(url, name):
        async def main():
            async with await locksmith.aio.connect(url, session_ttl=5.0) as client:
                await test(client, name)

        asyncio.run(main())

    runner.__name__ = test.__name__
    return runner


@run
async def test_async_with_excludes_and_tokens_increase(client, name):
    async with client.lock(name, wait=5.0) as guard:
        first = guard.fencing_token
        assert await client.lock(name).try_acquire() is None
        with pytest.raises(locksmith.Timeout):
            await client.lock(name).acquire(wait=0.2)
        guard.raise_if_lost()
    second = await client.lock(name).acquire(wait=5.0)
    assert second.fencing_token > first
    await second.release()
    with pytest.raises(locksmith.NotHeld):
        await second.release()


@run
async def test_waiters_are_woken_in_turn(client, name):
    holder = await client.lock(name).acquire()
    waiters = [asyncio.ensure_future(client.lock(name).acquire(wait=20.0)) for _ in range(3)]
    await asyncio.sleep(0.3)
    assert not any(waiter.done() for waiter in waiters)
    await holder.release()
    tokens, pending = [], set(waiters)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            guard = task.result()
            tokens.append(guard.fencing_token)
            await guard.release()
    assert len(set(tokens)) == 3 and min(tokens) > holder.fencing_token


@run
async def test_a_cancelled_acquire_leaves_nothing_behind(client, name):
    holder = await client.lock(name).acquire()
    waiter = asyncio.ensure_future(client.lock(name).acquire())
    await asyncio.sleep(0.3)
    waiter.cancel("no longer needed")
    # The task waits on what the pending call gave it, and the message of
    # its cancel comes through as an asyncio future's would.
    with pytest.raises(asyncio.CancelledError, match="no longer needed"):
        await waiter
    await holder.release()
    # The cancelled acquire's queue entry goes in the background, at once.
    again = await client.lock(name).acquire(wait=5.0)
    await again.release()


@run
async def test_the_loop_runs_other_work_while_a_call_waits(client, name):
    # A pending call may wait in the loop's place while the loop is idle:
    # timers, other tasks and callbacks from other threads still run, and
    # the call still completes when it can.
    holder = await client.lock(name).acquire()
    waiter = asyncio.ensure_future(client.lock(name).acquire(wait=20.0))
    loop = asyncio.get_running_loop()

    async def tick(times):
        for _ in range(times):
            await asyncio.sleep(0.01)

    await asyncio.wait_for(tick(5), 10.0)
    called = asyncio.Event()  # awaited with no timer: only the thread ends it
    threading.Thread(target=loop.call_soon_threadsafe, args=(called.set,)).start()
    await called.wait()
    assert not waiter.done()
    await holder.release()
    guard = await waiter
    assert guard.fencing_token > holder.fencing_token
    await guard.release()


@run
async def test_calls_are_coroutines_that_run_when_awaited(client, name):
    lock = client.lock(name)
    unawaited = lock.acquire()
    assert asyncio.iscoroutine(unawaited)
    unawaited.close()  # never awaited: nothing was asked of the store
    assert await client.status(name) is None
    guard = await asyncio.create_task(lock.acquire())
    with pytest.raises(RuntimeError):
        await asyncio.gather(unawaited)
    assert (await client.status(name)).holders[0].fencing_token == guard.fencing_token
    await guard.release()


def test_an_awaitable_steps_like_a_coroutine():
    """Stepped by hand (`send`, `__next__`, `throw`) as a coroutine is, and
    made only by the API's calls."""

    async def main():
        async with await locksmith.aio.connect("memory://") as client:
            lock = client.lock("stepped")
            acquiring = lock.acquire()
            with pytest.raises(TypeError):
                type(acquiring)()
            with pytest.raises(StopIteration) as stopped:
                acquiring.__await__().send(None)  # memory:// answers in one step
            guard = stopped.value.value
            assert (await client.status("stepped")).holders[0].fencing_token == guard.fencing_token
            with pytest.raises(StopIteration) as stopped:
                next(guard.release().__await__())
            assert stopped.value.value is None
            assert await client.status("stepped") is None
            miscalled = lock.acquire()
            with pytest.raises(TypeError):
                miscalled.throw()  # no error to raise: nothing changes
            guard = await miscalled
            await guard.release()
            thrown = lock.acquire()
            with pytest.raises(KeyError):
                thrown.throw(KeyError("thrown in"))
            assert await client.status("stepped") is None  # thrown before a step
            with pytest.raises(RuntimeError):
                await thrown

    asyncio.run(main())


@run
async def test_calls_without_a_value_return_none(client, name):
    guard = await client.lock(name, lease=30.0).acquire()
    assert await guard.extend(60.0) is None
    assert await guard.release() is None
    held = await client.lock(name).acquire()
    assert await client.force_release(name) is None
    assert await asyncio.wait_for(held.lost(), 15.0) is not None


@run
async def test_a_cancelled_extend_keeps_the_hold(client, name):
    guard = await client.lock(name, lease=30.0).acquire()
    extending = asyncio.ensure_future(guard.extend(60.0))
    await asyncio.sleep(0)  # the extend starts (on memory:// it ends too)
    extending.cancel()
    try:
        await extending
    except asyncio.CancelledError:
        pass
    assert guard.hold_count == 1
    assert (await client.status(name)) is not None
    await guard.release()


@run
async def test_lost_is_awaitable_and_calls_back_on_the_loop(client, name):
    guard = await client.lock(name, lease=1.0).acquire()
    loop = asyncio.get_running_loop()
    called = loop.create_future()
    guard.on_lost(
        lambda cause, reason: called.set_result((cause, reason, threading.get_ident()))
    )
    reason = await asyncio.wait_for(guard.lost(), 15)
    cause, called_reason, thread = await asyncio.wait_for(called, 10)
    assert called_reason == reason
    assert thread == threading.get_ident(), "the callback ran off the loop's thread"
    assert isinstance(cause, locksmith.LostCause)
    assert guard.lost_cause == cause
    with pytest.raises(locksmith.Lost):
        guard.raise_if_lost()


@run
async def test_on_lost_is_not_called_after_a_release(client, name):
    guard = await client.lock(name).acquire()
    calls = []
    watches = set(locksmith.aio._loss_watches)
    guard.on_lost(lambda cause, reason: calls.append(cause))
    guard.on_lost(lambda cause, reason: calls.append(cause))
    assert len(locksmith.aio._loss_watches - watches) == 2
    await guard.release()

    async def watches_end():
        while locksmith.aio._loss_watches - watches:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(watches_end(), 10)
    assert calls == []


@run
async def test_read_write_lock_and_semaphore(client, name):
    rw = client.rw_lock(name)
    async with rw.read() as first, rw.read(wait=5.0) as second:
        assert await rw.write().try_acquire() is None
        assert first.fencing_token > 0 and second.fencing_token > 0
    async with rw.write(wait=5.0):
        assert await rw.read().try_acquire() is None
    permits = [await client.semaphore(f"{name}/s", 2).acquire(wait=5.0) for _ in range(2)]
    assert await client.semaphore(f"{name}/s", 2).try_acquire() is None
    for permit in permits:
        await permit.release()


@run
async def test_one_lock_object_entered_by_two_tasks_exits_each_its_own(client, name):
    """Each task's exit releases the hold its own `async with` took, in
    whatever order the tasks leave their blocks."""
    semaphore = client.semaphore(name, 2)
    first_in, second_in, first_may_leave = asyncio.Event(), asyncio.Event(), asyncio.Event()
    tokens = {}

    async def first():
        async with semaphore as guard:
            tokens["first"] = guard.fencing_token
            first_in.set()
            await first_may_leave.wait()

    async def second():
        await first_in.wait()
        async with semaphore as guard:
            tokens["second"] = guard.fencing_token
            second_in.set()
            await asyncio.sleep(0)
            first_may_leave.set()
            await first_task
            info = await client.status(name)
            assert [holder.fencing_token for holder in info.holders] == [guard.fencing_token]

    first_task = asyncio.ensure_future(first())
    await asyncio.wait_for(second(), 10)
    assert tokens["first"] != tokens["second"]
    info = await client.status(name)
    assert info is None or not info.holders


@run
async def test_nested_blocks_and_a_task_started_inside_one_exit_their_own(client, name):
    """Blocks of one lock object nest; a task started inside a block
    (which inherits the block's context) enters and exits its own."""
    semaphore = client.semaphore(name, 3)

    async def holders():
        info = await client.status(name)
        return sorted(holder.fencing_token for holder in info.holders) if info else []

    async with semaphore as outer:
        async with semaphore as inner:
            assert await holders() == sorted([outer.fencing_token, inner.fencing_token])

            async def child():
                async with semaphore as own:
                    assert len(await holders()) == 3
                return own.fencing_token

            await asyncio.wait_for(asyncio.ensure_future(child()), 10)
            assert await holders() == sorted([outer.fencing_token, inner.fencing_token])
        assert await holders() == [outer.fencing_token]
    assert await holders() == []


@run
async def test_multi_lock_and_status(client, name):
    async with client.multi_lock([f"{name}/a", f"{name}/b"], owner="both") as both:
        info = await client.status(f"{name}/a")
        assert [holder.owner for holder in info.holders] == ["both"]
        assert len(both.fencing_tokens) == 2
        assert {lock.name for lock in await client.list(name)} >= {f"{name}/a", f"{name}/b"}


@run
async def test_election(client, name):
    election = client.election(name)
    observer = election.observe()
    assert await observer.__anext__() is None
    async with await election.campaign("node-1", wait=5.0) as leading:
        assert (await election.leader()).value == "node-1"
        assert (await observer.__anext__()).value == "node-1"
        with pytest.raises(locksmith.Timeout):
            await client.election(name).campaign("node-2", wait=0.3)
        assert leading.fencing_token > 0
    assert await observer.__anext__() is None


def test_blocking_and_asyncio_clients_share_a_store(stores, name):
    from conftest import url_of

    url = url_of(stores, "server")
    blocking = locksmith.connect(url)

    async def main():
        client = await locksmith.aio.connect(url)
        held = blocking.lock(name).acquire()
        started = time.monotonic()
        waiting = asyncio.ensure_future(client.lock(name).acquire(wait=10.0))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        held.release()
        guard = await waiting
        assert guard.fencing_token > held.fencing_token
        assert time.monotonic() - started < 10
        await guard.release()
        await client.close()

    asyncio.run(main())
    blocking.close()


def test_async_with_exits_only_what_its_own_task_entered(name):
    """A task that ends inside `async with` (its exit never runs) leaves
    its hold to its guard; a later task at the same address (CPython reuses
    a freed task's memory for the next one) exits nothing of it."""

    async def main():
        client = await locksmith.aio.connect("memory://")
        lock = client.lock(name)
        event_loop = asyncio.get_running_loop()

        async def enter_only():
            return await lock.__aenter__()

        async def exit_only():
            return await lock.__aexit__(None, None, None)

        for _ in range(20):
            entering = event_loop.create_task(enter_only())
            guard = await entering
            await asyncio.sleep(0)  # the loop lets go of the task
            address = id(entering)
            exiting = exit_only()
            del entering  # freed: the next task may take its address
            exiting = event_loop.create_task(exiting)
            assert await exiting is False
            if id(exiting) == address:
                assert guard.hold_count == 1
                info = await client.status(name)
                assert info.holders[0].fencing_token == guard.fencing_token
                await guard.release()
                await client.close()
                return
            await guard.release()
        pytest.fail("no new task took the address of the one that ended")

    asyncio.run(main())


def test_loops_in_two_threads_are_each_woken(stores, name):
    """Waits that end on a runtime thread wake the event loop that awaits
    them, each loop in its own thread, at the same time."""
    from conftest import url_of

    url = url_of(stores, "server")
    tokens = []

    def waiter(lock_name):
        async def main():
            async with await locksmith.aio.connect(url) as client:
                for _ in range(20):
                    async with client.lock(lock_name, wait=10.0) as guard:
                        tokens.append(guard.fencing_token)

        asyncio.run(main())

    threads = [threading.Thread(target=waiter, args=(f"{name}/{n}",)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(tokens) == 40
