"""The backend interface and :class:`Model`, the wrapper agents call.

A backend makes exactly one attempt at one provider call and reports failures as :class:`TransientModelAPIError`
(worth retrying) or :class:`~rexmle_grade.errors.ModelAPIError` (permanent). :class:`Model` adds everything that is
the same for every provider: the retry policy, the concurrency limit, cost, and the usage ledger.
"""

from __future__ import annotations

import email.utils
import errno
import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Protocol, cast

from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_before_delay,
    wait_exponential_jitter,
)
from tenacity.wait import wait_base

from rexmle_agents.models.accounting import (
    CallEstimate,
    ModelPrice,
    PriceTable,
    Reservation,
    UsageLedger,
    estimate_input_tokens,
    load_prices,
)
from rexmle_agents.models.types import GenerateConfig, Message, ModelResponse, ToolCall, ToolSpec
from rexmle_grade.errors import ConfigurationError, ModelAPIError

logger = logging.getLogger(__name__)
AZURE_PREFIX = "azure/"

# 408 request timeout, 409 conflict (OpenAI uses it for transient lock contention), 429 rate limit; 5xx below.
RETRYABLE_STATUS = frozenset({408, 409, 429})


class TransientModelAPIError(ModelAPIError):
    """A failure that may succeed when tried again (rate limit, timeout, 5xx, dropped connection).

    ``retry_after_s`` is the wait the server asked for, if it said; ``timeout_s`` is set when the attempt timed out
    (no answer within that many seconds); ``refused`` when nothing accepted the connection (ECONNREFUSED), which
    :class:`Model` retries only once. :class:`Model` retries these; a backend used on its own surfaces them like
    any :class:`ModelAPIError`.
    """

    def __init__(
        self,
        message: str,
        *,
        retry_after_s: float | None = None,
        timeout_s: float | None = None,
        refused: bool = False,
        hint: str | None = None,
    ) -> None:
        self.retry_after_s = retry_after_s
        self.timeout_s = timeout_s
        self.refused = refused
        super().__init__(message, hint=hint)


class ModelBackend(Protocol):
    """One provider call per :meth:`generate`; ``name`` is the model string (``openai/gpt-5``)."""

    name: str

    def generate(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig
    ) -> ModelResponse: ...


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds a response asks the client to wait: ``retry-after-ms``, or ``retry-after`` (seconds or HTTP date)."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def status_error(model: str, status: int, headers: Mapping[str, str], detail: str, *, key_env: str) -> ModelAPIError:
    """Classify an HTTP error response: transient (retry) or permanent, with a hint on what to do."""
    what = f"{model}: HTTP {status} from the provider: {detail}"
    # A status below 400 only arrives with an error event inside a stream: the server broke off mid-answer.
    if status in RETRYABLE_STATUS or status >= 500 or status < 400:
        return TransientModelAPIError(what, retry_after_s=parse_retry_after(headers))
    if status in (401, 403):
        hint = f"check the API key in ${key_env} and that it may use this model"
    elif status == 404:
        hint = "check the model name and the base URL"
    else:
        hint = "the provider rejected the request; fix the request (messages, tools, config) rather than retrying"
    return ModelAPIError(what, hint=hint)


def malformed_response(model: str, detail: str) -> ModelAPIError:
    return ModelAPIError(
        f"{model}: malformed response from the provider: {detail}",
        hint="the server does not speak the expected API; check the base URL and the server's version",
    )


def timed_out(model: str, timeout_s: float) -> TransientModelAPIError:
    return TransientModelAPIError(f"{model}: timed out: no answer within {timeout_s:g} s", timeout_s=timeout_s)


