"""Cost forecasts of runs before they start (``rexmle run ... --dry-run``): GPU-hours and API dollars per run, per
seed and in total.

* **GPU-hours** of a run: its time limit times its GPUs (the budget it holds the GPUs for; a run that ends early
  costs less, never more, because the harness stops it at the limit).
* **API dollars** of a run: steps x tokens per step x the model's price (``models/prices.yaml``), where steps are
  steps per hour x the time limit (at most ``--max-steps``) and the result is at most ``--max-cost``. Steps per hour
  and tokens per step come from recorded runs of the same agent (scaffold) under ``--history RUNS``, pooled over
  those runs (sum of tokens / sum of steps; sum of steps / sum of hours used); without any, from
  :data:`ASSUMED_USAGE`, a stated assumption printed beside the figure. A run with several models (one per role) is
  priced as if its calls were spread evenly over them. An agent that calls no model costs no API dollars. A model
  without a price leaves the dollars unknown (shown as such, never as $0).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: steps per hour of budget and tokens per step assumed for an agent without recorded runs: an LLM scaffold step is
#: one prompt with the task, the best code and its output (about 20k tokens) and one answer with a whole script
#: (about 2k), and it runs that script (about a quarter of an hour of training on a GPU)
ASSUMED_STEPS_PER_HOUR = 4.0
ASSUMED_INPUT_TOKENS_PER_STEP = 20_000.0
ASSUMED_OUTPUT_TOKENS_PER_STEP = 2_000.0


@dataclass(frozen=True)
class StepUsage:
    """How an agent spends its budget: steps per hour, and tokens per step; ``basis`` says where it comes from."""

    steps_per_hour: float
    input_tokens_per_step: float
    output_tokens_per_step: float
    basis: str


ASSUMED_USAGE = StepUsage(ASSUMED_STEPS_PER_HOUR, ASSUMED_INPUT_TOKENS_PER_STEP, ASSUMED_OUTPUT_TOKENS_PER_STEP,
                          f"assumed: {ASSUMED_STEPS_PER_HOUR:g} steps/h, {ASSUMED_INPUT_TOKENS_PER_STEP:,.0f} in + "
                          f"{ASSUMED_OUTPUT_TOKENS_PER_STEP:,.0f} out tokens/step")


@dataclass(frozen=True)
class PlannedRun:
    """What a forecast needs of one run (no prepared data, key or sandbox: a dry run checks none of them)."""

    task_id: str
    agent: str
    models: Mapping[str, str]
    seed: int
    time_limit_s: float
    gpus: int = 0
    max_steps: int | None = None
    max_tokens: int | None = None
    max_cost_usd: float | None = None


@dataclass(frozen=True)
class RunForecast:
    run: PlannedRun
    gpu_hours: float
    steps: float
    api_usd: float | None  # None: a model without a price
    basis: str


@dataclass(frozen=True)
class Forecast:
    runs: list[RunForecast] = field(default_factory=list)

    def per_seed(self) -> dict[int, tuple[float, float | None]]:
        """seed -> (GPU-hours, API dollars or None when some run's dollars are unknown) of that seed's runs."""
        seeds: dict[int, list[RunForecast]] = defaultdict(list)
        for r in self.runs:
            seeds[r.run.seed].append(r)
        return {seed: _sum(runs) for seed, runs in sorted(seeds.items())}

    def total(self) -> tuple[float, float | None]:
        return _sum(self.runs)


def _sum(runs: Sequence[RunForecast]) -> tuple[float, float | None]:
    dollars = [r.api_usd for r in runs if r.api_usd is not None]
    return sum(r.gpu_hours for r in runs), (sum(dollars) if len(dollars) == len(runs) else None)


def usage_from_history(rows: Iterable[Any]) -> dict[str, StepUsage]:
    """agent -> its pooled usage in recorded runs (:class:`rexmle_agents.results.rows.RunRow`): only runs that made
    steps and recorded their tokens count."""
    pooled: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0, 0.0])
    for row in rows:
        if not row.steps or row.input_tokens is None or row.output_tokens is None or not row.time_used_s:
            continue
        sums = pooled[row.agent]
        sums[0] += row.steps
        sums[1] += row.time_used_s / 3600
        sums[2] += row.input_tokens
        sums[3] += row.output_tokens
        sums[4] += 1
    return {agent: StepUsage(steps / hours, inputs / steps, outputs / steps,
                             f"history: {int(n)} run(s) of {agent}, {steps / hours:.3g} steps/h, "
                             f"{inputs / steps:,.0f} in + {outputs / steps:,.0f} out tokens/step")
            # runs whose model reported no usage at all (a scripted model) say nothing about tokens
            for agent, (steps, hours, inputs, outputs, n) in pooled.items() if inputs + outputs > 0}


def load_history(path: Path) -> dict[str, StepUsage]:
    """:func:`usage_from_history` of every run folder under ``path``."""
    from rexmle_agents.results.loader import load_runs
    from rexmle_agents.results.rows import run_row

    return usage_from_history(run_row(run) for run in load_runs([path]).runs)


def forecast_run(run: PlannedRun, usage: StepUsage, *, calls_models: bool, prices: Any) -> RunForecast:
    hours = run.time_limit_s / 3600
    gpu_hours = hours * run.gpus
    models = sorted(set(run.models.values()))
    if not calls_models or not models:
        return RunForecast(run, gpu_hours, 0.0, 0.0, "calls no model")
    steps = usage.steps_per_hour * hours
    if run.max_steps is not None:
        steps = min(steps, float(run.max_steps))
    inputs, outputs = steps * usage.input_tokens_per_step, steps * usage.output_tokens_per_step
    if run.max_tokens is not None and inputs + outputs > run.max_tokens:
        scale = run.max_tokens / (inputs + outputs)  # the run stops at its token budget
        inputs, outputs = inputs * scale, outputs * scale
    rates = [_price(model, prices) for model in models]
    if any(rate is None for rate in rates):
        unpriced = [m for m, rate in zip(models, rates, strict=True) if rate is None]
        return RunForecast(run, gpu_hours, steps, None, f"{usage.basis}; no price for {', '.join(unpriced)}")
    dollars = sum((inputs * r.input + outputs * r.output) / 1e6 / len(models) for r in rates if r is not None)
    basis = usage.basis
    if run.max_cost_usd is not None and dollars > run.max_cost_usd:
        dollars, basis = run.max_cost_usd, f"{basis}; capped by --max-cost"
    return RunForecast(run, gpu_hours, steps, dollars, basis)


def _price(model: str, prices: Any) -> Any:
    if model.startswith("replay:") or model.startswith("scripted/"):
        from rexmle_agents.models.accounting import ModelPrice

        return ModelPrice(input=0.0, output=0.0)  # calls nothing billed
    from rexmle_agents.models.registry import parse_model_string

    return prices.lookup(parse_model_string(model).model_string)


def forecast(runs: Sequence[PlannedRun], *, history: Mapping[str, StepUsage] | None = None,
             prices: Any = None) -> Forecast:
    """The forecast of ``runs``: each agent's usage from ``history`` when it has recorded runs there, else the
    stated assumption."""
    from rexmle_agents.harness.agent import get_agent_info
    from rexmle_agents.models.accounting import load_prices

    prices = prices or load_prices()
    roles = {agent: get_agent_info(agent).roles for agent in {r.agent for r in runs}}
    return Forecast([forecast_run(r, (history or {}).get(r.agent, ASSUMED_USAGE),
                                  calls_models=bool(roles[r.agent]) or bool(r.models), prices=prices) for r in runs])


def _usd(value: float | None) -> str:
    return "unknown (a model without a price)" if value is None else f"${value:,.2f}"


def render(result: Forecast, console: Any, *, title: str = "cost forecast") -> None:
    """One row per kind of run (agent, models, time limit, GPUs) with its per-run figures, then each seed's and the
    total."""
    from rich.table import Table
    from rich.text import Text

    kinds: dict[tuple[str, str, float, int], list[RunForecast]] = defaultdict(list)
    for r in result.runs:
        models = ",".join(f"{k}={v}" for k, v in sorted(r.run.models.items())) or "-"
        kinds[(r.run.agent, models, r.run.time_limit_s, r.run.gpus)].append(r)
    table = Table(title=title)
    for column in ("agent", "models", "time limit", "GPUs", "runs", "GPU-h/run", "steps/run", "API $/run", "basis"):
        table.add_column(column, overflow="fold")
    for (agent, models, limit, gpus), runs in kinds.items():
        first = runs[0]
        table.add_row(Text(agent), Text(models), f"{limit / 3600:g} h", str(gpus), str(len(runs)),
                      f"{first.gpu_hours:g}", f"{first.steps:.3g}", _usd(first.api_usd), Text(first.basis))
    console.print(table)
    for seed, (gpu_hours, dollars) in result.per_seed().items():
        console.print(f"seed {seed}: {gpu_hours:,.1f} GPU-h, API {_usd(dollars)}", markup=False)
    gpu_hours, dollars = result.total()
    console.print(f"total: {len(result.runs)} run(s), {gpu_hours:,.1f} GPU-h, API {_usd(dollars)}", markup=False)
