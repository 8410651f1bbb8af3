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

and prints the median time per pair of each, and Python's over Rust's.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
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


def main() -> None:
    urls = sys.argv[1:] or ["memory://"]
    print(
        f"{PAIRS} pairs x {ROUNDS} rounds, median per pair; Python {sys.version.split()[0]}; "
        f"{os.cpu_count()} CPUs, load average {' '.join(f'{load:.1f}' for load in os.getloadavg())}"
    )
    for url in urls:
        runs: dict[str, list[float]] = {label: [] for label, _ in CASES}
        for _ in range(ROUNDS):
            for label, case in CASES:
                name = f"bench/py/{uuid.uuid4().hex[:8]}"
                runs[label].append(case(url, name) / PAIRS)
        print(f"\n{url}")
        print(f"  {'':18} {'us/pair':>9} {'vs Rust':>8}")
        for label, _ in CASES:
            median = statistics.median(runs[label])
            ratio = ""
            if label in BASELINE:
                ratio = f"{median / statistics.median(runs[BASELINE[label]]):.2f}x"
            print(f"  {label:18} {median * 1e6:9.1f} {ratio:>8}")


if __name__ == "__main__":
    main()
