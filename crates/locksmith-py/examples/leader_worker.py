"""A worker that does its work only while it leads (asyncio).

Several replicas of a service run this; one is elected and works, the others
wait in line, and when the leader stops (or dies, or loses its session) the
next one takes over. The leader publishes its name as the election's value,
which followers (or `locksmith leader services/billing-worker`) read. The
leadership's fencing token goes with every action, so that an old leader's
late actions are refused; the work stops the moment leadership is lost.

    python leader_worker.py locksmith://127.0.0.1:7420 worker-1

Without arguments it runs against memory:// as worker-1, for three rounds.
It exits with 0 once its work is done, and with 1 when leadership is lost
(`locksmith release --force services/billing-worker` takes it away).
"""

import asyncio
import sys

import locksmith
import locksmith.aio


async def watch(election: locksmith.aio.Election) -> None:
    """Followers can watch who leads, for instance to forward requests."""
    async for leader in election.observe():
        print(f"leader: {leader.value}" if leader else "no leader")


async def work(leadership: locksmith.aio.Leadership, rounds: int) -> None:
    for round in range(1, rounds + 1):
        print(f"  round {round}: acting with fencing token {leadership.fencing_token}")
        await asyncio.sleep(0.2)


async def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else "memory://"
    me = sys.argv[2] if len(sys.argv) > 2 else "worker-1"
    rounds = 3 if len(sys.argv) <= 1 else 1_000_000
    async with await locksmith.aio.connect(url) as client:
        election = client.election("services/billing-worker")
        watcher = asyncio.create_task(watch(election))
        print(f"{me}: waiting to lead")
        try:
            # The exit resigns, checked: had leadership been lost, it would
            # raise locksmith.Lost, so a lost leadership is raised here first.
            async with await election.campaign(me) as leadership:
                print(f"{me}: leading (fencing token {leadership.fencing_token})")
                working = asyncio.create_task(work(leadership, rounds))
                lost = asyncio.ensure_future(leadership.lost())
                done, _ = await asyncio.wait({working, lost}, return_when=asyncio.FIRST_COMPLETED)
                if lost in done:
                    working.cancel()
                    leadership.raise_if_lost()
                lost.cancel()
                working.result()  # what the work raised, if it did
        except locksmith.Lost as error:
            print(f"{me}: leadership lost ({error.cause}: {error.reason}); stopped", file=sys.stderr)
            return 1
        finally:
            watcher.cancel()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
