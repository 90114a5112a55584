"""Budgets are reserved, not just checked: many calls made at once through one Model (threads, a slow scripted
backend) spend at most the budget plus one call's reservation; calls queued for a concurrency slot are checked
again; settlement gives back what a call did not use; a failed call gives back all it held; a call waiting for
budget stops at the ledger's gate."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import pytest

from rexmle_agents.models import (
    Budget,
    GenerateConfig,
    Message,
    Model,
    ModelResponse,
    ScriptedBackend,
    ToolSpec,
    Usage,
    UsageLedger,
)
from rexmle_agents.models.accounting import CallEstimate, estimate_input_tokens, load_prices
from rexmle_grade.errors import BudgetExceededError, ModelAPIError

PROMPT = "Describe the training loop of a small U-Net for 2-D vessel segmentation. " * 4  # 300 bytes
MAX_OUT = 50
PRICED = "openai/gpt-4o-mini"


class SlowBackend:
    """Answers after ``delay_s`` with a usage inside the call's worst case (input a quarter of the prompt's bytes:
    what English costs; output the full length limit), counting the calls in flight at once."""

    def __init__(self, *, name: str = "scripted/model", delay_s: float = 0.2,
                 usage: Callable[[Sequence[Message], GenerateConfig], Usage] | None = None) -> None:
        self.in_flight = self.peak = 0
        self.calls = 0
        self.lock = threading.Lock()
        self.usage = usage or (lambda messages, config: Usage(
            input_tokens=sum(len(m.content.encode()) for m in messages) // 4, output_tokens=config.max_tokens or 0))
        self.backend = ScriptedBackend(self._answer, name=name)
        self.name = name
        self.delay_s = delay_s

    def _answer(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig) -> ModelResponse:
        with self.lock:
            self.in_flight += 1
            self.calls += 1
            self.peak = max(self.peak, self.in_flight)
        time.sleep(self.delay_s)
        with self.lock:
            self.in_flight -= 1
        return ModelResponse(text="ok", usage=self.usage(messages, config), model=self.name)

    def generate(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig) -> ModelResponse:
        return self.backend.generate(messages, tools, config)


def fire(model: Model, count: int, config: GenerateConfig | None = None) -> tuple[list[ModelResponse], list[Exception]]:
    """``count`` threads calling ``model`` at once; what each got back."""
    answered: list[ModelResponse] = []
    refused: list[Exception] = []
    lock = threading.Lock()
    start = threading.Barrier(count)

    def call() -> None:
        start.wait()
        try:
            response = model.generate([Message.user(PROMPT)], config=config or GenerateConfig(max_tokens=MAX_OUT))
        except (BudgetExceededError, ModelAPIError) as exc:
            with lock:
                refused.append(exc)
        else:
            with lock:
                answered.append(response)

    threads = [threading.Thread(target=call) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return answered, refused


def one_reservation_tokens() -> int:
    return estimate_input_tokens([Message.user(PROMPT)]) + MAX_OUT


def test_the_estimate_errs_high_for_text_and_counts_tools() -> None:
    messages = [Message.system("You are terse."), Message.user(PROMPT)]
    estimate = estimate_input_tokens(messages)
    assert estimate >= len(PROMPT) // 3
    tool = ToolSpec(name="submit", description="hand in the answer " * 20)
    assert estimate_input_tokens(messages, [tool]) > estimate + 100


def test_fifty_calls_at_once_spend_at_most_the_token_budget_plus_one_reservation() -> None:
    budget = 1000
    backend = SlowBackend()
    ledger = UsageLedger(budget=Budget(max_tokens=budget))
    model = Model(backend, max_concurrency=8, ledger=ledger)
    answered, refused = fire(model, 50)
    spent = ledger.totals().usage.total_tokens
    assert spent == sum(r.usage.total_tokens for r in answered)
    assert spent <= budget + one_reservation_tokens()
    assert spent >= budget  # it went on until the budget was spent, then refused
    assert len(answered) + len(refused) == 50 and all(isinstance(e, BudgetExceededError) for e in refused)
    assert backend.calls == len(answered)  # a refused call never reached the backend
    assert backend.peak > 1  # calls that fit the budget together did run at once
    assert ledger.reserved() == (0, 0.0)


def test_fifty_calls_at_once_spend_at_most_the_money_budget_plus_one_reservation() -> None:
    price = load_prices().lookup(PRICED)
    assert price is not None
    one_call = price.cost(Usage(input_tokens=estimate_input_tokens([Message.user(PROMPT)]), output_tokens=MAX_OUT))
    budget = 7.5 * one_call
    backend = SlowBackend(name=PRICED)
    ledger = UsageLedger(budget=Budget(max_cost_usd=budget))
    model = Model(backend, max_concurrency=8, ledger=ledger)
    answered, refused = fire(model, 50)
    spent = ledger.totals().cost_usd
    assert spent == pytest.approx(sum(r.cost_usd or 0.0 for r in answered))
    assert budget <= spent <= budget + one_call
    assert refused and all("money budget spent" in str(e) for e in refused)
    assert backend.peak > 1


def test_calls_queued_for_a_slot_are_checked_again_when_they_get_it() -> None:
    """Reservations fit the budget, but the first call spends far more than its estimate (a provider counting
    what the estimate could not foresee): the calls queued behind the one slot are refused when they reach it."""
    release = threading.Event()

    def usage(messages: Sequence[Message], config: GenerateConfig) -> Usage:
        release.wait(timeout=30)
        return Usage(input_tokens=20_000, output_tokens=10)

    backend = SlowBackend(delay_s=0.0, usage=usage)
    ledger = UsageLedger(budget=Budget(max_tokens=10_000))
    model = Model(backend, max_concurrency=1, ledger=ledger)
    config = GenerateConfig(max_tokens=10)
    per_call = estimate_input_tokens([Message.user(PROMPT)]) + 10
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(_outcome(model, config))) for _ in range(6)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while ledger.reserved()[0] < 6 * per_call and time.monotonic() < deadline:  # all six hold a reservation
        time.sleep(0.01)
    assert ledger.reserved()[0] == 6 * per_call and backend.calls == 1
    release.set()
    for thread in threads:
        thread.join(timeout=30)
    assert backend.calls == 1  # the five queued calls never reached the backend
    assert sum(isinstance(r, BudgetExceededError) for r in results) == 5
    assert ledger.reserved() == (0, 0.0)


def _outcome(model: Model, config: GenerateConfig) -> object:
    try:
        return model.generate([Message.user(PROMPT)], config=config)
    except BudgetExceededError as exc:
        return exc


def test_settlement_gives_back_what_the_call_did_not_use_and_wakes_a_waiting_call() -> None:
    ledger = UsageLedger(budget=Budget(max_tokens=200))
    first = ledger.reserve(CallEstimate(input_tokens=100, output_tokens=50))
    assert ledger.reserved() == (150, 0.0)
    granted = threading.Event()

    def second() -> None:
        ledger.reserve(CallEstimate(input_tokens=60, output_tokens=40))  # 150 + 100 > 200: it must wait
        granted.set()

    waiter = threading.Thread(target=second)
    waiter.start()
    assert not granted.wait(timeout=0.3)
    ledger.record("scripted/model", ModelResponse(usage=Usage(input_tokens=40, output_tokens=20)), duration_s=0.1,
                  reservation=first)  # settles at 60 tokens: 60 + 100 <= 200
    assert granted.wait(timeout=5)
    waiter.join()
    assert ledger.totals().usage.total_tokens == 60 and ledger.reserved() == (100, 0.0)


def test_a_failed_call_releases_its_reservation_also_after_retries(fast_retry) -> None:
    from rexmle_agents.models import TransientModelAPIError

    seen: list[tuple[int, float]] = []
    ledger = UsageLedger(budget=Budget(max_tokens=1000))

    def failing(*_: object) -> ModelResponse:
        seen.append(ledger.reserved())  # held through every attempt
        raise TransientModelAPIError("scripted/model: HTTP 503")

    model = Model(ScriptedBackend(failing), retry=fast_retry, ledger=ledger)
    with pytest.raises(ModelAPIError, match="gave up after 3 attempt"):
        model.generate([Message.user(PROMPT)], config=GenerateConfig(max_tokens=MAX_OUT))
    assert seen == [(one_reservation_tokens(), 0.0)] * 3
    assert ledger.reserved() == (0, 0.0) and ledger.totals().calls == 0


def test_calls_without_a_length_limit_reserve_all_that_is_left_and_run_one_at_a_time() -> None:
    backend = SlowBackend(usage=lambda messages, config: Usage(input_tokens=50, output_tokens=50))
    ledger = UsageLedger(budget=Budget(max_tokens=450))
    answered, refused = fire(Model(backend, max_concurrency=8, ledger=ledger), 12, config=GenerateConfig())
    assert backend.peak == 1
    assert len(answered) == 5 and len(refused) == 7  # 5 x 100 tokens: the fifth started with 400 spent
    unlimited = SlowBackend()
    fire(Model(unlimited, max_concurrency=8, ledger=UsageLedger()), 12, config=GenerateConfig())
    assert unlimited.peak > 1  # without a budget nothing is reserved against


def test_a_call_waiting_for_budget_stops_at_the_ledger_gate() -> None:
    ledger = UsageLedger(budget=Budget(max_tokens=1000))
    held = ledger.reserve(CallEstimate(input_tokens=10, output_tokens=None))  # holds everything that is left
    stop = threading.Event()

    def gate() -> None:
        if stop.is_set():
            raise BudgetExceededError("time limit of 60 s reached")

    ledger.gate = gate
    outcome: list[BaseException] = []

    def waiting() -> None:
        try:
            ledger.reserve(CallEstimate(input_tokens=10, output_tokens=10))
        except BudgetExceededError as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=waiting)
    waiter.start()
    time.sleep(0.2)
    assert waiter.is_alive()
    stop.set()
    waiter.join(timeout=5)
    assert not waiter.is_alive() and "time limit" in str(outcome[0])
    ledger.release(held)
    ledger.release(held)  # twice is harmless
    assert ledger.reserved() == (0, 0.0)
