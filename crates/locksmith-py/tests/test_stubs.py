"""The `.pyi` stubs describe what the native module has, name for name, and
type-check: mypy --strict accepts them and a typed program that uses the
whole API (with the types of what each call returns pinned), and mypy's
stubtest finds them in agreement with the module as built."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import locksmith
import locksmith._base
import locksmith.aio

PACKAGE = Path(locksmith.__file__).parent
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# typeshed's `typing_extensions.disjoint_base`, which the stubs use (and
# stubtest's check that the native classes are marked with it), came with 1.18.
MYPY_AT_LEAST = (1, 18)


def stubbed(module_file: str) -> dict[str, set[str]]:
    """Classes of a stub file, each with the members it declares and those
    its base classes (in it or in `_base.pyi`) declare, all the way up."""
    classes = classes_of("_base.pyi")
    classes.update(classes_of(module_file))

    def members(name: str) -> set[str]:
        node = classes[name]
        found = set(members_of(node))
        for base in node.bases:
            if isinstance(base, ast.Subscript):  # Base[...]
                base = base.value
            if isinstance(base, ast.Name) and base.id in classes:
                found |= members(base.id)
        return found

    return {name: members(name) for name in classes_of(module_file)}


def classes_of(module_file: str) -> dict[str, ast.ClassDef]:
    tree = ast.parse((PACKAGE / module_file).read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def members_of(node: ast.ClassDef):
    for member in node.body:
        if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield member.name


def public(cls: type) -> set[str]:
    return {
        name
        for name, _ in inspect.getmembers(cls)
        if not name.startswith("_")
        or name in {"__enter__", "__exit__", "__aenter__", "__aexit__", "__iter__",
                    "__next__", "__aiter__", "__anext__"}
    }


@pytest.mark.parametrize(
    "module, stub",
    [(locksmith, "__init__.pyi"), (locksmith.aio, "aio.pyi"), (locksmith._base, "_base.pyi")],
)
def test_stubs_match_the_native_classes(module, stub):
    classes = stubbed(stub)
    assert classes, stub
    for name, members in classes.items():
        runtime = getattr(module, name)
        assert members == public(runtime), f"{module.__name__}.{name}"
    for name in module.__all__:
        assert hasattr(module, name), name


def test_stub_classes_are_generic_only_where_the_native_ones_are():
    """A stub class that is generic (`Generic[...]` among its bases) or used
    as one (`SomeBase[...]` as a base) lets users write `Class[...]`, which
    the native class must then take."""
    for module, stub in [(locksmith, "__init__.pyi"), (locksmith.aio, "aio.pyi"),
                         (locksmith._base, "_base.pyi")]:
        for name, node in classes_of(stub).items():
            for base in node.bases:
                if not (isinstance(base, ast.Subscript) and isinstance(base.value, ast.Name)):
                    continue
                generic = name if base.value.id in {"Generic", "Protocol"} else base.value.id
                runtime = getattr(module, generic, None) or getattr(locksmith._base, generic, None)
                if runtime is None:
                    continue  # not the package's (collections.abc.Iterator[...])
                assert hasattr(runtime, "__class_getitem__"), (
                    f"{stub}: {name} makes {generic} generic, but "
                    f"{runtime.__module__}.{generic}[...] fails at run time"
                )


def run_mypy(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m <args>` with mypy of this interpreter, the package under
    test first on both mypy's and Python's path."""
    if importlib.util.find_spec("mypy") is None:
        pytest.fail(
            f"mypy is missing: install it with `{sys.executable} -m pip install mypy` "
            "(scripts/test does)"
        )
    import mypy.version

    version = mypy.version.__version__
    if tuple(int(part) for part in version.split(".")[:2]) < MYPY_AT_LEAST:
        pytest.fail(
            f"mypy {version} is older than {'.'.join(map(str, MYPY_AT_LEAST))}: "
            f"`{sys.executable} -m pip install -U mypy`"
        )
    env = dict(os.environ)
    env["MYPYPATH"] = str(PACKAGE.parent)
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE.parent), *sys.path])
    # In a directory of its own: no configuration file of the repository or
    # of the caller applies, and the cache is thrown away with it.
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )


def test_stubs_and_typed_usage_pass_mypy_strict(tmp_path):
    usage = tmp_path / "typed_usage.py"
    usage.write_text(TYPED_USAGE)
    # The oldest Python the package supports, so that the stubs hold for it.
    checked = run_mypy(
        "mypy", "--strict", "--python-version", "3.10", "--cache-dir", str(tmp_path / "cache"),
        str(usage), *map(str, sorted(EXAMPLES.glob("*.py"))), str(PACKAGE),
        cwd=tmp_path,
    )
    assert checked.returncode == 0, checked.stdout


