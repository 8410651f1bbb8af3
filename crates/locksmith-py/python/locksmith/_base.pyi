"""Type stubs of the base classes the blocking and the asyncio API share
(the native classes are in Rust): everything that neither blocks nor awaits."""

from collections.abc import Iterable
from typing import Generic, TypeVar

from . import LostCause, Seconds

_Lock = TypeVar("_Lock", bound=LockBase)
_RwLock = TypeVar("_RwLock", bound=RwLockBase[LockBase])
_Election = TypeVar("_Election", bound=ElectionBase)

class ClientBase(Generic[_Lock, _RwLock, _Election]):
    """A connection to one lock store, handing out its API's locks."""

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
    ) -> _Lock: ...
    def rw_lock(self, name: str) -> _RwLock: ...
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
    ) -> _Lock: ...
    def multi_lock(
        self,
        names: Iterable[str],
        *,
        wait: Seconds | None = None,
        lease: Seconds | None = None,
        owner: str | None = None,
        reentrant: bool = True,
        lock_delay: Seconds | None = None,
    ) -> _Lock: ...
    def election(self, name: str) -> _Election: ...

class LockBase:
    """A lock to acquire."""

    @property
    def names(self) -> list[str]: ...
    @property
    def mode(self) -> str: ...
    @property
    def permits(self) -> int | None: ...

class RwLockBase(Generic[_Lock]):
    """A read-write lock: many readers or one writer.

    Writers are not starved where the store queues waiters in order (not on
    Redis outside ``mode=fair``, nor over Redlock).
    """

    def read(
        self,
        *,
        wait: Seconds | None = None,
        lease: Seconds | None = None,
        owner: str | None = None,
        reentrant: bool = True,
        lock_delay: Seconds | None = None,
    ) -> _Lock: ...
    def write(
        self,
        *,
        wait: Seconds | None = None,
        lease: Seconds | None = None,
        owner: str | None = None,
        reentrant: bool = True,
        lock_delay: Seconds | None = None,
    ) -> _Lock: ...

class HoldBase:
    """What guards and leaderships have alike: names, fencing tokens and
    whether the hold was lost."""

    @property
    def fencing_token(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def is_lost(self) -> bool: ...
    @property
    def lost_cause(self) -> LostCause | None: ...
    @property
    def lost_reason(self) -> str | None: ...
    def raise_if_lost(self) -> None: ...

class GuardBase(HoldBase):
    """A held lock (or several, for a multi-lock)."""

    @property
    def fencing_tokens(self) -> list[int]: ...
    @property
    def names(self) -> list[str]: ...
    @property
    def hold_count(self) -> int: ...
    @property
    def remaining_lease(self) -> float | None: ...

class ElectionBase:
    """An election on one lock name."""

    @property
    def name(self) -> str: ...

class LeadershipBase(HoldBase):
    """This candidate's leadership until resigned, dropped or lost."""

    @property
    def value(self) -> str: ...
