"""The local executor: a pool of worker processes; each run gets its own GPUs (no two runs share one)."""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path

from rexmle_agents.executors.common import Progress, run_one_job
from rexmle_agents.harness.hardware import gpu_ids
from rexmle_agents.harness.runner import RunOutcome
from rexmle_agents.harness.spec import RunSpec
from rexmle_grade.errors import UserInputError


def run_local(specs: Sequence[RunSpec], runs_dir: Path, *, workers: int, progress: Progress | None = None,
              gpus: Sequence[str] | None = None) -> list[RunOutcome]:
    free = deque(gpu_ids() if gpus is None else gpus)
    for spec in specs:
        if spec.resources.gpus > len(free):
            raise UserInputError(f"run {spec.run_id} needs {spec.resources.gpus} GPU(s); this machine has {len(free)}")
    pending = deque(specs)
    running: dict[Future[RunOutcome], tuple[str, ...]] = {}
    outcomes: list[RunOutcome] = []
    # spawn: workers must not inherit the parent's threads (rich progress, model clients) mid-state
    with ProcessPoolExecutor(max_workers=max(1, workers), mp_context=multiprocessing.get_context("spawn")) as pool:
        while pending or running:
            while pending and len(running) < workers and pending[0].resources.gpus <= len(free):
                spec = pending.popleft()
                assigned = tuple(free.popleft() for _ in range(spec.resources.gpus))
                running[pool.submit(run_one_job, spec.model_dump_json(), str(runs_dir), assigned)] = assigned
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                free.extend(running.pop(future))
                outcome = future.result()
                outcomes.append(outcome)
                if progress:
                    progress(outcome)
    return outcomes
