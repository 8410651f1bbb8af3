"""The lock model's behaviours through the blocking API, on every backend."""

from __future__ import annotations

import threading
import time

import pytest

import locksmith

from conftest import url_of


def test_exclusive_lock_excludes_and_tokens_increase(client, name):
    with client.lock(name, wait=5.0) as guard:
        first = guard.fencing_token
        assert guard.name == name
        assert client.lock(name).try_acquire() is None
        with pytest.raises(locksmith.Timeout) as timeout:
            client.lock(name, wait=0.2).acquire()
        assert timeout.value.wait == pytest.approx(0.2)
        assert isinstance(timeout.value, TimeoutError)
        guard.raise_if_lost()
    second = client.lock(name).acquire(wait=5.0)
    assert second.fencing_token > first
    second.release()


def test_wait_zero_tries_once(client, name):
    holder = client.lock(name).acquire()
    with pytest.raises(locksmith.Timeout):
        client.lock(name, wait=0).acquire()
    holder.release()
    client.lock(name, wait=0).acquire().release()


def test_waiter_gets_the_lock_when_it_is_released(client, name):
    holder = client.lock(name).acquire()
    got = []
    waiter = threading.Thread(target=lambda: got.append(client.lock(name).acquire(wait=20.0)))
    waiter.start()
    time.sleep(0.3)
    assert not got, "still held"
    holder.release()
    waiter.join(20)
    assert got and got[0].fencing_token > holder.fencing_token
    got[0].release()


def test_reentry_keeps_the_token(client, name):
    lock = client.lock(name, owner="worker-1")
    outer = lock.acquire()
    inner = lock.acquire()
    assert inner.fencing_token == outer.fencing_token
    assert outer.hold_count == 2
    inner.release()
    assert outer.hold_count == 1
    with pytest.raises(locksmith.AlreadyHeld):
        client.lock(name, owner="worker-1", reentrant=False).acquire()
    outer.release()


def test_release_twice_is_an_error(client, name):
    guard = client.lock(name).acquire()
    guard.release()
    with pytest.raises(locksmith.NotHeld):
        guard.release()
    assert guard.hold_count == 0


def test_with_block_releases_even_when_the_body_raises(client, name):
    with pytest.raises(RuntimeError):
        with client.lock(name) as guard:
            raise RuntimeError("boom")
    assert client.lock(name, wait=5.0).acquire() is not None
    assert "released" in repr(guard)


def test_one_lock_object_in_nested_with_blocks(client, name):
    lock = client.lock(name, owner="same")
    with lock as outer:
        with lock as inner:
            assert inner.fencing_token == outer.fencing_token
        assert outer.hold_count == 1
    assert lock.try_acquire() is not None


def test_read_write_lock(client, name):
    rw = client.rw_lock(name)
    reader_1 = rw.read().acquire()
    reader_2 = rw.read().acquire(wait=5.0)
    with pytest.raises(locksmith.Timeout):
        rw.write().acquire(wait=0.3)
    reader_1.release()
    reader_2.release()
    with rw.write(wait=5.0) as writer:
        assert writer.fencing_token > 0
        assert rw.read().try_acquire() is None


def test_semaphore_admits_its_permits(client, name):
    holds = [client.semaphore(name, 2).acquire(wait=5.0) for _ in range(2)]
    assert client.semaphore(name, 2).try_acquire() is None
    with pytest.raises(locksmith.Conflict) as conflict:
        client.semaphore(name, 3).acquire(wait=1.0)
    assert conflict.value.name == name
    holds.pop().release()
    client.semaphore(name, 2).acquire(wait=5.0).release()
    holds.pop().release()


