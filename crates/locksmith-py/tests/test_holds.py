"""What a guard or leadership keeps, and when its hold ends: `on_lost`
callbacks that refer to their guard (the guard is still collected, and its
hold released in the background), and a release while a call on the hold
(`extend`, `proclaim`) is in flight (the hold is released once that call
returns)."""

from __future__ import annotations

import asyncio
import gc
import signal
import socket
import subprocess
import textwrap
import threading
import weakref
from urllib.parse import urlsplit, urlunsplit

import pytest

import locksmith
import locksmith.aio
from conftest import python, url_of, wait_until


@pytest.fixture(params=["memory", "server"])
def url(request, stores) -> str:
    return url_of(stores, request.param)


@pytest.fixture
def clients(url):
    """Two blocking clients of one store: the holder's and another's."""
    holder, other = locksmith.connect(url), locksmith.connect(url)
    yield holder, other
    for client in (holder, other):
        try:
            client.close()
        except locksmith.Error:
            pass


def run(test):
    """Runs `test(holder, other, name)` in an event loop, with two asyncio
    clients of `url`."""

    def runner(url, name):
        async def main():
            async with await locksmith.aio.connect(url) as holder:
                async with await locksmith.aio.connect(url) as other:
                    await test(holder, other, name)

        asyncio.run(main())

    runner.__name__ = test.__name__
    return runner


