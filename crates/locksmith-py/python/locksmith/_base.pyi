"""Type stubs of the base classes the blocking and the asyncio API share
(the native classes are in Rust): everything that neither blocks nor awaits.

The classes are not generic (the native classes cannot be subscripted): each
API's classes declare again, with their own return types, what makes that
API's objects (`Client.lock`, `RwLock.read`, ...).
"""

from collections.abc import Iterable

from typing_extensions import disjoint_base

from . import LostCause, _Seconds

__all__ = [
    "ClientBase",
    "ElectionBase",
    "GuardBase",
    "HoldBase",
    "LeadershipBase",
    "LockBase",
    "RwLockBase",
]

@disjoint_base
class ClientBase:
    """A connection to one lock store, handing out its API's locks."""

    @property
    def backend(self) -> str: ...
    def lock(
        self,
        name: str,
        *,
        wait: _Seconds | None = None,
        lease: _Seconds | None = None,
        owner: str | None = None,
        reentrant: bool = True,
        lock_delay: _Seconds | None = None,
    ) -> LockBase: ...
    def rw_lock(self, name: str) -> RwLockBase: ...
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
    ) -> LockBase: ...
    def multi_lock(
        self,
        names: Iterable[str],
        *,
        wait: _Seconds | None = None,
        lease: _Seconds | None = None,
        owner: str | None = None,
        reentrant: bool = True,
        lock_delay: _Seconds | None = None,
    ) -> LockBase: ...
    def election(self, name: str) -> ElectionBase: ...

@disjoint_base
class LockBase:
    """A lock to acquire."""

    @property
    def names(self) -> list[str]: ...
    @property
    def mode(self) -> str: ...
    @property
    def permits(self) -> int | None: ...

@disjoint_base
class RwLockBase:
    """A read-write lock: many readers or one writer.

    Writers are not starved where the store queues waiters in order (not on
    Redis outside ``mode=fair``, nor over Redlock).
    """

    def read(
        self,
        *,
        wait: _Seconds | None = None,
        lease: _Seconds | None = None,
        owner: str | None = None,
        reentrant: bool = True,
        lock_delay: _Seconds | None = None,
    ) -> LockBase: ...
    def write(
        self,
        *,
        wait: _Seconds | None = None,
        lease: _Seconds | None = None,
        owner: str | None = None,
        reentrant: bool = True,
        lock_delay: _Seconds | None = None,
    ) -> LockBase: ...

@disjoint_base
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

@disjoint_base
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

@disjoint_base
class ElectionBase:
    """An election on one lock name."""

    @property
    def name(self) -> str: ...

@disjoint_base
class LeadershipBase(HoldBase):
    """This candidate's leadership until resigned, dropped or lost."""

    @property
    def value(self) -> str: ...
