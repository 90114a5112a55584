"""Model: retries, concurrency limit, cost, the usage ledger and budgets, with scripted backends."""

from __future__ import annotations

import email.utils
import json
import logging
import threading
import time
from dataclasses import replace

import pytest

from rexmle_agents.models import (
    Budget,
    Model,
    ModelResponse,
    ScriptedBackend,
    TransientModelAPIError,
    Usage,
    UsageLedger,
)
from rexmle_agents.models.base import parse_retry_after
from rexmle_grade.errors import BudgetExceededError, ConfigurationError, ModelAPIError


def reply(text: str = "ok", input_tokens: int = 1000, output_tokens: int = 100) -> ModelResponse:
    return ModelResponse(text=text, usage=Usage(input_tokens=input_tokens, output_tokens=output_tokens))


# gpt-4o-mini: $0.15 per million input tokens, $0.60 per million output tokens
MINI_CALL_USD = (1000 * 0.15 + 100 * 0.60) / 1e6


def test_transient_errors_are_retried_and_logged(fast_retry, caplog):
    backend = ScriptedBackend(
        [
            TransientModelAPIError("scripted/model: HTTP 503", retry_after_s=0.05),
            TransientModelAPIError("blip"),
            reply(),
        ]
    )
    model = Model(backend, retry=fast_retry)
    with caplog.at_level(logging.WARNING, logger="rexmle_agents.models.base"):
        response = model.generate("hi")
    assert response.text == "ok"
    assert response.retry_time_s >= 0.05
    retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) == 2
    assert "attempt 1 failed (scripted/model: HTTP 503); retrying in 0.05 s (as the server asked)" in retries[0]
    assert "attempt 2 failed (blip)" in retries[1] and "back-off" in retries[1]


def test_permanent_errors_are_not_retried(fast_retry):
    backend = ScriptedBackend([ModelAPIError("HTTP 400: bad"), reply()])
    with pytest.raises(ModelAPIError, match="HTTP 400"):
        Model(backend, retry=fast_retry).generate("hi")
    assert len(backend.requests) == 1


def test_total_retry_time_is_bounded(fast_retry):
    policy = replace(fast_retry, max_attempts=100, max_total_s=0.3, initial_backoff_s=0.05, max_backoff_s=0.05)
    backend = ScriptedBackend(lambda *_: TransientModelAPIError("down"))
    started = time.monotonic()
    with pytest.raises(ModelAPIError, match=r"gave up after \d+ attempt\(s\) in 0\.\d s.*down"):
        Model(backend, retry=policy).generate("hi")
    assert time.monotonic() - started < 0.5
    assert 2 <= len(backend.requests) < 100


