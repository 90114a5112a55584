"""The layout of one run folder (``runs/<group>/<run_id>/``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rexmle_agents.sandbox.base import DATA_DIRNAME, SUBMISSION_DIRNAME, WORKING_DIRNAME

INSTRUCTIONS_FILENAME = "instructions.md"


@dataclass(frozen=True)
class RunPaths:
    """``spec.json``, ``status.json``, ``journal.jsonl``, ``workspace/`` (the agent's world: ``data/`` a read-only
    view of the task's public folder, ``submission/``, ``working/``, ``instructions.md``), ``snapshots/`` (submissions
    the agent offered), ``final/`` (the chosen submission, the best solution's code, metadata), ``grade.json``,
    ``logs/``, ``cassette.jsonl`` (every model call, for replay)."""

    run_dir: Path

    @property
    def spec(self) -> Path:
        return self.run_dir / "spec.json"

    @property
    def status(self) -> Path:
        return self.run_dir / "status.json"

    @property
    def journal(self) -> Path:
        return self.run_dir / "journal.jsonl"

    @property
    def workspace(self) -> Path:
        return self.run_dir / "workspace"

    @property
    def data_view(self) -> Path:
        return self.workspace / DATA_DIRNAME

    @property
    def submission(self) -> Path:
        return self.workspace / SUBMISSION_DIRNAME

    @property
    def working(self) -> Path:
        return self.workspace / WORKING_DIRNAME

    @property
    def instructions(self) -> Path:
        return self.workspace / INSTRUCTIONS_FILENAME

    @property
    def snapshots(self) -> Path:
        return self.run_dir / "snapshots"

    @property
    def final(self) -> Path:
        return self.run_dir / "final"

    @property
    def final_submission(self) -> Path:
        return self.final / "submission"

    @property
    def grade(self) -> Path:
        return self.run_dir / "grade.json"

    @property
    def logs(self) -> Path:
        return self.run_dir / "logs"

    @property
    def cassette(self) -> Path:
        return self.run_dir / "cassette.jsonl"

    @property
    def lock(self) -> Path:
        return self.run_dir / ".lock"
