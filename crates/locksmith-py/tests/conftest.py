"""Real stores for the tests, started once per test session.

Redis, ZooKeeper, etcd and PostgreSQL are started by the testkit's `stores`
example (the same binaries and settings as the Rust tests), the lock server
by the `locksmith` command itself (`locksmith serve`). Both come from the
cargo target directory ($CARGO_TARGET_DIR, else target/ of the repository);
`scripts/test` builds them before it runs this suite. A store that cannot
start fails its tests with the reason; nothing is skipped.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

import locksmith

REPO = Path(__file__).resolve().parents[3]
BACKENDS = ["memory", "server", "redis", "zookeeper", "etcd", "postgres"]


def target_dir() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")


def built(relative: str, how: str) -> Path:
    path = target_dir() / "debug" / relative
    if not path.is_file():
        pytest.fail(f"{path} is missing: build it with `{how}` (scripts/test does)")
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Stores:
    """The testkit's `stores` process, started once per store."""

    def __init__(self) -> None:
        self._processes: list[subprocess.Popen] = []
        self._urls: dict[str, str] = {}
        self._directories: list[str] = []

    def url(self, name: str) -> str:
        if name not in self._urls:
            self._urls[name] = self._start(name)
        return self._urls[name]

    def _start(self, name: str) -> str:
        if name == "server":
            return self._start_server()
        binary = built(
            "examples/stores", "cargo build -p locksmith-testkit --example stores"
        )
        process = subprocess.Popen(
            [binary, name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._processes.append(process)
        line = process.stdout.readline().split()
        if len(line) != 2 or line[0] != name:
            pytest.fail(f"cannot start {name}: {process.stderr.read()}")
        return line[1]

    def _start_server(self) -> str:
        binary = built("locksmith", "cargo build -p locksmith-cli")
        port = free_port()
        data = tempfile.mkdtemp(prefix="locksmith-py-server-")
        process = subprocess.Popen(
            [binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._processes.append(process)
        self._directories.append(data)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"locksmith serve exited: {process.stderr.read().decode()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return f"locksmith://127.0.0.1:{port}"
            except OSError:
                time.sleep(0.05)
        pytest.fail("locksmith serve did not listen within 30 s")

    def stop(self) -> None:
        for process in self._processes:
            if process.stdin:
                process.stdin.close()  # the stores process stops its stores
            else:
                process.terminate()
        for process in self._processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        for directory in self._directories:
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def stores():
    running = Stores()
    yield running
    running.stop()


def url_of(stores: Stores, backend: str) -> str:
    if backend == "memory":
        return "memory://"
    if backend == "zookeeper":
        return stores.url("zookeeper") + "/locksmith-py-tests"
    return stores.url(backend)


@pytest.fixture(params=BACKENDS)
def url(request, stores) -> str:
    """The URL of each backend in turn."""
    return url_of(stores, request.param)


@pytest.fixture
def client(url):
    """A blocking client of each backend in turn, closed after the test."""
    client = locksmith.connect(url, session_ttl=5.0)
    yield client
    try:
        client.close()
    except locksmith.Error:
        pass


@pytest.fixture
def name() -> str:
    """A lock name of this test alone (the stores are shared)."""
    return f"py/{uuid.uuid4().hex[:12]}"


def wait_until(condition, seconds: float, what: str) -> None:
    """Polls `condition` until it holds; fails the test after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {seconds} s")
        time.sleep(0.01)


def python(*args: str, **kwargs) -> subprocess.Popen:
    """This interpreter, with the package under test on its path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return subprocess.Popen([sys.executable, *args], env=env, **kwargs)
