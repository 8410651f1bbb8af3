"""Type stubs of locksmith's asyncio API (the native classes are in Rust)."""

from collections.abc import AsyncIterator, Iterable
from types import TracebackType
from typing import final

from . import Grant, Leader, LockInfo, LostCallback, LostCause, Seconds

async def connect(
    url: str,
    *,
    session_ttl: Seconds | None = None,
    client_name: str | None = None,
    host: str | None = None,
) -> Client:
    """Connects to the store the URL names."""

@final
class Client:
    """A connection to one lock store; `async with` closes it."""

    @property
    def backend(self) -> str: ...
    def lock(
        self,
        name: str,
        *,
        wait: Seconds | None = None,
        lease: Seconds | None = None,
        owner: str | None = None,
        reentrant: bool = True,
        lock_delay: Seconds | None = None,
    ) -> Lock: ...
    def rw_lock(self, name: str) -> RwLock: ...
    def semaphore(
        self,
        name: str,
        permits: int,
        *,
        wait: Seconds | None = None,
        lease: Seconds | None = None,
        owner: str | None = None,
        reentrant: bool = True,
        lock_delay: Seconds | None = None,
    ) -> Lock: ...
    def multi_lock(
        self,
        names: Iterable[str],
        *,
        wait: Seconds | None = None,
        lease: Seconds | None = None,
        owner: str | None = None,
        reentrant: bool = True,
        lock_delay: Seconds | None = None,
    ) -> Lock: ...
    def election(self, name: str) -> Election: ...
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
class Lock:
    """A lock to acquire; `async with lock as guard:` acquires and releases."""

    @property
    def names(self) -> list[str]: ...
    @property
    def mode(self) -> str: ...
    @property
    def permits(self) -> int | None: ...
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
class RwLock:
    """A read-write lock: many readers or one writer, writers not starved."""

    def read(
        self,
        *,
        wait: Seconds | None = None,
        lease: Seconds | None = None,
        owner: str | None = None,
        reentrant: bool = True,
        lock_delay: Seconds | None = None,
    ) -> Lock: ...
    def write(
        self,
        *,
        wait: Seconds | None = None,
        lease: Seconds | None = None,
        owner: str | None = None,
        reentrant: bool = True,
        lock_delay: Seconds | None = None,
    ) -> Lock: ...

@final
class Guard:
    """A held lock (or several, for a multi-lock)."""

    @property
    def fencing_token(self) -> int: ...
    @property
    def fencing_tokens(self) -> list[int]: ...
    @property
    def name(self) -> str: ...
    @property
    def names(self) -> list[str]: ...
    @property
    def hold_count(self) -> int: ...
    @property
    def remaining_lease(self) -> float | None: ...
    @property
    def is_lost(self) -> bool: ...
    @property
    def lost_cause(self) -> LostCause | None: ...
    @property
    def lost_reason(self) -> str | None: ...
    def raise_if_lost(self) -> None: ...
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
class Election:
    """An election on one lock name."""

    @property
    def name(self) -> str: ...
    async def campaign(self, value: str, *, wait: Seconds | None = None) -> Leadership: ...
    async def leader(self) -> Leader | None: ...
    def observe(self) -> Observer: ...

@final
class Leadership:
    """This candidate's leadership; `async with` resigns it."""

    @property
    def value(self) -> str: ...
    @property
    def fencing_token(self) -> int: ...
    @property
    def is_lost(self) -> bool: ...
    @property
    def lost_cause(self) -> LostCause | None: ...
    @property
    def lost_reason(self) -> str | None: ...
    def raise_if_lost(self) -> None: ...
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
