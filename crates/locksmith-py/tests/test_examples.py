"""The examples run, and do what they say, against the lock server."""

from __future__ import annotations

import subprocess
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
