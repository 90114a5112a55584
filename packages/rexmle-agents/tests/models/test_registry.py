"""Model strings, keys from the environment, and the price table."""

from __future__ import annotations

from pathlib import Path

import pytest

from rexmle_agents.models import ModelSpec, Usage, get_model, load_prices, parse_model_string
from rexmle_grade.errors import ConfigurationError, UnknownNameError, UserInputError


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("openai/gpt-5", ModelSpec("openai", "gpt-5")),
        ("anthropic/claude-haiku-4-5", ModelSpec("anthropic", "claude-haiku-4-5")),
        ("google/gemini-2.5-pro", ModelSpec("google", "gemini-2.5-pro")),
        ("azure/my-gpt-5", ModelSpec("azure", "my-gpt-5")),
        (
            "openai-compatible/meta-llama/Llama-3.1-8B-Instruct@http://127.0.0.1:8000/v1",
            ModelSpec("openai-compatible", "meta-llama/Llama-3.1-8B-Instruct", "http://127.0.0.1:8000/v1"),
        ),
        (
            "openai-compatible/qwen3:8b@http://localhost:11434/v1",
            ModelSpec("openai-compatible", "qwen3:8b", "http://localhost:11434/v1"),
        ),
    ],
)
def test_model_strings_parse(text, spec):
    assert parse_model_string(text) == spec


def test_unknown_provider_names_close_matches():
    with pytest.raises(UnknownNameError, match="unknown model provider 'opnai'") as info:
        parse_model_string("opnai/gpt-5")
    assert "'openai'" in info.value.hint


@pytest.mark.parametrize("text", ["gpt-5", "openai/", "openai-compatible/llama", "openai-compatible/llama@localhost"])
def test_malformed_model_strings_are_refused(text):
    with pytest.raises(UserInputError, match="model string"):
        parse_model_string(text)


@pytest.mark.parametrize(
    ("model", "variable"),
    [
        ("openai/gpt-5", "OPENAI_API_KEY"),
        ("anthropic/claude-haiku-4-5", "ANTHROPIC_API_KEY"),
        ("google/gemini-2.5-flash", "GEMINI_API_KEY"),
        ("azure/my-deployment", "AZURE_OPENAI_API_KEY"),
    ],
)
def test_missing_key_names_the_variable(model, variable):
    with pytest.raises(ConfigurationError, match=f"{variable} is not set") as info:
        get_model(model)
    assert f"export {variable}=" in info.value.hint


def test_key_comes_from_the_environment(monkeypatch, server, wire):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    server.json(wire.chat_completion("hi"))
    get_model("openai/gpt-5", base_url=server.url).generate("hi")
    assert server.requests[0].headers["authorization"] == "Bearer sk-from-env"


def test_unknown_api_is_refused():
    with pytest.raises(UnknownNameError, match="unknown anthropic API 'chat'"):
        get_model("anthropic/claude-haiku-4-5", api="chat", api_key="k")


def test_importing_does_not_load_the_sdks():
    import subprocess
    import sys

    code = "import sys, rexmle_agents.models; print('openai' in sys.modules, 'anthropic' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split() == [
        "False",
        "False",
    ]


def test_prices_are_dated_and_priced_per_million_tokens():
    table = load_prices()
    assert table.as_of.year >= 2025 and table.sources
    price = table.lookup("openai/gpt-5-2025-08-07")  # a dated snapshot costs what its model costs
    assert price == table.lookup("openai/gpt-5")
    assert table.lookup("openai/gpt-5-mini") != price  # and a different model is not a snapshot
    assert table.lookup("openai/unknown") is None
    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000, cached_input_tokens=500_000)
    assert price.cost(usage) == pytest.approx(0.5 * 1.25 + 0.5 * 0.125 + 10.0)


def test_gemini_pro_prompts_over_200k_tokens_cost_the_long_context_rates():
    price = load_prices().lookup("google/gemini-2.5-pro")
    short = Usage(input_tokens=200_000, output_tokens=1_000, cached_input_tokens=100_000)
    assert price.cost(short) == pytest.approx((100_000 * 1.25 + 100_000 * 0.125 + 1_000 * 10.0) / 1e6)
    long = Usage(input_tokens=200_001, output_tokens=1_000)
    assert price.cost(long) == pytest.approx((200_001 * 2.50 + 1_000 * 15.0) / 1e6)
    flash = load_prices().lookup("google/gemini-2.5-flash")
    assert flash.long_context is None and flash.cost(long) == pytest.approx((200_001 * 0.30 + 1_000 * 2.50) / 1e6)


def test_custom_price_table(tmp_path: Path):
    path = tmp_path / "prices.yaml"
    path.write_text(
        "as_of: 2026-01-01\nsources: [internal]\nmodels:\n  openai-compatible/llama: {input: 0, output: 0}\n"
    )
    assert load_prices(path).lookup("openai-compatible/llama").cost(Usage(input_tokens=5)) == 0
    path.write_text("models: {}\n")
    with pytest.raises(ConfigurationError, match="not a valid price table"):
        load_prices(path)
