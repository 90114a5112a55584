"""What an Inspect sample of a rexmle task is: a :class:`RunSpec` (the same record a ``rexmle run`` writes, with the
agent ``inspect``), the task's public facts, and the prompt the agent gets.

The prompt is rexmle's own: the harness's instructions (``prompts/instructions.md``, rendered by
:func:`render_instructions`) wrapped in the terminal-agent prompt (``prompts/cli_agent.md``, :func:`cli_prompt`),
with the task's expert report added when asked for. Nothing here imports inspect_ai.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rexmle_agents.harness.context import TaskInfo
from rexmle_agents.harness.spec import Limits, Resources, RunSpec, data_variant, parse_duration
from rexmle_agents.sandbox.base import SUBMISSION_DIRNAME, WORKING_DIRNAME, WORKSPACE
from rexmle_grade.errors import UserInputError

INSPECT_AGENT = "inspect"  # the agent name of every run that came from Inspect (its solver is in agent_config)
DEFAULT_TIME_LIMIT = "12h"  # the paper's setting, as for `rexmle run`
DEFAULT_EXEC_TIMEOUT = "4h"


@dataclass(frozen=True)
class SampleOptions:
    """The ``-T`` options of a rexmle task in Inspect, checked."""

    time_limit_s: float = parse_duration(DEFAULT_TIME_LIMIT)
    exec_timeout_s: float = parse_duration(DEFAULT_EXEC_TIMEOUT)
    gpus: int = 0
    cpus: int | None = None
    memory_gb: float | None = None
    disk_gb: float | None = None
    selection_cases: int = 0
    difficulty: str | None = None  # the synthetic mirror's difficulty the prepared data must have (None: any data)
    expert_report: bool = False
    data_root: str | None = None

    @classmethod
    def parse(cls, *, time_limit: str | float, exec_timeout: str | float, gpus: int, cpus: int | None,
              memory_gb: float | None, selection_cases: int, difficulty: str | None, expert_report: bool | str,
              data_root: str | None, disk_gb: float | None = None) -> SampleOptions:
        time_limit_s, exec_timeout_s = parse_duration(time_limit), parse_duration(exec_timeout)
        for name, value in (("gpus", gpus), ("selection_cases", selection_cases)):
            if int(value) < 0:
                raise UserInputError(f"-T {name}={value}: expected a count of 0 or more", hint=f"e.g. -T {name}=1")
        for name, amount in (("memory_gb", memory_gb), ("disk_gb", disk_gb)):
            if amount is not None and float(amount) <= 0:
                raise UserInputError(f"-T {name}={amount}: expected gigabytes above zero", hint=f"e.g. -T {name}=32")
        if time_limit_s <= 0 or exec_timeout_s <= 0:
            raise UserInputError(f"-T time_limit={time_limit} / exec_timeout={exec_timeout}: expected durations "
                                 "above zero", hint="e.g. -T time_limit=12h -T exec_timeout=4h")
        if isinstance(expert_report, str):  # -T expert_report=true arrives as text from some shells' quoting
            expert_report = expert_report.strip().lower() in ("1", "true", "yes", "on")
        return cls(time_limit_s=time_limit_s, exec_timeout_s=min(exec_timeout_s, time_limit_s), gpus=int(gpus),
                   cpus=None if cpus is None else int(cpus), memory_gb=None if memory_gb is None else float(memory_gb),
                   disk_gb=None if disk_gb is None else float(disk_gb),
                   selection_cases=int(selection_cases), difficulty=difficulty or None,
                   expert_report=bool(expert_report), data_root=data_root)


def sample_spec(task_id: str, options: SampleOptions, *, seed: int = 0, models: dict[str, str] | None = None,
                agent_config: dict[str, Any] | None = None, group: str = "inspect") -> RunSpec:
    """The run spec of one sample of ``task_id``, after checking its data is prepared (and of the difficulty
    asked for) and its selection split can be drawn."""
    from rexmle_agents.harness.runner import prepared_for_run
    from rexmle_grade.settings import data_dir, rexmle_versions
    from rexmle_tasks.registry import get_task

    task = get_task(task_id)
    root = data_dir(options.data_root)
    info = prepared_for_run(task, root)
    variant = data_variant(synthetic=info.synthetic, difficulty=info.difficulty)
    if options.difficulty is not None and variant != f"synthetic-{options.difficulty}":
        raise UserInputError(f"-T difficulty={options.difficulty}: task {task.id!r} is prepared as {variant} data",
                             hint=f"run `rexmle prepare {task.id} --synthetic --difficulty {options.difficulty} "
                                  "--force`, or drop -T difficulty")
    if options.selection_cases:
        from rexmle_tasks.selection import check_selection_request

        check_selection_request(task.id, options.selection_cases, root)
    return RunSpec(task_id=task.id, task_version=task.meta.version, split_digest=info.split_digest,
                   data_variant=variant, agent=INSPECT_AGENT, agent_version=inspect_version(),
                   agent_config=dict(agent_config or {}), models=dict(models or {}), seed=seed,
                   limits=Limits(time_limit_s=options.time_limit_s, exec_timeout_s=options.exec_timeout_s),
                   resources=Resources(gpus=options.gpus, cpus=options.cpus, memory_gb=options.memory_gb,
                                       disk_gb=options.disk_gb),
                   sandbox="bwrap", selection_cases=options.selection_cases, group=group, data_root=str(root),
                   rexmle_versions=rexmle_versions())


def inspect_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("inspect_ai")
    except PackageNotFoundError:
        return "unknown"


def task_info(spec: RunSpec, public_dir: Path | None = None) -> TaskInfo:
    """The task's public facts as the harness gives them to agents (``public_dir``: the folder the agent sees,
    a selection split's own view when there is one)."""
    from rexmle_tasks.pipeline import task_dirs
    from rexmle_tasks.registry import get_task

    task = get_task(spec.task_id)
    public = public_dir or task_dirs(task, spec.data_root).public
    return TaskInfo(task_id=task.id, task_version=task.meta.version, grader_id=task.meta.grader,
                    title=task.meta.title, task_type=task.meta.task_type, dim=task.meta.dim,
                    description=(public / "description.md").read_text(encoding="utf-8"), public_dir=public)


