"""The examples run, and do what they say, against the lock server."""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from pathlib import Path

import locksmith
from conftest import python, url_of

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    child = python(str(EXAMPLES / script), *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = child.communicate(timeout=60)
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


def test_cron_once_runs_once(stores):
    url = url_of(stores, "server")
    ran = run("cron_once.py", url)
    assert ran.returncode == 0, ran.stderr
    assert "running the nightly report" in ran.stdout
    with locksmith.connect(url) as other, other.lock("cron/nightly-report") as _:
        skipped = run("cron_once.py", url)
    assert skipped.returncode == 0, skipped.stderr
    assert "nothing to do" in skipped.stdout


def test_leader_worker_leads_and_works():
    ran = run("leader_worker.py")
    assert ran.returncode == 0, ran.stderr
    assert "worker-1: leading" in ran.stdout
    assert "round 3" in ran.stdout


def test_leader_worker_stops_cleanly_when_leadership_is_lost(stores):
    url = url_of(stores, "server")
    child = python(
        "-u", str(EXAMPLES / "leader_worker.py"), url, "worker-1",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in child.stdout], daemon=True).start()
        deadline = time.monotonic() + 30
        while "worker-1: leading" not in lines.get(timeout=max(0.0, deadline - time.monotonic())):
            pass
        with locksmith.connect(url) as operator:
            operator.force_release("services/billing-worker")
        child.wait(timeout=30)  # stdout goes on being read by the thread
        err = child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 1, err
    assert "Traceback" not in err, err
    assert "worker-1: leadership lost (LostCause.FORCE_RELEASED" in err, err
    assert err.rstrip().endswith("stopped"), err