def test_multi_lock_is_all_or_nothing(client, name):
    a, b = f"{name}/a", f"{name}/b"
    other = client.lock(b).acquire()
    with pytest.raises(locksmith.Timeout):
        client.multi_lock([a, b]).acquire(wait=0.5)
    # Nothing taken: the timed-out attempt gave back what it had (on some
    # stores in the background, at once).
    client.lock(a).acquire(wait=5.0).release()
    other.release()
    both = client.multi_lock([a, b]).acquire(wait=5.0)
    assert both.names == [a, b]
    assert len(both.fencing_tokens) == 2
    both.release()


def test_status_shows_the_holder_and_its_token(client, name):
    assert client.status(name) is None
    guard = client.lock(name, owner="inspected").acquire()
    info = client.status(name)
    assert info.name == name
    [holder] = info.holders
    assert holder.owner == "inspected"
    assert holder.mode == "exclusive"
    assert holder.fencing_token in (None, guard.fencing_token)
    assert name in [lock.name for lock in client.list(name)]
    guard.release()


def test_invalid_name_is_refused_before_any_io(client):
    with pytest.raises(locksmith.InvalidName) as refused:
        client.lock("a//b").acquire()
    assert isinstance(refused.value, ValueError)
    with pytest.raises(locksmith.InvalidArgument):
        client.lock("fine", lease=-1)


def test_lease_expiry_fires_lost(client, name):
    guard = client.lock(name, lease=1.0).acquire()
    assert 0 < guard.remaining_lease <= 1.0
    called = threading.Event()
    causes = []

    def on_lost(cause, reason):
        causes.append((cause, reason))
        called.set()

    guard.on_lost(on_lost)
    reason = guard.lost(timeout=15.0)
    assert reason is not None, "the lease ran out"
    assert guard.is_lost and guard.lost_reason == reason
    assert called.wait(10)
    assert isinstance(causes[0][0], locksmith.LostCause)
    with pytest.raises(locksmith.Lost) as lost:
        guard.raise_if_lost()
    assert lost.value.reason == reason
    # The lock is free again for the next holder.
    client.lock(name).acquire(wait=10.0).release()


def test_force_release_takes_the_lock_away(client, name):
    guard = client.lock(name).acquire()
    client.force_release(name)
    assert guard.lost(timeout=15.0) is not None
    with pytest.raises(locksmith.Lost):
        guard.raise_if_lost()


def test_release_before_loss_calls_no_callback(client, name):
    guard = client.lock(name).acquire()
    calls = []
    guard.on_lost(lambda cause, reason: calls.append(cause))
    guard.release()
    assert guard.lost() is None, "a released hold is not waited on"
    time.sleep(0.2)
    assert calls == []


def test_election(client, name):
    election = client.election(name)
    assert election.leader() is None
    observer = election.observe()
    assert next(observer) is None
    with election.campaign("node-1", wait=5.0) as leading:
        assert leading.value == "node-1"
        leader = election.leader()
        assert leader.value == "node-1"
        assert next(observer).value == "node-1"
        with pytest.raises(locksmith.Timeout):
            client.election(name).campaign("node-2", wait=0.3)
        leading.raise_if_lost()
    assert election.leader() is None
    assert next(observer) is None
    second = client.election(name).campaign("node-2", wait=5.0)
    assert second.fencing_token > leading.fencing_token
    second.resign()


def test_a_grant_no_replica_acknowledged_raises_unreplicated(stores, name):
    # A Redis without replicas, asked to wait for one: every grant goes
    # unacknowledged, is given back, and the acquire says so.
    url = f"{url_of(stores, 'redis')}?wait_replicas=1&wait_timeout=100ms"
    with locksmith.connect(url) as client:
        with pytest.raises(locksmith.Unreplicated) as refused:
            client.lock(name).acquire(wait=0)
    error = refused.value
    assert (error.name, error.acknowledged, error.asked) == (name, 0, 1)
    assert error.within == pytest.approx(0.1)
    assert error.given_back is True
    assert (error.lease, error.undo_failure) == (None, None)
    with locksmith.connect(url_of(stores, "redis")) as plain:
        assert plain.status(name) is None, "the grant was given back"
