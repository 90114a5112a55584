"""Smoke test of tools/bench_grade.py (slow: it draws and grades two full-size TopCoW cases)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[4] / "tools" / "bench_grade.py"


@pytest.mark.slow
def test_bench_runs_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("bench_grade", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_grade", bench)  # dataclasses look their module up there
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    assert bench.main(["--cases", "2", "--workers", "1", "--json", str(out), "--work-dir", str(tmp_path / "w")]) == 0
    rows = json.loads(out.read_text())
    assert [r["run"] for r in rows] == ["1 case", "2 cases"]
    assert all(r["status"] == "valid" and r["peak_rss_mb"] > 0 for r in rows)
    assert "topcow-track1-task1" in capsys.readouterr().out
