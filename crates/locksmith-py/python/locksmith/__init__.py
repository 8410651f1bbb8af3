"""Distributed locks with fencing tokens, over the locksmith server, Redis,
ZooKeeper, etcd, PostgreSQL or memory: locksmith's Rust client for Python.

    import locksmith

    client = locksmith.connect("locksmith://127.0.0.1:7420")
    with client.lock("orders/42", wait=5.0) as guard:
        write_order(42, token=guard.fencing_token)
        guard.raise_if_lost()

This module is the blocking API; :mod:`locksmith.aio` is the same for
asyncio. See docs/python.md in the repository for the whole guide.
"""

from importlib.metadata import PackageNotFoundError, version as _version

from ._locksmith import (
    Client,
    Election,
    Guard,
    Leadership,
    Lock,
    Observer,
    RwLock,
    connect,
)
from ._model import (
    AlreadyHeld,
    BackendError,
    BackendNotEnabled,
    Closed,
    Conflict,
    Error,
    Grant,
    Holder,
    InvalidArgument,
    InvalidName,
    InvalidUrl,
    Leader,
    LimitReached,
    LockInfo,
    Lost,
    LostCause,
    NotHeld,
    NotOwner,
    PermissionDenied,
    Timeout,
    Unauthenticated,
    Unreplicated,
    Unsupported,
    Waiter,
)
from . import aio

try:
    __version__ = _version("locksmith")
except PackageNotFoundError:  # imported from a source tree, not installed
    __version__ = "0+unknown"

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
