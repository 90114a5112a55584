"""The SLURM executor, through submitit: one job array per group, requeued on preemption or time-out, each
requeued job resuming its run from the journal. ``local=True`` runs the same job code with submitit's
LocalExecutor (how this path is tested without a cluster)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rexmle_agents.executors.common import Progress, SlurmOptions, run_one_job
from rexmle_agents.harness.hardware import gpu_ids
from rexmle_agents.harness.runner import RunOutcome
from rexmle_agents.harness.spec import RunSpec
from rexmle_grade.errors import ConfigurationError

try:
    import submitit
    from submitit.helpers import Checkpointable
except ImportError:  # pragma: no cover - submitit is a dependency; guard for trimmed installs
    submitit = None
    Checkpointable = object


class RunJob(Checkpointable):  # type: ignore[misc,valid-type]
    """A run as a submitit job; on preemption or time-out submitit requeues it and the run resumes."""

    def __call__(self, spec_json: str, runs_dir: str, run_dir: str = "") -> RunOutcome:
        spec = RunSpec.model_validate_json(spec_json)
        return run_one_job(spec_json, runs_dir, gpu_ids()[: spec.resources.gpus], run_dir or None)


def run_submitit(specs: Sequence[RunSpec], runs_dir: Path, *, options: SlurmOptions, local: bool,
                 progress: Progress | None = None, run_dirs: Mapping[str, Path] | None = None) -> list[RunOutcome]:
    if submitit is None:
        raise ConfigurationError("the slurm executor needs submitit", hint="pip install submitit")
    folder = Path(runs_dir) / specs[0].group / ".submitit"
    executor: Any
    if local:
        executor = submitit.LocalExecutor(folder=folder)
        executor.update_parameters(timeout_min=_timeout_min(specs, options))
    else:
        executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
        executor.update_parameters(**slurm_parameters(specs, options))
    folders = [str((run_dirs or {}).get(s.run_id, "")) for s in specs]
    jobs = executor.map_array(RunJob(), [s.model_dump_json() for s in specs], [str(runs_dir)] * len(specs), folders)
    if not options.wait:
        return []
    outcomes = []
    for job in jobs:
        outcome = job.result()
        outcomes.append(outcome)
        if progress:
            progress(outcome)
    return outcomes


def _timeout_min(specs: Sequence[RunSpec], options: SlurmOptions) -> int:
    if options.timeout_min is not None:
        return options.timeout_min
    return math.ceil(max(s.limits.time_limit_s for s in specs) / 60) + 60


def slurm_parameters(specs: Sequence[RunSpec], options: SlurmOptions) -> dict[str, Any]:
    """submitit parameters for a group (the largest run's needs; runs of one group share their resources)."""
    gpus = max(s.resources.gpus for s in specs)
    cpus = options.cpus_per_task or max((s.resources.cpus or 0) for s in specs) or None
    mem = options.mem_gb or max((s.resources.memory_gb or 0) for s in specs) or None
    params: dict[str, Any] = {
        "timeout_min": _timeout_min(specs, options),
        "slurm_array_parallelism": options.array_parallelism,
        "name": f"rexmle-{specs[0].group}",
        "tasks_per_node": 1,
        "nodes": 1,
    }
    if gpus:
        params["gpus_per_node"] = gpus
    if cpus:
        params["cpus_per_task"] = cpus
    if mem:
        params["mem_gb"] = mem
    if options.partition:
        params["slurm_partition"] = options.partition
    if options.account:
        params["slurm_account"] = options.account
    if options.extra:
        params["slurm_additional_parameters"] = dict(options.extra)
    return params
