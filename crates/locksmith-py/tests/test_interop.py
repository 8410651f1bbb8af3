"""locksmith and the Python clients of the same stores exclude each other
on the same lock names: redis-py's `Lock` and kazoo's `Lock`."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout

import locksmith
from conftest import url_of


def test_redis_py_lock_and_locksmith_exclude_each_other(stores, name):
    url = stores.url("redis")
    port = int(url.rsplit(":", 1)[1])
    theirs = redis.Redis(host="127.0.0.1", port=port).lock(name, timeout=30)
    ours = locksmith.connect(f"{url}?mode=simple")

    assert theirs.acquire(blocking=False)
    assert ours.lock(name).try_acquire() is None, "redis-py's lock keeps locksmith out"
    theirs.release()

    with ours.lock(name, wait=5.0) as guard:
        assert not theirs.acquire(blocking=False), "locksmith keeps redis-py out"
        assert guard.fencing_token > 0
    assert theirs.acquire(blocking=False)
    theirs.release()
    ours.close()


def test_kazoo_lock_and_locksmith_exclude_each_other(stores, name):
    url = url_of(stores, "zookeeper")
    hosts = url.removeprefix("zk://").split("/", 1)[0]
    chroot = "/" + url.removeprefix("zk://").split("/", 1)[1]
    zk = KazooClient(hosts=hosts)
    zk.start(timeout=30)
    # kazoo sees other clients' contenders once told their node names.
    theirs = zk.Lock(f"{chroot}/{name}", "kazoo", extra_lock_patterns=["-lock-"])
    ours = locksmith.connect(url)
    try:
        assert theirs.acquire(timeout=10)
        assert ours.lock(name).try_acquire() is None, "kazoo's lock keeps locksmith out"
        waiting = []
        waiter = threading.Thread(target=lambda: waiting.append(ours.lock(name).acquire(wait=20.0)))
        waiter.start()
        time.sleep(0.3)
        assert not waiting
        theirs.release()
        waiter.join(20)
        [guard] = waiting

        other = zk.Lock(f"{chroot}/{name}", "kazoo-2", extra_lock_patterns=["-lock-"])
        with pytest.raises(LockTimeout):
            other.acquire(timeout=0.5)
        guard.release()
        assert other.acquire(timeout=10), "free for kazoo once locksmith released"
        other.release()
    finally:
        ours.close()
        zk.stop()
