"""Type stubs of locksmith's blocking API (the native classes are in Rust)."""

import builtins
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from types import TracebackType
from typing import Literal, final

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

__all__ = [
    "AlreadyHeld",
    "BackendError",
    "BackendNotEnabled",
    "Client",
    "Closed",
    "Conflict",
    "Election",
    "Error",
    "Grant",
    "Guard",
    "Holder",
    "InvalidArgument",
    "InvalidName",
    "InvalidUrl",
    "Leader",
    "Leadership",
    "LimitReached",
    "Lock",
    "LockInfo",
    "Lost",
    "LostCause",
    "NotHeld",
    "NotOwner",
    "Observer",
    "PermissionDenied",
    "RwLock",
    "Timeout",
    "Unauthenticated",
    "Unreplicated",
    "Unsupported",
    "Waiter",
    "aio",
    "connect",
]

# Type aliases of the stubs alone (the module has no such names at run time).
_Seconds = float | int | timedelta
"""A duration: seconds as a float or an int, or a `datetime.timedelta`."""

_LostCallback = Callable[[LostCause, str], object]
"""Called with why (in a word and in words) a hold was lost."""

def connect(
    url: str,
    *,
    session_ttl: _Seconds | None = None,
    client_name: str | None = None,
    host: str | None = None,
) -> Client:
    """Connects to the store the URL names (`locksmith://`, `redis://`,
    `zk://`, `etcd://`, `postgres://`, `memory://`, ...), blocking until
    connected."""

@final
class Client(ClientBase):
    """A connection to one lock store; `with` closes it."""

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
    def status(self, name: str) -> LockInfo | None: ...
    # `builtins.list`: inside this class `list` names the method.
    def list(self, prefix: str = "") -> builtins.list[LockInfo]: ...
    def history(self, prefix: str = "") -> builtins.list[Grant]: ...
    def force_release(self, name: str) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Client: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]: ...

@final
class Lock(LockBase):
    """A lock to acquire; `with lock as guard:` acquires and releases."""

    def acquire(self, wait: _Seconds | None = None) -> Guard: ...
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
    ) -> Literal[False]:
        """Releases the hold of the innermost open block of this lock that
        belongs to the same generator (or coroutine), else to this thread.
        Without one, it closes the only block of this lock still open, or
        among several the only one whose thread has ended; else it raises
        `RuntimeError` and closes none."""

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

    def lost(self, timeout: _Seconds | None = None) -> str | None: ...
    def on_lost(self, callback: _LostCallback) -> None: ...
    def extend(self, lease: _Seconds) -> None: ...
    def release(self) -> None: ...
    def __enter__(self) -> Guard: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]: ...

@final
class Election(ElectionBase):
    """An election on one lock name."""

    def campaign(self, value: str, *, wait: _Seconds | None = None) -> Leadership: ...
    def leader(self) -> Leader | None: ...
    def observe(self) -> Observer: ...

@final
class Leadership(LeadershipBase):
    """This candidate's leadership; `with` resigns it."""

    def lost(self, timeout: _Seconds | None = None) -> str | None: ...
    def on_lost(self, callback: _LostCallback) -> None: ...
    def proclaim(self, value: str) -> None: ...
    def resign(self) -> None: ...
    def __enter__(self) -> Leadership: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]: ...

@final
class Observer(Iterator[Leader | None]):
    """The leader now, then at every change (`None`: nobody leads)."""

    def __iter__(self) -> Observer: ...
    def __next__(self) -> Leader | None: ...