def connection_refused(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is a refused TCP connection: nothing listens there."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ConnectionRefusedError) or (
            isinstance(current, OSError) and current.errno == errno.ECONNREFUSED
        ):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def connection_failed(model: str, exc: BaseException) -> TransientModelAPIError:
    """A failed connection; a refused one says where it went and that the base URL is the likely fault."""
    if not connection_refused(exc):
        return TransientModelAPIError(f"{model}: connection failed: {exc.__cause__ or exc}")
    try:
        where = f" at {exc.request.url}"  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):  # httpx2's errors raise RuntimeError when they carry no request
        where = ""
    return TransientModelAPIError(
        f"{model}: connection refused{where}: nothing is listening there",
        refused=True,
        hint="check the base URL (openai-compatible/NAME@URL, base_url=..., $OPENAI_BASE_URL, "
        "$ANTHROPIC_BASE_URL, $AZURE_OPENAI_ENDPOINT) and that the server is running",
    )


@contextmanager
def translating_sdk_errors(
    sdk: ModuleType, model: str, *, key_env: str, timeout_s: float, transport: ModuleType | None = None
) -> Iterator[None]:
    """Turn the errors of an OpenAI-style SDK (``openai`` or ``anthropic``, which share names) into ours.

    ``transport`` is the SDK's HTTP library (an httpx-style module), for SDKs that let its errors escape unwrapped
    (the anthropic SDK does while it reads a stream's events): those are lost connections and timeouts too.
    """
    raw_timeout: tuple[type[BaseException], ...] = (transport.TimeoutException,) if transport else ()
    raw_transport: tuple[type[BaseException], ...] = (transport.TransportError,) if transport else ()
    try:
        yield
    except sdk.APIStatusError as exc:
        raise status_error(model, exc.status_code, exc.response.headers, exc.message, key_env=key_env) from exc
    except (sdk.APITimeoutError, *raw_timeout) as exc:
        raise timed_out(model, timeout_s) from exc
    except sdk.APIConnectionError as exc:
        raise connection_failed(model, exc) from exc
    except raw_transport as exc:
        if connection_refused(exc):
            raise connection_failed(model, exc) from exc
        raise TransientModelAPIError(f"{model}: connection lost: {type(exc).__name__}: {exc}") from exc
    except sdk.APIError as exc:  # an error event inside a stream: the server broke off mid-answer
        raise TransientModelAPIError(f"{model}: the stream reported an error: {exc.message}") from exc
    except ValueError as exc:  # undecodable JSON in a body or stream event (json and pydantic errors are ValueErrors)
        raise malformed_response(model, f"{type(exc).__name__}: {exc}") from exc


def tool_call_from_json(call_id: str, name: str, arguments: str) -> ToolCall:
    """A tool call whose arguments arrived as JSON text; bad JSON is kept as ``parse_error`` for the agent to report."""
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError as exc:
        return ToolCall(id=call_id, name=name, parse_error=f"arguments are not valid JSON ({exc}): {arguments[:500]}")
    if not isinstance(parsed, dict):
        return ToolCall(id=call_id, name=name, parse_error=f"arguments must be a JSON object, got: {arguments[:500]}")
    return ToolCall(id=call_id, name=name, arguments=parsed)


@dataclass(frozen=True)
class RetryPolicy:
    """How :class:`Model` retries transient failures.

    Back-off is exponential with jitter (``initial_backoff_s * 2**n + uniform(0, jitter_s)``, at most
    ``max_backoff_s``) unless the server asked for a wait (Retry-After), which is honoured. Retrying stops after
    ``max_attempts`` attempts or when the next attempt would start more than ``max_total_s`` after the first.
    """

    max_attempts: int = 8
    max_total_s: float = 900.0
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    jitter_s: float = 1.0


class _WaitHonouringRetryAfter(wait_base):
    def __init__(self, policy: RetryPolicy) -> None:
        self._backoff = wait_exponential_jitter(
            multiplier=policy.initial_backoff_s, max=policy.max_backoff_s, jitter=policy.jitter_s
        )

    def __call__(self, retry_state: RetryCallState) -> float:
        asked = _failure(retry_state).retry_after_s
        return self._backoff(retry_state) if asked is None else asked


def _failure(state: RetryCallState) -> TransientModelAPIError:
    """The error that ended a failed attempt: always transient, as nothing else is retried."""
    return cast(TransientModelAPIError, state.outcome.exception() if state.outcome else None)


