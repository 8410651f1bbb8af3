"""The asyncio API of locksmith: the same clients, locks and guards as
:mod:`locksmith`, with coroutines where the blocking API blocks.

    import locksmith.aio

    client = await locksmith.aio.connect("redis://localhost:6379")
    async with client.lock("jobs/nightly") as guard:
        await run_job(token=guard.fencing_token)

Cancelling an awaiting task cancels the call: a cancelled acquire leaves
no queue entry and no hold behind.
"""

from ._locksmith import aio as _native

connect = _native.connect
Client = _native.Client
Lock = _native.Lock
RwLock = _native.RwLock
Guard = _native.Guard
Election = _native.Election
Leadership = _native.Leadership
Observer = _native.Observer

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
