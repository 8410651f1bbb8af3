"""A cron job that must run once, however many machines start it.

Every machine's crontab starts this script at the same minute; the one that
takes the lock does the work, the others see it taken and exit at once. The
work checks between steps that the hold can still be trusted (its session
expired? an operator force-released it?) and passes the fencing token with
every write, so that storage which checks it refuses a late writer.

    python cron_once.py locksmith://127.0.0.1:7420

The URL names any store (redis://..., zk://..., etcd://..., postgres://...);
without one it runs against memory://.
"""

import sys
import time

import locksmith


def nightly_report(guard: locksmith.Guard) -> None:
    """The job: every write carries the fencing token."""
    for part in range(1, 4):
        guard.raise_if_lost()  # stop writing: someone else may hold the lock now
        print(f"  writing part {part} with token {guard.fencing_token}")
        time.sleep(0.1)


def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else "memory://"
    with locksmith.connect(url, client_name="nightly-report") as client:
        # No waiting: if another machine has the job, this run has nothing to do.
        guard = client.lock("cron/nightly-report").try_acquire()
        if guard is None:
            print("another machine runs the nightly report; nothing to do")
            return 0
        print(f"running the nightly report (fencing token {guard.fencing_token})")
        try:
            with guard:  # the checked release at the end: raises if the hold was lost
                nightly_report(guard)
        except locksmith.Lost as lost:
            print(f"lock lost ({lost.cause}: {lost.reason}); stopped", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