class Model:
    """A backend plus retries, a concurrency limit, cost and usage accounting: what agents call.

    ``max_concurrency`` bounds the calls in flight through this object (threads share it); retry back-off does
    not hold a slot. With a ``ledger``, every call reserves its worst case against the ledger's budget before it
    is sent (:meth:`UsageLedger.reserve`: estimated input tokens plus ``GenerateConfig.max_tokens``, or all the
    budget left when unset), keeps it while it waits for a slot and while it is retried, checks the budget again
    each time it gets a slot, and settles it with the real usage when the answer arrives (released on failure):
    calls made at once spend at most the budget plus one call's reservation. A refused connection (nothing
    listens at the base URL) is retried once, then raised as a permanent :class:`ModelAPIError`.
    """

    def __init__(
        self,
        backend: ModelBackend,
        *,
        retry: RetryPolicy | None = None,
        max_concurrency: int = 8,
        ledger: UsageLedger | None = None,
        prices: PriceTable | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        self.backend = backend
        self.name = backend.name
        self.retry = retry or RetryPolicy()
        self.ledger = ledger
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._prices = prices or load_prices()
        self.price: ModelPrice | None = self._prices.lookup(self.name)
        # an Azure deployment's name does not say which model it serves: each call is priced as the OpenAI model
        # its response names (a Global deployment costs OpenAI's list price), unless the table prices the deployment
        self._price_per_response = self.price is None and self.name.startswith(AZURE_PREFIX)
        # the price the deployment's last answer named: what its next calls reserve (none yet: they run alone)
        self._answered_price: ModelPrice | None = None
        if self.price is None and not self._price_per_response:
            logger.warning("%s is not in the price table: its calls are counted in tokens, not dollars", self.name)
            if ledger is not None and ledger.budget is not None and ledger.budget.max_cost_usd is not None:
                raise ConfigurationError(
                    f"a money budget is set but {self.name} has no price, so its cost cannot be counted",
                    hint="add the model to the price table, or use a token budget (Budget(max_tokens=...))",
                )

    def estimate(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig) -> CallEstimate:
        """The worst case of a call, as it is reserved against the ledger's budget."""
        return CallEstimate(input_tokens=estimate_input_tokens(messages, tools), output_tokens=config.max_tokens,
                            price=self.price or self._answered_price)

    def generate(
        self,
        messages: Sequence[Message] | str,
        tools: Sequence[ToolSpec] = (),
        config: GenerateConfig | None = None,
    ) -> ModelResponse:
        """One generation, retried on transient failures; raises ModelAPIError or BudgetExceededError."""
        if isinstance(messages, str):
            messages = [Message.user(messages)]
        config = config or GenerateConfig()
        ledger = self.ledger
        reservation = ledger.reserve(self.estimate(messages, tools, config)) if ledger is not None else None
        try:
            response, started = self._attempts(messages, tools, config, ledger)
        except BaseException:
            if ledger is not None and reservation is not None:
                ledger.release(reservation)
            raise
        return self._account(response, started, ledger, reservation)

    def _attempts(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: GenerateConfig, ledger: UsageLedger | None
    ) -> tuple[ModelResponse, float]:
        """The answer of the first attempt that succeeds, and when the attempts began."""
        started = attempt_started = time.monotonic()
        retrying = Retrying(
            retry=retry_if_exception_type(TransientModelAPIError),
            wait=_WaitHonouringRetryAfter(self.retry),
            # stop_before_delay stops as soon as the next wait would overrun the budget, so a server-requested
            # wait longer than what is left of it is never slept.
            stop=stop_after_attempt(self.retry.max_attempts) | stop_before_delay(self.retry.max_total_s),
            before_sleep=self._log_retry,
        )
        timeouts: list[float] = []  # the limit of each attempt that timed out
        refusals = 0
        try:
            for attempt in retrying:
                with attempt:
                    attempt_started = time.monotonic()
                    try:
                        with self._slots:
                            if ledger is not None:  # the budget may have been spent while this call queued
                                ledger.recheck()
                            response = self.backend.generate(messages, tools, config)
                    except TransientModelAPIError as exc:
                        if exc.timeout_s is not None:
                            timeouts.append(exc.timeout_s)
                        refusals += exc.refused
                        if refusals >= 2:  # twice refused: nothing listens there, retrying for minutes won't help
                            raise ModelAPIError(
                                f"{exc.message} (refused {refusals} times; not retried further)", hint=exc.hint
                            ) from exc
                        raise
        except RetryError as exc:
            raise self._gave_up(
                attempt.retry_state, time.monotonic() - started, timeouts
            ) from exc.last_attempt.exception()
        return response.model_copy(update={"retry_time_s": attempt_started - started}), started

    def _account(
        self, response: ModelResponse, started: float, ledger: UsageLedger | None, reservation: Reservation | None
    ) -> ModelResponse:
        price = self.price
        if self._price_per_response and response.model:
            price = self._prices.lookup(f"openai/{response.model}")
            self._answered_price = price or self._answered_price
        cost = price.cost(response.usage) if price is not None and response.usage_known else None
        response = response.model_copy(update={"cost_usd": cost})
        if ledger is not None:
            ledger.record(self.name, response, duration_s=time.monotonic() - started, reservation=reservation)
            budget = ledger.budget
            if price is None and budget is not None and budget.max_cost_usd is not None:  # an Azure deployment
                raise ConfigurationError(
                    f"a money budget is set but {self.name} answered as model {response.model or '(unnamed)'!r}, "
                    "which has no price, so its cost cannot be counted (the call is recorded in tokens)",
                    hint=f"add {self.name} to the price table, or use a token budget (Budget(max_tokens=...))",
                )
        return response

    def _log_retry(self, state: RetryCallState) -> None:
        failure = _failure(state)
        logger.warning(
            "attempt %d failed (%s); retrying in %.2f s (%s)",
            state.attempt_number,
            failure.message,
            state.next_action.sleep if state.next_action else 0.0,
            "back-off" if failure.retry_after_s is None else "as the server asked",
        )

    def _gave_up(self, state: RetryCallState, elapsed_s: float, timeouts: list[float]) -> ModelAPIError:
        failure = _failure(state)
        attempts = state.attempt_number
        policy = f"RetryPolicy(max_attempts={self.retry.max_attempts}, max_total_s={self.retry.max_total_s:g})"
        asked = failure.retry_after_s
        left_s = self.retry.max_total_s - elapsed_s
        if asked and asked >= left_s:
            return ModelAPIError(
                f"{self.name}: the server asked to wait {asked:g} s before trying again, longer than the "
                f"{max(left_s, 0.0):.1f} s left of the retry budget ({policy}); stopped without waiting after "
                f"{attempts} attempt(s) in {elapsed_s:.1f} s; last error: {failure.message}",
                hint=f"try again in {asked:g} s, or raise RetryPolicy.max_total_s above the wait if waits that long "
                "are acceptable",
            )
        if timeouts:
            limit = f"{timeouts[0]:g} s" if len(set(timeouts)) == 1 else f"{min(timeouts):g} to {max(timeouts):g} s"
            return ModelAPIError(
                f"{self.name}: timed out: {len(timeouts)} of {attempts} attempt(s) got no answer within {limit}; "
                f"gave up after {elapsed_s:.1f} s; last error: {failure.message}",
                hint="the server accepted the request but did not answer in time: check the provider's status and "
                "the base URL (a proxy that swallows requests looks the same), or allow longer attempts "
                f"(GenerateConfig.timeout_s, get_model(timeout_s=...)) or more retries ({policy})",
            )
        more = "" if asked is None else f"; the server asked to wait {asked:g} s more"
        return ModelAPIError(
            f"{self.name}: gave up after {attempts} attempt(s) in {elapsed_s:.1f} s{more}; "
            f"last error: {failure.message}",
            hint=f"the provider kept failing; try again later or allow more retries ({policy})",
        )