class _PromptView:
    """What the instructions need to know of the sandbox: where the workspace is inside (bubblewrap's place)."""

    workspace_path = WORKSPACE


def hardware_of(spec: RunSpec, gpus: tuple[str, ...] = ()) -> dict[str, Any]:
    from rexmle_agents.harness.hardware import describe
    from rexmle_agents.harness.limits import GIB, resolve_limits

    limits = resolve_limits(spec, workspace=Path(spec.data_root))
    memory_gb = None if limits.memory_bytes is None else limits.memory_bytes / GIB
    hardware = describe(gpus, spec.resources.cpus, memory_gb)
    if not gpus:  # the prompt is written before the sandbox is given its GPUs: it states how many it will have
        hardware["gpus"] = spec.resources.gpus
    return hardware


def instructions_text(spec: RunSpec, info: TaskInfo, hardware: dict[str, Any]) -> str:
    """``instructions.md`` of the sample's workspace: exactly what ``rexmle run`` writes."""
    from rexmle_agents.harness.instructions import render_instructions

    return render_instructions(spec, info, _PromptView(), hardware)  # type: ignore[arg-type]


def task_prompt(spec: RunSpec, *, expert_report: bool = False) -> str:
    """The first user message of a sample: rexmle's terminal-agent prompt around the run's instructions."""
    from rexmle_agents.external.agent import cli_prompt

    info = task_info(spec)
    hardware = hardware_of(spec)
    instructions = instructions_text(spec, info, hardware)
    values = {"agent_dir": f"{WORKSPACE}/{WORKING_DIRNAME}", "instructions_file": f"{WORKSPACE}/instructions.md",
              "instructions": instructions, "time_limit_s": int(spec.limits.time_limit_s),
              "submission_dir": f"{WORKSPACE}/{SUBMISSION_DIRNAME}", "harness_python": sys.executable,
              "cpus": hardware.get("cpus")}
    prompt = cli_prompt(values, hardware)
    if expert_report:
        from rexmle_agents.scaffolds.prompting import expert_report as report_section
        from rexmle_tasks.registry import get_task

        prompt += "\n\n" + report_section(get_task(spec.task_id).folder).strip() + "\n"
    return prompt
