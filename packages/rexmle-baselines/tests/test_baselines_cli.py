"""``rexmle baselines list`` reports every baseline family and whether its extra is installed."""

from __future__ import annotations

import importlib.util

import pytest

from rexmle_baselines.cli import BASELINE_FAMILIES
from rexmle_grade.cli import main


def test_list_shows_install_status(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["baselines", "list"]) == 0
    out = capsys.readouterr().out
    for name, (module, extra, _) in BASELINE_FAMILIES.items():
        assert name in out and f"rexmle-baselines[{extra}]" in out
        assert importlib.util.find_spec(module) is None or "yes" in out
