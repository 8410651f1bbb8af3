"""The Python client's overhead on an acquire + release pair, against the
Rust client doing the same pairs in the same process, side by side.

    python crates/locksmith-py/bench/acquire_release.py URL [URL...]

For each URL (`memory://`, `locksmith://127.0.0.1:7420`, ...) it runs, in
turn and ROUNDS times (env LOCKSMITH_BENCH_ROUNDS, default 5), PAIRS
uncontended acquire + release pairs of one lock (env LOCKSMITH_BENCH_PAIRS,
default 2000) with:

- Rust, blocking: `locksmith::blocking::Client`, `lock.acquire()?.release()?`
- Python, blocking: `lock.acquire().release()` and `with lock: pass`
- Rust, async: `lock.acquire().await?.release().await?` on a tokio runtime
- Python, asyncio: `await (await lock.acquire()).release()`, and
  `async with lock: pass`

and prints the median time per pair of each, and Python's over Rust's;
also the CPU time the process spent per pair (every thread, connecting and
closing included), which a loaded machine disturbs less than wall time.

Then the floors under the asyncio figures, also per pair (two awaits):

- Rust, 2 woken waits: two awaits of a no-op task spawned on a tokio
  runtime, from a thread outside it (as the Rust pairs run)
- asyncio, 2 woken waits: the same from an asyncio task, through the
  awaitable every `locksmith.aio` call returns (one wake-up of the loop)
- asyncio, 2 ready awaits: two of those awaitables that are ready at once
- asyncio, 2 coroutines: two awaits of `async def` functions that return
  at once (Python's own cost of an await)
- asyncio, 2 thread wakes: two asyncio futures each resolved by another
  Python thread through `call_soon_threadsafe`
- Rust, 2 socket round trips: two one-byte round trips over a Unix socket
  to an echo process, awaited on a tokio runtime from a thread outside it
  (as the Rust pairs run against a server)
- asyncio, 2 socket round trips: the same round trips to the same kind of
  echo process from an asyncio task (`loop.sock_sendall`,
  `loop.sock_recv`): what asyncio's own loop costs per wait on the
  network, without locksmith

With LOCKSMITH_BENCH_JSON=PATH it also writes every round's seconds per
pair (wall and CPU, and the floors' wall) there, for `side_by_side.py`,
which runs this script once per round with each build of the module in
turn; LOCKSMITH_BENCH_FLOORS=0 leaves the floors out.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid

import locksmith
import locksmith.aio
from locksmith import _locksmith

ROUNDS = int(os.environ.get("LOCKSMITH_BENCH_ROUNDS", "5"))
PAIRS = int(os.environ.get("LOCKSMITH_BENCH_PAIRS", "2000"))


def python_blocking(url: str, name: str) -> float:
    with locksmith.connect(url) as client:
        lock = client.lock(name)
        lock.acquire().release()  # warm
        started = time.perf_counter()
        for _ in range(PAIRS):
            lock.acquire().release()
        return time.perf_counter() - started


def python_with(url: str, name: str) -> float:
    with locksmith.connect(url) as client:
        lock = client.lock(name)
        started = time.perf_counter()
        for _ in range(PAIRS):
            with lock:
                pass
        return time.perf_counter() - started


def python_asyncio(url: str, name: str) -> float:
    async def main() -> float:
        async with await locksmith.aio.connect(url) as client:
            lock = client.lock(name)
            await (await lock.acquire()).release()  # warm
            started = time.perf_counter()
            for _ in range(PAIRS):
                await (await lock.acquire()).release()
            return time.perf_counter() - started

    return asyncio.run(main())


def python_async_with(url: str, name: str) -> float:
    async def main() -> float:
        async with await locksmith.aio.connect(url) as client:
            lock = client.lock(name)
            started = time.perf_counter()
            for _ in range(PAIRS):
                async with lock:
                    pass
            return time.perf_counter() - started

    return asyncio.run(main())


def rust(api: str):
    return lambda url, name: _locksmith._bench_rust(url, name, PAIRS, api)


CASES = [
    ("Rust, blocking", rust("blocking")),
    ("Python, blocking", python_blocking),
    ("Python, with", python_with),
    ("Rust, async", rust("async")),
    ("Python, asyncio", python_asyncio),
    ("Python, async with", python_async_with),
]
BASELINE = {
    "Python, blocking": "Rust, blocking",
    "Python, with": "Rust, blocking",
    "Python, asyncio": "Rust, async",
    "Python, async with": "Rust, async",
}


def awaiting(make) -> float:
    """Seconds for PAIRS pairs of two awaits of `make()` in a task."""

    async def main() -> float:
        await make()  # warm
        started = time.perf_counter()
        for _ in range(PAIRS):
            await make()
            await make()
        return time.perf_counter() - started

    return asyncio.run(main())


async def ready_coroutine() -> None:
    pass


def thread_wakes() -> float:
    """Seconds for PAIRS pairs of two asyncio futures, each resolved by
    another Python thread with `call_soon_threadsafe`."""
    asked: queue.SimpleQueue = queue.SimpleQueue()

    def resolver() -> None:
        while (future := asked.get()) is not None:
            future.get_loop().call_soon_threadsafe(future.set_result, None)

    def woken():
        future = asyncio.get_running_loop().create_future()
        asked.put(future)
        return future

    thread = threading.Thread(target=resolver)
    thread.start()
    try:
        return awaiting(woken)
    finally:
        asked.put(None)
        thread.join()


# The peer of the round trips: echoes every byte back, in a process of its
# own, so that the same peer answers Rust and asyncio alike.
ECHO = """
import os, sys
fd = int(sys.argv[1])
while data := os.read(fd, 64):
    os.write(fd, data)
