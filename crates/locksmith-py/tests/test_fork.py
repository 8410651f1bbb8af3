"""fork while other threads are inside locksmith calls.

A forked child has only the thread that forked: a lock that another thread
of the parent held at the fork stays held in the child for ever. The child
must never wait on one, so `memory://` tables, whose locks the parent's
threads take on every call, are new in the child (see docs/python.md,
"fork"). Nor are the process-wide registries of the cleanups that cancelled Redis
and etcd acquires leave behind (which inspection waits for), and an object
the child inherited is forgotten when dropped there, never touching the
parent's connections. These tests fork while threads keep taking those
locks, so that some forks land while one is held.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
import traceback
import warnings

import pytest

import locksmith

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")

# Forks per test. Before the fix about a third of the forks hung while these
# threads ran (the listing one holds the table's lock for most of each call),
# so that 25 forks all came through had a chance under 1 in 10,000.
FORKS = 25
# How long the children may take, all together, once the last was forked;
# each needs a few milliseconds (a store's, some tens).
CHILDREN_DEADLINE = 10.0
# How long one child may live: it is killed (SIGALRM) when this passes, a
# hang that the parent reports as one.
CHILD_TIMEOUT = 8
HELD = 300


class Threads:
    """Threads that each repeat one piece of work until stopped; `stop`
    raises what any of them raised."""

    def _start(self, work) -> None:
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._threads = [threading.Thread(target=self._run, args=(w,)) for w in work]
        for thread in self._threads:
            thread.start()

    def _run(self, work) -> None:
        try:
            while not self._stop.is_set():
                work()
        except BaseException as error:  # reported by _join()
            self._errors.append(error)

    def _join(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


class Busy(Threads):
    """Threads that keep calling `memory://` (the table's lock) and
    connecting to it (the lock of the registry of tables), until stopped."""

    def __init__(self, url: str, name: str) -> None:
        self._url = url
        self._name = name
        self.client = locksmith.connect(url)
        # Many holders: listing them holds the table's lock for a while.
        self.held = [self.client.lock(f"{name}/{i}").acquire() for i in range(HELD)]
        self._start([self._listing, self._cycling, self._connecting])

    def _listing(self) -> None:
        assert len(self.client.list(self._name + "/")) >= HELD

    def _cycling(self) -> None:
        self.client.lock(f"{self._name}-cycle").acquire().release()

    def _connecting(self) -> None:
        locksmith.connect(self._url).close()

    def stop(self) -> None:
        self._join()
        for guard in self.held:
            guard.release()
        self.client.close()
        assert not self._errors, self._errors


def fork_while_busy(busy, child, forks: int = FORKS) -> None:
    """Forks `forks` children while `busy` runs, each running `child()` and
    exiting 0 if it returns, 1 if it raises (killed if it hangs past
    CHILD_TIMEOUT); then stops `busy` and waits for the children."""
    pids: list[int] = []
    try:
        with warnings.catch_warnings():
            # Python 3.12+ warns that forking a process with threads may
            # deadlock: that is the point here.
            warnings.simplefilter("ignore", DeprecationWarning)
            for _ in range(forks):
                pid = os.fork()
                if pid == 0:  # the child
                    # SIGALRM's default action ends the process, even one
                    # waiting for a lock for ever.
                    signal.alarm(CHILD_TIMEOUT)
                    code = 1
                    try:
                        child()
                        code = 0
                    except BaseException:
                        traceback.print_exc()
                    finally:
                        os._exit(code)
                pids.append(pid)
                time.sleep(0.005)  # the threads get back into their calls
    finally:
        # The threads stop before the wait, so that the children get the CPU.
        try:
            busy.stop()
        finally:
            wait_for_children(pids)


def wait_for_children(pids: list[int]) -> None:
    """Waits for every child, at most CHILDREN_DEADLINE; kills those left
    (hung) and fails naming them, and fails on a child that exited with an
    error."""
    deadline = time.monotonic() + CHILDREN_DEADLINE
    codes: dict[int, int] = {}
    while len(codes) < len(pids) and time.monotonic() < deadline:
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    left = [pid for pid in pids if pid not in codes]
    for pid in left:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    alarmed = [pid for pid, code in codes.items() if code == -signal.SIGALRM]
    hung = left + alarmed
    failed = [pid for pid, code in codes.items() if code not in (0, -signal.SIGALRM)]
    assert not hung, f"{len(hung)} of {len(pids)} forked children hung (killed)"
    assert not failed, f"{len(failed)} of {len(pids)} forked children failed"


@pytest.mark.parametrize("table", ["", "fork-tests"])
def test_a_child_forked_while_threads_use_a_memory_table_connects_to_a_new_one(name, table):
    url = f"memory://{table}"
    busy = Busy(url, name)
    parents = busy.held[0]

    def child() -> None:
        fresh = locksmith.connect(url)
        # A new, empty table: the parent's holders are not in it, so what the
        # parent holds is free here.
        assert fresh.status(parents.name) is None
        assert fresh.list(name + "/") == []
        fresh.lock(parents.name).acquire(wait=5.0).release()
        fresh.close()

    fork_while_busy(busy, child)


def test_the_parents_objects_stay_closed_in_a_child_forked_while_they_were_in_use(name):
    busy = Busy("memory://", name)
    inherited = {"lock": busy.client.lock(name + "/0"), "guard": busy.held[0]}

    def child() -> None:
        with pytest.raises(locksmith.Closed):
            inherited["lock"].try_acquire()
        with pytest.raises(locksmith.Closed):
            inherited["guard"].release()
        with pytest.raises(locksmith.Closed):
            busy.client.close()
        # Dropped in the child: forgotten, without touching the parent's
        # table (whose lock may be held for ever here) nor releasing.
        inherited.clear()
        busy.held.clear()
        busy.client = None
        gc.collect()
        with locksmith.connect("memory://") as fresh:
            fresh.lock(name + "/0").acquire(wait=5.0).release()

    fork_while_busy(busy, child)


class StoreBusy(Threads):
    """Threads that keep a store's cleanup paths busy in this process, on one
    client, until stopped: acquires that their wait cancels (each leaves its
    undo to a background task, which a process-wide registry tracks) and
    `status` / `list` (which wait for those undos, reading the registry)."""

    THREADS = 3

    def __init__(self, url: str, name: str) -> None:
        self.client = locksmith.connect(url, session_ttl=5.0)
        self.held = self.client.lock(name + "/held").acquire(wait=5.0)
        self._prefix = name + "/"
        self._start([self._cancelling, self._describing, self._listing] * self.THREADS)

    def _cancelling(self) -> None:
        try:
            self.client.lock(self.held.name).acquire(wait=0.002).release()
        except locksmith.Timeout:
            pass

    def _describing(self) -> None:
        assert self.client.status(self.held.name) is not None

    def _listing(self) -> None:
        self.client.list(self._prefix)

    def stop(self) -> None:
        self._join()
        self.held.release()
        self.client.close()
        assert not self._errors, self._errors


# Forks per store test: a child hangs only if the fork lands inside one of
# the registry's short critical sections, so more of them than for memory://.
STORE_FORKS = 60


@pytest.mark.parametrize("backend", ["redis", "etcd"])
def test_a_child_forked_while_threads_clean_up_after_cancelled_acquires_uses_a_new_client(
    stores, name, backend
):
    from conftest import url_of

    url = url_of(stores, backend)
    # Held until every child is done: the children find it held.
    blocker = locksmith.connect(url, session_ttl=5.0)
    blocked = blocker.lock(name + "/blocked").acquire(wait=5.0)
    busy = StoreBusy(url, name)

    def child() -> None:
        fresh = locksmith.connect(url, session_ttl=5.0)
        assert fresh.status(blocked.name) is not None
        # Cancelled by its wait: its undo goes to this process's registry,
        # which `status` and `list` then wait for.
        with pytest.raises(locksmith.Timeout):
            fresh.lock(blocked.name).acquire(wait=0.05)
        assert fresh.status(blocked.name).holders[0].fencing_token == blocked.fencing_token
        assert blocked.name in [info.name for info in fresh.list(name + "/")]
        fresh.close()

    try:
        fork_while_busy(busy, child, STORE_FORKS)
    finally:
        blocked.release()
        blocker.close()


def test_a_child_drops_an_election_observer_it_inherited(stores, name):
    """The observer's stream (an etcd watch, on the connection the parent's
    runtime keeps busy) is forgotten in the child, as its client is."""
    from conftest import url_of

    busy = StoreBusy(url_of(stores, "etcd"), name)
    election = busy.client.election(name + "/election")
    leading = election.campaign("parent", wait=5.0)
    inherited = {"observer": election.observe()}
    # Watching now: the first read subscribed it.
    assert next(inherited["observer"]).value == "parent"

    def child() -> None:
        with pytest.raises(locksmith.Closed):
            next(inherited["observer"])
        inherited.clear()
        gc.collect()

    fork_while_busy(busy, child, STORE_FORKS)
    del leading  # closing the client ended it
