"""What Python adds: the GIL, signals, garbage collection and fork."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import locksmith
from conftest import python, url_of


@pytest.fixture(params=["memory", "server"])
def client(request, stores):
    client = locksmith.connect(url_of(stores, request.param))
    yield client
    client.close()


def test_other_threads_run_while_an_acquire_waits(client, name):
    holder = client.lock(name).acquire()
    waiting = threading.Thread(target=lambda: client.lock(name).acquire(wait=3.0).release())
    waiting.start()
    time.sleep(0.1)
    # The waiting thread is blocked in Rust; this thread counts meanwhile.
    counted, deadline = 0, time.monotonic() + 0.5
    while time.monotonic() < deadline:
        counted += 1
    assert waiting.is_alive(), "still waiting for the lock"
    assert counted > 100_000, f"only {counted} iterations in 0.5 s: the GIL was held"
    holder.release()
    waiting.join(10)
    assert not waiting.is_alive()


def test_ctrl_c_interrupts_a_blocked_acquire(stores, name):
    url = url_of(stores, "server")
    holder = locksmith.connect(url)
    guard = holder.lock(name).acquire()
    child = python(
        "-c",
        textwrap.dedent(
            f"""
            import locksmith, sys
            client = locksmith.connect({url!r})
            print("waiting", flush=True)
            try:
                client.lock({name!r}).acquire()
            except KeyboardInterrupt:
                print("interrupted", flush=True)
                sys.exit(0)
            print("acquired?!", flush=True)
            """
        ),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "waiting"
    time.sleep(0.5)
    child.send_signal(signal.SIGINT)
    assert child.stdout.readline().strip() == "interrupted"
    assert child.wait(10) == 0
    # The interrupted acquire left no waiter behind.
    deadline = time.monotonic() + 5
    while holder.status(name).waiters and time.monotonic() < deadline:
        time.sleep(0.05)
    assert holder.status(name).waiters == ()
    guard.release()
    holder.close()


def test_a_dropped_guard_is_released_in_the_background(client, name):
    client.lock(name).acquire()  # not kept: garbage at once
    gc.collect()
    client.lock(name).acquire(wait=5.0).release()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_cannot_use_the_parents_client(client, name):
    guard = client.lock(name).acquire()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            os.close(read)
            try:
                client.lock(name).try_acquire()
                answer = "used"
            except locksmith.Closed:
                answer = "closed"
            # A new client in the child works, and the parent's hold holds.
            fresh = locksmith.connect("memory://")
            fresh.lock("child").acquire().release()
            del guard  # forgotten, not released: the parent holds it
            os.write(write, answer.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        assert answer.read() == "closed"
    os.waitpid(pid, 0)
    assert client.lock(name).try_acquire() is None, "the parent still holds"
    guard.release()
