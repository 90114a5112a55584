"""The local executor: a pool of worker processes; each run gets its own GPUs (no two runs share one).

Workers die with the command that started them: a SIGKILL of ``rexmle run`` leaves no run going on without it
(each worker asks the kernel for SIGKILL when its parent dies, and also watches for being orphaned). The killed
runs resume when the same command is run again."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path

from rexmle_agents.executors.common import Progress, run_one_job
from rexmle_agents.harness.hardware import gpu_ids
from rexmle_agents.harness.runner import RunOutcome
from rexmle_agents.harness.spec import RunSpec
from rexmle_grade.errors import UserInputError

PR_SET_PDEATHSIG = 1
ORPHAN_CHECK_S = 1.0


def die_with_parent(parent: int) -> None:
    """Pool-worker initializer: SIGKILL this process when ``parent`` (the command) dies."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)

    def watch() -> None:  # where prctl is missing, or the thread that forked the worker is gone
        while True:
            time.sleep(ORPHAN_CHECK_S)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def run_local(specs: Sequence[RunSpec], runs_dir: Path, *, workers: int, progress: Progress | None = None,
              gpus: Sequence[str] | None = None, run_dirs: Mapping[str, Path] | None = None) -> list[RunOutcome]:
    free = deque(gpu_ids() if gpus is None else gpus)
    for spec in specs:
        if spec.resources.gpus > len(free):
            raise UserInputError(f"run {spec.run_id} needs {spec.resources.gpus} GPU(s) (--gpus-per-run), but this "
                                 f"machine has {len(free)}",
                                 hint="drop --gpus-per-run, or run where GPUs are (--executor slurm asks the cluster "
                                      "for them)")
    pending = deque(specs)
    running: dict[Future[RunOutcome], tuple[str, ...]] = {}
    outcomes: list[RunOutcome] = []
    # spawn: workers must not inherit the parent's threads (rich progress, model clients) mid-state
    run_dirs = dict(run_dirs or {})
    concurrent = max(1, min(workers, len(specs)))
    with ProcessPoolExecutor(max_workers=max(1, workers), mp_context=multiprocessing.get_context("spawn"),
                             initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
        while pending or running:
            while pending and len(running) < workers and pending[0].resources.gpus <= len(free):
                spec = pending.popleft()
                assigned = tuple(free.popleft() for _ in range(spec.resources.gpus))
                folder = run_dirs.get(spec.run_id)
                job = pool.submit(run_one_job, spec.model_dump_json(), str(runs_dir), assigned,
                                  None if folder is None else str(folder), concurrent)
                running[job] = assigned
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                free.extend(running.pop(future))
                outcome = future.result()
                outcomes.append(outcome)
                if progress:
                    progress(outcome)
    return outcomes
