"""What Python adds: the GIL, signals, garbage collection and fork."""

from __future__ import annotations

import gc
import os
import queue
import signal
import select
import subprocess
import textwrap
import threading
import time

import pytest

import locksmith
from conftest import python, url_of, wait_until


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


class Lines:
    """The lines a child prints, each awaited at most `timeout` seconds: a
    child that stops answering fails the test (killed, with its stderr)
    instead of hanging it."""

    def __init__(self, child: subprocess.Popen) -> None:
        self._child = child
        self._lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._child.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def next(self, timeout: float, waiting_for: str) -> str:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            self.fail(f"no line from the child within {timeout} s, waiting for {waiting_for}")
        if line is None:
            self.fail(f"the child exited ({self._child.wait()}), waiting for {waiting_for}")
        return line

    def fail(self, message: str):
        self._child.kill()
        self._child.wait()
        pytest.fail(f"{message}; its stderr:\n{self._child.stderr.read()}")


def test_ctrl_c_interrupts_a_blocked_acquire(stores, name):
    url = url_of(stores, "server")
    with locksmith.connect(url) as holder:
        guard = holder.lock(name).acquire()
        # Python keeps SIGINT ignored in a process that starts with it
        # ignored, as everything run from a shell script's background job
        # does: Ctrl-C would never reach the child. So the child always
        # starts that way here, whatever started pytest, and takes SIGINT
        # back as an interactive Python has it.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            child = python(
                "-c",
                textwrap.dedent(
                    f"""
                    import locksmith, signal, sys
                    signal.signal(signal.SIGINT, signal.default_int_handler)
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
                stderr=subprocess.PIPE,
                text=True,
            )
        finally:
            signal.signal(signal.SIGINT, previous)
        lines = Lines(child)
        try:
            assert lines.next(30, "the child to connect") == "waiting"
            # Ctrl-C once the child waits inside the acquire, in Rust.
            wait_until(
                lambda: holder.status(name).waiters, 30, "the child queued for the lock"
            )
            child.send_signal(signal.SIGINT)
            assert lines.next(30, "the interrupted acquire to return") == "interrupted"
            assert child.wait(30) == 0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        # The interrupted acquire left no waiter behind.
        wait_until(lambda: not holder.status(name).waiters, 5, "the waiter gone")
        guard.release()


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
        if not select.select([answer], [], [], 30)[0]:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child answered nothing within 30 s")
        assert answer.read() == "closed"
    os.waitpid(pid, 0)
    assert client.lock(name).try_acquire() is None, "the parent still holds"
    guard.release()
