"""``rexmle models list`` and ``rexmle models prices``."""

from __future__ import annotations

import json

from rexmle_grade.cli import main


def test_list_shows_providers_keys_and_priced_models(capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    for text in ("openai-compatible", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "openai/gpt-5", "claude-haiku-4-5"):
        assert text in out
    for text in ("GEMINI_API_KEY", "google/gemini-2.5-pro", "AZURE_OPENAI_API_KEY", "AZURE_OPENAI_ENDPOINT"):
        assert text in out
    assert "│ openai            │ OPENAI_API_KEY            │ yes" in out


def test_prices_as_json(capsys):
    assert main(["models", "prices", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert table["as_of"] and table["sources"]
    assert table["models"]["anthropic/claude-haiku-4-5"]["cache_write"] == 1.25


def test_prices_table_shows_date_and_sources(capsys):
    assert main(["models", "prices"]) == 0
    out = capsys.readouterr().out
    assert "as of" in out and "sources: https://" in out and "cached input" in out
    assert "google/gemini-2.5-pro" in out and "prompt > 200,000 tokens" in out


def test_bad_price_table_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "prices.yaml"
    path.write_text("as_of: someday\n")
    assert main(["models", "prices", "--table", str(path)]) == 2
    assert "not a valid price table" in capsys.readouterr().err
