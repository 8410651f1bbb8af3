"""Two or more builds of the native module compared in one run, rounds
interleaved, each against the Rust client's pairs of its own round.

    python crates/locksmith-py/bench/side_by_side.py A=path/a.so B=path/b.so -- URL [URL...]

Each build (a `liblocksmith_py.so` from `cargo build --release -p
locksmith-py`, copied aside) is staged with the package's Python files in a
directory of its own. Every round runs `acquire_release.py` once per build,
in a fresh process, with one round of PAIRS pairs per case (env
LOCKSMITH_BENCH_PAIRS, default 2000); the builds take turns, A B then B A,
for ROUNDS rounds (env LOCKSMITH_BENCH_ROUNDS, default 5), so that a change
of the machine's load falls on every build alike. The load average is
read before each process.

It prints, per URL and build, the median µs per pair of each case, and the
median over the rounds of Python's time over the Rust pair's of the same
process and round: wall clock, and CPU time of the process (all threads,
connecting and closing included), which waits for a CPU disturb less.
Then the floors of `acquire_release.py`, measured in the same processes
(asyncio's own socket round trip against Rust's among them), the same
way; LOCKSMITH_BENCH_FLOORS=0 leaves them out.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent / "python" / "locksmith"
ROUNDS = int(os.environ.get("LOCKSMITH_BENCH_ROUNDS", "5"))

# Each Python case and the Rust pair it is compared with.
BASELINE = {
    "Python, blocking": "Rust, blocking",
    "Python, with": "Rust, blocking",
    "Python, asyncio": "Rust, async",
    "Python, async with": "Rust, async",
}
# Each asyncio floor and the Rust one it is compared with.
FLOOR_BASELINE = {
    "asyncio, 2 woken waits": "Rust, 2 woken waits",
    "asyncio, 2 socket round trips": "Rust, 2 socket round trips",
}


def stage(root: Path, label: str, module: Path) -> Path:
    """The package with `module` as its native module, as maturin lays it out."""
    directory = root / label
    shutil.copytree(PACKAGE, directory / "locksmith")
    shutil.copy(module, directory / "locksmith" / "_locksmith.abi3.so")
    return directory


def one_round(path: Path, urls: list[str]) -> dict:
    """One run of acquire_release.py with the package at `path`."""
    with tempfile.NamedTemporaryFile(suffix=".json") as output:
        env = dict(
            os.environ,
            PYTHONPATH=str(path),
            LOCKSMITH_BENCH_ROUNDS="1",
            LOCKSMITH_BENCH_FLOORS=os.environ.get("LOCKSMITH_BENCH_FLOORS", "1"),
            LOCKSMITH_BENCH_JSON=output.name,
        )
        subprocess.run(
            [sys.executable, str(HERE / "acquire_release.py"), *urls],
            env=env, check=True, stdout=subprocess.DEVNULL,
        )
        return json.load(open(output.name))


def main() -> None:
    args = sys.argv[1:]
    if "--" not in args:
        sys.exit(__doc__)
    split = args.index("--")
    builds = dict(arg.split("=", 1) for arg in args[:split])
    urls = args[split + 1:]
    with tempfile.TemporaryDirectory() as root:
        staged = {label: stage(Path(root), label, Path(module)) for label, module in builds.items()}
        rounds: dict[str, list[dict]] = {label: [] for label in staged}
        loads: list[float] = []
        for number in range(ROUNDS):
            order = list(staged) if number % 2 == 0 else list(reversed(staged))
            for label in order:
                loads.append(os.getloadavg()[0])
                rounds[label].append(one_round(staged[label], urls))

    print(
        f"{os.environ.get('LOCKSMITH_BENCH_PAIRS', '2000')} pairs x {ROUNDS} rounds per build, "
        f"interleaved; Python {sys.version.split()[0]}; {os.cpu_count()} CPUs; "
        f"load average (1 min) {min(loads):.1f}-{max(loads):.1f}, median {statistics.median(loads):.1f}"
    )
    for label, module in builds.items():
        print(f"  {label}: {module}")
    for url in urls:
        print(f"\n{url}: median us per pair; in brackets the median ratio to the Rust pair (wall, CPU)")
        cases = list(rounds[next(iter(rounds))][0][url])
        print(f"  {'':20}" + "".join(f" {label:>26}" for label in rounds))
        for case in cases:
            cells = []
            for label, runs in rounds.items():
                wall = statistics.median(run[url][case]["wall"][0] for run in runs) * 1e6
                cell = f"{wall:.1f}"
                if case in BASELINE:
                    ratios = {
                        kind: statistics.median(
                            run[url][case][kind][0] / run[url][BASELINE[case]][kind][0]
                            for run in runs
                        )
                        for kind in ("wall", "cpu")
                    }
                    cell += f" ({ratios['wall']:.2f}x, {ratios['cpu']:.2f}x)"
                cells.append(f" {cell:>26}")
            print(f"  {case:20}" + "".join(cells))
    if all("floors" in run for runs in rounds.values() for run in runs):
        print_floors(rounds)


def print_floors(rounds: dict[str, list[dict]]) -> None:
    """The floors' median µs per pair, per build (`-`: a build without the
    helper), with the median ratio of asyncio's to Rust's of the same round."""
    print("\nfloors (two awaits per pair): median us per pair; in brackets the median ratio to Rust's")
    print(f"  {'':30}" + "".join(f" {label:>18}" for label in rounds))
    labels = dict.fromkeys(label for runs in rounds.values() for label in runs[0]["floors"])
    for floor in labels:
        cells = []
        for runs in rounds.values():
            if floor not in runs[0]["floors"]:
                cells.append(f" {'-':>18}")
                continue
            cell = f"{statistics.median(run['floors'][floor][0] for run in runs) * 1e6:.1f}"
            rust = FLOOR_BASELINE.get(floor)
            if rust in runs[0]["floors"]:
                ratio = statistics.median(run["floors"][floor][0] / run["floors"][rust][0] for run in runs)
                cell += f" ({ratio:.2f}x)"
            cells.append(f" {cell:>18}")
        print(f"  {floor:30}" + "".join(cells))


if __name__ == "__main__":
    main()
