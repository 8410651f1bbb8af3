"""Exceptions, loss causes and inspection records, shared by both APIs.

The native module raises these exceptions and builds these records; they are
plain Python so that they pickle, compare and print as Python users expect.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime


class LostCause(enum.Enum):
    """Why a hold was lost, in a word, on every backend."""

    SESSION_EXPIRED = "session_expired"
    """The session that kept the hold alive expired."""
    SESSION_CLOSED = "session_closed"
    """The session was closed while the hold was held."""
    LEASE_EXPIRED = "lease_expired"
    """The hold's own lease ran out."""
    FORCE_RELEASED = "force_released"
    """An administrator took the lock away."""
    CLIENT_CLOSED = "client_closed"
    """The client was closed."""
    CONNECTION_LOST = "connection_lost"
    """The client could not reach the store for longer than the hold can be trusted."""
    GONE = "gone"
    """The store no longer has the hold and cannot say why."""
    OTHER = "other"
    """None of the above."""


class Error(Exception):
    """Base class of every error locksmith raises."""


class InvalidName(Error, ValueError):
    """The lock name breaks the naming rules; nothing was sent anywhere."""

    name: str | None = None


class InvalidArgument(Error, ValueError):
    """An option is out of range or contradictory (zero permits, a lease too long, ...)."""


class InvalidUrl(Error, ValueError):
    """The backend URL cannot be used."""


class BackendNotEnabled(Error):
    """The URL names a backend this build leaves out."""


class Timeout(Error, TimeoutError):
    """The acquire did not succeed within its wait time."""

    wait: float | None = None
    """The wait that ran out, in seconds."""


class NotOwner(Error):
    """The lock is held, but not by the caller."""

    name: str | None = None


class NotHeld(Error):
    """The lock is not held at all."""

    name: str | None = None


class AlreadyHeld(Error):
    """The owner already holds the lock and re-entry is off."""

    name: str | None = None


class Conflict(Error):
    """The request conflicts with how the lock is held or defined (re-entry in
    another mode, a semaphore's permits that differ from its holders')."""

    name: str | None = None
    mode: str | None = None
    """The requested mode: ``"exclusive"``, ``"shared"`` or ``"semaphore(N)"``."""


class Lost(Error):
    """The hold was lost (expired, taken away, connection gone)."""

    cause: LostCause | None = None
    """Why, in a word, where it is known."""
    reason: str | None = None
    """Why, in words."""


class LimitReached(Error):
    """A limit of the store was reached."""


class Unauthenticated(Error):
    """The store refused the credentials, or got none where it requires them."""


class PermissionDenied(Error, PermissionError):
    """The caller may not do this to this lock; nothing changed."""


class Unsupported(Error):
    """The backend cannot do this (lock-delay on a store without it, ...)."""

    backend: str | None = None


class Unreplicated(Error):
    """A Redis grant that fewer replicas than asked acknowledged in time
    (``wait_replicas``), so a failover could hand the lock out again: it was
    not handed to the caller. Retrying is right once the replicas catch up;
    ``given_back`` says whether the grant is gone."""

    name: str | None = None
    primary: str | None = None
    """Where it was granted (the primary, or "the Redis Cluster")."""
    acknowledged: int | None = None
    """How many replicas acknowledged the grant."""
    asked: int | None = None
    """How many were asked for (``wait_replicas``)."""
    within: float | None = None
    """How long they had, in seconds (``wait_timeout``)."""
    connected: int | None = None
    """How many replicas the primary had connected right after, if it said."""
    given_back: bool | None = None
    """Whether the grant was given back before the call returned (nothing is
    held); if not, it may hold the lock, unrenewed, for ``lease``."""
    lease: float | None = None
    """The grant's lease in seconds, when giving it back was not confirmed."""
    undo_failure: str | None = None
    """Why giving the grant back was not confirmed."""


class Closed(Error):
    """The client was closed, or connected in a process that has since forked."""


class BackendError(Error):
    """The store failed (I/O, protocol, server error)."""

    backend: str | None = None


@dataclass(frozen=True)
class Holder:
    """One holder of a lock. Fields a store does not record are ``None``."""

    owner: str
    mode: str
    """``"exclusive"``, ``"shared"`` or ``"semaphore"``."""
    permits: int | None
    """The semaphore's permits (``None`` for the other modes)."""
    hold_count: int
    fencing_token: int | None
    lock_by: str | None
    """Who the client is (``"name@host"``, or what the store records)."""
    lock_time: datetime | None
    lease_expires: datetime | None
    """When the hold's lease or session runs out unless renewed."""


@dataclass(frozen=True)
class Waiter:
    """One waiter of a lock."""

    owner: str
    mode: str
    permits: int | None
    since: datetime | None


@dataclass(frozen=True)
class LockInfo:
    """A lock as inspection sees it: its holders and its waiters in queue order
    (no waiters where the store cannot list them)."""

    name: str
    holders: tuple[Holder, ...]
    waiters: tuple[Waiter, ...]


@dataclass(frozen=True)
class Grant:
    """One grant of a lock, from the locksmith server's grant history."""

    name: str
    owner: str
    mode: str
    permits: int | None
    fencing_token: int
    lock_by: str | None
    granted_at: datetime
    waited: float
    """Seconds the acquire waited in the queue first."""
    state: str
    """``"held"``, ``"released"`` or ``"lost"``."""
    ended_at: datetime | None
    lost_reason: str | None


@dataclass(frozen=True)
class Leader:
    """An election's leader as observers see it."""

    value: str
    """The value the leader published (its candidate id, address, ...)."""
    fencing_token: int | None
    """Its fencing token, where the store records one."""
