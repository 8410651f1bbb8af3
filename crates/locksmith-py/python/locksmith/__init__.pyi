"""Type stubs of locksmith's blocking API (the native classes are in Rust)."""

from collections.abc import Callable, Iterator
from datetime import timedelta
from types import TracebackType
from typing import final

from . import aio as aio
from ._base import ClientBase, ElectionBase, GuardBase, LeadershipBase, LockBase, RwLockBase
from ._model import (
    AlreadyHeld as AlreadyHeld,
    BackendError as BackendError,
    BackendNotEnabled as BackendNotEnabled,
    Closed as Closed,
    Conflict as Conflict,
    Error as Error,
    Grant as Grant,
    Holder as Holder,
    InvalidArgument as InvalidArgument,
    InvalidName as InvalidName,
    InvalidUrl as InvalidUrl,
    Leader as Leader,
    LimitReached as LimitReached,
    LockInfo as LockInfo,
    Lost as Lost,
    LostCause as LostCause,
    NotHeld as NotHeld,
    NotOwner as NotOwner,
    PermissionDenied as PermissionDenied,
    Timeout as Timeout,
    Unauthenticated as Unauthenticated,
    Unreplicated as Unreplicated,
    Unsupported as Unsupported,
    Waiter as Waiter,
)

__version__: str

Seconds = float | int | timedelta
"""A duration: seconds as a float or an int, or a `datetime.timedelta`."""

LostCallback = Callable[[LostCause, str], object]
"""Called with why (in a word and in words) a hold was lost."""

def connect(
    url: str,
    *,
    session_ttl: Seconds | None = None,
    client_name: str | None = None,
    host: str | None = None,
) -> Client:
    """Connects to the store the URL names (`locksmith://`, `redis://`,
    `zk://`, `etcd://`, `postgres://`, `memory://`, ...), blocking until
    connected."""

@final
class Client(ClientBase[Lock, RwLock, Election]):
    """A connection to one lock store; `with` closes it."""

    def status(self, name: str) -> LockInfo | None: ...
    def list(self, prefix: str = "") -> list[LockInfo]: ...
    def history(self, prefix: str = "") -> list[Grant]: ...
    def force_release(self, name: str) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Client: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool: ...

@final
class Lock(LockBase):
    """A lock to acquire; `with lock as guard:` acquires and releases."""

    def acquire(self, wait: Seconds | None = None) -> Guard: ...
    def try_acquire(self) -> Guard | None: ...
    def __enter__(self) -> Guard:
        """Acquires with the lock's own `wait`, opening a block that the
        matching `__exit__` closes: the block belongs to the generator (or
        coroutine) that runs the `with` statement, wherever it is resumed,
        else to this thread."""
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        """Releases the hold of the innermost open block of this lock that
        belongs to the same generator (or coroutine), else to this thread.
        Without one, it closes the only block of this lock still open, or
        among several the only one whose thread has ended; else it raises
        `RuntimeError` and closes none."""

@final
class RwLock(RwLockBase[Lock]):
    """A read-write lock: many readers or one writer.

    Writers are not starved where the store queues waiters in order (not on
    Redis outside ``mode=fair``, nor over Redlock).
    """

@final
class Guard(GuardBase):
    """A held lock (or several, for a multi-lock)."""

    def lost(self, timeout: Seconds | None = None) -> str | None: ...
    def on_lost(self, callback: LostCallback) -> None: ...
    def extend(self, lease: Seconds) -> None: ...
    def release(self) -> None: ...
    def __enter__(self) -> Guard: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool: ...

@final
class Election(ElectionBase):
    """An election on one lock name."""

    def campaign(self, value: str, *, wait: Seconds | None = None) -> Leadership: ...
    def leader(self) -> Leader | None: ...
    def observe(self) -> Observer: ...

@final
class Leadership(LeadershipBase):
    """This candidate's leadership; `with` resigns it."""

    def lost(self, timeout: Seconds | None = None) -> str | None: ...
    def on_lost(self, callback: LostCallback) -> None: ...
    def proclaim(self, value: str) -> None: ...
    def resign(self) -> None: ...
    def __enter__(self) -> Leadership: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool: ...

@final
class Observer(Iterator[Leader | None]):
    """The leader now, then at every change (`None`: nobody leads)."""

    def __iter__(self) -> Observer: ...
    def __next__(self) -> Leader | None: ...
