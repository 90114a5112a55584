"""rexmle's tasks as Inspect tasks: ``rexmle/<task id>`` (one sample), ``rexmle/lite`` and ``rexmle/all`` (one
sample per task), each sample one rexmle run (``--epochs K``: K seeds).

Task options (``-T``): ``time_limit`` (12h), ``exec_timeout`` (4h, one command), ``gpus`` (0), ``cpus``,
``memory_gb``, ``disk_gb``, ``selection_cases`` (0: the held-out selection split, as ``rexmle run --selection-cases``),
``difficulty`` (the synthetic mirror's difficulty the prepared data must have), ``expert_report`` (add the winning
team's method to the prompt), ``data_root`` (else ``$REXMLE_DATA_DIR``), ``work_dir`` (where the samples' run
folders go) and ``keep_workspace``.

The default solver is Inspect's ReAct agent with its bash and python tools; the prompt is the sample's input, so any
``--solver`` gets the same task. The sandbox is rexmle's (:mod:`.sandbox`), the scorer rexmle's grader
(:mod:`.scorer`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inspect_ai import Task, task
from inspect_ai.agent import Agent, react
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.tool import bash, python
from inspect_ai.util import SandboxEnvironmentSpec

from rexmle_agents.integrations.inspect._names import published, qualified
from rexmle_agents.integrations.inspect.sandbox import SANDBOX_NAME, RexmleSandboxConfig
from rexmle_agents.integrations.inspect.scorer import SPEC_KEY, rexmle_scorer
from rexmle_agents.integrations.inspect.spec import (
    DEFAULT_EXEC_TIMEOUT,
    DEFAULT_TIME_LIMIT,
    SampleOptions,
    sample_spec,
    task_prompt,
)
from rexmle_grade.errors import RexmleError, UserInputError

GROUPS = ("lite", "all")


def default_solver(exec_timeout_s: float) -> Agent:
    """Inspect's standard ReAct agent with bash and python, each command bounded by the task's exec timeout."""
    timeout = max(1, int(exec_timeout_s))
    return react(tools=[bash(timeout=timeout), python(timeout=timeout)])


def rexmle_task(task_ids: list[str], options: SampleOptions, *, work_dir: str | None = None,
                keep_workspace: bool = False, name: str | None = None) -> Task:
    """The Inspect task of ``task_ids``: one sample per rexmle task, each in its own rexmle sandbox."""
    samples, problems = [], []
    for task_id in task_ids:
        try:
            spec = sample_spec(task_id, options)
        except RexmleError as exc:  # every unprepared task is named at once, not one per attempt
            problems.append(f"{task_id}: {exc.message}" + (f" ({exc.hint})" if getattr(exc, "hint", None) else ""))
            continue
        config = RexmleSandboxConfig(spec=spec.model_dump_json(), work_dir=work_dir, keep=keep_workspace)
        samples.append(Sample(id=task_id, input=task_prompt(spec, expert_report=options.expert_report), target="",
                              metadata={SPEC_KEY: spec.model_dump(mode="json"), "task_id": task_id,
                                        "data_variant": spec.data_variant,
                                        "selection_cases": spec.selection_cases},
                              sandbox=SandboxEnvironmentSpec(SANDBOX_NAME, config)))
    if problems:
        raise UserInputError("these rexmle tasks cannot run:\n  " + "\n  ".join(problems),
                             hint="prepare them (rexmle prepare TASK, or --synthetic for the offline mirror), or "
                                  "name the tasks that are ready")
    return Task(dataset=MemoryDataset(samples, name=name or ",".join(task_ids)),
                solver=default_solver(options.exec_timeout_s), scorer=rexmle_scorer(),
                time_limit=max(1, int(options.time_limit_s)), name=name,
                metadata={"benchmark": "rexmle", "tasks": list(task_ids),
                          "time_limit_s": options.time_limit_s, "gpus": options.gpus,
                          "selection_cases": options.selection_cases, "expert_report": options.expert_report})


def _factory(name: str, task_ids: Callable[[], list[str]]) -> Callable[..., Task]:
    def make(time_limit: str = DEFAULT_TIME_LIMIT, exec_timeout: str = DEFAULT_EXEC_TIMEOUT, gpus: int = 0,
             cpus: int | None = None, memory_gb: float | None = None, disk_gb: float | None = None,
             selection_cases: int = 0,
             difficulty: str | None = None, expert_report: bool = False, data_root: str | None = None,
             work_dir: str | None = None, keep_workspace: bool = False) -> Task:
        options = SampleOptions.parse(time_limit=time_limit, exec_timeout=exec_timeout, gpus=gpus, cpus=cpus,
                                      memory_gb=memory_gb, selection_cases=selection_cases, difficulty=difficulty,
                                      expert_report=expert_report, data_root=data_root, disk_gb=disk_gb)
        return rexmle_task(task_ids(), options, work_dir=work_dir, keep_workspace=bool(keep_workspace),
                           name=qualified(name))

    make.__doc__ = f"rexmle {'task ' + name if name not in GROUPS else 'tasks: ' + name} (see rexmle_agents." \
                   "integrations.inspect.tasks for the -T options)"
    return task(name=qualified(name))(published(make, name))


def _select(expression: str) -> Callable[[], list[str]]:
    def chosen() -> list[str]:
        from rexmle_agents.cli import select_tasks

        return select_tasks(expression)

    return chosen


def register_all() -> dict[str, Any]:
    """Every rexmle task and group, registered with Inspect as ``rexmle/<name>``."""
    from rexmle_tasks.registry import task_ids

    made = {task_id: _factory(task_id, _select(task_id)) for task_id in task_ids()}
    made.update({group: _factory(group, _select(group)) for group in GROUPS})
    return made


TASKS = register_all()
