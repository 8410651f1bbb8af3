"""The asyncio API of locksmith: the same clients, locks and guards as
:mod:`locksmith`, with coroutines where the blocking API blocks.

    import locksmith.aio

    client = await locksmith.aio.connect("redis://localhost:6379")
    async with client.lock("jobs/nightly") as guard:
        await run_job(token=guard.fencing_token)

Cancelling an awaiting task cancels the call: a cancelled acquire leaves
no queue entry and no hold behind.
"""

import asyncio

from ._locksmith import aio as _native

connect = _native.connect
Client = _native.Client
Lock = _native.Lock
RwLock = _native.RwLock
Guard = _native.Guard
Election = _native.Election
Leadership = _native.Leadership
Observer = _native.Observer

# The tasks that wait for a loss to call an `on_lost` callback: a loop
# keeps only weak references to its tasks. A task has no strong reference
# to its callback, which the guard keeps (so that a guard the callback
# refers to can still be collected): it ends when the hold is released,
# lost, or dropped with its guard.
_loss_watches: set[asyncio.Task[object]] = set()


async def _await(awaitable):
    return await awaitable


def _call_on_loss(loss):
    """Calls an ``on_lost`` callback on the running loop once ``loss``
    completes with one: an awaitable of ``(callback, cause, reason)`` once
    the hold is lost, or ``None`` once it is released first, or once its
    guard (which keeps the callback) is gone. Used by ``on_lost``."""
    task = asyncio.get_running_loop().create_task(_await(loss))
    _loss_watches.add(task)

    def done(task):
        _loss_watches.discard(task)
        if not task.cancelled():
            lost = task.result()
            if lost is not None:
                callback, cause, reason = lost
                callback(cause, reason)

    task.add_done_callback(done)


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
