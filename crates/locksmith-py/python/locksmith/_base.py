"""The base classes the blocking and the asyncio API share: everything that
neither blocks nor awaits (names, tokens, lost state, making locks)."""

from ._locksmith import (
    ClientBase,
    ElectionBase,
    GuardBase,
    HoldBase,
    LeadershipBase,
    LockBase,
    RwLockBase,
)

__all__ = [
    "ClientBase",
    "ElectionBase",
    "GuardBase",
    "HoldBase",
    "LeadershipBase",
    "LockBase",
    "RwLockBase",
]
