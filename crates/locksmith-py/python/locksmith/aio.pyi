"""Type stubs of locksmith's asyncio API (the native classes are in Rust)."""

import builtins
from collections.abc import AsyncIterator, Iterable
from types import TracebackType
from typing import Literal, final

from . import Grant, Leader, LockInfo, _LostCallback, _Seconds
from ._base import ClientBase, ElectionBase, GuardBase, LeadershipBase, LockBase, RwLockBase

async def connect(
    url: str,
    *,
    session_ttl: _Seconds | None = None,
    client_name: str | None = None,
    host: str | None = None,
) -> Client:
    """Connects to the store the URL names."""

@final
class Client(ClientBase):
    """A connection to one lock store; `async with` closes it."""

    # ClientBase's, returning this API's classes (ClientBase is not generic:
    # the native class cannot be subscripted).
    def lock(
        self,
        name: str,
        *,
        wait: _Seconds | None = None,
        lease: _Seconds | None = None,
        owner: str | None = None,
        reentrant: bool = True,
        lock_delay: _Seconds | None = None,
    ) -> Lock: ...
    def rw_lock(self, name: str) -> RwLock: ...
    def semaphore(
        self,
        name: str,
        permits: int,
        *,
        wait: _Seconds | None = None,
        lease: _Seconds | None = None,
        owner: str | None = None,
        reentrant: bool = True,
        lock_delay: _Seconds | None = None,
    ) -> Lock: ...
    def multi_lock(
        self,
        names: Iterable[str],
        *,
        wait: _Seconds | None = None,
        lease: _Seconds | None = None,
        owner: str | None = None,
        reentrant: bool = True,
        lock_delay: _Seconds | None = None,
    ) -> Lock: ...
    def election(self, name: str) -> Election: ...
    async def status(self, name: str) -> LockInfo | None: ...
    # `builtins.list`: inside this class `list` names the method.
    async def list(self, prefix: str = "") -> builtins.list[LockInfo]: ...
    async def history(self, prefix: str = "") -> builtins.list[Grant]: ...
    async def force_release(self, name: str) -> None: ...
    async def close(self) -> None: ...
    async def __aenter__(self) -> Client: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]: ...

@final
class Lock(LockBase):
    """A lock to acquire; `async with lock as guard:` acquires and releases."""

    async def acquire(self, wait: _Seconds | None = None) -> Guard: ...
    async def try_acquire(self) -> Guard | None: ...
    async def __aenter__(self) -> Guard: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]: ...

@final
class RwLock(RwLockBase):
    """A read-write lock: many readers or one writer.

    Writers are not starved where the store queues waiters in order (not on
    Redis outside ``mode=fair``, nor over Redlock).
    """

    # RwLockBase's, returning this API's `Lock`.
    def read(
        self,
        *,
        wait: _Seconds | None = None,
        lease: _Seconds | None = None,
        owner: str | None = None,
        reentrant: bool = True,
        lock_delay: _Seconds | None = None,
    ) -> Lock: ...
    def write(
        self,
        *,
        wait: _Seconds | None = None,
        lease: _Seconds | None = None,
        owner: str | None = None,
        reentrant: bool = True,
        lock_delay: _Seconds | None = None,
    ) -> Lock: ...

@final
class Guard(GuardBase):
    """A held lock (or several, for a multi-lock)."""

    async def lost(self) -> str | None: ...
    def on_lost(self, callback: _LostCallback) -> None: ...
    async def extend(self, lease: _Seconds) -> None: ...
    async def release(self) -> None: ...
    async def __aenter__(self) -> Guard: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]: ...

@final
class Election(ElectionBase):
    """An election on one lock name."""

    async def campaign(self, value: str, *, wait: _Seconds | None = None) -> Leadership: ...
    async def leader(self) -> Leader | None: ...
    def observe(self) -> Observer: ...

@final
class Leadership(LeadershipBase):
    """This candidate's leadership; `async with` resigns it."""

    async def lost(self) -> str | None: ...
    def on_lost(self, callback: _LostCallback) -> None: ...
    async def proclaim(self, value: str) -> None: ...
    async def resign(self) -> None: ...
    async def __aenter__(self) -> Leadership: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]: ...

@final
class Observer(AsyncIterator[Leader | None]):
    """The leader now, then at every change (`None`: nobody leads)."""

    def __aiter__(self) -> Observer: ...
    async def __anext__(self) -> Leader | None: ...

__all__ = [
    "Client",
    "Election",
    "Guard",
    "Leadership",
    "Lock",
    "Observer",
    "RwLock",
    "connect",
]
