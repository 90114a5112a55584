"""Fixtures of the analysis tests: the shipped example runs (real run folders made by the harness with scripted
models, unpacked into a temporary folder), a judge built on a scripted backend, and run text made in code."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rexmle_agents.analysis.evidence import NodeText, Output, RunText
from rexmle_agents.analysis.examples import EXAMPLES, unpack
from rexmle_agents.analysis.factors import load_rubrics
from rexmle_agents.analysis.judge import Judge
from rexmle_agents.models import Budget, Model, RetryPolicy, ScriptedBackend, UsageLedger
from rexmle_agents.models.accounting import ModelPrice, PriceTable
from rexmle_agents.results.loader import RunRecord, load_runs

JUDGE_NAME = "scripted/judge"
# a made-up price, so that the scripted judge's calls cost money and a budget can run out
PRICES = PriceTable(as_of="2026-01-01", sources=("test",),
                    models={JUDGE_NAME: ModelPrice(input=1.0, output=4.0)})


@pytest.fixture(scope="session")
def example_group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack(tmp_path_factory.mktemp("examples"))


@pytest.fixture(scope="session")
def example_runs(example_group: Path) -> dict[str, RunRecord]:
    """Example name (ldct-plain, ldct-rich, isles-threshold, isles-failures, ldct-sample) -> its run."""
    runs = {(r.spec.task_id, r.spec.agent, r.spec.seed): r for r in load_runs([example_group]).runs}
    return {e.name: runs[(e.task, e.agent, e.seed)] for e in EXAMPLES}


MakeJudge = Callable[..., Judge]


@pytest.fixture
def make_judge() -> MakeJudge:
    """A judge answering with ``script`` (a list or a function of the request), priced at PRICES."""

    def make(script: Any, *, max_cost: float | None = None, chunk_chars: int = 48_000, attempts: int = 3,
             journal: Path | None = None) -> Judge:
        ledger = UsageLedger(journal=journal, budget=Budget(max_cost_usd=max_cost) if max_cost else None)
        model = Model(ScriptedBackend(script, name=JUDGE_NAME), retry=RetryPolicy(max_attempts=1), ledger=ledger,
                      prices=PRICES)
        return Judge(model, load_rubrics(), chunk_chars=chunk_chars, max_attempts=attempts)

    return make


MakeRun = Callable[..., RunText]


@pytest.fixture
def code_run() -> MakeRun:
    """A run's text made in code: ``code_run({"code": ..., "output": ..., "ran": True, "exit_code": 0,
    "stopped_by": None}, ...)``, node ids 0, 1, ... unless given."""

    def make(*specs: dict[str, Any], run_id: str = "t.aide.s0.x") -> RunText:
        nodes = []
        for index, spec in enumerate(specs):
            node_id = spec.get("id", index)
            outputs = (Output(name=f"step{node_id:04d}-node{node_id}", exit_code=spec.get("exit_code", 0),
                              stopped_by=spec.get("stopped_by"), seconds=1.0, text=spec.get("output", "")),) \
                if spec.get("ran", True) else ()
            nodes.append(NodeText(id=node_id, stage="draft", parent=None, code=spec.get("code", ""),
                                  outputs=outputs))
        return RunText(run_id=run_id, nodes=tuple(nodes))

    return make
