"""What the capability analysis writes to disk, as typed, frozen records.

* :class:`FactorVerdict` - one factor of one run by one source (the judge, or a deterministic detector), with its
  evidence (each quote checked against the run) and, for the judge, every chunk's answer and the judge's model,
  prompt version and rubric version;
* :class:`RunFailures` - the deterministic failure analysis of one run (why it ended, each step's outcome and
  error type, where the time went, whether the final submission was valid);
* :class:`RunAnalysis` - one run: its keys, verdicts and failures (``<out>/runs/<run_id>.json``);
* :class:`AnalysisManifest` - the whole analysis: versions, judge, factors, runs, cost, and whether it completed
  (``<out>/manifest.json``);
* :class:`HumanLabel` - one line of a human rater's label file.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rexmle_agents.models.accounting import UsageTotals

ANALYSIS_FORMAT_VERSION = 1
Source = Literal["judge", "detector"]
# demonstrated: proven by at least one verified quote; unverified: claimed, but no quote was found in the run (counts
# as not demonstrated); error: no usable answer (kept out of shares and agreement); not_run: the analysis stopped
# (budget) before this factor; not_applicable: a detector that does not apply to the task (CT/MR steps elsewhere)
Status = Literal["demonstrated", "not_demonstrated", "unverified", "error", "not_run", "not_applicable"]
JUDGED_STATUSES = ("demonstrated", "not_demonstrated", "unverified")  # the statuses that count as a verdict


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Quote(_Record):
    """A piece of evidence: a quote said to be in a node's code or output, and whether it is."""

    node: int | None = Field(description="the node (scaffold search) or step (other agents) it is said to come from")
    quote: str
    verified: bool = Field(description="found verbatim (whitespace-normalised) in that node's code that ran, or in "
                                       "its output")
    where: Literal["code", "output"] | None = None
    problem: str = Field(default="", description="why it was not verified")
    rule: str = Field(default="", description="for a quote of code: the rule that decided which of the node's code "
                                              "ran (its final execution exited 0, or up to the line its traceback "
                                              "names)")


class ChunkAnswer(_Record):
    """The judge's answer for one chunk of a run (long runs are judged in chunks, never truncated)."""

    index: int
    nodes: list[int]
    claimed: bool | None = Field(description="what the judge answered (None: no usable answer)")
    evidence: list[Quote] = Field(default_factory=list)
    reason: str = ""
    error: str = Field(default="", description="why no usable answer came (malformed, refused, model error)")
    attempts: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None


class JudgeSettings(_Record):
    """What made a judge verdict: recorded with every one, and the key under which a later analysis reuses it."""

    model: str
    prompt_version: str
    rubric_version: str
    chunk_chars: int
    max_attempts: int
    temperature: float | None = None


class FactorVerdict(_Record):
    run_id: str
    factor: str
    source: Source
    status: Status
    demonstrated: bool = Field(description="counted as demonstrated (status 'demonstrated' only)")
    evidence: list[Quote] = Field(default_factory=list)
    reason: str = ""
    rubric_version: str
    # the judge
    judge: JudgeSettings | None = None
    evidence_digest: str = Field(default="", description="sha256 of the code and outputs judged")
    chunks: list[ChunkAnswer] = Field(default_factory=list)
    unverified_claims: int = Field(default=0, description="chunks that claimed the factor without a verified quote")
    # a detector
    detector: str | None = None
    detector_version: str | None = None

    @property
    def judged(self) -> bool:
        return self.status in JUDGED_STATUSES


class StepOutcome(_Record):
    """How one node or step ended: ok, crashed (with the error type), an invalid submission (with the validator's
    reason), or no code to run."""

    node: int
    stage: str
    outcome: Literal["ok", "crashed", "invalid_submission", "no_code"]
    error_type: str | None = None
    detail: str = ""
    exit_code: int | None = None
    stopped_by: str | None = None


class RunFailures(_Record):
    end: str = Field(description="why the run ended: finished, limit:<budget>, agent_error, failed, cancelled, "
                                 "cluster:<state>, or not_ended")
    state: str
    limit: str | None = None
    reason: str = ""
    steps: int = Field(description="nodes or steps that wrote code or ran something")
    executed: int
    crashed: int
    invalid: int
    error_types: dict[str, int] = Field(default_factory=dict)
    outcomes: list[StepOutcome] = Field(default_factory=list)
    time_s: float = Field(description="wall-clock of the run, all attempts")
    exec_s: float = Field(description="agent code running in the sandbox (training, inference); parallel workers "
                                      "add up, so it can exceed time_s")
    model_s: float = Field(description="model calls, including retries")
    idle_s: float = Field(description="the rest: harness, validation, grading, waiting (never below 0)")
    retry_s: float = 0.0
    final_valid: bool | None = Field(description="the final submission was valid (None: unknown)")
    final_source: Literal["grade", "snapshot", "none"]


class RunAnalysis(_Record):
    format_version: int = ANALYSIS_FORMAT_VERSION
    run_id: str
    run_dir: str
    group: str
    task_id: str
    task_type: str
    modality: str
    agent: str
    model: str
    config: str
    seed: int
    data: str
    state: str
    evidence_digest: str
    nodes: int = Field(description="nodes or steps with code or output")
    verdicts: list[FactorVerdict]
    failures: RunFailures
    problems: list[str] = Field(default_factory=list, description="what the loader could not read")

    def verdict(self, factor: str, source: Source) -> FactorVerdict | None:
        return next((v for v in self.verdicts if v.factor == factor and v.source == source), None)


class AnalysisManifest(_Record):
    format_version: int = ANALYSIS_FORMAT_VERSION
    started_at: str
    finished_at: str
    rexmle_versions: dict[str, str]
    rubric_version: str
    detectors_version: str
    prompt_version: str | None
    judge: JudgeSettings | None
    factors: list[str]
    runs: list[str]
    refused: list[dict[str, str]] = Field(default_factory=list)
    complete: bool
    stopped: str = Field(default="", description="why the analysis stopped early (the cost budget), else empty")
    max_cost_usd: float | None = None
    usage: UsageTotals = Field(description="the judge's calls in this invocation")
    reused_verdicts: int = Field(default=0, description="judge verdicts taken from an earlier analysis of the same "
                                                        "run content, judge, prompt and rubric")


class HumanLabel(_Record):
    """One row of a label file: a rater's verdict on one factor of one run, with the evidence they saw."""

    rater: str
    run: str
    factor: str
    demonstrated: bool
    node: int | None = None
    quote: str = ""
    note: str = ""
