"""Model strings and :func:`get_model`.

A model string names a provider and a model: ``openai/gpt-5``, ``anthropic/claude-sonnet-4-5``,
``google/gemini-2.5-pro``, ``azure/DEPLOYMENT`` (an Azure OpenAI deployment), or
``openai-compatible/NAME@http://host:port/v1`` for a local server (vLLM, Ollama, LM Studio). Keys come from the
provider's environment variable (or ``api_key=``) and are checked when the model is made, not on import.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rexmle_agents.models.accounting import PriceTable, UsageLedger
from rexmle_agents.models.base import Model, ModelBackend, RetryPolicy
from rexmle_agents.models.replay import RecordingBackend, ReplayBackend
from rexmle_grade.errors import ConfigurationError, UnknownNameError, UserInputError

DEFAULT_TIMEOUT_S = 600.0
# OpenAI-compatible servers rarely check keys, but the SDK refuses to run without one.
_NO_KEY = "no-key"
AZURE_ENDPOINT_ENV = "AZURE_OPENAI_ENDPOINT"
# The openai SDK reads OPENAI_API_VERSION; Azure's own tools use AZURE_OPENAI_API_VERSION. Either works, first wins.
AZURE_API_VERSION_ENVS = ("OPENAI_API_VERSION", "AZURE_OPENAI_API_VERSION")


@dataclass(frozen=True)
class Provider:
    name: str
    key_env: str
    key_required: bool
    apis: tuple[str, ...]  # the first is the default
    example: str
    description: str


PROVIDERS: dict[str, Provider] = {
    p.name: p
    for p in (
        Provider("openai", "OPENAI_API_KEY", True, ("chat", "responses"), "openai/gpt-5", "OpenAI API"),
        Provider("anthropic", "ANTHROPIC_API_KEY", True, ("messages",), "anthropic/claude-sonnet-4-5", "Anthropic API"),
        Provider(
            "google",
            "GEMINI_API_KEY",
            True,
            ("chat",),
            "google/gemini-2.5-pro",
            "Google Gemini API (through its OpenAI-compatible endpoint)",
        ),
        Provider(
            "azure",
            "AZURE_OPENAI_API_KEY",
            True,
            ("chat", "responses"),
            "azure/my-gpt-5-deployment",
            f"Azure OpenAI: MODEL is the deployment name; endpoint from ${AZURE_ENDPOINT_ENV}, API version from "
            f"${AZURE_API_VERSION_ENVS[0]} or ${AZURE_API_VERSION_ENVS[1]}",
        ),
        Provider(
            "openai-compatible",
            "OPENAI_COMPATIBLE_API_KEY",
            False,
            ("chat", "responses"),
            "openai-compatible/qwen3:8b@http://localhost:11434/v1",
            "any server speaking the OpenAI API (vLLM, Ollama, LM Studio)",
        ),
    )
}


@dataclass(frozen=True)
class ModelSpec:
    """A parsed model string. ``model_string`` leaves out the URL: prices and replay keys do not depend on it."""

    provider: str
    name: str
    base_url: str | None = None

    @property
    def model_string(self) -> str:
        return f"{self.provider}/{self.name}"


def parse_model_string(model: str) -> ModelSpec:
    provider, slash, rest = model.partition("/")
    if not slash or not rest:
        raise UserInputError(
            f"model string {model!r} is not PROVIDER/MODEL",
            hint="e.g. " + ", ".join(p.example for p in PROVIDERS.values()),
        )
    if provider not in PROVIDERS:
        raise UnknownNameError("model provider", provider, PROVIDERS)
    if provider != "openai-compatible":
        return ModelSpec(provider, rest)
    name, at, url = rest.partition("@")
    if not name or not at or not url.startswith(("http://", "https://")):
        raise UserInputError(
            f"model string {model!r} does not name the server: expected openai-compatible/NAME@URL",
            hint=f"e.g. {PROVIDERS[provider].example}",
        )
    return ModelSpec(provider, name, url)


def missing_credentials(model: str) -> list[str]:
    """The environment variables a model string needs that are not set (none for replay and test models)."""
    if model.startswith("replay:") or model.split("/", 1)[0] not in PROVIDERS:
        return []
    provider = PROVIDERS[parse_model_string(model).provider]
    missing = [provider.key_env] if provider.key_required and not os.environ.get(provider.key_env) else []
    if provider.name == "azure":
        if not os.environ.get(AZURE_ENDPOINT_ENV):
            missing.append(AZURE_ENDPOINT_ENV)
        if not any(os.environ.get(name) for name in AZURE_API_VERSION_ENVS):
            missing.append(AZURE_API_VERSION_ENVS[0])
    return missing


def get_model(
    model: str,
    *,
    api: str | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    retry: RetryPolicy | None = None,
    max_concurrency: int = 8,
    ledger: UsageLedger | None = None,
    prices: PriceTable | None = None,
    record_to: Path | None = None,
    replay_from: Path | None = None,
) -> Model:
    """A ready :class:`Model` for a model string.

    ``api`` picks the OpenAI API (``chat``, the default, or ``responses``). ``base_url`` overrides the provider's
    URL (tests, proxies). ``record_to`` appends every call to a cassette; ``replay_from`` serves calls from one
    instead of the provider, needing neither key nor network.
    """
    spec = parse_model_string(model)
    provider = PROVIDERS[spec.provider]
    api = api or provider.apis[0]
    if api not in provider.apis:
        raise UnknownNameError(f"{provider.name} API", api, provider.apis)
    if record_to is not None and replay_from is not None:
        raise UserInputError("record_to and replay_from exclude each other: a call is either recorded or replayed")
    backend: ModelBackend
    if replay_from is not None:
        backend = ReplayBackend(replay_from, spec.model_string)
    else:
        backend = _live_backend(spec, provider, api, api_key=api_key, base_url=base_url, timeout_s=timeout_s)
        if record_to is not None:
            backend = RecordingBackend(backend, record_to)
    return Model(backend, retry=retry, max_concurrency=max_concurrency, ledger=ledger, prices=prices)


def _live_backend(
    spec: ModelSpec, provider: Provider, api: str, *, api_key: str | None, base_url: str | None, timeout_s: float
) -> ModelBackend:
    key = api_key or os.environ.get(provider.key_env)
    if not key and provider.key_required:
        raise ConfigurationError(
            f"{provider.key_env} is not set: the {provider.name} backend needs an API key",
            hint=f"export {provider.key_env}=... (or pass api_key=...), or replay a recorded run offline",
        )
    url = base_url or spec.base_url
    # The SDKs are imported here, not at the top: listing models or replaying should not pay for loading them.
    if provider.name == "anthropic":
        from rexmle_agents.models.anthropic_backend import AnthropicBackend

        return AnthropicBackend(spec.model_string, spec.name, api_key=key or "", base_url=url, timeout_s=timeout_s)
    from rexmle_agents.models.openai_backend import (
        OpenAIChatBackend,
        OpenAIResponsesBackend,
        azure_client,
        openai_client,
    )

    if provider.name == "azure":
        client = azure_client(
            api_key=key or "", endpoint=url or _azure_endpoint(), api_version=_azure_api_version(), timeout_s=timeout_s
        )
    else:
        if provider.name == "google":
            from rexmle_agents.models.google_backend import BASE_URL

            url = url or BASE_URL
        client = openai_client(api_key=key or _NO_KEY, base_url=url, timeout_s=timeout_s)
    common = {"client": client, "key_env": provider.key_env, "timeout_s": timeout_s}
    if api == "responses":
        return OpenAIResponsesBackend(spec.model_string, spec.name, **common)
    if provider.name == "google":
        from rexmle_agents.models.google_backend import GeminiChatBackend

        return GeminiChatBackend(spec.model_string, spec.name, **common)
    # Compatible servers often predate max_completion_tokens; OpenAI's reasoning models refuse max_tokens.
    field = "max_completion_tokens" if provider.name in ("openai", "azure") else "max_tokens"
    return OpenAIChatBackend(spec.model_string, spec.name, max_tokens_field=field, **common)


def _azure_endpoint() -> str:
    endpoint = os.environ.get(AZURE_ENDPOINT_ENV)
    if not endpoint:
        raise ConfigurationError(
            f"{AZURE_ENDPOINT_ENV} is not set: the azure backend needs the resource's endpoint",
            hint=f"export {AZURE_ENDPOINT_ENV}=https://RESOURCE.openai.azure.com (or pass base_url=...)",
        )
    return endpoint


def _azure_api_version() -> str:
    for name in AZURE_API_VERSION_ENVS:
        if version := os.environ.get(name):
            return version
    raise ConfigurationError(
        f"neither {' nor '.join(AZURE_API_VERSION_ENVS)} is set: the azure backend needs an API version",
        hint=f"export {AZURE_API_VERSION_ENVS[0]}=... with a version your resource supports (see the Azure OpenAI "
        "API version lifecycle)",
    )