class Gate:
    """A TCP proxy to a store whose way to the store can be held shut: what
    a client sends while it is shut stays in flight until it opens, so a
    call sent then (an `extend`) is in flight for as long as a test needs."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._store = (parts.hostname, parts.port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        self.url = urlunsplit(parts._replace(netloc=f"127.0.0.1:{port}"))
        self._open = threading.Event()
        self._open.set()
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def shut(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._open.set()
        for sock in self._sockets:
            try:
                sock.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                store = socket.create_connection(self._store)
            except OSError:
                return
            self._sockets += [client, store]
            for source, sink, gated in ((client, store, True), (store, client, False)):
                threading.Thread(
                    target=self._pump, args=(source, sink, gated), daemon=True
                ).start()

    def _pump(self, source: socket.socket, sink: socket.socket, gated: bool) -> None:
        try:
            while data := source.recv(65536):
                if gated:
                    self._open.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture
def gate(stores):
    """A gate to the lock server."""
    gate = Gate(url_of(stores, "server"))
    yield gate
    gate.close()


# A guard whose callback refers to it: collected, and released.


def test_a_dropped_guard_whose_callback_refers_to_it_is_released(clients, name):
    holder, other = clients
    called = []

    def acquire():
        guard = holder.lock(name).acquire()
        callback = lambda cause, reason: called.append(guard.name)  # noqa: E731
        guard.on_lost(callback)
        assert callback in gc.get_referents(guard), "the guard keeps its callback"
        return weakref.ref(callback)

    callback = acquire()
    gc.collect()
    assert callback() is None, "the callback went with its guard"
    other.lock(name).acquire(wait=5.0).release()
    assert called == []


def test_a_dropped_leadership_whose_callback_refers_to_it_resigns(clients, name):
    holder, other = clients

    def campaign():
        leadership = holder.election(name).campaign("first", wait=5.0)
        leadership.on_lost(lambda cause, reason: print(leadership.value))

    campaign()
    gc.collect()
    other.election(name).campaign("second", wait=5.0).resign()


def test_a_kept_guard_whose_callback_refers_to_it_is_called_on_a_loss(clients, name):
    holder, other = clients
    guard = holder.lock(name).acquire()
    called = threading.Event()
    seen = []

    def lost(cause, reason):
        seen.append((guard.name, cause))
        called.set()

    guard.on_lost(lost)
    del lost
    gc.collect()  # the guard is still referenced: its callback stays
    other.force_release(name)
    assert called.wait(10), "on_lost was not called"
    assert seen == [(name, locksmith.LostCause.FORCE_RELEASED)]


@run
async def test_async_dropped_guard_whose_callback_refers_to_it_is_released(
    holder, other, name
):
    watches = set(locksmith.aio._loss_watches)

    async def acquire():
        guard = await holder.lock(name).acquire()
        guard.on_lost(lambda cause, reason: print(guard.name))

    await acquire()
    gc.collect()
    guard = await other.lock(name).acquire(wait=5.0)
    await guard.release()

    async def watches_end():
        while locksmith.aio._loss_watches - watches:
            await asyncio.sleep(0.01)

    # The task that waited for the loss ends with the hold.
    await asyncio.wait_for(watches_end(), 10)


@run
async def test_async_dropped_leadership_whose_callback_refers_to_it_resigns(
    holder, other, name
):
    async def campaign():
        leadership = await holder.election(name).campaign("first", wait=5.0)
        leadership.on_lost(lambda cause, reason: print(leadership.value))

    await campaign()
    gc.collect()
    leadership = await other.election(name).campaign("second", wait=5.0)
    await leadership.resign()


@run
async def test_async_kept_guard_whose_callback_refers_to_it_is_called_on_a_loss(
    holder, other, name
):
    guard = await holder.lock(name).acquire()
    called = asyncio.get_running_loop().create_future()
    guard.on_lost(lambda cause, reason: called.set_result((guard.name, cause)))
    gc.collect()
    await other.force_release(name)
    assert await asyncio.wait_for(called, 10) == (
        name,
        locksmith.LostCause.FORCE_RELEASED,
    )


def test_a_script_ending_with_a_guard_and_its_callback_releases(stores, name):
    """A guard in a module global with a callback (which refers to the
    module's globals) is released when the script ends, not when its
    session expires."""
    url = url_of(stores, "server")
    script = textwrap.dedent(
        f"""
        import locksmith
        client = locksmith.connect({url!r}, session_ttl=60)
        guard = client.lock({name!r}).acquire()
        guard.on_lost(lambda cause, reason: print(guard.name))
        print("held", flush=True)
        """
    )
    child = python("-c", script, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "held\n"
        assert child.wait(30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    with locksmith.connect(url) as other:
        other.lock(name).acquire(wait=5.0).release()


# A release while a call on the hold is in flight: released once it returns.


@pytest.mark.parametrize("ending", ["release", "with"])
def test_a_release_while_another_thread_extends_releases(gate, stores, name, ending):
    with locksmith.connect(gate.url) as holder, locksmith.connect(
        url_of(stores, "server")
    ) as other:
        guard = holder.lock(name, lease=10.0).acquire()
        gate.shut()
        extended = []
        extending = threading.Thread(target=lambda: extended.append(guard.extend(20.0)))
        extending.start()
        wait_until(lambda: guard.hold_count == 0, 5, "lent to the extend")
        threading.Timer(0.3, gate.open).start()
        if ending == "release":
            guard.release()
        else:
            with guard:
                pass
        extending.join(10)
        assert extended == [None], "the extend went through"
        assert "released" in repr(guard)
        other.lock(name).acquire(wait=5.0).release()
        with pytest.raises(locksmith.NotHeld):
            guard.release()


def test_a_signal_handler_releasing_during_its_threads_extend_releases(gate, stores, name):
    with locksmith.connect(gate.url) as holder, locksmith.connect(
        url_of(stores, "server")
    ) as other:
        guard = holder.lock(name, lease=10.0).acquire()
        released = []

        def handler(signum, frame):
            guard.release()  # cannot wait for the extend it interrupted
            released.append(True)
            gate.open()

        previous = signal.signal(signal.SIGUSR1, handler)
        try:
            gate.shut()
            main = threading.main_thread().ident
            threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGUSR1)).start()
            guard.extend(20.0)
        finally:
            signal.signal(signal.SIGUSR1, previous)
            gate.open()
        assert released == [True]
        other.lock(name).acquire(wait=5.0).release()


@pytest.mark.parametrize("ending", ["release", "async with"])
def test_async_release_while_an_extend_is_in_flight_releases(stores, name, ending):
    async def main():
        url = url_of(stores, "server")
        async with await locksmith.aio.connect(url) as holder:
            async with await locksmith.aio.connect(url) as other:
                lock = holder.lock(name, lease=10.0)
                if ending == "release":
                    guard = await lock.acquire()
                    extending = asyncio.ensure_future(guard.extend(20.0))
                    await asyncio.sleep(0)  # the extend is sent
                    await guard.release()
                else:
                    async with lock as guard:
                        extending = asyncio.ensure_future(guard.extend(20.0))
                        await asyncio.sleep(0)
                await asyncio.wait_for(extending, 10)
                assert "released" in repr(guard)
                assert await asyncio.wait_for(guard.lost(), 1) is None
                await (await other.lock(name).acquire(wait=5.0)).release()
                with pytest.raises(locksmith.NotHeld):
                    await guard.release()

    asyncio.run(main())


def test_async_resign_while_a_proclaim_is_in_flight_resigns(stores, name):
    gate = Gate(url_of(stores, "etcd"))

    async def main():
        async with await locksmith.aio.connect(gate.url) as holder:
            async with await locksmith.aio.connect(url_of(stores, "etcd")) as other:
                leadership = await holder.election(name).campaign("first", wait=5.0)
                gate.shut()
                proclaiming = asyncio.ensure_future(leadership.proclaim("second"))
                await asyncio.sleep(0)  # the proclaim is sent
                asyncio.get_running_loop().call_later(0.3, gate.open)
                await asyncio.wait_for(leadership.resign(), 10)
                await asyncio.wait_for(proclaiming, 10)
                assert leadership.value == "second"
                rival = await other.election(name).campaign("rival", wait=5.0)
                await rival.resign()

    try:
        asyncio.run(main())
    finally:
        gate.close()