"""


def round_trips(run) -> float:
    """Seconds `run(sock)` takes, `sock` connected to a fresh echo process."""
    ours, theirs = socket.socketpair()
    echo = subprocess.Popen([sys.executable, "-c", ECHO, str(theirs.fileno())], pass_fds=[theirs.fileno()])
    theirs.close()
    try:
        return run(ours)
    finally:
        ours.close()
        echo.wait()


def asyncio_round_trips(sock: socket.socket) -> float:
    """Seconds for PAIRS pairs of two one-byte round trips from a task,
    through the loop's selector."""
    sock.setblocking(False)

    async def main() -> float:
        loop = asyncio.get_running_loop()

        async def round_trip() -> None:
            await loop.sock_sendall(sock, b"x")
            if await loop.sock_recv(sock, 1) != b"x":
                raise RuntimeError("the echo process answered something else")

        await round_trip()  # warm
        started = time.perf_counter()
        for _ in range(PAIRS):
            await round_trip()
            await round_trip()
        return time.perf_counter() - started

    return asyncio.run(main())


FLOORS = [
    ("Rust, 2 woken waits", "_bench_rust_woken", lambda: _locksmith._bench_rust_woken(2 * PAIRS)),
    ("asyncio, 2 woken waits", "_bench_woken", lambda: awaiting(_locksmith._bench_woken)),
    ("asyncio, 2 ready awaits", "_bench_ready", lambda: awaiting(_locksmith._bench_ready)),
    ("asyncio, 2 coroutines", None, lambda: awaiting(ready_coroutine)),
    ("asyncio, 2 thread wakes", None, thread_wakes),
    (
        "Rust, 2 socket round trips",
        "_bench_rust_round_trips",
        lambda: round_trips(lambda sock: _locksmith._bench_rust_round_trips(sock.fileno(), 2 * PAIRS)),
    ),
    ("asyncio, 2 socket round trips", None, lambda: round_trips(asyncio_round_trips)),
]
FLOOR_BASELINE = {
    "asyncio, 2 woken waits": "Rust, 2 woken waits",
    "asyncio, 2 socket round trips": "Rust, 2 socket round trips",
}


def report(title: str, runs: dict[str, list[float]], baseline: dict[str, str],
           cpu: dict[str, list[float]] | None = None) -> None:
    """Medians per pair of the wall-clock times (and of the process's CPU
    times, all threads, if given), each with its ratio to its baseline's."""
    print(f"\n{title}")
    print(f"  {'':24} {'us/pair':>9} {'vs Rust':>8}" + (f" {'CPU us':>9} {'vs Rust':>8}" if cpu else ""))

    def columns(times: dict[str, list[float]], label: str) -> str:
        median = statistics.median(times[label])
        ratio = ""
        if baseline.get(label) in times:
            ratio = f"{median / statistics.median(times[baseline[label]]):.2f}x"
        return f" {median * 1e6:9.1f} {ratio:>8}"

    for label in runs:
        print(f"  {label:24}" + columns(runs, label) + (columns(cpu, label) if cpu else ""))


def main() -> None:
    urls = sys.argv[1:] or ["memory://"]
    print(
        f"{PAIRS} pairs x {ROUNDS} rounds, median per pair; Python {sys.version.split()[0]}; "
        f"{os.cpu_count()} CPUs, load average {' '.join(f'{load:.1f}' for load in os.getloadavg())}"
    )
    results: dict[str, dict] = {}
    for url in urls:
        runs: dict[str, list[float]] = {label: [] for label, _ in CASES}
        cpu: dict[str, list[float]] = {label: [] for label, _ in CASES}
        for _ in range(ROUNDS):
            for label, case in CASES:
                name = f"bench/py/{uuid.uuid4().hex[:8]}"
                # CPU time of the whole case, connecting and closing too.
                cpu_started = time.process_time()
                runs[label].append(case(url, name) / PAIRS)
                cpu[label].append((time.process_time() - cpu_started) / PAIRS)
        report(url, runs, BASELINE, cpu)
        results[url] = {label: {"wall": runs[label], "cpu": cpu[label]} for label in runs}
    if os.environ.get("LOCKSMITH_BENCH_FLOORS") != "0":
        # A module built before the floors' helpers existed runs only Python's.
        floors = [(label, run) for label, helper, run in FLOORS if helper is None or hasattr(_locksmith, helper)]
        runs = {label: [] for label, _ in floors}
        for _ in range(ROUNDS):
            for label, run in floors:
                runs[label].append(run() / PAIRS)
        report("floors (two awaits per pair)", runs, FLOOR_BASELINE)
        results["floors"] = runs
    if path := os.environ.get("LOCKSMITH_BENCH_JSON"):
        with open(path, "w") as file:
            json.dump(results, file)


if __name__ == "__main__":
    main()
