"""Which exit of `with lock:` closes which block (the blocking API).

A block belongs to the generator (or coroutine) whose frame runs the `with`
statement, wherever it is resumed, closed or collected; else to the thread
that entered it. An exit that finds no block of its own closes the only one
open, or the only one whose thread has ended, or raises RuntimeError.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time

import pytest

import locksmith


def on_thread(function, *args):
    """Runs `function(*args)` on a new thread that has ended when this
    returns; its result, or its exception raised here."""
    outcome = {}

    def run():
        try:
            outcome["result"] = function(*args)
        except BaseException as error:  # noqa: BLE001 - re-raised below
            outcome["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def held_by_nobody(client, name, wait=5.0):
    """Whether another acquire gets `name` within `wait` seconds."""
    try:
        client.lock(name).acquire(wait=wait).release()
        return True
    except locksmith.Timeout:
        return False


@pytest.fixture
def memory():
    with locksmith.connect("memory://") as client:
        yield client


def test_a_generator_closed_on_another_thread_releases_its_hold(url, name):
    with locksmith.connect(url) as mine, locksmith.connect(url) as other:
        lock = mine.lock(name)

        def generator():
            with lock as guard:
                yield guard

        blocks = generator()
        guard = on_thread(next, blocks)  # entered on a thread that has ended
        blocks.close()  # exited here, on the main thread
        assert "released" in repr(guard)
        del blocks, guard
        gc.collect()
        assert held_by_nobody(other, name)


def test_a_generator_resumed_on_another_thread_releases_its_hold(memory, name):
    lock = memory.lock(name)

    def generator():
        with lock as guard:
            yield guard
        yield "exited"

    blocks = generator()
    guard = next(blocks)  # entered here
    assert on_thread(next, blocks) == "exited"  # exited on another thread
    assert "released" in repr(guard)
    assert held_by_nobody(memory, name, wait=0)


def test_a_generator_collected_on_another_thread_releases_its_hold(memory, name):
    lock = memory.lock(name)

    def generator():
        with lock:
            yield

    blocks = [generator()]
    next(blocks[0])
    on_thread(blocks.clear)  # collected there: its exit runs there
    assert held_by_nobody(memory, name)


def test_a_context_manager_exited_on_another_thread(memory, name):
    lock = memory.lock(name)

    @contextlib.contextmanager
    def locked():
        with lock as guard:
            yield guard

    manager = locked()
    guard = on_thread(manager.__enter__)
    assert guard.hold_count == 1
    manager.__exit__(None, None, None)
    assert "released" in repr(guard)
    assert held_by_nobody(memory, name, wait=0)


def test_interleaved_generators_each_release_their_own_hold(client, name):
    semaphore = client.semaphore(name, 3)

    def generator():
        with semaphore as guard:
            yield guard

    first, second = generator(), generator()
    first_guard, second_guard = next(first), next(second)
    first.close()  # the outer of the two blocks opened on this thread
    assert "released" in repr(first_guard)
    assert "released" not in repr(second_guard)
    assert second_guard.hold_count == 1
    # Two of the three permits are free again, not one.
    holds = [client.semaphore(name, 3).acquire(wait=5.0) for _ in range(2)]
    assert client.semaphore(name, 3).try_acquire() is None
    second.close()
    assert "released" in repr(second_guard)
    for hold in holds:
        hold.release()


def test_nested_blocks_of_a_semaphore_on_one_thread(memory, name):
    semaphore = memory.semaphore(name, 2)
    with semaphore as outer:
        with semaphore as inner:
            assert memory.semaphore(name, 2).try_acquire() is None
        assert "released" in repr(inner)
        assert "released" not in repr(outer)
    assert "released" in repr(outer)


def test_threads_sharing_one_lock_object_exclude_each_other(client, name):
    lock = client.lock(name, wait=30.0)
    inside = []
    overlaps = []
    tokens = []
    unreleased = []

    def work():
        for _ in range(5):
            with lock as guard:
                inside.append(guard)
                if len(inside) > 1:
                    overlaps.append(len(inside))
                tokens.append(guard.fencing_token)
                time.sleep(0.002)
                inside.remove(guard)
            if "released" not in repr(guard):
                unreleased.append(guard)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == []
    assert unreleased == []
    assert len(tokens) == 30
    assert tokens == sorted(tokens) and len(set(tokens)) == 30
    assert held_by_nobody(client, name)


def test_blocks_of_one_lock_object_in_threads_and_generators(memory, name):
    # Each thread and each generator exits its own block, in any order.
    semaphore = memory.semaphore(name, 4)
    entered, leave = threading.Barrier(3), threading.Event()
    guards = {}

    def in_thread(key):
        with semaphore as guard:
            guards[key] = guard
            entered.wait(timeout=30)
            leave.wait(timeout=30)

    def generator():
        with semaphore as guard:
            yield guard

    threads = [threading.Thread(target=in_thread, args=(key,), daemon=True) for key in "ab"]
    for thread in threads:
        thread.start()
    entered.wait(timeout=30)
    blocks = generator()
    in_generator = next(blocks)
    with semaphore as here:
        leave.set()
        for thread in threads:
            thread.join()
        assert all("released" in repr(guard) for guard in guards.values())
        assert "released" not in repr(in_generator)
    assert "released" in repr(here)
    assert "released" not in repr(in_generator)
    on_thread(blocks.close)
    assert "released" in repr(in_generator)


def test_an_exit_elsewhere_closes_the_only_open_block(memory, name):
    lock = memory.lock(name)
    stack = contextlib.ExitStack()
    guard = on_thread(stack.enter_context, lock)  # entered by hand there
    assert "released" not in repr(guard)
    stack.close()  # exited by hand here
    assert "released" in repr(guard)
    assert held_by_nobody(memory, name, wait=0)


def test_an_exit_elsewhere_closes_the_only_block_whose_thread_ended(memory, name):
    semaphore = memory.semaphore(name, 3)
    stack = contextlib.ExitStack()
    ended = on_thread(stack.enter_context, semaphore)
    entered, leave = threading.Event(), threading.Event()
    running = {}

    def hold():
        with semaphore as guard:
            running["guard"] = guard
            entered.set()
            leave.wait(timeout=30)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    entered.wait(timeout=30)
    stack.close()  # two blocks open, one of them of a thread that ended
    assert "released" in repr(ended)
    assert "released" not in repr(running["guard"])
    leave.set()
    thread.join()
    assert "released" in repr(running["guard"])


def test_an_exit_that_cannot_tell_which_block_raises(memory, name):
    semaphore = memory.semaphore(name, 3)
    entered, leave = threading.Barrier(3), threading.Event()
    guards = []

    def hold():
        with semaphore as guard:
            guards.append(guard)
            entered.wait(timeout=30)
            leave.wait(timeout=30)

    threads = [threading.Thread(target=hold, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    entered.wait(timeout=30)
    with pytest.raises(RuntimeError, match="exit a block on the thread that entered it"):
        semaphore.__exit__(None, None, None)
    assert not any("released" in repr(guard) for guard in guards)
    leave.set()
    for thread in threads:
        thread.join()
    assert all("released" in repr(guard) for guard in guards)
    with pytest.raises(RuntimeError, match="no `with` block of this lock is open"):
        semaphore.__exit__(None, None, None)


def test_a_block_left_open_by_an_ended_thread_holds_no_longer_than_its_guard(
    memory, name
):
    lock = memory.lock(name)
    guard = on_thread(lock.__enter__)  # never exited; the thread has ended
    assert memory.lock(name).try_acquire() is None
    del guard
    gc.collect()
    assert held_by_nobody(memory, name)
    # Its exit, were it to come now, has nothing left to release.
    with pytest.raises(RuntimeError, match="no `with` block"):
        lock.__exit__(None, None, None)


def test_a_block_left_open_by_an_ended_thread_keeps_its_hold_while_its_guard_lives(
    memory, name
):
    lock = memory.lock(name)
    guard = on_thread(lock.__enter__)
    gc.collect()
    time.sleep(0.1)
    assert "released" not in repr(guard)
    assert memory.lock(name).try_acquire() is None
    lock.__exit__(None, None, None)  # the only open block
    assert "released" in repr(guard)


def test_a_lock_collected_with_a_block_open_leaves_the_hold_to_its_guard(memory, name):
    lock = memory.lock(name)
    lock.__enter__()  # never exited, the guard dropped at once
    assert memory.lock(name).try_acquire() is None
    del lock
    gc.collect()
    assert held_by_nobody(memory, name)