def test_concurrency_limit_is_honoured():
    in_flight, peak, lock = 0, 0, threading.Lock()

    def slow(*_):
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        time.sleep(0.05)
        with lock:
            in_flight -= 1
        return "ok"

    model = Model(ScriptedBackend(slow), max_concurrency=2)
    threads = [threading.Thread(target=model.generate, args=("hi",)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak == 2


def test_ledger_totals_per_step_and_run_and_journal(tmp_path):
    journal = tmp_path / "run" / "journal.jsonl"
    ledger = UsageLedger(journal=journal)
    model = Model(
        ScriptedBackend([reply(), reply(), reply(input_tokens=10, output_tokens=5)], name="openai/gpt-4o-mini"),
        ledger=ledger,
    )
    ledger.begin_step(1)
    model.generate("a")
    model.generate("b")
    ledger.begin_step(2)
    model.generate("c")
    assert ledger.step_totals(1).calls == 2
    assert ledger.step_totals(1).usage == Usage(input_tokens=2000, output_tokens=200)
    assert ledger.step_totals(1).cost_usd == pytest.approx(2 * MINI_CALL_USD)
    assert ledger.step_totals(2).usage == Usage(input_tokens=10, output_tokens=5)
    run = ledger.totals()
    assert (run.calls, run.usage.total_tokens, run.uncosted_calls) == (3, 2215, 0)
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 1, 2]
    assert all(line["kind"] == "model_call" and line["model"] == "openai/gpt-4o-mini" for line in lines)
    assert lines[1]["step_totals"]["calls"] == 2
    assert lines[-1]["run_totals"]["usage"] == {
        "input_tokens": 2010,
        "output_tokens": 205,
        "cached_input_tokens": 0,
        "cache_write_input_tokens": 0,
    }
    assert lines[-1]["run_totals"]["cost_usd"] == pytest.approx(run.cost_usd)
    summary = json.loads(ledger.summary().model_dump_json())
    assert summary["steps"]["2"]["calls"] == 1 and summary["run"]["calls"] == 3


def test_token_budget_stops_before_the_next_call():
    backend = ScriptedBackend([reply(), reply(), reply()])
    model = Model(backend, ledger=UsageLedger(budget=Budget(max_tokens=2000)))
    model.generate("a")  # 1100 tokens
    model.generate("b")  # 2200: over budget, but the call was already made
    with pytest.raises(BudgetExceededError, match="token budget spent: 2,200 of 2,000 tokens used in 2 model call"):
        model.generate("c")
    assert len(backend.requests) == 2


def test_money_budget_stops_before_the_next_call():
    backend = ScriptedBackend([reply()] * 3, name="openai/gpt-4o-mini")
    model = Model(backend, ledger=UsageLedger(budget=Budget(max_cost_usd=1.5 * MINI_CALL_USD)))
    model.generate("a")
    model.generate("b")
    with pytest.raises(BudgetExceededError, match=r"money budget spent: \$0\.0004 of \$0\.0003"):
        model.generate("c")
    assert len(backend.requests) == 2


def test_money_budget_needs_a_priced_model():
    with pytest.raises(ConfigurationError, match="has no price") as info:
        Model(ScriptedBackend([]), ledger=UsageLedger(budget=Budget(max_cost_usd=1.0)))
    assert "max_tokens" in info.value.hint


def test_unpriced_model_costs_none_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        model = Model(ScriptedBackend([reply()], name="openai-compatible/llama"), ledger=UsageLedger())
    assert "openai-compatible/llama is not in the price table" in caplog.text
    assert model.generate("hi").cost_usd is None
    assert model.ledger.totals().uncosted_calls == 1


def test_scripted_backend_reports_when_used_up():
    model = Model(ScriptedBackend(["only"]))
    assert model.generate("a").text == "only"
    with pytest.raises(ModelAPIError, match=r"script is used up \(1 response\(s\) for 2 calls\)"):
        model.generate("b")


def test_concurrency_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        Model(ScriptedBackend([]), max_concurrency=0)


def test_retry_after_headers():
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert parse_retry_after({"retry-after": "7"}) == 7.0
    in_a_minute = email.utils.formatdate(time.time() + 60, usegmt=True)
    assert 55 < parse_retry_after({"retry-after": in_a_minute}) <= 60
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


def test_timeouts_among_other_failures_are_reported_with_their_limit(fast_retry):
    backend = ScriptedBackend(
        [
            TransientModelAPIError("scripted/model: timed out: no answer within 0.2 s", timeout_s=0.2),
            TransientModelAPIError("scripted/model: HTTP 502"),
            TransientModelAPIError("scripted/model: timed out: no answer within 0.2 s", timeout_s=0.2),
        ]
    )
    with pytest.raises(ModelAPIError, match=r"timed out: 2 of 3 attempt\(s\) got no answer within 0\.2 s; gave up"):
        Model(backend, retry=fast_retry).generate("hi")


def test_unknown_usage_is_counted_apart_and_costs_nothing_known():
    unknown = ModelResponse(text="?", usage_known=False)
    model = Model(ScriptedBackend([reply(), unknown], name="openai/gpt-4o-mini"), ledger=UsageLedger())
    model.generate("a")
    assert model.generate("b").cost_usd is None
    totals = model.ledger.totals()
    assert (totals.calls, totals.unknown_usage_calls, totals.uncosted_calls) == (2, 1, 1)
    assert totals.cost_usd == pytest.approx(MINI_CALL_USD)
