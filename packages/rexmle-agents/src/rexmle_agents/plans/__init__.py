"""Experiment plans: a group of runs written down as data (YAML), run with one command and reported with another.

```bash
rexmle run --plan paper-main --dry-run             # what it would run (540 runs) and what would refuse it
rexmle run --plan paper-main --executor slurm --partition gpu
rexmle report --plan paper-main                    # the plan's table, grouped as the plan says
```

A plan names a group, a number of seeds, run options shared by every run (``options``: the ``rexmle run`` options
that define a run: time limit, execution timeout, budgets, GPUs, sandbox ...) and blocks of runs. Within a block
every list is crossed: agents x agent configs x models x time limits x tasks x seeds. ``agent_config`` is a mapping
or ``"@name.yaml"`` (a shipped scaffold configuration or a file); a model is a string for every role or a mapping
role -> model. Shipped plans (this folder): ``paper-main``, ``ablation-time-budget``, ``ablation-backend``,
``ablation-expert-report``. Where to run (executor, workers, runs folder) stays on the command line.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rexmle_grade.errors import UnknownNameError, UserInputError

PLAN_DIR = Path(__file__).parent
PLAN_FORMAT = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunOptions(_Strict):
    """The ``rexmle run`` options that define a run (and so its id); a block may override any of them."""

    time_limit: str = "12h"
    exec_timeout: str = "4h"
    max_steps: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None
    extend_for_retries: bool = False
    gpus_per_run: int = 0
    cpus: int | None = None
    memory_gb: float | None = None
    sandbox: str = "auto"
    selection_cases: int = 0


class Block(_Strict):
    agent: str | list[str]
    agent_config: str | dict[str, Any] | list[str | dict[str, Any]] = Field(default_factory=dict)
    models: list[str | dict[str, str]] = Field(default_factory=list)
    tasks: str = "all"
    exclude_tasks: list[str] = Field(default_factory=list)
    time_limits: list[str] | None = None
    seeds: int | None = None
    options: dict[str, Any] = Field(default_factory=dict)


class ReportSettings(_Strict):
    by: list[str] = Field(default_factory=lambda: ["agent", "model", "config", "budget"])


class Plan(_Strict):
    format: Literal[1] = PLAN_FORMAT
    name: str
    description: str = ""
    group: str
    seeds: int = Field(default=1, ge=1)
    options: RunOptions = RunOptions()
    runs: list[Block] = Field(min_length=1)
    report: ReportSettings = ReportSettings()


@dataclass(frozen=True)
class RunRequest:
    """One run of a plan, before any check (``build_spec`` checks it)."""

    task_id: str
    agent: str
    agent_config: dict[str, Any]
    models: dict[str, str]
    seed: int
    options: RunOptions


def shipped_plans() -> list[str]:
    return sorted(p.stem for p in PLAN_DIR.glob("*.yaml"))


def load_plan(reference: str | Path) -> Plan:
    """A plan from a file, or a shipped plan by name (``paper-main`` or ``paper-main.yaml``)."""
    path = Path(reference).expanduser()
    if not path.is_file():
        name = Path(str(reference)).name
        shipped = PLAN_DIR / (name if name.endswith((".yaml", ".yml")) else f"{name}.yaml")
        if "/" in str(reference) or not shipped.is_file():
            raise UnknownNameError("plan", str(reference), shipped_plans())
        path = shipped
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise UserInputError(f"cannot read plan {path}: {exc}") from None
    try:
        return Plan.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
        raise UserInputError(f"plan {path} is not valid: {problems}",
                             hint=f"see a shipped plan, e.g. {PLAN_DIR / 'paper-main.yaml'}") from None


def expand(plan: Plan, *, select_tasks: Callable[[str], list[str]],
           read_config: Callable[[str], dict[str, Any]]) -> list[RunRequest]:
    """Every run of the plan, in order. ``select_tasks`` turns a task expression into ids; ``read_config`` reads an
    ``@file`` agent configuration."""
    requests: list[RunRequest] = []
    for number, block in enumerate(plan.runs, start=1):
        agents = [block.agent] if isinstance(block.agent, str) else list(block.agent)
        configs = block.agent_config if isinstance(block.agent_config, list) else [block.agent_config]
        configs_read = [read_config(c) if isinstance(c, str) else dict(c) for c in configs]
        models = [m if isinstance(m, dict) else {"default": m} for m in block.models] or [{}]
        unknown = [t for t in block.exclude_tasks if t not in select_tasks("all")]
        if unknown:
            raise UserInputError(f"plan {plan.name!r}, block {number}: exclude_tasks names unknown task(s) {unknown}")
        task_ids = [t for t in select_tasks(block.tasks) if t not in block.exclude_tasks]
        try:
            base = plan.options.model_copy(update=dict(block.options))
            base = RunOptions.model_validate(base.model_dump())
        except ValidationError as exc:
            raise UserInputError(f"plan {plan.name!r}, block {number}: bad options: {exc.errors()[0]['msg']}") from None
        limits = block.time_limits or [base.time_limit]
        seeds = range(block.seeds or plan.seeds)
        for agent, config, model, limit, task_id, seed in itertools.product(agents, configs_read, models, limits,
                                                                           task_ids, seeds):
            requests.append(RunRequest(task_id=task_id, agent=agent, agent_config=config, models=model, seed=seed,
                                       options=base.model_copy(update={"time_limit": limit})))
    return requests


def refusals(requests: list[RunRequest]) -> list[tuple[str, int, str]]:
    """What would refuse runs of a plan before they start, found by making each distinct agent with its settings
    (nothing runs, nothing is written): unknown settings, or a checkout still at a shipped plan's placeholder path.
    Each is (agent, number of runs, the refusal and its hint)."""
    from rexmle_agents.harness.agent import make_agent
    from rexmle_grade.errors import RexmleError

    counts: dict[tuple[str, str], int] = {}
    for request in requests:
        key = (request.agent, json.dumps(request.agent_config, sort_keys=True))
        counts[key] = counts.get(key, 0) + 1
    found = []
    for (agent, config), count in counts.items():
        try:
            make_agent(agent, json.loads(config))
        except RexmleError as exc:
            found.append((agent, count, exc.message + (f" ({exc.hint})" if exc.hint else "")))
    return found
