"""Model backends: one small interface to OpenAI, Anthropic, Google Gemini, Azure OpenAI and compatible servers.

>>> model = get_model("openai/gpt-5", ledger=UsageLedger(budget=Budget(max_cost_usd=5)))  # doctest: +SKIP
>>> reply = model.generate([Message.system("..."), Message.user("...")], tools=[...])  # doctest: +SKIP

:class:`Model` retries transient failures, limits concurrency and accounts tokens and cost; cassettes record a
run's calls and replay them offline; :class:`ScriptedBackend` stands in for a model in tests.
"""

from rexmle_agents.models.accounting import Budget, CallRecord, ModelPrice, PriceTable, UsageLedger, load_prices
from rexmle_agents.models.base import Model, ModelBackend, RetryPolicy, TransientModelAPIError
from rexmle_agents.models.registry import PROVIDERS, ModelSpec, get_model, parse_model_string
from rexmle_agents.models.replay import RecordingBackend, ReplayBackend, ScriptedBackend
from rexmle_agents.models.types import GenerateConfig, Message, ModelResponse, ToolCall, ToolSpec, Usage

__all__ = [
    "PROVIDERS",
    "Budget",
    "CallRecord",
    "GenerateConfig",
    "Message",
    "Model",
    "ModelBackend",
    "ModelPrice",
    "ModelResponse",
    "ModelSpec",
    "PriceTable",
    "RecordingBackend",
    "ReplayBackend",
    "RetryPolicy",
    "ScriptedBackend",
    "ToolCall",
    "ToolSpec",
    "TransientModelAPIError",
    "Usage",
    "UsageLedger",
    "get_model",
    "load_prices",
    "parse_model_string",
]
