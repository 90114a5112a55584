"""Cost and usage accounting: the dated price table, the per-run usage ledger and token/money budgets."""

from __future__ import annotations

import functools
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from rexmle_agents.models._jsonl import append_jsonl, dumps_strict
from rexmle_agents.models.types import Message, ModelResponse, ToolSpec, Usage
from rexmle_grade.errors import BudgetExceededError, ConfigurationError

logger = logging.getLogger(__name__)

# Dated snapshots (gpt-5-2025-08-07, claude-sonnet-4-5-20250929) cost what their undated model costs.
_SNAPSHOT_SUFFIX = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8})$")
# Tokenisers spend about 4 bytes of English per token; 3 leaves room for code, numbers and other languages.
BYTES_PER_TOKEN = 3
# The few tokens a chat format adds around each message (role, separators) and around the whole prompt.
TOKENS_PER_MESSAGE = 4
TOKENS_PER_PROMPT = 3
# How often a call waiting for budget to be freed re-runs the ledger's gate (the run's deadline and cancellation).
RESERVATION_POLL_S = 0.5


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
    :class:`UsageLedger` enforces the limits by reservation (see there): calls made at once spend at most the
    budget plus one call's reservation.
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


def estimate_input_tokens(messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> int:
    """A conservative count of a prompt's tokens without a tokeniser: UTF-8 bytes / :data:`BYTES_PER_TOKEN` of
    every message's text, tool calls and tool schemas, plus the chat format's overhead per message."""
    # never raises on what an agent or a model wrote (lone surrogates, NaN, nesting past any recursion limit)
    size = sum(len(m.content.encode("utf-8", "surrogatepass")) for m in messages)
    size += sum(len(c.name) + len(dumps_strict(c.arguments)) for m in messages for c in m.tool_calls)
    size += sum(len(dumps_strict(t)) for t in tools)
    return math.ceil(size / BYTES_PER_TOKEN) + TOKENS_PER_MESSAGE * len(messages) + TOKENS_PER_PROMPT


@dataclass(frozen=True)
class CallEstimate:
    """The worst case of one call, reserved before it is sent.

    ``output_tokens`` is the call's length limit; ``None`` (the call sets none) reserves whatever the budget has
    left. ``price`` turns tokens into dollars (input price for input, output price for output); ``None``
    (unpriced) reserves the whole money budget left.
    """

    input_tokens: int
    output_tokens: int | None
    price: ModelPrice | None = None


class Reservation:
    """What one call holds of the budget between :meth:`UsageLedger.reserve` and its settlement or release."""

    def __init__(self, estimate: CallEstimate) -> None:
        self.estimate = estimate
        self.tokens = 0
        self.cost_usd = 0.0
        self.settled = False


class UsageLedger:
    """Per-step and per-run usage of every model a run uses; thread-safe.

    The harness calls :meth:`begin_step` as each agent step starts; every :class:`~rexmle_agents.models.base.Model`
    sharing the ledger records its calls against the current step. With ``journal``, each call is appended to that
    JSON-lines file (durably) as a :class:`CallRecord`, so the journal's last line always holds the run totals.

    **Budgets are reserved, not just checked.** Every call reserves its worst case (:meth:`reserve`) before it is
    sent: its estimated input tokens plus its output limit (the budget left when it sets none), and those tokens
    priced for the money budget. The reservation is held while the call waits for a concurrency slot and while it
    is retried, and is settled with the real usage when the answer arrives (:meth:`record`) or released when the
    call fails (:meth:`release`). A reservation is granted when spent + reserved + its own worst case fit the budget,
    or when no other call holds one; otherwise the call waits for calls in flight to settle (re-running ``gate``,
    if set, every :data:`RESERVATION_POLL_S` seconds: the harness passes its deadline and cancellation check, so a
    wait never outlives the run). Once spent >= budget every call is refused with :class:`BudgetExceededError`.
    So calls made at once never spend more than the budget plus one call's reservation (the one granted alone),
    as long as each call spends at most its worst case: output is capped by the call's own limit, and the input
    estimate (:func:`estimate_input_tokens`) errs high for ordinary text; a call whose usage the provider did not
    report counts nothing (``unknown_usage_calls``).
    """

    def __init__(self, journal: Path | None = None, budget: Budget | None = None) -> None:
        self.journal = journal
        self.budget = budget
        self.step: int | None = None
        # Raises to stop a call waiting for budget (time limit, cancellation); called without the ledger's lock.
        self.gate: Callable[[], None] | None = None
        self._run = UsageTotals()
        self._steps: dict[int, UsageTotals] = {}
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._held: list[Reservation] = []

    def begin_step(self, step: int) -> None:
        self.step = step

    def check_budget(self) -> None:
        if self.budget is not None:
            self.budget.check(self.totals())

    def recheck(self) -> None:
        """The check a call repeats when it gets its concurrency slot: the gate, then spent >= budget."""
        if self.gate is not None:
            self.gate()
        self.check_budget()

    def reserve(self, estimate: CallEstimate) -> Reservation:
        """Hold ``estimate``'s worst case against the budget, waiting while calls in flight hold what is left.

        Raises :class:`BudgetExceededError` once spent >= budget (or when the gate raises while waiting).
        """
        reservation = Reservation(estimate)
        waited = False
        while True:
            with self._lock:
                if self.budget is not None:
                    self.budget.check(self._run)
                if self._grant(reservation):
                    return reservation
                if not waited:
                    logger.info("a model call waits for budget: %d call(s) in flight hold what is left of it",
                                len(self._held))
                    waited = True
                self._settled.wait(timeout=RESERVATION_POLL_S)
            if self.gate is not None:
                self.gate()

    def release(self, reservation: Reservation) -> None:
        """Give back what a failed call held; settling twice is harmless."""
        with self._lock:
            self._drop(reservation)

    def reserved(self) -> tuple[int, float]:
        """Tokens and dollars held by calls in flight."""
        with self._lock:
            return sum(r.tokens for r in self._held), sum(r.cost_usd for r in self._held)

    def _grant(self, reservation: Reservation) -> bool:
        budget = self.budget
        if budget is None:
            self._held.append(reservation)
            return True
        estimate = reservation.estimate
        spent_tokens, spent_usd = self._run.usage.total_tokens, self._run.cost_usd
        held_tokens = sum(r.tokens for r in self._held)
        held_usd = sum(r.cost_usd for r in self._held)
        tokens = estimate.input_tokens
        if estimate.output_tokens is not None:
            tokens += max(0, estimate.output_tokens)
        elif budget.max_tokens is not None:
            tokens += max(0, budget.max_tokens - spent_tokens)
        cost = 0.0
        if budget.max_cost_usd is not None:
            left_usd = max(0.0, budget.max_cost_usd - spent_usd)
            if estimate.price is None:
                cost = math.inf  # its cost is known only once it is answered: it runs alone
            elif estimate.output_tokens is None:
                cost = estimate.price.cost(Usage(input_tokens=estimate.input_tokens)) + left_usd
            else:
                cost = estimate.price.cost(Usage(input_tokens=estimate.input_tokens,
                                                 output_tokens=max(0, estimate.output_tokens)))
        fits = (budget.max_tokens is None or spent_tokens + held_tokens + tokens <= budget.max_tokens) and (
            budget.max_cost_usd is None or spent_usd + held_usd + cost <= budget.max_cost_usd)
        if self._held and not fits:  # a call is always granted alone: that one may pass the budget
            return False
        reservation.tokens, reservation.cost_usd = tokens, cost
        self._held.append(reservation)
        return True

    def _drop(self, reservation: Reservation | None) -> None:
        if reservation is not None and not reservation.settled:
            reservation.settled = True
            self._held.remove(reservation)
            self._settled.notify_all()

    def record(self, model: str, response: ModelResponse, *, duration_s: float,
               reservation: Reservation | None = None) -> CallRecord:
        """Add an answered call to the totals (and the journal), settling its ``reservation`` in the same step."""
        with self._lock:
            self._drop(reservation)
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