# What stubtest may report, each with why. Only what comes of the module
# being compiled belongs here.
STUBTEST_ALLOWLIST = """
# pyo3 writes a default that is not a Python literal (here the Rust
# `String::new()` of `prefix`, a String because the coroutine outlives the
# call) as `...` in the method's __text_signature__, which stubtest reads as
# a default of Ellipsis. The default is "", as the stub says.
locksmith.aio.Client.list
locksmith.aio.Client.history
"""


def test_stubtest_finds_the_stubs_in_agreement_with_the_module(tmp_path):
    allowlist = tmp_path / "allowlist.txt"
    allowlist.write_text(STUBTEST_ALLOWLIST)
    # An allowlist entry that no longer matches an error fails the run too.
    checked = run_mypy("mypy.stubtest", "locksmith", "--allowlist", str(allowlist), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout


# A typed program that uses the whole API, blocking and asyncio: never run,
# only checked. `assert_type` fails the check where a call's type is not the
# one pinned, an `Any` (from a stub mypy cannot read) included.
TYPED_USAGE = """
from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from typing_extensions import assert_type

import locksmith
import locksmith.aio
from locksmith._base import ClientBase, GuardBase, HoldBase, LockBase


def on_lost(cause: locksmith.LostCause, reason: str) -> None:
    print(cause.value, reason)


def blocking(url: str) -> None:
    client = locksmith.connect(url, session_ttl=5.0, client_name="typed", host=None)
    assert_type(client, locksmith.Client)
    assert_type(client.backend, str)
    with client as entered:
        assert_type(entered, locksmith.Client)
        lock = client.lock("a", wait=timedelta(seconds=1), lease=10, owner="me", reentrant=False)
        assert_type(lock, locksmith.Lock)
        assert_type(lock.names, list[str])
        assert_type(lock.mode, str)
        assert_type(lock.permits, int | None)
        guard = lock.acquire(wait=0.5)
        assert_type(guard, locksmith.Guard)
        assert_type(guard.fencing_token, int)
        assert_type(guard.fencing_tokens, list[int])
        assert_type(guard.name, str)
        assert_type(guard.names, list[str])
        assert_type(guard.hold_count, int)
        assert_type(guard.remaining_lease, float | None)
        assert_type(guard.is_lost, bool)
        assert_type(guard.lost_cause, locksmith.LostCause | None)
        assert_type(guard.lost_reason, str | None)
        assert_type(guard.lost(timeout=0), str | None)
        guard.on_lost(on_lost)
        guard.on_lost(lambda cause, reason: print(cause.name, reason.upper()))
        guard.raise_if_lost()
        guard.extend(30)
        guard.release()
        assert_type(lock.try_acquire(), locksmith.Guard | None)
        with lock as held:
            assert_type(held, locksmith.Guard)
            with held as again:
                assert_type(again, locksmith.Guard)
        rw = client.rw_lock("b")
        assert_type(rw, locksmith.RwLock)
        assert_type(rw.read(lease=5), locksmith.Lock)
        assert_type(rw.write(), locksmith.Lock)
        assert_type(client.semaphore("c", 3, wait=None), locksmith.Lock)
        assert_type(client.multi_lock(["d", "e"], lock_delay=1.5), locksmith.Lock)
        election = client.election("f")
        assert_type(election, locksmith.Election)
        assert_type(election.name, str)
        with election.campaign("me", wait=1) as leadership:
            assert_type(leadership, locksmith.Leadership)
            assert_type(leadership.value, str)
            assert_type(leadership.fencing_token, int)
            assert_type(leadership.lost(timeout=1.0), str | None)
            leadership.on_lost(on_lost)
            leadership.proclaim("me too")
        leader = election.leader()
        assert_type(leader, locksmith.Leader | None)
        if leader is not None:
            assert_type(leader.value, str)
            assert_type(leader.fencing_token, int | None)
        for seen in election.observe():
            assert_type(seen, locksmith.Leader | None)
        info = client.status("a")
        assert_type(info, locksmith.LockInfo | None)
        if info is not None:
            assert_type(info.name, str)
            assert_type(info.holders, tuple[locksmith.Holder, ...])
            assert_type(info.waiters, tuple[locksmith.Waiter, ...])
            for holder in info.holders:
                assert_type(holder.fencing_token, int | None)
                assert_type(holder.lock_time, datetime | None)
        assert_type(client.list(), list[locksmith.LockInfo])
        assert_type(client.list("a/"), list[locksmith.LockInfo])
        assert_type(client.history(), list[locksmith.Grant])
        for grant in client.history("a/"):
            assert_type(grant.granted_at, datetime)
            assert_type(grant.lost_reason, str | None)
        client.force_release("a")
        client.close()


def errors(client: locksmith.Client) -> None:
    try:
        client.lock("a").acquire().release()
    except locksmith.Lost as lost:
        assert_type(lost.cause, locksmith.LostCause | None)
        assert_type(lost.reason, str | None)
        if lost.cause is locksmith.LostCause.FORCE_RELEASED:
            pass
    except locksmith.Timeout as timeout:
        assert_type(timeout.wait, float | None)
    except (locksmith.NotOwner, locksmith.NotHeld, locksmith.AlreadyHeld) as refused:
        assert_type(refused.name, str | None)
    except locksmith.Conflict as conflict:
        assert_type(conflict.mode, str | None)
    except locksmith.Unreplicated as unreplicated:
        assert_type(unreplicated.given_back, bool | None)
        assert_type(unreplicated.within, float | None)
    except (locksmith.Unsupported, locksmith.BackendError) as failed:
        assert_type(failed.backend, str | None)
    except locksmith.Error as error:
        assert_type(error, locksmith.Error)
    try:
        client.lock("a", wait=0).acquire()
    except TimeoutError:  # Timeout is one
        pass
    except ValueError:  # InvalidName, InvalidArgument and InvalidUrl are
        pass


def returns_from_with(client: locksmith.Client) -> int:
    # The exits swallow nothing: no "missing return statement".
    with client.lock("a") as guard:
        return guard.fencing_token


async def returns_from_async_with(client: locksmith.aio.Client) -> int:
    async with client.lock("a") as guard:
        return guard.fencing_token


async def asynchronous(url: str) -> None:
    client = await locksmith.aio.connect(url, session_ttl=timedelta(seconds=5))
    assert_type(client, locksmith.aio.Client)
    async with client as entered:
        assert_type(entered, locksmith.aio.Client)
        lock = client.lock("a", wait=1.0)
        assert_type(lock, locksmith.aio.Lock)
        assert_type(lock.names, list[str])
        guard = await lock.acquire()
        assert_type(guard, locksmith.aio.Guard)
        assert_type(guard.fencing_token, int)
        assert_type(guard.remaining_lease, float | None)
        assert_type(guard.lost_cause, locksmith.LostCause | None)
        assert_type(await guard.lost(), str | None)
        lost = asyncio.create_task(guard.lost())
        assert_type(lost, asyncio.Task[str | None])
        lost.cancel()
        guard.on_lost(on_lost)
        await guard.extend(10)
        await asyncio.wait_for(guard.release(), 5)
        assert_type(await lock.try_acquire(), locksmith.aio.Guard | None)
        async with lock as held:
            assert_type(held, locksmith.aio.Guard)
        rw = client.rw_lock("b")
        assert_type(rw, locksmith.aio.RwLock)
        assert_type(rw.read(), locksmith.aio.Lock)
        assert_type(rw.write(wait=0), locksmith.aio.Lock)
        assert_type(client.semaphore("c", 2), locksmith.aio.Lock)
        assert_type(client.multi_lock(("d", "e")), locksmith.aio.Lock)
        election = client.election("f")
        assert_type(election, locksmith.aio.Election)
        async with await election.campaign("me", wait=2) as leadership:
            assert_type(leadership, locksmith.aio.Leadership)
            assert_type(leadership.value, str)
            assert_type(await leadership.lost(), str | None)
            await leadership.proclaim("again")
        assert_type(await election.leader(), locksmith.Leader | None)
        async for seen in election.observe():
            assert_type(seen, locksmith.Leader | None)
        assert_type(await client.status("a"), locksmith.LockInfo | None)
        assert_type(await client.list(), list[locksmith.LockInfo])
        assert_type(await client.history("a/"), list[locksmith.Grant])
        await client.force_release("a")
        try:
            async with client.lock("g") as guard:
                await guard.release()
        except locksmith.Lost as error:
            assert_type(error.cause, locksmith.LostCause | None)
        await client.close()


def shared(client: ClientBase, guard: GuardBase, hold: HoldBase) -> None:
    # The base classes both APIs' classes extend.
    assert_type(client.lock("a"), LockBase)
    assert_type(client.rw_lock("a").read(), LockBase)
    assert_type(guard.fencing_tokens, list[int])
    assert_type(hold.lost_cause, locksmith.LostCause | None)
    blocking: ClientBase = locksmith.connect("memory://")
    assert isinstance(guard, locksmith.Guard | locksmith.aio.Guard)
"""
