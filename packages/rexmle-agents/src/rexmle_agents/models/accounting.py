"""Cost and usage accounting: the dated price table, the per-run usage ledger and token/money budgets."""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from dataclasses import dataclass
from datetime import date
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from rexmle_agents.models._jsonl import append_jsonl
from rexmle_agents.models.types import ModelResponse, Usage
from rexmle_grade.errors import BudgetExceededError, ConfigurationError

logger = logging.getLogger(__name__)

# Dated snapshots (gpt-5-2025-08-07, claude-sonnet-4-5-20250929) cost what their undated model costs.
_SNAPSHOT_SUFFIX = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8})$")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _Rates(_Frozen):
    """US dollars per million tokens."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cached_input: float | None = Field(default=None, ge=0)
    cache_write: float | None = Field(default=None, ge=0)

    def _cost(self, usage: Usage) -> float:
        cached = self.input if self.cached_input is None else self.cached_input
        write = self.input if self.cache_write is None else self.cache_write
        uncached = usage.input_tokens - usage.cached_input_tokens - usage.cache_write_input_tokens
        return (
            uncached * self.input
            + usage.cached_input_tokens * cached
            + usage.cache_write_input_tokens * write
            + usage.output_tokens * self.output
        ) / 1_000_000


class LongContextRates(_Rates):
    """The rates of a whole call whose prompt is longer than ``above_input_tokens`` (Gemini Pro models)."""

    above_input_tokens: int = Field(gt=0)


class ModelPrice(_Rates):
    """US dollars per million tokens of one model; ``long_context`` replaces every rate of a call whose prompt
    exceeds its threshold."""

    long_context: LongContextRates | None = None

    def cost(self, usage: Usage) -> float:
        tier = self.long_context
        if tier is not None and usage.input_tokens > tier.above_input_tokens:
            return tier._cost(usage)
        return self._cost(usage)


class PriceTable(_Frozen):
    """Prices keyed by model string (``openai/gpt-5``), valid as of ``as_of`` according to ``sources``."""

    as_of: date
    sources: tuple[str, ...]
    models: dict[str, ModelPrice]

    def lookup(self, model: str) -> ModelPrice | None:
        return self.models.get(model) or self.models.get(_SNAPSHOT_SUFFIX.sub("", model))


def load_prices(path: Path | None = None) -> PriceTable:
    """The price table at ``path``, or the one shipped with rexmle-agents."""
    if path is None:
        return _shipped_prices()
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigurationError(f"cannot read the price table {path}: {exc}") from exc
    return _validate_prices(raw, str(path))


@functools.cache
def _shipped_prices() -> PriceTable:
    text = resources.files("rexmle_agents.models").joinpath("prices.yaml").read_text(encoding="utf-8")
    return _validate_prices(yaml.safe_load(text), "the shipped prices.yaml")


def _validate_prices(raw: object, where: str) -> PriceTable:
    try:
        return PriceTable.model_validate(raw)
    except ValueError as exc:
        raise ConfigurationError(
            f"{where} is not a valid price table: {exc}",
            hint="expected keys as_of (a date), sources (a list) and models (model string -> input/output prices)",
        ) from exc


class UsageTotals(_Frozen):
    """Sums over a set of calls.

    ``cost_usd`` covers the calls with a known cost; ``uncosted_calls`` counts the others (an unpriced model, or
    unknown usage). ``unknown_usage_calls`` counts the calls whose provider reported no usage: ``usage`` and the
    budgets leave their tokens out, so totals are lower bounds whenever it is not 0.
    """

    calls: int = 0
    usage: Usage = Usage()
    cost_usd: float = 0.0
    uncosted_calls: int = 0
    unknown_usage_calls: int = 0
    retry_time_s: float = 0.0

    def plus(self, response: ModelResponse) -> UsageTotals:
        return UsageTotals(
            calls=self.calls + 1,
            usage=self.usage + response.usage,
            cost_usd=self.cost_usd + (response.cost_usd or 0.0),
            uncosted_calls=self.uncosted_calls + (response.cost_usd is None),
            unknown_usage_calls=self.unknown_usage_calls + (not response.usage_known),
            retry_time_s=self.retry_time_s + response.retry_time_s,
        )


class CallRecord(_Frozen):
    """One model call as the run journal stores it, with the step's and the run's totals after it. ``time`` is Unix
    seconds, like every other journal event (records written before that carried an ISO-8601 string, which
    :mod:`rexmle_agents.results` still reads)."""

    kind: Literal["model_call"] = "model_call"
    time: float
    step: int | None
    model: str
    response_id: str | None
    finish_reason: str
    usage: Usage
    # False: the provider reported no usage, and ``usage`` holds zeros standing for "unknown".
    usage_known: bool = True
    cost_usd: float | None
    duration_s: float
    retry_time_s: float
    step_totals: UsageTotals | None
    run_totals: UsageTotals


class LedgerSummary(_Frozen):
    run: UsageTotals
    steps: dict[int, UsageTotals]


@dataclass(frozen=True)
class Budget:
    """Limits on a run's model use; ``None`` means no limit. Tokens count input plus output.

    A call whose usage the provider did not report adds nothing to either count (see ``unknown_usage_calls``).
    """

    max_tokens: int | None = None
    max_cost_usd: float | None = None

    def check(self, totals: UsageTotals) -> None:
        """Raise BudgetExceededError once a limit is reached, so the agent stops before its next call."""
        used = totals.usage.total_tokens
        if self.max_tokens is not None and used >= self.max_tokens:
            raise BudgetExceededError(
                f"token budget spent: {used:,} of {self.max_tokens:,} tokens used in {totals.calls} model call(s)",
                hint="the agent must stop here; raise Budget.max_tokens to let it go on",
            )
        if self.max_cost_usd is not None and totals.cost_usd >= self.max_cost_usd:
            raise BudgetExceededError(
                f"money budget spent: ${totals.cost_usd:.4f} of ${self.max_cost_usd:.4f} used in "
                f"{totals.calls} model call(s)",
                hint="the agent must stop here; raise Budget.max_cost_usd to let it go on",
            )


class UsageLedger:
    """Per-step and per-run usage of every model a run uses; thread-safe.

    The harness calls :meth:`begin_step` as each agent step starts; every :class:`~rexmle_agents.models.base.Model`
    sharing the ledger records its calls against the current step. With ``journal``, each call is appended to that
    JSON-lines file (durably) as a :class:`CallRecord`, so the journal's last line always holds the run totals.
    """

    def __init__(self, journal: Path | None = None, budget: Budget | None = None) -> None:
        self.journal = journal
        self.budget = budget
        self.step: int | None = None
        self._run = UsageTotals()
        self._steps: dict[int, UsageTotals] = {}
        self._lock = threading.Lock()

    def begin_step(self, step: int) -> None:
        self.step = step

    def check_budget(self) -> None:
        if self.budget is not None:
            self.budget.check(self.totals())

    def record(self, model: str, response: ModelResponse, *, duration_s: float) -> CallRecord:
        with self._lock:
            step = self.step
            self._run = self._run.plus(response)
            step_totals = None
            if step is not None:
                step_totals = self._steps[step] = self._steps.get(step, UsageTotals()).plus(response)
            record = CallRecord(
                time=time.time(),
                step=step,
                model=model,
                response_id=response.id,
                finish_reason=response.finish_reason,
                usage=response.usage,
                usage_known=response.usage_known,
                cost_usd=response.cost_usd,
                duration_s=duration_s,
                retry_time_s=response.retry_time_s,
                step_totals=step_totals,
                run_totals=self._run,
            )
            if self.journal is not None:
                append_jsonl(self.journal, record)
        return record

    def totals(self) -> UsageTotals:
        with self._lock:
            return self._run

    def step_totals(self, step: int) -> UsageTotals:
        with self._lock:
            return self._steps.get(step, UsageTotals())

    def summary(self) -> LedgerSummary:
        with self._lock:
            return LedgerSummary(run=self._run, steps=dict(self._steps))
