"""Type stubs of locksmith's asyncio API (the native classes are in Rust)."""

from collections.abc import AsyncIterator
from types import TracebackType
from typing import final

from . import Grant, Leader, LockInfo, LostCallback, Seconds
from ._base import ClientBase, ElectionBase, GuardBase, LeadershipBase, LockBase, RwLockBase

async def connect(
    url: str,
    *,
    session_ttl: Seconds | None = None,
    client_name: str | None = None,
    host: str | None = None,
) -> Client:
    """Connects to the store the URL names."""

@final
class Client(ClientBase[Lock, RwLock, Election]):
    """A connection to one lock store; `async with` closes it."""

    async def status(self, name: str) -> LockInfo | None: ...
    async def list(self, prefix: str = "") -> list[LockInfo]: ...
    async def history(self, prefix: str = "") -> list[Grant]: ...
    async def force_release(self, name: str) -> None: ...
    async def close(self) -> None: ...
    async def __aenter__(self) -> Client: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool: ...

@final
class Lock(LockBase):
    """A lock to acquire; `async with lock as guard:` acquires and releases."""

    async def acquire(self, wait: Seconds | None = None) -> Guard: ...
    async def try_acquire(self) -> Guard | None: ...
    async def __aenter__(self) -> Guard: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool: ...

@final
class RwLock(RwLockBase[Lock]):
    """A read-write lock: many readers or one writer.

    Writers are not starved where the store queues waiters in order (not on
    Redis outside ``mode=fair``, nor over Redlock).
    """

@final
class Guard(GuardBase):
    """A held lock (or several, for a multi-lock)."""

    async def lost(self) -> str | None: ...
    def on_lost(self, callback: LostCallback) -> None: ...
    async def extend(self, lease: Seconds) -> None: ...
    async def release(self) -> None: ...
    async def __aenter__(self) -> Guard: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool: ...

@final
class Election(ElectionBase):
    """An election on one lock name."""

    async def campaign(self, value: str, *, wait: Seconds | None = None) -> Leadership: ...
    async def leader(self) -> Leader | None: ...
    def observe(self) -> Observer: ...

@final
class Leadership(LeadershipBase):
    """This candidate's leadership; `async with` resigns it."""

    async def lost(self) -> str | None: ...
    def on_lost(self, callback: LostCallback) -> None: ...
    async def proclaim(self, value: str) -> None: ...
    async def resign(self) -> None: ...
    async def __aenter__(self) -> Leadership: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool: ...

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
