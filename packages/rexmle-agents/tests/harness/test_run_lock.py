"""The run lock: one harness per run folder, and a probe that holds the lock for a moment (`rexmle run` and `runs
status` take it to see whether a run is live) does not make a harness starting at that instant fail."""

from __future__ import annotations

import fcntl
import threading
import time
from pathlib import Path

import pytest

from rexmle_agents.harness.paths import RunPaths
from rexmle_agents.harness.runner import LOCK_PROBE_GRACE_S, RunLockedError, run_lock


def hold(paths: RunPaths, seconds: float, taken: threading.Event) -> None:
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    with paths.lock.open("a+") as handle:  # another open file description: flock conflicts as between processes
        fcntl.flock(handle, fcntl.LOCK_EX)
        taken.set()
        time.sleep(seconds)
        fcntl.flock(handle, fcntl.LOCK_UN)


def test_a_lock_held_for_a_moment_is_waited_for(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    taken = threading.Event()
    prober = threading.Thread(target=hold, args=(paths, 0.1, taken))
    prober.start()
    assert taken.wait(5)
    started = time.monotonic()
    with run_lock(paths):
        waited = time.monotonic() - started
    prober.join()
    assert 0.0 < waited < LOCK_PROBE_GRACE_S


def test_a_lock_another_harness_keeps_is_refused(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    taken = threading.Event()
    other = threading.Thread(target=hold, args=(paths, LOCK_PROBE_GRACE_S + 1.5, taken))
    other.start()
    assert taken.wait(5)
    started = time.monotonic()
    with pytest.raises(RunLockedError, match="being run by another process"), run_lock(paths):
        pass
    assert time.monotonic() - started >= LOCK_PROBE_GRACE_S
    other.join()
